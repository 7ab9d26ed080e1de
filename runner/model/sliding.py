"""Which layers attend through a sliding window, and how far: one rule for the model code
(``models/gemma3.py`` builds its caches from it) and the load plan (``runner/loading/plan.py`` sizes
the memory from it). Pure Python over GGUF metadata.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

__all__ = ["GEMMA3_GLOBAL_EVERY", "SlidingWindow", "gemma3_local_layers"]

GEMMA3_GLOBAL_EVERY = 6  # gemma3: layers 5, 11, 17, ... are global, the others local


def gemma3_local_layers(n_layer: int, pattern: Sequence[bool] | None = None) -> tuple[bool, ...]:
    """Per layer, whether it is local (sliding window): the file's
    ``attention.sliding_window_pattern`` when it has one per layer, else five local layers then
    a global one, repeated."""
    if pattern is not None and len(pattern) == n_layer:
        return tuple(bool(p) for p in pattern)
    return tuple((i + 1) % GEMMA3_GLOBAL_EVERY != 0 for i in range(n_layer))


@dataclass(frozen=True)
class SlidingWindow:
    """A model's sliding window: ``size`` tokens a local layer sees (the token itself
    included, as llama.cpp and Hugging Face count it) and which layers are local."""

    size: int
    local: tuple[bool, ...]

    @property
    def cache_window(self) -> int:
        """The window as the KV cache counts it: the positions *before* a token that it may
        see (Ollama's ``swaWindowSize``)."""
        return self.size - 1

    @classmethod
    def of(cls, arch: str, metadata: dict, pattern: Sequence[bool] | None = None) -> SlidingWindow | None:
        """The sliding window of a model with these ``{arch}.*`` metadata, or None when it has
        none (every layer global)."""
        if arch != "gemma3":
            return None
        size = int(metadata.get(f"{arch}.attention.sliding_window", 0) or 0)
        n_layer = int(metadata.get(f"{arch}.block_count", 0) or 0)
        if size < 1 or n_layer < 1:
            return None
        return cls(size, gemma3_local_layers(n_layer, pattern))
