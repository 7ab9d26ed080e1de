"""GGML through ctypes: :mod:`.bindings` (the C functions) and :mod:`.backend` (the CPU backend,
graphs, tensors)."""

from __future__ import annotations

from .backend import GGMLBackend, GGMLTensor, GraphContext, Storage

__all__ = ["GGMLBackend", "GGMLTensor", "GraphContext", "Storage"]
