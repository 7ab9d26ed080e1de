"""Verifying a draft: the target model's own choice at each drafted position decides.

A decode of the sampled token ``t`` and the drafted ``d1..dK`` gives K + 1 rows of logits: row
``i`` is what follows ``t, d1..di``. Row 0 is sampled with the sequence's own sampler, as without
speculation; if the token equals ``d1``, ``d1`` is right and row 1 is what the model computes next
anyway, so it is sampled in turn, and so on, up to the first row whose token differs from the
draft (that token is the target's own, the next pending one) or the last row (a bonus token).

Only rows whose token is emitted are sampled, in order, each exactly once: the sampler sees the
same calls as without speculation, so penalties, a grammar's state and a seeded random stream
advance the same way, and at temperature > 0 a draft is accepted with the target's probability of
drafting it and a rejection draws from the rest: speculative sampling, for a deterministic draft
(issue 26 notes §B). Each token goes to the output before the next row is sampled, and the
verification stops where the output ends the sequence (a stop, ``num_predict``, end of
generation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence


@dataclass(frozen=True)
class Verified:
    tokens: list[int]  # the tokens emitted, in order: the accepted drafted ones, then the target's
    accepted: int  # drafted tokens confirmed: their positions stay in the KV cache
    ended: bool  # the output ended the sequence at the last of ``tokens``


def verify(draft: Sequence[int], sample: Callable[[int], int], emit: Callable[[int, int], bool]) -> Verified:
    """Verify ``draft`` against rows ``0..len(draft)`` of a decode.

    ``sample(i)``: the sequence's sampler's token for row ``i`` (called only for rows reached,
    in order). ``emit(i, token)``: hand the token of row ``i`` to the output; False when that
    ended the sequence. ``emit(i, ...)`` is called only once ``draft[i - 1]`` is known right, so
    the caller may count ``draft[:i]`` into the sequence's history before handling it."""
    tokens: list[int] = []
    for i in range(len(draft) + 1):
        token = sample(i)
        tokens.append(token)
        if not emit(i, token):
            return Verified(tokens, i, True)
        if i == len(draft) or token != draft[i]:
            return Verified(tokens, i, False)
    raise AssertionError("unreachable")
