"""The old engine's KV operations: llama.cpp's ``llama_memory_seq_*`` behind :class:`KvOps`.

The context keeps all slots in one unified KV buffer (``kv_unified``): sequences decoded together
share one attention pass (measured: 4 streams give 1.33× the aggregate of 1, against 1.01× with a
stream per slot), and a prefix fork is metadata only — cells gain the destination sequence, as in
Ollama's zero-copy ``CopyPrefix``. The runner enforces the per-slot ``num_ctx`` itself.
"""

from __future__ import annotations

import llama_cpp as L


class LlamaKv:
    def __init__(self, ctx) -> None:
        self.mem = L.llama_get_memory(ctx)
        self.shiftable = bool(L.llama_memory_can_shift(self.mem))

    def seq_rm(self, seq: int, begin: int, end: int | None) -> bool:
        return bool(L.llama_memory_seq_rm(self.mem, seq, begin, -1 if end is None else end))

    def seq_cp(self, src: int, dst: int, length: int) -> None:
        L.llama_memory_seq_cp(self.mem, src, dst, 0, length)

    def shift(self, seq: int, keep: int, discard: int, length: int) -> bool:
        if not self.shiftable:
            return False
        if not L.llama_memory_seq_rm(self.mem, seq, keep, keep + discard):
            return False
        L.llama_memory_seq_add(self.mem, seq, keep + discard, length, -discard)
        return True

    def can_resume(self, seq: int, pos: int) -> bool:
        return True
