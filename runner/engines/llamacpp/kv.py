"""The old engine's KV operations: llama.cpp's ``llama_memory_seq_*`` behind :class:`KvOps`.

The context gives every slot its own KV stream of ``num_ctx`` cells (``kv_unified`` off, which is
what llama-server does with ``-np N``): a sequence's attention spans only its own cells, so the
caches that idle slots keep for their next turn cost the live sequences nothing. Sequences still
decode together: the batch loop adds them in slot order, and llama.cpp evaluates a run of
consecutive slot ids as one ubatch. A prefix fork across streams copies the stream's buffer (at
the next decode) and trims the copy, since llama.cpp copies between streams only whole.

Sliding-window models (gemma3): the context keeps only ``window + n_ubatch`` cells per stream for
the local layers (``swa_full`` off, as llama-server runs), overwriting the oldest once they fall
out of every token's window. A slot may then hold the tail of a conversation but not its start,
so :meth:`LlamaKv.can_resume` asks llama.cpp for the oldest position it still holds
(``llama_memory_seq_pos_min``): resuming at ``pos`` needs ``[pos - window, pos)`` (llama-server's
rule); otherwise the slot starts over instead of attending over overwritten cells.
"""

from __future__ import annotations

import llama_cpp as L


class LlamaKv:
    def __init__(self, ctx, model) -> None:
        self.mem = L.llama_get_memory(ctx)
        self.shiftable = bool(L.llama_memory_can_shift(self.mem))
        self.window = int(L.llama_model_n_swa(model))  # 0: no sliding window

    def seq_rm(self, seq: int, begin: int, end: int | None) -> bool:
        return bool(L.llama_memory_seq_rm(self.mem, seq, begin, -1 if end is None else end))

    def seq_cp(self, src: int, dst: int, length: int) -> None:
        L.llama_memory_seq_cp(self.mem, src, dst, 0, -1)  # whole: the only copy between streams
        L.llama_memory_seq_rm(self.mem, dst, length, -1)

    def shift(self, seq: int, keep: int, discard: int, length: int) -> bool:
        if not self.shiftable:
            return False
        if not L.llama_memory_seq_rm(self.mem, seq, keep, keep + discard):
            return False
        L.llama_memory_seq_add(self.mem, seq, keep + discard, length, -discard)
        return True

    def can_resume(self, seq: int, pos: int) -> bool:
        if self.window <= 0 or pos <= 0:
            return True
        oldest = L.llama_memory_seq_pos_min(self.mem, seq)
        return 0 <= oldest <= max(0, pos - self.window)
