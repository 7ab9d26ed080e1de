"""Images in the input stream of the new engine (Ollama's ``input.Input`` + ``PostTokenize``), and
the attention mask that gives image tokens llama.cpp's attention: pure functions over plain data.

A tokenized prompt is a list of token ids and :class:`ImageInput` (an image's identity and how
many soft tokens its encoder makes). A model's ``post_tokenize`` lays each image out as inputs;
gemma3's layout is libmtmd's (checked against it in ``tests/test_vision.py``)::

    ... text ..., <start_of_image>, row 0, row 1, ..., row n-1, <end_of_image>, ... text ...

Row ``r`` is an :class:`Input` that takes row ``r`` of the image's embedding instead of a token
embedding. ``<start_of_image>`` carries ``same_batch = n + 1``: the rows and ``<end_of_image>``
go in its batch.

**Attention.** llama.cpp decodes gemma3's image rows with causal attention off (libmtmd's
``mtmd_decode_use_non_causal``; every layer, the sliding window still applies) in batches of
their own, so a row sees everything of its sequence already in the cache plus every row of the
same image in its batch, and the text after the image is causal again. Because an image's rows
hold consecutive positions, that is one rule on positions: an input may also see the next
``ahead`` positions of its sequence, where ``ahead = n - 1 - r`` for row ``r`` and 0 for text.
Rows of a later batch are not in the cache yet, so an image split across batches gets what
llama.cpp gives it when it splits the image at the same place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Collection, Sequence, Union

import numpy as np

__all__ = ["Input", "ImageInput", "attention_mask", "gemma3_post_tokenize", "image_rows"]

GEMMA3_START_OF_IMAGE = 255999
GEMMA3_END_OF_IMAGE = 256000
PLACEHOLDER = 0  # token id of an input whose embedding comes from an image


@dataclass(frozen=True)
class ImageInput:
    """An image where the prompt names it: its identity and its soft-token count."""

    digest: str  # sha256 of the image bytes: equal images share cache entries and embeddings
    n_tokens: int

    def __post_init__(self) -> None:
        if self.n_tokens < 1:
            raise ValueError(f"an image of {self.n_tokens} tokens")


@dataclass(frozen=True)
class Input:
    """One position of the input stream.

    - ``token``: the token id (``PLACEHOLDER`` for an image row);
    - ``image``/``row``: this position takes row ``row`` of image ``image``'s embedding;
    - ``same_batch``: the next ``same_batch`` inputs go in the same batch as this one;
    - ``ahead``: how many later positions of its sequence this input may attend to (0: causal).
    """

    token: int = PLACEHOLDER
    image: str | None = None
    row: int = 0
    same_batch: int = 0
    ahead: int = 0

    @property
    def key(self) -> tuple[int, str | None, int]:
        """What makes two inputs equal for the slot cache's prefix match."""
        return (self.token, self.image, self.row)


Prompt = Sequence[Union[int, ImageInput]]


def image_rows(image: ImageInput) -> list[Input]:
    """The ``n`` row inputs of ``image``: each sees the rest of its image (non-causal)."""
    n = image.n_tokens
    return [Input(image=image.digest, row=r, ahead=n - 1 - r) for r in range(n)]


def gemma3_post_tokenize(prompt: Prompt) -> list[Input]:
    """gemma3's layout: ``<start_of_image>`` (``same_batch`` n + 1), the ``n`` rows,
    ``<end_of_image>``; tokens stay as they are."""
    out: list[Input] = []
    for item in prompt:
        if isinstance(item, ImageInput):
            out.append(Input(GEMMA3_START_OF_IMAGE, same_batch=item.n_tokens + 1))
            out.extend(image_rows(item))
            out.append(Input(GEMMA3_END_OF_IMAGE))
        else:
            out.append(Input(int(item)))
    return out


def attention_mask(
    positions: Sequence[int],
    sequences: Sequence[int],
    ahead: Sequence[int],
    cell_positions: Sequence[int],
    cell_sequences: Sequence[Collection[int]],
    window: int | None = None,
) -> np.ndarray:
    """The mask of one batch over the cache, float32 ``(n_batch, n_cells)``: 0 where batch input
    ``i`` (at ``positions[i]`` of sequence ``sequences[i]``, seeing ``ahead[i]`` positions
    ahead) may attend to cell ``j`` (holding position ``cell_positions[j]`` for the sequences
    ``cell_sequences[j]``; empty: a free cell), ``-inf`` elsewhere. Cell ``j`` is visible when it
    holds the input's sequence, ``pos_j <= pos_i + ahead_i``, and, with a sliding ``window``
    (positions before a token it may see), ``pos_j >= pos_i - window``."""
    pos = np.asarray(positions, dtype=np.int64)[:, None]
    limit = pos + np.asarray(ahead, dtype=np.int64)[:, None]
    cell_pos = np.asarray(cell_positions, dtype=np.int64)[None, :]
    same = np.array([[s in held for held in cell_sequences] for s in sequences], dtype=bool)
    ok = same.reshape(len(positions), len(cell_sequences)) & (cell_pos <= limit)
    if window is not None:
        ok &= cell_pos >= pos - window
    return np.where(ok, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
