"""The C++ runtime, loaded into the process's global symbol scope before any native library of
llama.cpp or GGML: ``runner/__init__.py`` calls :func:`load_cxx_runtime` before its imports.

Both engines load llama.cpp's and GGML's libraries with ``RTLD_GLOBAL`` (llama-cpp-python does,
and ``runner.ml.ggml.bindings`` follows it, so that one copy of GGML serves both). A Python
executable does not link libstdc++, so the first global library that defines a C++ symbol
decides what every later one binds to. A CUDA build's ``libggml-cuda.so`` (built by nvcc)
defines its own instances of libstdc++ templates, such as ``std::ostream::_M_insert<long>``,
and comes before libstdc++ in that scope: ``libllama.so`` then printed the loaded model's
layers through them and died with a segmentation fault in ``llama_model::print_info``, at
every offloaded load on an H200 (bench/gpu_device.sh; llama-bench ran: an executable comes first
in its own scope). With libstdc++ loaded globally first, those symbols bind to it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

_loaded: ctypes.CDLL | None = None


def load_cxx_runtime() -> None:
    """Load libstdc++ with ``RTLD_GLOBAL`` (Linux; once; where it cannot be found, nothing)."""
    global _loaded
    if _loaded is not None or not sys.platform.startswith("linux"):
        return
    name = ctypes.util.find_library("stdc++") or "libstdc++.so.6"
    try:
        _loaded = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass

