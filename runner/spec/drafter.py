"""What speculative decoding needs from a source of guesses: one :class:`Drafter` per sequence.

Prompt lookup (:class:`runner.spec.ngram.PromptLookup`) and a draft model
(:class:`runner.spec.draftmodel.ModelDrafter`) are two; a shared n-gram pool would be another. Whatever the source, a guess is only a guess: the target
model verifies every drafted token (:mod:`runner.spec.verify`), so a wrong draft costs time,
never output.
"""

from __future__ import annotations

from typing import Protocol, Sequence


class Drafter(Protocol):
    def propose(self, generated: Sequence[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens guessed to come next, after the sequence's prompt (given when
        the drafter was made) and ``generated``, its output so far, whose last token is the one
        just sampled and not decoded yet (the drafted tokens follow it). ``generated`` only
        grows between calls, by the tokens the model emitted. Deterministic: the same history
        gives the same guess. ``[]``: no guess."""


class NoDrafter:
    """A :class:`Drafter` that never guesses (speculation off for the sequence)."""

    def propose(self, generated: Sequence[int], limit: int) -> list[int]:
        return []
