"""The tensor layer: a small Backend/Context/Tensor contract (:mod:`.backend`) and its GGML
implementation (:mod:`.ggml`)."""

from __future__ import annotations

from .backend import Backend, BackendOptions, CacheConfig, Context, Tensor

__all__ = ["Backend", "BackendOptions", "CacheConfig", "Context", "Tensor"]
