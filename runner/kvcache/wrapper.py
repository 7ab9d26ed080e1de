"""A cache made of several caches (Ollama's ``kvcache/wrapper.go``).

Models whose layers need different caches (gemma2/3: sliding-window layers and global layers;
mllama: an encoder cache and a causal cache) hold one :class:`WrapperCache`. Sequence
operations fan out to every cache; ``get``/``put`` go to the cache of the current layer type,
chosen by the model with :meth:`WrapperCache.set_layer_type`.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Hashable, Sequence

import numpy as np

from . import snapshot
from .cache import Batch, Cache, CacheConfig, KvCacheError, LayerShape, NotSupported

__all__ = ["WrapperCache"]

log = logging.getLogger(__name__)


class WrapperCache:
    """Fans the :class:`Cache` contract out to ``caches``; implements :class:`Cache` itself."""

    def __init__(self, *caches: Cache, layer_types: Sequence[int] = ()) -> None:
        """Wrap ``caches`` (at least one); layer type ``t`` selects ``caches[t]``.
        ``layer_types[i]`` is the type of layer ``i``, which :meth:`allocate` needs to give
        each cache only its layers (the model selects the same type with
        :meth:`set_layer_type` when it runs layer ``i``)."""
        if not caches:
            raise ValueError("WrapperCache needs at least one cache")
        if any(not 0 <= t < len(caches) for t in layer_types):
            raise ValueError(f"layer types must be in 0..{len(caches) - 1}")
        self.caches: tuple[Cache, ...] = caches
        self.layer_types = tuple(layer_types)
        self._cur_type = 0
        self._spare: bytearray | None = None  # the last whole state imported: the next export's buffer if free

    def set_layer_type(self, layer_type: int) -> None:
        """Select which wrapped cache the following ``get``/``put`` use (an index into
        ``caches``; ``IndexError`` if out of range). Reset to 0 by ``start_forward``."""
        if not 0 <= layer_type < len(self.caches):
            raise IndexError(f"layer type {layer_type} not in 0..{len(self.caches) - 1}")
        self._cur_type = layer_type

    @property
    def underlying(self) -> Cache:
        """The cache of the current layer type."""
        return self.caches[self._cur_type]

    def set_layer(self, layer: int) -> None:
        """Set the layer on every wrapped cache."""
        for c in self.caches:
            c.set_layer(layer)

    def get(self, ctx: Any) -> tuple[Any, Any, Any]:
        """``get`` of the current layer type's cache."""
        return self.underlying.get(ctx)

    def put(self, ctx: Any, k: Any, v: Any) -> None:
        """``put`` into the current layer type's cache."""
        self.underlying.put(ctx, k, v)

    def set_config(self, config: CacheConfig) -> None:
        """Give ``config`` to every wrapped cache."""
        for c in self.caches:
            c.set_config(config)

    def init(
        self, backend: Any, dtype: str, max_sequences: int, capacity: int, max_batch: int
    ) -> None:
        """Initialise every wrapped cache with the same sizes."""
        for c in self.caches:
            c.init(backend, dtype, max_sequences, capacity, max_batch)

    def allocate(self, layers: Sequence[LayerShape]) -> None:
        """Allocate each wrapped cache's layers (by ``layer_types``); the others get nothing.
        ``ValueError`` when ``layer_types`` does not cover ``layers``."""
        if len(self.layer_types) != len(layers):
            raise ValueError(f"{len(layers)} layers, but layer types for {len(self.layer_types)}")
        for t, c in enumerate(self.caches):
            c.allocate([shape if self.layer_types[i] == t else (0, 0, 0) for i, shape in enumerate(layers)])

    def close(self) -> None:
        """Close every wrapped cache."""
        for c in self.caches:
            c.close()

    @property
    def config(self) -> CacheConfig:
        """The layout of the wrapped caches (one backend gives them all the same)."""
        return self.caches[0].config

    @property
    def max_batch(self) -> int:
        """The batch limit every wrapped cache was sized for."""
        return self.caches[0].max_batch

    @property
    def nbytes(self) -> int:
        """Storage of all wrapped caches."""
        return sum(c.nbytes for c in self.caches)

    def graph_key(self) -> Hashable:
        """The wrapped caches' keys together."""
        return tuple(c.graph_key() for c in self.caches)

    def graph_inputs(self) -> dict[str, np.ndarray]:
        """The wrapped caches' inputs together (their names do not collide)."""
        inputs: dict[str, np.ndarray] = {}
        for c in self.caches:
            inputs.update(c.graph_inputs())
        return inputs

    def start_forward(self, ctx: Any, batch: Batch, reserve: bool) -> None:
        """Start the forward pass on every cache, in order. If one fails, the batch's tokens are
        removed again from the caches that had accepted it (removal to the end never fails) and
        the error is re-raised, so the caches stay consistent."""
        for i, c in enumerate(self.caches):
            try:
                c.start_forward(ctx, batch, reserve)
            except Exception:
                if not reserve:
                    _unwind(self.caches[:i], batch.positions, batch.sequences)
                raise
        self._cur_type = 0

    def copy_prefix(self, src_seq: int, dst_seq: int, length: int) -> None:
        """``copy_prefix`` on every wrapped cache."""
        for c in self.caches:
            c.copy_prefix(src_seq, dst_seq, length)

    def can_resume(self, seq: int, pos: int) -> bool:
        """True only if every wrapped cache can resume ``seq`` at ``pos``."""
        return all(c.can_resume(seq, pos) for c in self.caches)

    def remove(self, seq: int, begin: int, end: int | None) -> None:
        """``remove`` on every wrapped cache; stops at the first error (the caller then removes
        the whole sequence, which cannot fail)."""
        for c in self.caches:
            c.remove(seq, begin, end)

    @property
    def state_layout(self) -> str:
        """The wrapped caches' layouts, in order ("" when one of them cannot export)."""
        layouts = [c.state_layout for c in self.caches]
        return "" if not all(layouts) else "wrapper[" + "; ".join(layouts) + "]"

    def export_seq(self, seq: int, start: int = 0) -> bytearray | memoryview:
        """Every wrapped cache's state of ``seq``, packed in order (:func:`snapshot.pack`): a
        sliding-window cache's holds only the window it kept. Packed into the buffer of the
        last whole state imported, when nothing holds it any more (the prompt store keeps a
        wrapper's states whole, so an export's own buffer stays the store's): a new 20 MB buffer
        costs thousands of first-touch page faults. Whole only (``start`` 0)."""
        if start:
            raise NotSupported("a sliding-window state is exported whole")
        states = [c.export_seq(seq) for c in self.caches]
        spare, self._spare = self._spare, None
        if spare is not None and sys.getrefcount(spare) > 2:
            spare = None
        return snapshot.pack(states, spare)

    def import_seq(self, seq: int, data: bytes | bytearray | memoryview) -> bool:
        """Each wrapped cache imports its part; when one refuses, ``seq`` is removed from all of
        them (removal to the end never fails), so nothing is half-restored."""
        try:
            parts = snapshot.unpack(data, len(self.caches))
        except snapshot.SnapshotError as err:
            log.warning("KV state of sequence %d refused: %s", seq, err)
            parts = None
        if parts is not None and all(c.import_seq(seq, part) for c, part in zip(self.caches, parts)):
            whole = data.obj if isinstance(data, memoryview) else data
            if isinstance(whole, bytearray):
                self._spare = whole  # read now: the next export may pack into it
            return True
        for c in self.caches:
            c.remove(seq, 0, None)
        return False


def _unwind(caches: Sequence[Cache], positions: Sequence[int], seqs: Sequence[int]) -> None:
    """Drop each token (``seqs[i]`` from ``positions[i]`` on) from ``caches``, newest first."""
    for c in reversed(caches):
        for pos, seq in zip(positions, seqs):
            try:
                c.remove(seq, pos, None)
            except KvCacheError:  # removing to the end does not shift, so should not fail
                pass
