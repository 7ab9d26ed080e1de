"""Model-side code of the new engine: GGUF loading, the tokenizer, model definitions."""

from __future__ import annotations

from runner.model.tokenizer import Tokenizer, load_tokenizer

__all__ = ["Tokenizer", "load_tokenizer"]
