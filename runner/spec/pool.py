"""An n-gram pool shared by a model's sequences (llama.cpp's ngram-mod): the token that
followed each run of :data:`KEY` tokens in any prompt or answer the model has drafted for since it
loaded, so a request that repeats an earlier answer (asked again, retried, a second agent asking
what the first asked) is drafted from that answer, which its own prompt does not hold.

From llama.cpp (``common/ngram-mod.cpp``, ``common/speculative.cpp``): keys of 24 tokens (shorter
ones match by accident), drafts chained key by key, a bounded table forgotten whole when it
fills. Here the table is a dict from a key's hash to the token after it, bounded by
:data:`MAX_KEYS` (two keys of one hash count as one, as in llama.cpp's table, where keys share
slots).

Unlike llama.cpp's, where the latest occurrence wins, a key seen with two different tokens after
it guesses nothing (:data:`AMBIGUOUS`): the sequence's own prompt lookup guesses there instead.
Such keys are where a draft chained from the pool goes wrong: a rewrite's answer, whose renamed
words follow keys its prompt continued with the old name (the prompt is learnt again when the
request is repeated, after the first answer), and a story that comes back to a sentence and goes
on otherwise. SmolLM2's repeated rewrite, quote and story (bench_spec.py, two repeats each):
560/674, 558/656 and 568/624 drafted tokens accepted with the latest winning, 562/586, 562/568
and 572/572 so.

A guess is only a guess: what the pool proposes is verified like any draft, so another
sequence's text can cost a wasted row, never a wrong token.
"""

from __future__ import annotations

from typing import Sequence

#: tokens in a key (llama.cpp's ``n_match``, 24)
KEY = 24
#: keys kept before the pool is forgotten whole (~30 MB; llama.cpp resets its table past a quarter
#: of its 4M entries)
MAX_KEYS = 1 << 18
#: what the table holds for a key seen with two different tokens after it (a token id is >= 0)
AMBIGUOUS = -1


class NgramPool:
    """What followed each :data:`KEY`-token run seen so far, for every sequence of one model."""

    def __init__(self, key: int = KEY, max_keys: int = MAX_KEYS) -> None:
        if key < 1 or max_keys < 1:
            raise ValueError("an n-gram pool needs keys of at least one token and room for one")
        self.key = key
        self.max_keys = max_keys
        self._next: dict[int, int] = {}  # hash of a key: the token after it

    def __len__(self) -> int:
        return len(self._next)

    def learn(self, tokens: Sequence[int], start: int = 0, floor: int = 0, stop: int | None = None) -> None:
        """Learn what follows each key within ``tokens[floor:stop]`` (text: the caller cuts at
        images) whose following token is at ``start`` or after (an earlier call learnt the
        rest); a key learnt before with another token after it becomes :data:`AMBIGUOUS`."""
        n = self.key
        first, stop = max(start, floor + n), len(tokens) if stop is None else stop
        if first >= stop:
            return
        if len(self._next) + stop - first > self.max_keys:
            self._next.clear()  # full: start over, as llama.cpp resets its table
            first = max(first, stop - self.max_keys)  # a text longer than the pool: its end
        table = self._next
        for end in range(first, stop):
            key, token = hash(tuple(tokens[end - n : end])), int(tokens[end])
            if table.setdefault(key, token) != token:
                table[key] = AMBIGUOUS

    def chain(self, tail: Sequence[int], limit: int) -> list[int]:
        """Up to ``limit`` tokens to follow ``tail`` (its last :data:`KEY` tokens, the last the
        token just sampled): the pool's token after that key, then after the key that ends with
        it, and so on, up to a key it has not seen or seen :data:`AMBIGUOUS`; ``[]`` when
        ``tail`` is shorter than a key."""
        n = self.key
        if limit <= 0 or len(tail) < n:
            return []
        window = [int(t) for t in tail[-n:]]
        out: list[int] = []
        table = self._next
        while len(out) < limit:
            token = table.get(hash(tuple(window[len(window) - n :])), AMBIGUOUS)
            if token == AMBIGUOUS:
                break
            out.append(token)
            window.append(token)
        return out
