"""The old engine's side of GPU offload: which GPUs llama.cpp can use, and a
:class:`~runner.loading.gpu.Placement` as llama.cpp's model parameters.

On a CPU build (``llama_supports_gpu_offload`` false) there are none, and the parameters are
what they always were: no layer offloaded, llama.cpp's defaults otherwise.
"""

from __future__ import annotations

import ctypes
from typing import Any

import llama_cpp as L

from ...loading import gpu
from ...loading.gpu import Placement
from ...ml.device import Device


def offload_devices() -> list[Device]:
    """The GPUs llama.cpp offloads to, numbered as ``main_gpu`` numbers them; none when this
    build of llama.cpp cannot offload (GGML's registry is not even asked then)."""
    if not L.llama_supports_gpu_offload():
        return []
    from ...ml.ggml.devices import devices  # the registry of the GGML libraries llama.cpp loaded

    return gpu.offload_devices(devices())


def model_params(placement: Placement, use_mmap: bool) -> tuple[Any, tuple[Any, ...]]:
    """``llama_model_params`` for ``placement``, and the ctypes arrays they point to (keep them
    until the model is loaded).

    - layers offloaded: ``n_gpu_layers``; one GPU: split mode none on ``main_gpu``; several:
      split mode layer with ``tensor_split`` the layers of each;
    - nothing offloaded on a build that could offload (``num_gpu`` 0, or nothing fits): an empty
      device list, so llama.cpp runs on the CPU alone (with no device it neither offloads a
      layer nor sends a large batch's matmuls to a GPU);
    - a CPU build: ``n_gpu_layers`` 0 and llama.cpp's defaults."""
    mparams = L.llama_model_default_params()
    mparams.use_mmap = use_mmap
    mparams.n_gpu_layers = placement.layers
    keep: tuple[Any, ...] = ()
    if placement.layers:
        mparams.main_gpu = placement.main_gpu
        if placement.split == "none":
            mparams.split_mode = L.LLAMA_SPLIT_MODE_NONE
        else:
            mparams.split_mode = L.LLAMA_SPLIT_MODE_LAYER
            n = int(L.llama_max_devices())
            split = (ctypes.c_float * n)(*placement.tensor_split(n))
            mparams.tensor_split = split
            keep = (split,)
    elif L.llama_supports_gpu_offload():
        none = (ctypes.c_void_p * 1)(None)  # NULL-terminated: no device
        mparams.devices = ctypes.addressof(none)
        keep = (none,)
    return mparams, keep
