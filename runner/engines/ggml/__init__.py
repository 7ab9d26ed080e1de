"""The new engine: our model code over GGML with our own KV cache (Ollama's ``ollamarunner``)."""

from __future__ import annotations

from .engine import GGMLEngine, supports

__all__ = ["GGMLEngine", "supports"]
