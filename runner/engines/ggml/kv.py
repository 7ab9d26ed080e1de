"""The new engine's KV operations: our :class:`runner.kvcache.Cache` behind :class:`KvOps`.

Export and import (the prompt store, :mod:`runner.kvstore`) are the cache's own
(:meth:`runner.kvcache.cache.Cache.export_seq`/``import_seq``): per cell its position and per layer
the K and V rows as stored, in :mod:`runner.kvcache.snapshot`'s format. A restored sequence goes
back to the cells it was exported from when they are free (one slot: always), so it continues bit
for bit like the live one, sliding windows included (gemma3's window cache exports the cells it
kept; :meth:`CacheKv.can_resume` still decides whether a shorter prefix of it can serve). When
those cells are taken it goes to the lowest free ones, with its rows unchanged: with flash
attention still bit for bit; without it GGML's attention sums group the terms by where the cells
sit, so the logits move in their last bits (amplified by the quantized matmuls after), as a
recompute into those cells would (measured in ``tests/test_kvstore_ggml.py``).

Pages (the prompt store's): :func:`runner.kvcache.snapshot.split` and ``join`` cut a causal
cache's state into the states of position ranges and put them back; a sliding-window wrapper's
state is not cut (the store keeps it whole).
"""

from __future__ import annotations

from typing import Collection

from ...kvcache import Cache, NotSupported, snapshot


class CacheKv:
    """:class:`runner.loop.slots.KvOps` over the model's :class:`runner.kvcache.Cache` (causal,
    or gemma3's sliding-window + global wrapper: ``can_resume`` is how a slot whose window has
    slid past the prefix starts over)."""

    def __init__(self, cache: Cache) -> None:
        self.cache = cache
        self._joined = bytearray()  # the last joined state: the next join writes into it

    @property
    def state_layout(self) -> str:
        """The cache's (format version, dtype, V layout, window); part of the store's fingerprint."""
        return self.cache.state_layout

    def seq_rm(self, seq: int, begin: int, end: int | None) -> bool:
        try:
            self.cache.remove(seq, begin, end)
            return True
        except NotSupported:
            return False

    def seq_cp(self, src: int, dst: int, length: int) -> None:
        self.cache.copy_prefix(src, dst, length)

    def shift(self, seq: int, keep: int, discard: int, length: int) -> bool:
        return self.seq_rm(seq, keep, keep + discard)

    def can_resume(self, seq: int, pos: int) -> bool:
        return self.cache.can_resume(seq, pos)

    def export_seq(self, seq: int, start: int = 0) -> bytes | bytearray | None:
        return self.cache.export_seq(seq, start) if self.state_layout else None

    def import_seq(self, seq: int, state: bytes | bytearray) -> bool:
        if not self.state_layout:
            self.seq_rm(seq, 0, None)
            return False
        return self.cache.import_seq(seq, state)

    def split_state(self, state: bytes | bytearray, bounds: list[int],
                    held: Collection[int] = ()) -> list[bytearray | None] | None:
        return snapshot.split(state, bounds, held)

    def join_states(self, parts: list) -> bytearray | memoryview:
        state = snapshot.join(parts, self._joined)  # SnapshotError is a ValueError
        buf = state.obj if isinstance(state, memoryview) else state
        if isinstance(buf, bytearray):
            self._joined = buf  # the next join writes into it (this one is imported first)
        return state

    def page_state(self, state: bytes | bytearray, lo: int, hi: int) -> bytearray | memoryview:
        return snapshot.join([(state, lo, hi)])  # no buffer of ours: any thread may call it
