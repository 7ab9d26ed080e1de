"""Vision encoders of the new engine: a projector GGUF (llama.cpp's ``clip`` format, Ollama's
``projector`` layer) -> an :class:`ImageEncoder` that turns image bytes into soft tokens of the
text model's width.

    enc = load_projector("mmproj.gguf", BackendOptions(num_threads=4))
    pixels = enc.preprocess(open("cat.png", "rb").read())   # (3, size, size) float32
    tokens = enc.encode(pixels)                              # (enc.n_tokens, enc.n_embd) float32

Each projector type is one class here (gemma3: :class:`~runner.model.vision.gemma3.Gemma3Vision`).
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np

from runner.ml.backend import BackendOptions
from runner.model.gguf_weights import GGUFError, GGUFFile

from .gemma3 import Gemma3Vision

__all__ = ["PROJECTORS", "ImageEncoder", "load_projector"]


class ImageEncoder(Protocol):
    """An image encoder over its own weights and backend (its graph is not the text model's)."""

    n_tokens: int  # soft tokens per image (every image: one tile)
    n_embd: int  # their width: the text model's embedding width

    def preprocess(self, data: bytes) -> np.ndarray:
        """Decode ``data`` (PNG, JPEG, WEBP) and make the encoder's input pixels. Raises
        ``runner.api.InvalidRequest`` (one line) when it is not such an image."""
        ...

    def reserve(self) -> int:
        """Build the image graph and size its compute buffer now (so a model that loads cannot
        fail for memory at its first image); returns the buffer's bytes. ``MemoryError`` if it
        cannot be allocated."""
        ...

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """The soft tokens of one image's pixels (from :meth:`preprocess`): a new float32 array
        ``(n_tokens, n_embd)``. ``ValueError`` for pixels of another shape."""
        ...

    def close(self) -> None:
        """Free the weights, graph and backend."""
        ...


#: ``clip.projector_type`` -> the encoder class
PROJECTORS: dict[str, type[Gemma3Vision]] = {"gemma3": Gemma3Vision}


def load_projector(path: str | os.PathLike[str], options: BackendOptions | None = None) -> ImageEncoder:
    """The encoder of the projector GGUF at ``path``. Raises GGUFError (not a projector, an
    unsupported projector type, a missing tensor or key)."""
    with GGUFFile.open(path) as f:
        if f.get("general.architecture") != "clip":
            raise GGUFError(f"{path}: not a vision projector (general.architecture is not clip)")
        kind = f.get("clip.projector_type") or f.get("clip.vision.projector_type")
    cls = PROJECTORS.get(str(kind))
    if cls is None:
        raise GGUFError(f"{path}: unsupported projector type {kind!r} (supported: {', '.join(sorted(PROJECTORS))})")
    return cls.load(path, options)
