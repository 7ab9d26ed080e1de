"""How the store cuts an engine's state into pages and puts pages back together.

A state of ``n`` inputs is kept as the states of its pages (:meth:`runner.kvstore.key.Chain.pages`:
one per block of inputs, then the partial block at its end), so conversations that share a prefix
share its pages (:mod:`.ram`). Only the engine knows its bytes: it cuts and joins them
(:class:`runner.loop.slots.KvOps` has the methods; the store is given the engine's KV operations
as its :class:`Pager`, and never calls anything else of them).

**Groups.** A save cuts the pages it adds (the ones after those the store holds already) as one
state, a :class:`Group`, and keeps each page as a :class:`Span` of it: the positions it holds
within the group. The engine's state formats lay out each layer's rows, and a transposed V each
element's values, position after position, so a join copies one run per group where separate
pages cost one run per page: a 2,300-token SmolLM2 state is 144 pages, and their V runs of 32
bytes made the join three times slower than the import it feeds. A returning conversation is the
one or two groups its saves cut; one whole group (positions ``0..n-1``: the first save of a
conversation) is imported as it is, without a join. When the store holds every page of a slot's
state up to some page (the conversation came back from it), the slot is exported from there on
only (:meth:`runner.loop.slots.KvOps.export_seq`'s ``start``): that export is the new group. A group stays in memory while any of its
pages is held (:mod:`.ram` counts it whole till then): a system prompt that later conversations
share keeps the save of the first one that cut it, as llama-server's ``--cache-ram`` keeps every
state whole. The disk tier writes a file per page (:meth:`Span.page_state` cuts it on the
writer's thread).

A state is cut only when it holds exactly positions ``0..n-1``, as a slot filled in order does. A
sliding-window model's state does not: its window layers keep only the last cells, so the state
is not a concatenation of per-block pages; the engine says None and the store keeps it whole.

Pages joined from two conversations (a system prompt kept from A, the rest from B) are exact up to
the engine's own batch rounding: the shared positions' rows are A's, computed in A's batches, which
B computed in its own (where a batch ends moves the last bits). Joining one state's own pages gives
its bytes back exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Collection, Protocol, Sequence


class Pager(Protocol):
    def split_state(self, state: bytes | bytearray, bounds: list[int],
                    held: Collection[int] = ()) -> Sequence[bytes | bytearray | None] | None:
        """The states of positions ``[bounds[i], bounds[i + 1])`` of ``state``, which holds
        positions ``0..bounds[-1]-1`` (``bounds`` ascending from 0), None in place of each page
        whose index is in ``held`` (the store has it: only new pages are cut); None when it
        does not cut so (then it is kept whole)."""

    def join_states(self, parts: Sequence[Any]) -> bytes | bytearray | memoryview:
        """One state of the positions ``parts`` hold, in order: states :meth:`split_state` cut,
        or ``(state, lo, hi)``, the positions such a state holds at indices ``[lo, hi)``; valid
        until the next join (the engine may reuse its buffer). ValueError when they do not fit
        together (damage: the store drops them)."""

    def page_state(self, state: bytes | bytearray, lo: int, hi: int) -> bytes | bytearray:
        """The state of the positions ``state`` holds at indices ``[lo, hi)``, on their own, in
        a new buffer. Reads ``state`` only: the disk writer calls it on its own thread."""


@dataclass(eq=False)
class Group:
    """The state of the pages one save cut: ``n`` positions, ``nbytes`` bytes. ``live`` is how
    many of its pages the RAM tier holds (changed under that tier's lock only)."""

    state: Any
    n: int
    nbytes: int
    cut: Callable[[Any, int, int], Any]  # the pager's :meth:`Pager.page_state`
    live: int = 0


@dataclass(frozen=True, eq=False)
class Span:
    """A page kept in its group: the group's positions at indices ``[lo, hi)``."""

    group: Group
    lo: int
    hi: int

    def __len__(self) -> int:
        """Its share of the group's bytes (what a queued disk write of it is counted as)."""
        return self.group.nbytes * (self.hi - self.lo) // max(self.group.n, 1)

    def page_state(self) -> bytes | bytearray:
        """The page's own state, in a new buffer (for a file of its own)."""
        return self.group.cut(self.group.state, self.lo, self.hi)


def cut_group(pager: Pager, state: bytes | bytearray, bounds: list[int], first: int) -> list[Span] | None:
    """Pages ``first..`` of ``state`` (``bounds`` as :meth:`Pager.split_state` takes them) as
    spans of one group, the state of positions ``[bounds[first], bounds[-1])``; None when the
    engine does not cut ``state``."""
    parts = pager.split_state(state, [0, bounds[first], bounds[-1]] if first else [0, bounds[-1]],
                              {0} if first else ())
    if parts is None or parts[-1] is None:
        return None
    return spans_of(pager, parts[-1], bounds, first)


def spans_of(pager: Pager, state: bytes | bytearray, bounds: list[int], first: int) -> list[Span]:
    """Pages ``first..`` as spans of ``state``, the state of positions ``[bounds[first],
    bounds[-1])`` (cut, or exported so: :meth:`runner.loop.slots.KvOps.export_seq` from a start)."""
    start = bounds[first]
    group = Group(state, bounds[-1] - start, len(state), pager.page_state)
    return [Span(group, a - start, b - start) for a, b in zip(bounds[first:], bounds[first + 1 :])]


def join(pager: Pager, parts: Sequence[Any]) -> Any:
    """The state of ``parts`` (page states, :class:`Span` s) in order: each run of spans that
    follow one another in one group is one range for the engine's join (one copy each), and one
    group's whole, from position 0, is that group's state as it is (no join)."""
    runs: list[Any] = []
    for part in parts:
        last = runs[-1] if runs else None
        if isinstance(part, Span) and isinstance(last, Span) and last.group is part.group and last.hi == part.lo:
            runs[-1] = Span(part.group, last.lo, part.hi)
        else:
            runs.append(part)
    if len(runs) == 1 and isinstance(runs[0], Span) and runs[0].lo == 0 and runs[0].hi == runs[0].group.n:
        return runs[0].group.state
    return pager.join_states([(p.group.state, p.lo, p.hi) if isinstance(p, Span) else p for p in runs])
