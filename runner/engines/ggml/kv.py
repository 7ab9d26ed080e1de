"""The new engine's KV operations: our :class:`runner.kvcache.Cache` behind :class:`KvOps`."""

from __future__ import annotations

from ...kvcache import Cache, NotSupported


class CacheKv:
    """:class:`runner.loop.slots.KvOps` over the model's :class:`runner.kvcache.Cache` (causal,
    or gemma3's sliding-window + global wrapper: ``can_resume`` is how a slot whose window has
    slid past the prefix starts over)."""

    state_layout = ""  # no export yet

    def __init__(self, cache: Cache) -> None:
        self.cache = cache

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

    def export_seq(self, seq: int) -> None:
        return None  # not yet (issue 25: rows of the sequence's cells, runner/kvcache)

    def import_seq(self, seq: int, state: bytes | bytearray) -> bool:
        self.seq_rm(seq, 0, None)
        return False
