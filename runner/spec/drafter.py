"""What speculative decoding needs from a source of guesses: one :class:`Drafter` per sequence.

Prompt lookup (:class:`runner.spec.ngram.PromptLookup`, with the model's shared n-gram pool,
:class:`runner.spec.pool.NgramPool`) and a draft model (:class:`runner.loop.draftmodel.ModelDrafter`)
are two. Whatever the source, a guess is only a guess: the target
model verifies every drafted token (:mod:`runner.spec.verify`), so a wrong draft costs time,
never output.
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence


class Drafter(Protocol):
    #: the kinds of guess this drafter makes, the sequence's acceptance is learnt per kind (prompt
    #: lookup: its key lengths and the shared pool, whose long keys guess far better than short
    #: ones; a draft model: one kind), so confident guesses are not held back by hopeful ones
    kinds: tuple[str, ...]
    #: the kind of the last guess :meth:`propose` returned (one of :attr:`kinds`)
    kind: str
    #: each kind's acceptance before its first draft (where the controller's estimate of it starts
    #: and drifts back to): what such guesses were measured to score
    priors: Mapping[str, float]

    def propose(self, generated: Sequence[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens guessed to come next, after the sequence's prompt (given when
        the drafter was made) and ``generated``, its output so far, whose last token is the one
        just sampled and not decoded yet (the drafted tokens follow it). ``generated`` only
        grows between calls, by the tokens the model emitted. Deterministic: the same history
        (and, for prompt lookup, the same shared n-gram pool) gives the same guess. ``[]``: no
        guess. ``limit`` 0 asks for none, and shows the drafter the history (while the sequence
        does not draft, prompt lookup's pool still learns what it emits)."""


class NoDrafter:
    """A :class:`Drafter` that never guesses (speculation off for the sequence)."""

    kinds: tuple[str, ...] = ()
    kind = ""
    priors: Mapping[str, float] = {}

    def propose(self, generated: Sequence[int], limit: int) -> list[int]:
        return []


class DraftSource(Protocol):
    """A source of drafters shared by a runner's sequences: a draft model
    (:class:`runner.loop.draftmodel.DraftModel`, a second engine the loop drives)."""

    token_cost: float  # the time one guessed token takes, relative to the target's one-row decode

    def drafter(self, seq_id: int, prompt: Sequence[Any]) -> Drafter | None:
        """The drafter of the sequence in slot ``seq_id`` whose inputs are ``prompt``; None when
        this source cannot draft for it (an image in the prompt)."""

    def close(self) -> None:
        """Free what the source holds (the runner unloads)."""
