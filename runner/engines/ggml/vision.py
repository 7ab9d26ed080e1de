"""Images on the new engine: our own vision encoder (:mod:`runner.model.vision`) and the text
model's decode of an image's soft tokens at their positions of a slot's KV sequence.

An image fills the prompt as libmtmd lays it out for gemma3 (so both engines see the same
inputs): ``<start_of_image>``, one :class:`~runner.loop.slots.ImageInput` per soft token (all
carrying the image's identity, the sha256 of its bytes), ``<end_of_image>``. Its embedding is
computed on first use and kept on the host by identity (a few images), so a second turn about
the same picture, or a new conversation that repeats it, does not encode it again.

Decoding gives the text model the image's rows in pieces of at most ``num_batch`` (as libmtmd's
``mtmd_helper_decode_image_chunk`` splits them): each piece replaces the token embeddings by the
image's rows (unscaled) and attends non-causally within itself (``Batch.causal_except``) and to
what its sequence already holds (the text before the image and the earlier pieces).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from ...api import Image, InvalidModel, LoadError
from ...images import EmbeddingCache
from ...loop.slots import ImageInput, Input
from ...ml.backend import BackendOptions
from ...model.gguf_weights import GGUFError, GGUFFile
from ...model.model import Batch
from ...model.multimodal import GEMMA3_END_OF_IMAGE, GEMMA3_START_OF_IMAGE
from ...model.vision import ImageEncoder, load_projector

log = logging.getLogger(__name__)

#: projector types the new engine decodes, with the text architecture each goes with and the
#: tokens that wrap an image (the old engine, libmtmd, serves every other one)
LAYOUTS: dict[str, tuple[str, int, int]] = {"gemma3": ("gemma3", GEMMA3_START_OF_IMAGE, GEMMA3_END_OF_IMAGE)}


def projector_type(path: str) -> str | None:
    """``clip.projector_type`` of the projector GGUF at ``path`` (None when unreadable)."""
    try:
        with GGUFFile.open(path) as f:
            kind = f.get("clip.projector_type") or f.get("clip.vision.projector_type")
    except (GGUFError, OSError):
        return None
    return None if kind is None else str(kind)


def supports(architecture: str, projector: str) -> bool:
    """Whether the new engine takes images for this text architecture with this projector."""
    layout = LAYOUTS.get(projector_type(projector) or "")
    return layout is not None and layout[0] == architecture


class Vision:
    """The projector of one loaded text model. :meth:`image_inputs` may run on any thread;
    :meth:`decode` runs on the loop thread (it uses the encoder and the text model)."""

    def __init__(self, path: str, kind: str, model: Any, options: BackendOptions) -> None:
        try:
            self.encoder: ImageEncoder = load_projector(path, options)
        except GGUFError as err:
            raise InvalidModel(f"cannot load the vision projector {path}: {err}") from None
        _, self._start, self._end = LAYOUTS[kind]
        if self.encoder.n_embd != model.n_embd:
            self.encoder.close()
            raise InvalidModel(f"the projector {path} makes {self.encoder.n_embd}-wide embeddings, "
                               f"the model takes {model.n_embd}")
        try:
            self.memory_size = self.encoder.reserve()
        except MemoryError as err:
            self.encoder.close()
            raise LoadError(f"cannot allocate the vision encoder's compute buffer: {err}") from None
        self._model = model
        self._embeddings = EmbeddingCache()
        self.stats = self._embeddings.stats

    @property
    def n_tokens(self) -> int:
        """Soft tokens per image (every image is one tile)."""
        return self.encoder.n_tokens

    def image_inputs(self, image: Image) -> list[Input]:
        """``<start_of_image>``, one ImageInput per soft token, ``<end_of_image>``. The image is
        preprocessed here (an image that cannot be read fails its request now, InvalidRequest);
        the pixels ride on the inputs until the image is decoded."""
        pixels = self.encoder.preprocess(image.data)
        n = self.encoder.n_tokens
        return [self._start, *(ImageInput(image.digest, k, n, pixels) for k in range(n)), self._end]

    def embedding(self, image: ImageInput) -> np.ndarray:
        """The image's soft tokens ``(count, n_embd)``, from the host cache or the encoder."""
        return self._embeddings.get(image.digest, lambda: self.encoder.encode(image.source))

    def decode(self, image: ImageInput, pos: int, seq_id: int, num_batch: int) -> None:
        """Put the image's rows at positions ``pos..pos+count-1`` of ``seq_id``, ``num_batch``
        rows a decode, each piece non-causal within itself."""
        embd = self.embedding(image)
        try:
            for first in range(0, len(embd), num_batch):
                rows = embd[first:first + num_batch]
                n = len(rows)
                self._model.compute(Batch(tokens=[0] * n, positions=range(pos + first, pos + first + n),
                                          sequences=[seq_id] * n, outputs=[n - 1], embeds=rows,
                                          causal_except=range(n)))
        except Exception as err:
            raise LoadError(f"decoding the image failed: {err}") from err
        self.stats.decodes += 1

    def close(self) -> None:
        self.encoder.close()
        self._embeddings.clear()
