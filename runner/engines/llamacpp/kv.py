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

Export and import (the prompt store, :mod:`runner.kvstore`): llama.cpp's per-sequence state,
``llama_state_seq_get_data``/``set_data``, whole: a header, then per stream the cells (position,
sequences) and per layer the K and V rows of the sequence's cells. It carries no model identity and
no token ids (the store's key does), and is tied to the number of KV streams (``num_parallel``: the
import fails otherwise, hence :attr:`LlamaKv.state_layout`). The import restores the positions, in
the destination's stream from its first cell, as a recompute from an empty slot places them, so a
restored sequence decodes bit for bit like the one exported (measured: restore into another stream,
FA on and off). A sliding-window model's state holds only the window (llama.cpp drops masked cells),
so it would serve its exact end only, and past the window decoding after such a restore drifts
from the live sequence (the window's cells come back compacted, another layout; llama.cpp #25295).
Until the store keeps window pages of its own, sliding-window models export nothing
(``state_layout`` "").
"""

from __future__ import annotations

import ctypes
import logging

import llama_cpp as L

log = logging.getLogger(__name__)


class LlamaKv:
    def __init__(self, ctx, model, num_streams: int = 1) -> None:
        self.ctx = ctx
        self.mem = L.llama_get_memory(ctx)
        self.window = int(L.llama_model_n_swa(model))  # 0: no sliding window
        # "": no export (a sliding window's state does not restore exactly yet, see above)
        self.state_layout = "" if self.window > 0 else f"llama.cpp-{L.__version__} streams={num_streams}"
        self.shiftable = bool(L.llama_memory_can_shift(self.mem))

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

    def export_seq(self, seq: int) -> bytearray | None:
        if not self.state_layout:
            return None
        size = L.llama_state_seq_get_size(self.ctx, seq)
        if size <= 0:
            return None
        state = bytearray(size)
        got = L.llama_state_seq_get_data(self.ctx, (ctypes.c_uint8 * size).from_buffer(state), size, seq)
        if got != size:
            log.warning("llama_state_seq_get_data wrote %d of %d bytes for sequence %d", got, size, seq)
            return None
        return state

    def import_seq(self, seq: int, state: bytes | bytearray) -> bool:
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)
        size = len(state)
        if size == 0:
            return False
        array_type = ctypes.c_uint8 * size
        buf = array_type.from_buffer(state) if isinstance(state, bytearray) else array_type.from_buffer_copy(state)
        if L.llama_state_seq_set_data(self.ctx, buf, size, seq) != size:
            L.llama_memory_seq_rm(self.mem, seq, -1, -1)  # a failed read may have left some cells
            return False
        return True
