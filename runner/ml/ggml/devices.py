"""The devices of GGML's backend registry: every backend the loaded GGML libraries were built
with (always the CPU; CUDA, Metal, Vulkan... in a GPU build) and their devices, in registry order.

Both engines see the same list: the bindings load the GGML libraries from where llama-cpp-python
loads them (``LLAMA_CPP_LIB_PATH`` or its wheel), so there is one registry per process.
"""

from __future__ import annotations

import ctypes

from ..device import Device, Kind
from . import bindings as g

_KINDS: dict[int, Kind] = {
    g.GGML_BACKEND_DEVICE_TYPE_CPU: "cpu",
    g.GGML_BACKEND_DEVICE_TYPE_GPU: "gpu",
    g.GGML_BACKEND_DEVICE_TYPE_IGPU: "igpu",
    g.GGML_BACKEND_DEVICE_TYPE_ACCEL: "accel",
    g.GGML_BACKEND_DEVICE_TYPE_META: "meta",
}


def _text(raw: bytes | None) -> str:
    return (raw or b"").decode("utf-8", errors="replace")


def devices() -> list[Device]:
    """Every device in the registry with its memory now (``ggml_backend_dev_memory``: for a GPU
    what its driver reports free, for the CPU the host's). A device type this code does not know
    (a newer GGML) is listed as ``accel``: used by nobody, claimed by nothing."""
    out = []
    for i in range(g.ggml_backend_dev_count()):
        dev = g.ggml_backend_dev_get(i)
        if not dev:
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        g.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        reg = g.ggml_backend_dev_backend_reg(dev)
        out.append(Device(
            name=_text(g.ggml_backend_dev_name(dev)),
            description=_text(g.ggml_backend_dev_description(dev)),
            backend=_text(g.ggml_backend_reg_name(reg)) if reg else "",
            kind=_KINDS.get(g.ggml_backend_dev_type(dev), "accel"),
            free=int(free.value),
            total=int(total.value),
        ))
    return out
