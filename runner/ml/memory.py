"""How much memory this process can still get: the one number both engines check before allocating."""

from __future__ import annotations

import resource
from pathlib import Path


def _meminfo(field: str) -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_room() -> int | None:
    """memory.max - memory.current of this process's cgroup (v2), when it has a limit."""
    try:
        rel = next(line.split("::", 1)[1].strip() for line in Path("/proc/self/cgroup").read_text().splitlines()
                   if line.startswith("0::"))
        base = Path("/sys/fs/cgroup") / rel.lstrip("/")
        limit = (base / "memory.max").read_text().strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((base / "memory.current").read_text()))
    except (OSError, ValueError, StopIteration):
        return None


def _address_space_room() -> int | None:
    """RLIMIT_AS minus the address space already mapped (``ulimit -v``)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmSize:"):
                return max(0, soft - int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    return soft


def available_memory() -> int | None:
    """Bytes this process can allocate without swapping or failing: ``MemAvailable``, lowered by
    a cgroup memory limit and by ``RLIMIT_AS``. ``None`` where none of them is known."""
    known = [n for n in (_meminfo("MemAvailable"), _cgroup_room(), _address_space_room()) if n is not None]
    return min(known) if known else None
