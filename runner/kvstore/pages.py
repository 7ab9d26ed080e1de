"""How the store cuts an engine's state into pages and puts pages back together.

A state of ``n`` inputs is kept as the states of its pages (:meth:`runner.kvstore.key.Chain.pages`:
one per block of inputs, then the partial block at its end), so conversations that share a prefix
share its pages (:mod:`.ram`). Only the engine knows its bytes: it cuts and joins them
(:class:`runner.loop.slots.KvOps` has both methods; the store is given the engine's KV operations
as its :class:`Pager`, and never calls anything else of them). A page's state is a state of the
engine's own format holding only that page's positions.

A state is cut only when it holds exactly positions ``0..n-1``, as a slot filled in order does. A
sliding-window model's state does not: its window layers keep only the last cells, so the state
is not a concatenation of per-block pages; the engine says None and the store keeps it whole.

Pages joined from two conversations (a system prompt kept from A, the rest from B) are exact up to
the engine's own batch rounding: the shared positions' rows are A's, computed in A's batches, which
B computed in its own (where a batch ends moves the last bits). Joining one state's own pages gives
its bytes back exactly.
"""

from __future__ import annotations

from typing import Collection, Protocol, Sequence


class Pager(Protocol):
    def split_state(self, state: bytes | bytearray, bounds: list[int],
                    held: Collection[int] = ()) -> Sequence[bytes | bytearray | None] | None:
        """The states of positions ``[bounds[i], bounds[i + 1])`` of ``state``, which holds
        positions ``0..bounds[-1]-1`` (``bounds`` ascending from 0), None in place of each page
        whose index is in ``held`` (the store has it: only new pages are cut); None when it
        does not cut so (then it is kept whole)."""

    def join_states(self, parts: list[bytes | bytearray]) -> bytes | bytearray | memoryview:
        """One state of the positions ``parts`` hold, in order, valid until the next join (the
        engine may reuse its buffer); ValueError when they do not fit together (damage: the
        store drops them)."""
