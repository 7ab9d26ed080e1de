"""Cell bookkeeping of the causal KV cache (the metadata half of Ollama's ``kvcache/causal.go``).

The cache's storage is ``size`` *cells*, one K/V row each. A cell holds a token position and the
set of sequences that use it (several after :meth:`CellTable.copy_prefix`, which shares cells
instead of copying data); a cell with no sequence is free. :class:`CellTable` decides where each
token of a batch goes, which range of cells a batch attends to and with what mask, and what a
removal shifts. It knows nothing of tensors: ``runner.kvcache.causal`` applies its plans to GGML
storage (``set_rows`` at :attr:`ForwardPlan.locs`, views over ``[start, start+length)``, the mask,
and RoPE re-application for a :class:`ShiftPlan`).

State is kept as NumPy arrays so that the per-token work (``start_forward`` runs for every
decoded token) is a handful of vector operations over the cells, not Python loops:

- ``_pos[i]``: position stored in cell i (stale once the cell is free);
- ``_refs[i]``: how many sequences use cell i (0 = free);
- ``_member[seq][i]``: whether ``seq`` uses cell i (one boolean row per live sequence).

Rules (reference §2.4):

- *find locations*: any free cells, lowest index first, one per batch token; no contiguous block.
  With ``in_order`` (the GGML backend's; llama.cpp's cache searches from a head that moves on
  past each batch, the same ring), a sliding window with finite memory that one
  sequence holds alone takes the free cells after that sequence's newest cell first, round the
  table (a ring): with ``size >= memory + max_batch`` a position then lands in the same cell
  whether its tokens came one at a time or in batches (the cell's last occupant is out of
  memory by then), so attention, which sums the cells in index order, sums a lone row's window
  and a batch row's in one order. Lowest-free would put position ``memory + 1`` of one-token
  steps in cell 0 (freed) and a batch's in the cells after the window.
- *ranges*: a sequence's range is ``[min, max]`` of the cell indices it uses. A batch attends to
  the union of its sequences' ranges (for a sliding-window cache with finite memory: of the cells
  inside each sequence's window) plus the cells just written, rounded to ``padding``.
- *mask* entry (batch token i, cell j) is -inf when j does not hold token i's sequence, or
  ``pos_j > pos_i`` (causal, unless i is in ``causal_except``), or with chunked attention
  ``pos_j < pos_i - pos_i % chunk_size``, or with a sliding window ``pos_j < pos_i - window``.
- *sliding window cleanup* (finite memory only), before each batch: for each sequence let
  ``lowest`` be its lowest position in the batch (``last stored + 1`` when absent from it); drop
  its cells with ``pos < lowest - memory``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from .cache import KvCacheFull, NotSupported

__all__ = [
    "INT32_MAX",
    "CacheGeometry",
    "CellInfo",
    "CellTable",
    "ForwardPlan",
    "ShiftChunk",
    "ShiftPlan",
    "cache_geometry",
    "round_down",
    "round_up",
]

#: Go's ``math.MaxInt32``: as ``end`` of :meth:`CellTable.remove` it means "to the end".
INT32_MAX = 2**31 - 1

_NEG_INF = np.float32(-np.inf)
_ZERO = np.float32(0.0)
_NO_MASK = np.empty((0, 0), dtype=np.float32)


def round_down(n: int, pad: int) -> int:
    """Largest multiple of ``pad`` that is ``<= n`` (``n >= 0``)."""
    return (n // pad) * pad


def round_up(n: int, pad: int) -> int:
    """Smallest multiple of ``pad`` that is ``>= n`` (``n >= 0``)."""
    return ((n + pad - 1) // pad) * pad


# ------------------------------------------------------------------------------------- sizing
@dataclass(frozen=True)
class CacheGeometry:
    """How big a cache is and what its sliding window keeps.

    ``swa_window``/``swa_memory`` are ``None`` for unlimited (a full-history cache; or a window
    whose memory covers the whole capacity, where only the mask applies the window)."""

    size: int
    swa_window: int | None
    swa_memory: int | None


def cache_geometry(
    max_sequences: int,
    capacity: int,
    max_batch: int,
    *,
    padding: int = 1,
    swa_window: int = 0,
    swa_memory: int = 0,
) -> CacheGeometry:
    """Ollama's sizing rules (``Causal.Init``).

    ``capacity`` is the context of one sequence, ``max_batch`` the largest batch. ``swa_window``
    0 means no sliding window; ``swa_memory`` 0 means "the window". With a window and
    ``max_sequences > 1`` the memory is at least ``window + 1`` (room for the stop token, which is
    not part of the next prompt, so a sequence can step back one token without a cache break);
    memory ``>= capacity`` is unlimited. Size is ``max_sequences * capacity``, or with a limited
    memory ``max_sequences * memory + max_batch``, rounded up to ``padding``.

    Raises ``ValueError`` if the memory is smaller than the window (or set without a window)."""
    if max_sequences < 1 or capacity < 1 or max_batch < 1 or padding < 1:
        raise ValueError(
            f"invalid cache geometry: max_sequences={max_sequences} capacity={capacity} "
            f"max_batch={max_batch} padding={padding}"
        )
    window = swa_window if swa_window > 0 else None
    memory = swa_memory if swa_memory > 0 else window
    if memory is not None and window is not None and max_sequences > 1:
        memory = max(memory, window + 1)
    if memory is not None and memory >= capacity:
        memory = None
    if memory is not None and (window is None or memory < window):
        raise ValueError(
            f"sliding window memory ({memory}) must be at least as large as the window "
            f"({window if window is not None else 'unlimited'})"
        )
    size = max_sequences * capacity if memory is None else max_sequences * memory + max_batch
    return CacheGeometry(size=round_up(size, padding), swa_window=window, swa_memory=memory)


# ---------------------------------------------------------------------------------- plan types
@dataclass
class ForwardPlan:
    """What one forward pass does with the cache (result of :meth:`CellTable.start_forward`).

    - ``locs[i]``: the cell that batch token i is stored in (the rows for ``set_rows``);
    - ``[start, start + length)``: the cells the batch attends to (K/V views), a multiple of the
      padding on both ends;
    - ``mask``: float32 ``(n_batch, length)``, 0 where token i may attend to cell ``start + j``,
      -inf elsewhere (GGML's ``[length, n_batch]``).
    """

    positions: list[int]
    sequences: list[int]
    locs: list[int]
    start: int
    length: int
    mask: np.ndarray
    reserve: bool = False
    causal_except: tuple[int, ...] = ()
    _locs_array: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def n_batch(self) -> int:
        return len(self.positions)

    @property
    def stop(self) -> int:
        """One past the last cell of the attended range."""
        return self.start + self.length

    @property
    def locs_array(self) -> np.ndarray:
        """``locs`` as int32, ready for a GGML I32 tensor."""
        if self._locs_array is None:
            self._locs_array = np.array(self.locs, dtype=np.int32)
        return self._locs_array


@dataclass(frozen=True)
class ShiftChunk:
    """One RoPE re-application: cells ``[start, start + len(offsets))`` move by ``offsets``
    (int32; 0 for cells in the run that do not move, so rotating them is a no-op)."""

    start: int
    offsets: np.ndarray


@dataclass(frozen=True)
class ShiftPlan:
    """The keys to re-RoPE after :meth:`CellTable.remove`: every cell in ``cells`` (ascending)
    had its position changed by ``offset`` (negative: ``begin - end``). Empty when nothing moved
    (removing to the end, or nothing after ``end``)."""

    seq: int
    cells: list[int] = field(default_factory=list)
    offset: int = 0

    def __bool__(self) -> bool:
        return bool(self.cells)

    @property
    def deltas(self) -> list[int]:
        """Per-cell position delta, aligned with ``cells``."""
        return [self.offset] * len(self.cells)

    def chunks(self, max_cells: int) -> list[ShiftChunk]:
        """Group the shift into contiguous runs of at most ``max_cells`` cells (Ollama shifts in
        chunks of ``max_batch`` cells, one compute graph each). Each run starts and ends at a
        shifted cell; cells in between that do not move get offset 0."""
        if max_cells < 1:
            raise ValueError(f"max_cells must be >= 1, got {max_cells}")
        out: list[ShiftChunk] = []
        cells = self.cells
        i = 0
        while i < len(cells):
            first = cells[i]
            j = i
            while j + 1 < len(cells) and cells[j + 1] < first + max_cells:
                j += 1
            offsets = np.zeros(cells[j] - first + 1, dtype=np.int32)
            offsets[np.asarray(cells[i : j + 1]) - first] = self.offset
            out.append(ShiftChunk(start=first, offsets=offsets))
            i = j + 1
        return out


@dataclass(frozen=True)
class CellInfo:
    """One cell, for inspection: its position and the sequences using it (empty = free)."""

    pos: int
    sequences: tuple[int, ...]


# ------------------------------------------------------------------------------------ the table
class CellTable:
    """Positions and sequence sets of the cache's cells, and the plans derived from them."""

    def __init__(
        self,
        size: int,
        *,
        padding: int = 1,
        swa_window: int = 0,
        swa_memory: int = 0,
        chunk_size: int = 0,
        in_order: bool = False,
    ) -> None:
        """A table of ``size`` cells (rounded up to ``padding``).

        ``swa_window`` > 0 masks out cells more than ``window`` positions behind a token;
        ``swa_memory`` > 0 (default: the window) also frees them once they are more than
        ``memory`` positions behind a sequence's oldest batch token. The values are used as
        given: apply :func:`cache_geometry` first (or use :meth:`for_cache`) for Ollama's rules.
        ``chunk_size`` > 0 is chunked attention (a token sees only its own chunk). ``in_order``:
        a sliding window's only sequence takes cells round the table (module doc)."""
        if size < 1 or padding < 1 or swa_window < 0 or swa_memory < 0 or chunk_size < 0:
            raise ValueError(
                f"invalid cell table: size={size} padding={padding} swa_window={swa_window} "
                f"swa_memory={swa_memory} chunk_size={chunk_size}"
            )
        self.padding = padding
        self.size = round_up(size, padding)
        self.swa_window: int | None = swa_window or None
        self.swa_memory: int | None = swa_memory or self.swa_window
        if self.swa_memory is not None and (
            self.swa_window is None or self.swa_memory < self.swa_window
        ):
            raise ValueError(
                f"sliding window memory ({self.swa_memory}) must be at least as large as the "
                f"window ({self.swa_window or 'unlimited'})"
            )
        self.chunk_size: int | None = chunk_size or None
        self.in_order = in_order and self.swa_memory is not None
        self._pos = np.zeros(self.size, dtype=np.int64)
        self._refs = np.zeros(self.size, dtype=np.int32)
        self._member: dict[int, np.ndarray] = {}
        self._plan: ForwardPlan | None = None
        # whether the current plan's mask is still what it says about the cells: only the
        # one-token step (:meth:`_step`) keeps it so; every other change to the cells clears it
        self._mask_current = False
        # the last one-token step (its plan, cell, and the sequence's cell bounds after it)
        self._last_step: tuple[ForwardPlan, int, tuple[int, int]] | None = None

    @classmethod
    def for_cache(
        cls,
        max_sequences: int,
        capacity: int,
        max_batch: int,
        *,
        padding: int = 1,
        swa_window: int = 0,
        swa_memory: int = 0,
        chunk_size: int = 0,
    ) -> CellTable:
        """A table sized by Ollama's rules (:func:`cache_geometry`), as ``Causal.Init`` does."""
        geo = cache_geometry(
            max_sequences,
            capacity,
            max_batch,
            padding=padding,
            swa_window=swa_window,
            swa_memory=swa_memory,
        )
        return cls(
            geo.size,
            padding=padding,
            swa_window=geo.swa_window or 0,
            swa_memory=geo.swa_memory or 0,
            chunk_size=chunk_size,
        )

    # ------------------------------------------------------------------------------ inspection
    @property
    def plan(self) -> ForwardPlan | None:
        """The plan of the current forward pass (``None`` before the first one)."""
        return self._plan

    @property
    def sequences(self) -> list[int]:
        """Sequences that hold at least one cell, ascending."""
        return sorted(self._member)

    @property
    def free_cells(self) -> int:
        """Number of cells that no sequence uses."""
        return int(np.count_nonzero(self._refs == 0))

    def cell(self, index: int) -> CellInfo:
        """Position and sequences of cell ``index`` (``sequences`` empty when free)."""
        seqs = tuple(s for s in sorted(self._member) if self._member[s][index])
        return CellInfo(pos=int(self._pos[index]), sequences=seqs)

    def seq_cells(self, seq: int) -> list[int]:
        """Indices of the cells ``seq`` uses, ascending (empty if none)."""
        m = self._member.get(seq)
        return [] if m is None else np.flatnonzero(m).tolist()

    def seq_positions(self, seq: int) -> list[int]:
        """Positions ``seq`` holds, in cell order (aligned with :meth:`seq_cells`)."""
        m = self._member.get(seq)
        return [] if m is None else self._pos[m].tolist()

    def seq_range(self, seq: int) -> tuple[int, int] | None:
        """``(min, max)`` cell index (inclusive) that ``seq`` uses, or ``None`` if it has none."""
        m = self._member.get(seq)
        return None if m is None else _bounds(m)

    # --------------------------------------------------------------------------- forward pass
    def start_forward(
        self,
        positions: Sequence[int],
        seqs: Sequence[int],
        reserve: bool = False,
        causal_except: Iterable[int] = (),
    ) -> ForwardPlan:
        """Place a batch (token i at ``positions[i]`` of sequence ``seqs[i]``) and build its plan.

        Slides the sliding windows, takes the lowest free cells (one per token), records the
        tokens there, and returns the :class:`ForwardPlan`. ``causal_except`` lists batch indices
        exempt from the causal rule (they see later positions of their sequence in the range).

        Raises :class:`KvCacheFull` when fewer cells are free than there are tokens; then no
        token was recorded (a sliding-window cleanup may have happened, which is harmless).
        ``ValueError`` for an empty batch, mismatched lengths, or a ``causal_except`` index
        outside the batch.

        ``reserve``: worst-case shaping only, nothing is recorded: ``locs = 0..n-1`` and the
        range is the whole cache."""
        n = len(positions)
        if n == 1 and len(seqs) == 1 and not reserve and not causal_except:
            plan = self._step(int(positions[0]), int(seqs[0]))
            if plan is not None:
                return plan
        if n == 0 or n != len(seqs):
            raise ValueError(f"bad batch: {n} positions, {len(seqs)} sequences")
        self._mask_current = False
        pos_list = [int(p) for p in positions]
        seq_list = [int(s) for s in seqs]
        exc = _check_except(causal_except, n)

        if reserve:
            if n > self.size:
                raise KvCacheFull(f"cache: {self.size} batch: {n}")
            locs = list(range(n))
            lo, hi = 0, self.size - 1
        else:
            window_range = self._update_sliding_window(pos_list, seq_list)
            free = (self._refs == 0).nonzero()[0]
            if len(free) < n:
                raise KvCacheFull(f"cache: {self.size} batch: {n}")
            after = self._ring_start(seq_list)
            if after is not None:
                free = np.concatenate((free[free >= after], free[free < after]))
            loc_arr = free[:n]
            self._write(loc_arr, pos_list, seq_list)
            locs = loc_arr.tolist()
            lo, hi = int(loc_arr.min()), int(loc_arr.max())
            if window_range is not None:  # sliding window with finite memory
                if window_range[0] <= window_range[1]:
                    lo, hi = min(lo, window_range[0]), max(hi, window_range[1])
            else:
                for seq in set(seq_list):
                    b = _bounds(self._member[seq])
                    if b is not None:
                        lo, hi = min(lo, b[0]), max(hi, b[1])

        start = round_down(lo, self.padding)
        stop = round_up(hi + 1, self.padding)
        plan = ForwardPlan(
            positions=pos_list,
            sequences=seq_list,
            locs=locs,
            start=start,
            length=stop - start,
            mask=np.empty((0, 0), dtype=np.float32),
            reserve=reserve,
            causal_except=exc,
        )
        plan.mask = self._build_mask(plan)
        self._plan = plan
        return plan

    def _step(self, pos: int, seq: int) -> ForwardPlan | None:
        """:meth:`start_forward` of one token of a sequence that already holds cells (every
        decode step of one conversation) in a few scalar operations: when the last plan was the
        step before this one (same sequence, position one less, same cell range, nothing else
        changed since), its mask gains the new cell instead of being built again. None when the
        general path must place it: the sequence holds no cells yet, or a sliding window with
        finite memory is shared by several sequences (each one's cleanup is the general rule's).
        """
        m = self._member.get(seq)
        if m is None:
            return None
        memory, window = self.swa_memory, self.swa_window
        # Up to position ``window`` a sliding window hides no cell and frees none (positions are
        # >= 0): the step is then a full-history cache's (the first ``window`` tokens of a chat)
        seen = window is None or pos <= window  # the window hides nothing
        plain = memory is None or seen  # every cell of the sequence is kept and in range
        if memory is not None:  # the sliding-window cleanup of the only sequence
            if len(self._member) != 1:
                return None
            drop = None if seen else m & (self._pos < pos - memory)
            if drop is not None and drop.any():
                self._mask_current = False
                m &= ~drop
                self._refs -= drop
                if not m.any():
                    del self._member[seq]
                    return None
        refs = self._refs
        prev = self._plan
        # In a streak of this sequence's steps (nothing else changed since the last one), the
        # lowest free cell is above the last step's (every cell below that one was taken), and
        # the sequence's cells span the last step's bounds plus the new cell.
        streak = (self._mask_current and self._last_step is not None and self._last_step[0] is prev
                  and plain and prev.sequences[0] == seq)
        cell = -1
        if streak:
            assert self._last_step is not None
            _, last_cell, (first, last) = self._last_step
            if last_cell + 1 < self.size and not refs.item(last_cell + 1):
                cell = last_cell + 1
        if cell < 0:
            after = self._ring_start([seq])
            if after is None:
                cell = int(refs.argmin())
            else:
                free = np.flatnonzero(refs == 0)
                later = free[free >= after]
                cell = int(later[0] if len(later) else free[0] if len(free) else 0)
            if refs[cell]:
                raise KvCacheFull(f"cache: {self.size} batch: 1")
        self._pos[cell] = pos
        refs[cell] = 1
        m[cell] = True
        if streak:
            bounds = (min(first, cell), max(last, cell))
        else:
            bounds = _bounds(m if plain else m & (self._pos >= pos - (window or memory)))
            assert bounds is not None  # m holds cell
        start = round_down(bounds[0], self.padding)
        length = round_up(bounds[1] + 1, self.padding) - start
        plan = ForwardPlan(positions=[pos], sequences=[seq], locs=[cell], start=start, length=length,
                           mask=_NO_MASK)
        if (self._mask_current and prev is not None and prev.sequences == plan.sequences
                and prev.positions[0] == pos - 1 and prev.start == start and prev.length == length
                and seen and self.chunk_size is None):
            plan.mask = prev.mask.copy()
            plan.mask[0, cell - start] = _ZERO
        else:
            plan.mask = self._build_mask(plan)
        self._plan = plan
        self._mask_current = True
        self._last_step = (plan, cell, bounds) if plain else None
        return plan

    def set_causal(self, causal_except: Iterable[int]) -> np.ndarray:
        """Rebuild the current plan's mask with other batch indices exempt from the causal rule
        (Ollama's ``SetCausal``; the exemption lasts until the next :meth:`start_forward`).

        Returns the new mask (also stored in :attr:`plan`). ``RuntimeError`` before any forward."""
        if self._plan is None:
            raise RuntimeError("set_causal called before start_forward")
        exc = _check_except(causal_except, self._plan.n_batch)
        if exc != self._plan.causal_except:
            self._mask_current = False
            self._plan.causal_except = exc
            self._plan.mask = self._build_mask(self._plan)
        return self._plan.mask

    # --------------------------------------------------------------------------- sequences
    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        """Make ``dst`` use exactly the cells of ``src`` with positions ``< length`` (shared, no
        copy); whatever ``dst`` used before is released. ``src == dst`` truncates to ``length``."""
        self._mask_current = False
        m = self._member.get(src)
        new = None if m is None else m & (self._pos < length)
        old = self._member.pop(dst, None)
        if old is not None:
            self._refs -= old
        if new is not None and new.any():
            self._member[dst] = new
            self._refs += new

    def can_resume(self, seq: int, pos: int) -> bool:
        """Whether ``seq`` can continue at position ``pos`` with what is stored.

        Always true without a limited sliding-window memory. Otherwise the window of ``pos``,
        ``[max(0, pos - window), pos)``, must start at or after the oldest stored position and
        ``pos`` must be at most one past the newest."""
        if self.swa_memory is None:
            return True
        m = self._member.get(seq)
        if m is None:
            return False
        held = self._pos[m]
        first, last = int(held.min()), int(held.max())
        window = self.swa_window if self.swa_window is not None else 0
        return max(0, pos - window) >= first and pos <= last + 1

    def remove(self, seq: int, begin: int, end: int | None) -> ShiftPlan:
        """Drop ``seq`` from its cells with ``begin <= pos < end`` (``end=None`` or
        ``>= INT32_MAX``: to the end) and renumber its later cells ``pos += begin - end``.

        Returns the :class:`ShiftPlan` of the renumbered cells, whose keys must be re-RoPEd (if
        the model cannot, the caller raises :class:`NotSupported` and removes the whole sequence).
        Raises :class:`NotSupported` ("shifting cells shared by multiple sequences not supported")
        when a cell to renumber is shared with another sequence; then nothing changed."""
        if end is not None and end >= INT32_MAX:
            end = None
        self._mask_current = False
        m = self._member.get(seq)
        if m is None or (end is not None and end <= begin):
            return ShiftPlan(seq=seq)
        gone = m & (self._pos >= begin)
        if end is None:
            later = None
        else:
            later = m & (self._pos >= end)
            gone &= ~later
            if np.any(later & (self._refs > 1)):
                raise NotSupported("shifting cells shared by multiple sequences not supported")
        m &= ~gone
        self._refs -= gone
        if not m.any():
            del self._member[seq]
        if later is None or end is None:
            return ShiftPlan(seq=seq)  # removing to the end never shifts
        offset = begin - end
        self._pos[later] += offset
        return ShiftPlan(seq=seq, cells=np.flatnonzero(later).tolist(), offset=offset)

    def restore(self, seq: int, positions: Sequence[int], cells: Sequence[int] = ()) -> list[int]:
        """Make ``seq`` hold exactly ``positions`` (ascending, distinct), one fresh cell each,
        for a sequence state brought back from outside the cache (:meth:`Cache.import_seq`).

        Whatever ``seq`` held is dropped first. The cells are ``cells`` (aligned with
        ``positions``) when every one of them is inside the table and free: the layout the state
        was exported from, so the sequence attends over the same cells in the same order as
        before. Otherwise they are the lowest free cells, taken in position order: where a
        recompute from an empty sequence puts its tokens (:meth:`start_forward`). Returns the
        chosen cells, aligned with ``positions``. Raises :class:`KvCacheFull` (``seq`` then holds
        nothing, the rest is unchanged) when fewer cells are free than ``positions``; ``ValueError``
        for positions that are not ascending and distinct, or a ``cells`` of another length."""
        pos = np.asarray(positions, dtype=np.int64)
        if len(pos) > 1 and not bool(np.all(pos[1:] > pos[:-1])):
            raise ValueError("restored positions must be ascending and distinct")
        if len(cells) and len(cells) != len(pos):
            raise ValueError(f"{len(cells)} cells for {len(pos)} positions")
        self._mask_current = False
        self._last_step = None
        old = self._member.pop(seq, None)
        if old is not None:
            self._refs -= old
        if len(pos) == 0:
            return []
        want = np.asarray(cells, dtype=np.int64)
        if (len(want) and int(want.min()) >= 0 and int(want.max()) < self.size
                and len(np.unique(want)) == len(want) and not self._refs[want].any()):
            locs = want
        else:
            free = (self._refs == 0).nonzero()[0]
            if len(free) < len(pos):
                raise KvCacheFull(f"cache: {self.size} free: {len(free)} restoring: {len(pos)}")
            locs = free[: len(pos)]
        self._pos[locs] = pos
        self._refs[locs] = 1
        m = self._member[seq] = np.zeros(self.size, dtype=bool)
        m[locs] = True
        return locs.tolist()

    def clear(self) -> None:
        """Free every cell (all sequences dropped)."""
        self._refs[:] = 0
        self._member.clear()
        self._plan = None
        self._mask_current = False

    # ------------------------------------------------------------------------------ internals
    def _ring_start(self, seqs: Sequence[int]) -> int | None:
        """With :attr:`in_order`, the cell from which the batch of ``seqs`` takes free cells: the
        one after its sequence's newest cell, when it is one sequence that holds cells and the
        only one in the table; else None (the lowest free cells)."""
        if not self.in_order or len(self._member) != 1:
            return None
        seq = seqs[0]
        m = self._member.get(seq)
        if m is None or any(s != seq for s in seqs):
            return None
        cells = np.flatnonzero(m)
        return int(cells[np.argmax(self._pos[cells])]) + 1

    def _write(self, locs: np.ndarray, positions: list[int], seqs: list[int]) -> None:
        """Record token i at cell ``locs[i]`` (a free cell) for sequence ``seqs[i]``."""
        self._pos[locs] = positions
        self._refs[locs] = 1
        seq_arr = np.asarray(seqs)
        for seq in set(seqs):
            m = self._member.get(seq)
            if m is None:
                m = self._member[seq] = np.zeros(self.size, dtype=bool)
            m[locs[seq_arr == seq] if len(seqs) > 1 else locs] = True

    def _update_sliding_window(
        self, positions: list[int], seqs: list[int]
    ) -> tuple[int, int] | None:
        """Free cells that fell out of each sequence's memory; return the ``(lo, hi)`` cell range
        (lo > hi when empty) inside the windows of the batch's sequences, or ``None`` when the
        memory is unlimited (then the batch attends to its sequences' whole ranges)."""
        memory = self.swa_memory
        if memory is None:
            return None
        window = self.swa_window if self.swa_window is not None else memory
        lowest: dict[int, int] = {}
        for p, s in zip(positions, seqs):
            if s not in lowest or p < lowest[s]:
                lowest[s] = p
        lo, hi = self.size, -1
        for seq in list(self._member):
            m = self._member[seq]
            in_batch = seq in lowest
            low = lowest[seq] if in_batch else max(0, int(self._pos[m].max())) + 1
            drop = m & (self._pos < low - memory)
            if drop.any():
                m &= ~drop
                self._refs -= drop
                if not m.any():
                    del self._member[seq]
                    continue
            if in_batch:
                b = _bounds(m & (self._pos >= low - window))
                if b is not None:
                    lo, hi = min(lo, b[0]), max(hi, b[1])
        return lo, hi

    def _build_mask(self, plan: ForwardPlan) -> np.ndarray:
        """The (n_batch, length) float32 mask of ``plan`` over the current cells."""
        sl = slice(plan.start, plan.stop)
        cell_pos = self._pos[sl]
        tok_pos = np.asarray(plan.positions, dtype=np.int64)[:, None]
        uniq = sorted(set(plan.sequences))
        empty = np.zeros(plan.length, dtype=bool)
        rows = [self._member[s][sl] if s in self._member else empty for s in uniq]
        if len(uniq) == 1:
            ok = rows[0][None, :]  # broadcast over the batch by the & below
        else:
            index = {s: k for k, s in enumerate(uniq)}
            ok = np.stack(rows)[[index[s] for s in plan.sequences]]
        causal = cell_pos <= tok_pos
        if plan.causal_except:
            causal[list(plan.causal_except), :] = True
        ok = ok & causal
        if self.chunk_size is not None:
            ok &= cell_pos >= tok_pos - tok_pos % self.chunk_size
        if self.swa_window is not None:
            ok &= cell_pos >= tok_pos - self.swa_window
        return np.where(ok, _ZERO, _NEG_INF)


def _check_except(causal_except: Iterable[int], n: int) -> tuple[int, ...]:
    """``causal_except`` as a sorted tuple of batch indices; ``ValueError`` if one is not in
    ``[0, n)``."""
    exc = tuple(sorted({int(i) for i in causal_except}))
    if exc and (exc[0] < 0 or exc[-1] >= n):
        raise ValueError(f"causal_except indices {exc} outside the batch of {n}")
    return exc


def _bounds(m: np.ndarray) -> tuple[int, int] | None:
    """``(first, last)`` index of the True entries of ``m``, or ``None`` if there are none."""
    first = int(m.argmax())
    if not m[first]:
        return None
    return first, len(m) - 1 - int(m[::-1].argmax())
