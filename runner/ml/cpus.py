"""How many compute threads a load uses when ``num_thread`` is not set: the one place for it."""

from __future__ import annotations

import os


def default_threads() -> int:
    """Cores this process may run on. llama.cpp counts physical cores; with SMT siblings we cannot
    tell them apart portably, so take the affinity count (the CPU count off Linux)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)
