"""The old engine's KV operations: llama.cpp's ``llama_memory_seq_*`` behind :class:`KvOps`.

The context gives every slot its own KV stream of ``num_ctx`` cells (``kv_unified`` off, which is
what llama-server does with ``-np N``): a sequence's attention spans only its own cells, so the
caches that idle slots keep for their next turn cost the live sequences nothing. Sequences still
decode together: the batch loop adds them in slot order, and llama.cpp evaluates a run of
consecutive slot ids as one ubatch. A prefix fork across streams copies the stream's buffer (at
the next decode) and trims the copy, since llama.cpp copies between streams only whole.

Sliding-window models (gemma3): the context keeps only ``window + n_ubatch`` cells per stream,
padded to 256 (:attr:`LlamaKv.ring`), for the local layers (``swa_full`` off, as llama-server
runs), overwriting the oldest once they fall out of every token's window. A slot may then hold the
tail of a conversation but not its start, so :meth:`LlamaKv.can_resume` asks llama.cpp for the
oldest position it still holds (``llama_memory_seq_pos_min``): resuming at ``pos`` needs
``[pos - window, pos)`` (llama-server's rule); otherwise the slot starts over instead of attending
over overwritten cells.

Export and import (the prompt store, :mod:`runner.kvstore`): llama.cpp's per-sequence state,
``llama_state_seq_get_data``/``set_data``, whole: a header, then per stream the cells (position,
sequences) and per layer the K and V rows of the sequence's cells. It carries no model identity and
no token ids (the store's key does), and is tied to the number of KV streams (``num_parallel``: the
import fails otherwise, hence :attr:`LlamaKv.state_layout`). The import restores the positions, in
the destination's stream from its first cell, as a recompute from an empty slot places them, so a
restored sequence decodes bit for bit like the one exported (measured: restore into another stream,
FA on and off).

A sliding-window model's state holds the global layers' cells and, of the window's, only those a
later token can see: positions ``[n - window, n)`` of a sequence of ``n``. That is all continuing
at ``n`` reads, but llama.cpp puts those cells into the destination's stream one after another
from its first, where a recompute keeps its ring (position ``p`` in cell ``p % ring``), and
attention sums over cells in cell order, so the same rows in other cells round differently.
Measured on gemma-3-270m (logits up to ~19), 64 tokens past the window: live vs restored differs
by up to 1.8 (flash attention off) and 1.5 (on), greedy tokens parting after as few as 1; that is
a recompute's own batch rounding (1.2 to 2.3 from the live sequence, parting after as few as 7),
and llama.cpp #25295's drift. Nothing is missing or misplaced: :meth:`LlamaKv.import_seq` lays the
same rows out in ring order first (:func:`.kvstate.relay_window`, with zero-filled filler cells
at positions outside every later window where the ring holds nothing of it), and the restored
sequence then decodes bit for bit like the one exported (measured: 64 greedy tokens past the
window, FA on and off, the ring wrapped or not), and so like a recompute up to that one's batch
rounding. Bit for bit needs the exported window where a recompute puts it, as a slot filled in
order has it; a slot cut back or shifted across its ring's end rounds like a recompute instead.

The rule for a restored window is the slot's (:meth:`LlamaKv.can_resume`): resuming at ``pos``
needs ``[pos - window, pos)`` held, and a restore holds the window's first position onwards as its
own (the fillers below it are not the sequence's: :meth:`LlamaKv.oldest`). So a stored state
serves its exact end, and a prompt that shares less of it is recomputed from position 0, not read
from cells that are gone. (The rule is llama-server's, one position stricter than the mask:
resuming at ``n - 1``, a prompt equal to the state's inputs, recomputes too.)

Pages (the prompt store's): :func:`.kvstate.split` and ``join`` cut a state without a sliding
window into the states of position ranges and put them back (a sliding-window state is kept whole).
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Collection

import llama_cpp as L

from . import kvstate
from .kvstate import relay_window

log = logging.getLogger(__name__)


class LlamaKv:
    def __init__(self, ctx, model, num_streams: int = 1, swa_full: bool = False) -> None:
        self.ctx = ctx
        self.mem = L.llama_get_memory(ctx)
        self.window = int(L.llama_model_n_swa(model))  # 0: no sliding window
        self.state_layout = f"llama.cpp-{L.__version__} streams={num_streams}"
        self.shiftable = bool(L.llama_memory_can_shift(self.mem))
        # the window's cells per stream (llama_kv_cache_iswa: padded to 256, streams not unified)
        per_stream = int(L.llama_n_ctx_seq(ctx))
        self.ring = per_stream if swa_full else min(per_stream, _pad(self.window + int(L.llama_n_ubatch(ctx)), 256))
        # sequences restored with fillers: the first position that is their own (fillers below)
        self._own: dict[int, int] = {}
        self._joined = bytearray()  # the last joined state: the next join writes into it
        self._exported = bytearray()  # the last export's buffer: the next export reuses it if free
        self._relaid = bytearray()  # the last window relaid for an import: the next one writes into it
        self._spare: bytearray | None = None  # a whole state relaid and imported: free once its caller lets go

    def seq_rm(self, seq: int, begin: int, end: int | None) -> bool:
        done = bool(L.llama_memory_seq_rm(self.mem, seq, begin, -1 if end is None else end))
        if seq in self._own and L.llama_memory_seq_pos_max(self.mem, seq) < 0:
            del self._own[seq]  # emptied: its fillers went with it
        return done

    def seq_cp(self, src: int, dst: int, length: int) -> None:
        L.llama_memory_seq_cp(self.mem, src, dst, 0, -1)  # whole: the only copy between streams
        L.llama_memory_seq_rm(self.mem, dst, length, -1)
        self._own.pop(dst, None)
        if src in self._own:
            self._own[dst] = self._own[src]  # the copy holds the same fillers

    def shift(self, seq: int, keep: int, discard: int, length: int) -> bool:
        if not self.shiftable:
            return False
        if not L.llama_memory_seq_rm(self.mem, seq, keep, keep + discard):
            return False
        L.llama_memory_seq_add(self.mem, seq, keep + discard, length, -discard)
        own = self._own.get(seq)
        if own is not None and own > keep:  # fillers above keep went or moved down with the rest
            self._own[seq] = max(own, keep + discard) - discard
        return True

    def oldest(self, seq: int) -> int:
        """The oldest position ``seq`` holds of its own (-1: none): llama.cpp's, or above a
        restore's fillers."""
        oldest = int(L.llama_memory_seq_pos_min(self.mem, seq))
        return max(oldest, self._own.get(seq, 0)) if oldest >= 0 else -1

    def can_resume(self, seq: int, pos: int) -> bool:
        if self.window <= 0 or pos <= 0:
            return True
        oldest = self.oldest(seq)
        return 0 <= oldest <= max(0, pos - self.window)

    def export_seq(self, seq: int, start: int = 0) -> bytearray | memoryview | None:
        state = self._export(seq)
        if state is None or not start:
            return state
        return kvstate.tail(state, start)  # llama.cpp exports a sequence whole: cut what was asked

    def _export(self, seq: int) -> bytearray | memoryview | None:
        size = L.llama_state_seq_get_size(self.ctx, seq)
        if size <= 0:
            return None
        # the last export's buffer when nothing holds it any more (the store kept its pages, as
        # copies): a new 50 MB buffer costs ~13,000 first-touch page faults, more than the copy.
        # Held (a state kept whole, a caller's view), it stays theirs and a new one is made.
        if len(self._exported) < size or sys.getrefcount(self._exported) > 2:
            spare, self._spare = self._spare, None  # a whole state imported since: nothing reads it now
            if spare is not None and len(spare) >= size and sys.getrefcount(spare) <= 2:
                self._exported = spare
            else:
                self._exported = bytearray(size + size // 8)  # room to grow by a turn or two
        buf = self._exported
        state = memoryview(buf)[:size]
        got = L.llama_state_seq_get_data(self.ctx, (ctypes.c_uint8 * size).from_buffer(buf), size, seq)
        if got != size:
            log.warning("llama_state_seq_get_data wrote %d of %d bytes for sequence %d", got, size, seq)
            return None
        return state

    def import_seq(self, seq: int, state: bytes | bytearray) -> bool:
        self._own.pop(seq, None)
        L.llama_memory_seq_rm(self.mem, seq, -1, -1)
        if len(state) == 0:
            return False
        relaid = relay_window(state, self.ring, self._relaid) if self.window > 0 else None
        if relaid is not None:
            blob, own = relaid
            if isinstance(blob, memoryview) and isinstance(blob.obj, bytearray) and blob.obj is not state:
                self._relaid = blob.obj  # the next relay writes into it
            if self._set(seq, blob):
                if own > L.llama_memory_seq_pos_min(self.mem, seq):
                    self._own[seq] = own
                whole = state.obj if isinstance(state, memoryview) else state
                if blob is not state and isinstance(whole, bytearray):
                    self._spare = whole  # a state kept whole, read now: the next export may take its buffer
                return True
            log.warning("llama.cpp refused sequence %d's window in ring order (%d cells); importing it as saved",
                        seq, self.ring)
        return self._set(seq, state)

    def split_state(self, state: bytes | bytearray, bounds: list[int],
                    held: Collection[int] = ()) -> list[bytearray | None] | None:
        return kvstate.split(state, bounds, held)

    def join_states(self, parts: list) -> bytearray | memoryview:
        state = kvstate.join(parts, self._joined)
        buf = state.obj if isinstance(state, memoryview) else state
        if isinstance(buf, bytearray):
            self._joined = buf  # the next join writes into it (this one is imported first)
        return state

    def page_state(self, state: bytes | bytearray, lo: int, hi: int) -> bytearray | memoryview:
        return kvstate.join([(state, lo, hi)])  # no buffer of ours: any thread may call it

    def _set(self, seq: int, state: bytes | bytearray) -> bool:
        size = len(state)
        array_type = ctypes.c_uint8 * size
        writable = isinstance(state, bytearray) or (isinstance(state, memoryview) and not state.readonly)
        buf = array_type.from_buffer(state) if writable else array_type.from_buffer_copy(state)
        if L.llama_state_seq_set_data(self.ctx, buf, size, seq) != size:
            L.llama_memory_seq_rm(self.mem, seq, -1, -1)  # a failed read may have left some cells
            return False
        return True


def _pad(n: int, to: int) -> int:
    return (n + to - 1) // to * to
