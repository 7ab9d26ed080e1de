"""The slot cache both engines share (reference §1.2–1.3, §2.3): which slot a prompt goes to, how
much of it is already in the KV cache, and context shift.

A slot is one KV sequence with the inputs it holds: token ids, and for an image, one
:class:`ImageInput` per position it fills, carrying the image's identity (the sha256 of its bytes),
so a prompt that repeats an image matches the cached positions like repeated tokens do. An image is
never cut: a cached prefix that ends inside an image is cut back to the image's start, and a context
shift drops whole images. The policy is plain Python over plain data;
the engine supplies :class:`KvOps`, the KV-memory operations it needs (llama.cpp's
``llama_memory_seq_*`` for the old engine, our ``kvcache`` for the new one), including the export
and import of a whole sequence's state that the prompt store (:mod:`runner.kvstore`) keeps.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Collection, Protocol, Sequence, Union

if TYPE_CHECKING:
    from ..kvstore.store import PromptStore

log = logging.getLogger(__name__)


class KvOps(Protocol):
    #: what exported states are tied to besides the load options (llama.cpp: its version and the
    #: number of KV streams); part of the prompt store's fingerprint
    state_layout: str

    def seq_rm(self, seq: int, begin: int, end: int | None) -> bool:
        """Forget positions [begin, end) of ``seq`` (end None: to the end). False when the model
        cannot erase part of a sequence (the caller then erases all of it)."""

    def seq_cp(self, src: int, dst: int, length: int) -> None:
        """Make ``dst`` hold positions [0, length) of ``src`` (``dst`` is empty)."""

    def shift(self, seq: int, keep: int, discard: int, length: int) -> bool:
        """Drop positions [keep, keep+discard) and move [keep+discard, length) down by
        ``discard`` (re-applying RoPE). False when the model cannot shift: the caller re-evaluates."""

    def can_resume(self, seq: int, pos: int) -> bool:
        """Whether the sequence can continue at ``pos`` with its cached prefix (SWA may say no)."""

    def export_seq(self, seq: int, start: int = 0) -> bytes | bytearray | memoryview | None:
        """A host copy of everything ``seq`` holds (positions 0..n-1), for :meth:`import_seq`
        into a sequence of this same load (the prompt store's fingerprint keeps it there). Opaque
        to the caller, which owns it while it holds a reference and counts ``len`` bytes for it
        (an engine may reuse the buffer of an export nothing references any more); None when
        the engine cannot export (the caller then keeps nothing). ``start`` > 0: the state of
        positions ``start..n-1`` only, as :meth:`split_state` would cut it (only for a state it
        cuts: the prompt store holds the pages before), in a buffer of its own size. It may run
        on another thread beside :meth:`join_states`, never beside anything else of this object."""

    def import_seq(self, seq: int, state: bytes | bytearray) -> bool:
        """Make ``seq`` hold what :meth:`export_seq` exported, positions included, so decoding
        continues at the exported length exactly as the exported sequence would have: the same
        logits, bit for bit, for the same batches. ``seq`` is emptied first. False when the engine
        cannot import or refuses ``state`` (another layout, damaged): ``seq`` is then empty and
        the caller evaluates the inputs instead."""

    def split_state(self, state: bytes | bytearray, bounds: list[int],
                    held: Collection[int] = ()) -> list[bytearray | None] | None:
        """The states of positions ``[bounds[i], bounds[i + 1])`` of ``state``, an
        :meth:`export_seq` of positions ``0..bounds[-1]-1`` (``bounds`` ascending from 0): the
        prompt store's pages (:class:`runner.kvstore.pages.Pager`); None in place of page ``i``
        for each ``i`` in ``held`` (the store has it: not cut). None when ``state`` does not cut
        so (a sliding window holds only its last cells): the store keeps it whole."""

    def join_states(self, parts: list[Any]) -> bytes | bytearray | memoryview:
        """One state, for :meth:`import_seq`, of the positions ``parts`` hold (states that
        :meth:`split_state` cut, of this load or another with the same ``state_layout``, or
        ``(state, lo, hi)``: the positions such a state holds at indices ``[lo, hi)``), in
        order; joining what was split gives its bytes back. It may be written into a buffer the
        engine reuses: valid until the next join (a restore imports it at once). ValueError when
        they do not fit together."""

    def page_state(self, state: bytes | bytearray, lo: int, hi: int) -> bytes | bytearray | memoryview:
        """The state of the positions ``state`` (a :meth:`split_state` part) holds at indices
        ``[lo, hi)``, in a new buffer; reads ``state`` only, so any thread may call it (the prompt
        store's disk writer does)."""


@dataclass(frozen=True)
class ImageInput:
    """Position ``index`` of ``count`` that one image fills in a sequence."""

    digest: str  # hex sha256 of the image's bytes: its identity
    index: int
    count: int
    # what the engine decodes the image from (libmtmd's chunk, an embedding): not compared
    source: Any = field(default=None, compare=False, repr=False)


Input = Union[int, ImageInput]


def text_tokens(inputs: Sequence[Input]) -> list[int]:
    """The token ids among ``inputs`` (for what reads tokens only: penalties, a generate context)."""
    return [t for t in inputs if isinstance(t, int)]


def image_start(inputs: Sequence[Input], n: int) -> int:
    """``n``, or the start of the image position ``n`` falls inside of (a prefix never cuts one)."""
    if 0 < n < len(inputs):
        item = inputs[n]
        if isinstance(item, ImageInput) and item.index > 0:
            return n - item.index
    return n


def image_end(inputs: Sequence[Input], n: int) -> int:
    """``n``, or the end of the image position ``n`` falls inside of."""
    if 0 < n < len(inputs):
        item = inputs[n]
        if isinstance(item, ImageInput) and item.index > 0:
            return n + item.count - item.index
    return n


class NoSlotAvailable(RuntimeError):
    pass


class ReprocessInputs(Exception):
    """The shift could not be done in place: the slot is empty, re-evaluate ``inputs``."""

    def __init__(self, inputs: list[Input]):
        super().__init__("reprocess inputs")
        self.inputs = inputs


@dataclass
class Slot:
    id: int
    inputs: list[Input] = field(default_factory=list)  # inputs held in the KV cache, positions 0..n-1
    in_use: bool = False
    last_used: float = 0.0  # time.monotonic(); 0 = never used
    cached_from: str = ""  # where the last claim's cached prefix came from: "slot", "ram", "disk"; "" none


def count_common_prefix(a: Sequence[Input], b: Sequence[Input]) -> int:
    n = min(len(a), len(b))
    i = 0
    # Compare in chunks: list slices compare in C, much faster than a Python loop on long prompts.
    step = 256
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shift_discard(num_ctx: int, input_len: int, num_keep: int) -> int:
    """How many tokens after ``num_keep`` to drop so half the free context is free again."""
    target_free = max((num_ctx - num_keep) // 2, 1)
    current_free = num_ctx - input_len
    return max(target_free - current_free, 0)


class InputCache:
    def __init__(self, kv: KvOps, kv_size: int, num_slots: int, multi_user: bool,
                 store: PromptStore | None = None):
        """``store``: where slots' states go when another conversation takes their slot, and
        come back from when a prompt returns (the prompt store, issue 25); None: no store."""
        if num_slots < 1 or kv_size // num_slots < 1:
            raise ValueError("must have at least one kv cache entry per parallel sequence")
        self.kv = kv
        self.store = store
        # a slot lost to another conversation is exported on this thread while the store finds
        # and joins the prompt's state: both copy tens of MB, and llama.cpp's copy (or numpy's)
        # runs without the GIL, so the export mostly hides behind the join (SmolLM2, 2 cores:
        # a restore 22.7 -> 19.7 ms; nothing gained right after a decode, while llama.cpp's
        # OpenMP worker still spins on the other core)
        self._exporter = ThreadPoolExecutor(1, thread_name_prefix="kv-export") if store is not None else None
        self.num_ctx = kv_size // num_slots
        self.multi_user = multi_user
        self.slots = [Slot(i) for i in range(num_slots)]

    # -------------------------------------------------------------------------- slot choice
    def find_longest_slot(self, prompt: Sequence[Input]) -> tuple[Slot, int]:
        """The free slot sharing the longest prefix with ``prompt`` (first wins ties)."""
        best, longest = None, -1
        for slot in self.slots:
            if slot.in_use:
                continue
            n = count_common_prefix(slot.inputs, prompt)
            if n > longest:
                best, longest = slot, n
        if best is None:
            raise NoSlotAvailable("no available cache slots")
        return best, longest

    def find_best_slot(self, prompt: Sequence[Input]) -> tuple[Slot, int]:
        """Multi-user policy: reuse a slot that is a full prefix of the prompt; otherwise take
        the least recently used free slot and fork the longest matching prefix into it."""
        longest, longest_slot = -1, None
        oldest_slot, oldest_time = None, float("inf")
        for slot in self.slots:
            n = count_common_prefix(slot.inputs, prompt)
            if n > longest:
                longest, longest_slot = n, slot
            if not slot.in_use and slot.last_used < oldest_time:
                oldest_slot, oldest_time = slot, slot.last_used
        assert longest_slot is not None
        if longest == len(longest_slot.inputs) and not longest_slot.in_use:
            return longest_slot, longest
        if oldest_slot is None:
            raise NoSlotAvailable("no available cache slots")
        if oldest_slot.inputs:
            log.debug("evicting cache slot %d (%d tokens)", oldest_slot.id, len(oldest_slot.inputs))
        if longest > 0 and longest_slot is not oldest_slot:
            self._save(oldest_slot)
            log.debug("forking %d tokens from slot %d into slot %d", longest, longest_slot.id, oldest_slot.id)
            oldest_slot.inputs = list(longest_slot.inputs[:longest])
            self.kv.seq_rm(oldest_slot.id, 0, None)
            self.kv.seq_cp(longest_slot.id, oldest_slot.id, longest)
        return oldest_slot, longest

    def find_scratch_slot(self) -> Slot:
        """For a prompt that reuses nothing (embeddings, ``cache_prompt`` off): the least valuable
        free slot, so no warm conversation is evicted while an empty slot is free. An empty slot
        first, then the least recently used; ties go to the lowest id."""
        free = [slot for slot in self.slots if not slot.in_use]
        if not free:
            raise NoSlotAvailable("no available cache slots")
        slot = min(free, key=lambda s: (len(s.inputs) > 0, s.last_used if s.inputs else 0.0, s.id))
        if slot.inputs:
            log.debug("evicting cache slot %d (%d tokens)", slot.id, len(slot.inputs))
        return slot

    def claim_scratch(self) -> Slot:
        """Claim the least valuable free slot, emptied, for work that keeps nothing in it (an
        embedding job's lanes use its share of the KV memory); give it back with :meth:`release`."""
        slot, _ = self.load_slot([], cache_prompt=False)
        return slot

    def load_slot(self, prompt: list[Input], cache_prompt: bool = True) -> tuple[Slot, list[Input]]:
        """Claim a slot for ``prompt``; return it and the tokens still to evaluate (all of them
        when ``cache_prompt`` is off, and never none)."""
        if not cache_prompt:
            slot, num_past = self.find_scratch_slot(), 0
        elif self.multi_user:
            slot, num_past = self.find_best_slot(prompt)
        else:
            slot, num_past = self.find_longest_slot(prompt)
        slot.in_use = True
        slot.last_used = time.monotonic()
        source = "slot"
        if self.store is not None and cache_prompt:
            num_past, source = self._restore(slot, prompt, num_past)
        elif self.store is not None:
            self._save(slot)  # a scratch job (embeddings) is taking it
        if num_past == len(prompt) and num_past > 0:
            num_past -= 1  # leave one input to evaluate: its logits give the first token
        num_past = image_start(prompt, num_past)  # an image is decoded whole or not at all
        if num_past > 0 and not self.kv.can_resume(slot.id, num_past):
            num_past = 0
        if not self.kv.seq_rm(slot.id, num_past, None):
            self.kv.seq_rm(slot.id, 0, None)  # no partial erasure: start the slot over
            num_past = 0
        slot.inputs = list(prompt[:num_past])
        slot.cached_from = source if num_past > 0 else ""
        return slot, list(prompt[num_past:])

    def save_all(self) -> None:
        """Put what every slot holds in the store (the model is unloading; with a disk tier,
        conversations survive the process). The caller waits for the disk with the store's
        ``flush``."""
        for slot in self.slots:
            self._save(slot)

    # ------------------------------------------------------------------------- prompt store
    def _save(self, slot: Slot, exported: tuple[Future, int] | None = None) -> None:
        """Put what ``slot`` holds in the store before it is lost (unless stored already);
        ``exported``: its export, begun already (:meth:`_export`)."""
        if self.store is None or not self.store.wants(slot.inputs):
            return
        if exported is None:
            start = self.store.new_from(slot.inputs)
            state = self.kv.export_seq(slot.id, start)
        else:
            state, start = exported[0].result(), exported[1]
        if state is not None and self.store.save(slot.inputs, state, start):
            log.debug("prompt cache: saved slot %d (%d inputs from %d, %d bytes)", slot.id, len(slot.inputs), start,
                      len(state))

    def _export(self, slot: Slot) -> tuple[Future, int]:
        """Begin exporting what ``slot`` holds on the export thread, from where the store lacks
        its pages (a conversation that came back from the store: its new pages only)."""
        assert self.store is not None and self._exporter is not None
        start = self.store.new_from(slot.inputs)
        return self._exporter.submit(self.kv.export_seq, slot.id, start), start

    def _restore(self, slot: Slot, prompt: list[Input], num_past: int) -> tuple[int, str]:
        """How much of ``prompt`` ``slot`` holds once the store had its say, and where it came
        from ("slot", or the tier: "ram", "disk"): a stored state that
        serves more than the slot's ``num_past`` inputs replaces the slot's contents (saved first
        when the slot would lose most of them: another conversation takes it, as llama-server
        saves a slot whose prompt keeps less than half of it). A restored whole state leaves the
        store (llama-server's too): the slot holds it, and saves it again when it loses it; pages
        stay (other conversations share them), and that save adds only the slot's new ones."""
        assert self.store is not None and self._exporter is not None
        losing = num_past < len(slot.inputs) / 2  # another conversation takes the slot: save it
        exported = self._export(slot) if losing and self.store.wants(slot.inputs) else None  # beside the lookup
        try:
            found = self.store.lookup(prompt)
        finally:
            if exported is not None:
                wait([exported[0]])  # nothing touches the slot's cells while they are read
        # worth a restore only for a block or more beyond what the slot holds: a prompt sharing a
        # word or two with a stored conversation evaluates them in a blink, and the state stays
        # stored (a restore takes it out of RAM) for the conversation it belongs to
        better = found is not None and image_start(prompt, min(found.n, len(prompt) - 1)) >= num_past + self.store.block
        if losing or better:
            self._save(slot, exported)
        if not better:
            return num_past, "slot"
        assert found is not None
        if not self.kv.import_seq(slot.id, found.state):
            log.warning("prompt cache: slot %d refused a stored state of %d inputs; evaluating the prompt",
                        slot.id, found.state_n)
            self.store.forget(found, refused=True)
            slot.inputs = []
            return 0, ""
        resume = image_start(prompt, min(found.n, len(prompt) - 1))
        if not self.kv.can_resume(slot.id, resume):
            # a sliding window serves only its own end: a prompt sharing less is evaluated, and the
            # state stays in the store for the conversation it belongs to
            log.debug("prompt cache: a stored window of %d inputs cannot resume at %d", found.state_n, resume)
            self.kv.seq_rm(slot.id, 0, None)
            slot.inputs = []
            return 0, ""
        self.store.forget(found)  # it lives in the slot now, saved again (its new pages) when the slot is lost
        log.debug("prompt cache: %d input(s) (%s) into slot %d", found.n, found.source, slot.id)
        slot.inputs = list(prompt[: found.n])  # the import holds state_n positions: cut below
        return found.n, found.source

    def release(self, slot: Slot) -> None:
        slot.in_use = False
        slot.last_used = time.monotonic()

    # ------------------------------------------------------------------------- context shift
    def shift_discard(self, input_len: int, num_keep: int) -> int:
        return shift_discard(self.num_ctx, input_len, num_keep)

    def shift_slot(self, slot: Slot, num_keep: int) -> int:
        """Make room in a full slot by dropping tokens after ``num_keep``; returns how many.

        Raises ReprocessInputs (slot emptied) when the KV memory cannot shift in place.
        """
        if num_keep >= self.num_ctx:
            raise ValueError(f"unable to shift context: num_keep {num_keep} >= num_ctx {self.num_ctx}")
        input_len = len(slot.inputs)
        discard = self.shift_discard(input_len, num_keep)
        if discard <= 0:
            return 0
        num_keep = image_start(slot.inputs, num_keep)  # images are kept or dropped whole
        discard = image_end(slot.inputs, num_keep + discard) - num_keep
        log.debug("context shift: slot %d, keep %d, discard %d of %d", slot.id, num_keep, discard, input_len)
        if self.kv.shift(slot.id, num_keep, discard, input_len):
            del slot.inputs[num_keep : num_keep + discard]
            return discard
        kept = slot.inputs[:num_keep] + slot.inputs[num_keep + discard :]
        self.kv.seq_rm(slot.id, 0, None)
        slot.inputs = []
        raise ReprocessInputs(kept)
