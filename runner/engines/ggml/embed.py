"""The new engine's embedding lanes: sequences of their own in the model's KV cell pool."""

from __future__ import annotations

from typing import Any

import numpy as np

from ...api import LoadError
from ...loop.slots import InputCache, Slot
from ...model.models import Batch
from .kv import CacheKv


class CacheLanes:
    """:class:`runner.loop.embedding.EmbedLanes` in our own cell pool: lane ``k`` is sequence
    ``num_parallel + k``, beside the slots' sequences. A job first takes the least valuable
    slot and empties it, so its lanes find that slot's share (``num_ctx`` cells) free."""

    def __init__(self, model: Any, kv: CacheKv, num_parallel: int, max_lanes: int) -> None:
        self.max_lanes = max_lanes
        self._model, self._kv, self._first = model, kv, num_parallel
        self._tokens: list[int] = []
        self._positions: list[int] = []
        self._seqs: list[int] = []
        self._out: np.ndarray | None = None

    def reserve(self, cache: InputCache) -> Slot | None:
        return cache.claim_scratch()

    def seq(self, lane: int) -> int:
        return self._first + lane

    def begin(self) -> None:
        self._tokens, self._positions, self._seqs = [], [], []

    def add(self, tokens: list[int], pos: int, seq: int) -> int:
        first = len(self._tokens)
        self._tokens.extend(tokens)
        self._positions.extend(range(pos, pos + len(tokens)))
        self._seqs.extend([seq] * len(tokens))
        return first

    def decode(self) -> None:
        outputs = list(range(len(self._tokens)))
        try:
            self._out = self._model.compute(Batch(self._tokens, self._positions, self._seqs, outputs, embeddings=True))
        except Exception as err:
            raise LoadError(f"forward pass failed: {err}") from err

    def rows(self, first: int, count: int) -> np.ndarray:
        assert self._out is not None
        return self._out[first : first + count].copy()

    def forget(self, seq: int) -> None:
        self._kv.seq_rm(seq, 0, None)
