"""The new engine: our model code over GGML with our own KV cache (Ollama's ``ollamarunner``)."""

from __future__ import annotations

from .runner import OllamaRunner, load_runner, supports

__all__ = ["OllamaRunner", "load_runner", "supports"]
