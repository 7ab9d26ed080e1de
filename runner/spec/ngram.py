"""Prompt lookup: draft what followed the most recent earlier occurrence of the sequence's last
tokens (llama.cpp's ngram-simple, ``common_ngram_simple_draft``).

The key is the last ``n`` tokens of the history with the token just sampled as its last; keys are
tried longest first (:data:`KEY_SIZES`: a long match is a confident guess, a short one a hopeful
one) and the first that occurred before wins. The draft is what followed that occurrence, up to a
limit. llama.cpp scans the history backwards at every step; here an index per key size maps each
n-gram to the start of its latest occurrence, kept up to date as the history grows (only with
tokens the model emitted, so a rejected guess never enters it), so a step costs one dict lookup
per key size, also when nothing matches.

With a :class:`runner.spec.pool.NgramPool` (the model's, shared by its sequences), the sequence's
prompt and output also teach the pool, and the pool's draft comes first: its keys are longer
(24 tokens), and it holds what other requests' answers said, so a request that repeats an earlier
answer is drafted from it.

An image in the prompt is a barrier: no key spans one, and a draft stops before one.
"""

from __future__ import annotations

from typing import Any, Sequence

from .pool import NgramPool

#: key lengths, tried in this order. llama.cpp's ngram-simple uses 12 alone; shorter keys find
#: more (code edits where a line differs in one name) and the controller decides from the
#: sequence's acceptance whether their drafts are worth verifying
KEY_SIZES = (12, 8, 6, 4)
#: keys this long or longer make "long" guesses, shorter ones "short" guesses: the two kinds whose
#: acceptance the controller learns apart. Over 16 greedy answers of SmolLM2 and gemma-3-270m
#: (bench_spec's tasks and 5 more; key by key), a drafted token was right 0.97-0.99 of the time
#: after a 12-token key, and 0.56-0.93 after 4-, 6- and 8-token keys, in no order among those
#: three: one record for them learns from a third as many failed drafts as three records did
LONG_KEY = 12
#: each kind's acceptance before its first draft (:attr:`runner.spec.drafter.Drafter.priors`):
#: long keys' and the pool's guesses are right nearly always (above), short keys' from about
#: half the time to nearly always, so they start lower, as a short answer pays for drafts made
#: before anything is learnt: at 0.85 a first short guess is 3 tokens on our Q4_1 kernels, 5
#: where each row is multiplied alone and 7 on GGML's batched kernels, where 0.9 made them 6, 8
#: and 11. Lower still (0.8), the one-row table drafts none, and short keys never learn there
PRIORS = {"long": 0.9, "short": 0.85, "pool": 0.9}
#: the kind of a guess from the shared pool (its record is the model's: :class:`runner.spec.controller.Speculation`)
POOL = "pool"
#: history tokens kept; past twice this the oldest half is forgotten and the index rebuilt
MAX_HISTORY = 1 << 16
_BARRIER = -1  # an image position in the history


def _repeat(period: list[int], limit: int) -> list[int]:
    """``limit`` tokens of ``period`` over and over: the guess when the key's latest occurrence is
    so recent that what followed it runs into the pending token, i.e. the text repeats with that
    period (what followed it then is what follows now, the draft included: LZ77's overlapping
    copy)."""
    return (period * (limit // len(period) + 1))[:limit]


def _kind(key: int) -> str:
    """The kind of a guess found by a key of ``key`` tokens."""
    return "long" if key >= LONG_KEY else "short"


class PromptLookup:
    """A :class:`runner.spec.drafter.Drafter` over the sequence's own prompt and output."""

    def __init__(self, prompt: Sequence[Any], sizes: Sequence[int] = KEY_SIZES,
                 max_history: int = MAX_HISTORY, pool: NgramPool | None = None) -> None:
        """``prompt``: the sequence's inputs (token ids; anything else, an image position, is a
        barrier); ``sizes``: key lengths (each >= 1); ``pool``: the model's shared pool, which
        learns the prompt and output and drafts first."""
        self.sizes = tuple(sorted({int(n) for n in sizes if n >= 1}, reverse=True))
        self.max_history = max(max_history, 2 * max(self.sizes, default=1))
        self._history: list[int] = [t if isinstance(t, int) else _BARRIER for t in prompt]
        self._taken = 0  # tokens of ``generated`` in the history
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self._indexed = 0  # n-grams ending before this history position are in the index
        self._barrier = -1  # the last barrier position the index has passed
        self._last_barrier = max((i for i, t in enumerate(self._history) if t == _BARRIER), default=-1)
        kinds = [_kind(n) for n in self.sizes] + ([POOL] if pool is not None else [])
        self.kinds = tuple(dict.fromkeys(kinds))
        self.priors = {kind: PRIORS[kind] for kind in self.kinds}
        self.kind = self.kinds[0] if self.kinds else ""  # "long", "short" (the key of the last guess) or "pool"
        self.pool = pool
        self._pooled = len(self._history)  # the pool has learnt what precedes the history before this
        if pool is not None:  # the prompt, a stretch of text between images at a time
            floor = 0
            for i, t in enumerate(self._history):
                if t == _BARRIER:
                    pool.learn(self._history, floor=floor, stop=i)
                    floor = i + 1
            pool.learn(self._history, floor=floor)

    def propose(self, generated: Sequence[int], limit: int) -> list[int]:
        if not generated or not self.sizes:
            return []
        self._extend(generated)  # also at limit 0: the pool learns what the sequence emits
        if limit <= 0:
            return []
        history, pending = self._history, int(generated[-1])
        end = len(history)
        if self.pool is not None and end - (self.pool.key - 1) > self._last_barrier:
            draft = self.pool.chain([*history[end - (self.pool.key - 1) :], pending], limit)
            if draft:
                self.kind = POOL
                return draft
        for n in self.sizes:
            tail = end - (n - 1)
            if tail < 0 or tail <= self._last_barrier:
                continue  # too short, or the key would span an image
            start = self._index[n].get((*history[tail:], pending))
            if start is None:
                continue
            draft = history[start + n : start + n + limit]
            if _BARRIER in draft:
                draft = draft[: draft.index(_BARRIER)]
            elif len(draft) < limit:
                draft = _repeat(history[start + n :] + [pending], limit)
            if draft:
                self.kind = _kind(n)
                return draft
        return []

    def _extend(self, generated: Sequence[int]) -> None:
        """Bring the history to the prompt plus ``generated`` but its last token (the pending
        one), and the index with it."""
        want = len(generated) - 1
        if want > self._taken:
            self._history.extend(int(t) for t in generated[self._taken : want])
            self._taken = want
        if len(self._history) > 2 * self.max_history:
            self._forget()
        self._update_index()
        if self.pool is not None:
            self.pool.learn(self._history, self._pooled, self._last_barrier + 1)
            self._pooled = len(self._history)

    def _update_index(self) -> None:
        """Index every n-gram that has a token after it (its continuation), latest wins."""
        history, index = self._history, self._index
        for p in range(self._indexed, len(history) - 1):
            if history[p] == _BARRIER:
                self._barrier = p
                continue
            if history[p + 1] == _BARRIER:
                continue  # nothing to draft after it
            for n in self.sizes:
                start = p - n + 1
                if start > self._barrier:
                    index[n][tuple(history[start : p + 1])] = start
        self._indexed = max(self._indexed, len(history) - 1)

    def _forget(self) -> None:
        """Keep the last ``max_history`` tokens of the history and index them anew."""
        self._pooled = max(0, self._pooled - (len(self._history) - self.max_history))
        self._history = self._history[-self.max_history :]
        self._index = {n: {} for n in self.sizes}
        self._indexed, self._barrier = 0, -1
        self._last_barrier = max((i for i, t in enumerate(self._history) if t == _BARRIER), default=-1)
