"""Token samplers over NumPy logits (Ollama's ``sample/samplers.go`` + llama.cpp's penalties).

Order, as in Ollama's new engine, with llama.cpp's repetition penalties in front:

1. penalties over the last ``repeat_last_n`` accepted tokens (``llama_sampler_penalties``):
   for a token seen ``c`` times, ``logit = logit * repeat_penalty`` if ``logit <= 0`` else
   ``logit / repeat_penalty``, then ``logit -= c * frequency_penalty + presence_penalty``;
2. ``temperature == 0``: greedy (argmax), done;
3. top_k (``k <= 0`` or ``k >= vocab``: all tokens), sorted by logit, descending;
   then typical_p (``< 1``; llama.cpp's locally typical sampling): with ``p`` the softmax of the
   raw logits and ``H`` its entropy, keep the tokens closest to ``|-log p - H| = 0`` until their
   probabilities add up to more than ``typical_p``;
4. temperature: ``logit / max(temperature, 1e-7)``;
5. softmax;
6. top_p: keep the shortest prefix whose cumulative probability exceeds ``top_p`` (1.0: all);
7. min_p: keep tokens with ``prob >= min_p * max_prob``;
8. draw from what is left with the sampler's RNG (seeded: reproducible; ``seed=-1``: random).

The draw (8) is a cumulative sum over the candidates sorted by logit and a uniform number from
the sampler's seeded ``random.Random``; the token is where the number lands. No step copies or
sorts the vocabulary unless it must: greedy is ``argmax`` over the logits as given; penalties
touch only the penalised entries (in place, undone after the pick); top_k is :func:`top_ids` (a
vectorised threshold, then a sort of the few candidates); with top_k off, the sort is done on a
growing sorted prefix until the top_p/min_p cut, or with no cut the draw itself, falls inside it
(a sorted prefix has the full sort's cumulative sums, so the token is the one a full sort
gives), and the softmax's normaliser is one float32 pass. A flat distribution may still need
the whole vocabulary sorted.

Penalties that only lower logits keep the k best after them among the k + P best before them
(P penalised tokens), so top_k sampling reads those alone (:meth:`Sampler._few`), and
:meth:`Sampler.sample_top` decides greedy and top_k sampling from the row's best 128 (the new
engine picks them with ``best.c``), reading the whole row only when they do not suffice.
"""

from __future__ import annotations

import math
import random
import struct
from bisect import bisect_left, bisect_right
from collections import Counter, deque
from dataclasses import dataclass
from itertools import accumulate
from typing import Callable, Iterable, Sequence

import numpy as np

from runner.api import Options

_DEFAULTS = Options()  # the sampling options' defaults, written once: in runner.api.Options

__all__ = ["Sampler", "SamplerOptions", "apply_penalties", "penalized", "top_ids", "top_ids_values"]


@dataclass(frozen=True)
class SamplerOptions:
    """Sampling parameters, with Ollama's names; their defaults are ``runner.api.Options``'."""

    temperature: float = _DEFAULTS.temperature
    top_k: int = _DEFAULTS.top_k
    top_p: float = _DEFAULTS.top_p
    min_p: float = _DEFAULTS.min_p
    typical_p: float = _DEFAULTS.typical_p
    seed: int = _DEFAULTS.seed
    repeat_penalty: float = _DEFAULTS.repeat_penalty
    repeat_last_n: int = _DEFAULTS.repeat_last_n  # 0: off, -1: the whole context (num_ctx)
    presence_penalty: float = _DEFAULTS.presence_penalty
    frequency_penalty: float = _DEFAULTS.frequency_penalty

    @classmethod
    def from_options(cls, options: object) -> SamplerOptions:
        """From any object with these attribute names (e.g. ``runner.api.Options``)."""
        return cls(**{f: getattr(options, f) for f in cls.__dataclass_fields__ if hasattr(options, f)})


def apply_penalties(
    logits: np.ndarray,
    recent: Sequence[int] | np.ndarray,
    repeat_penalty: float,
    presence_penalty: float,
    frequency_penalty: float,
) -> np.ndarray:
    """llama.cpp's penalties of ``recent`` tokens applied to a *copy* of ``logits`` (returned);
    returns ``logits`` itself when nothing applies."""
    changed = penalized(logits, recent, repeat_penalty, presence_penalty, frequency_penalty)
    if changed is None:
        return logits
    out = logits.copy()
    out[changed[0]] = changed[1]
    return out


def penalized(
    logits: np.ndarray,
    recent: Sequence[int] | np.ndarray,
    repeat_penalty: float,
    presence_penalty: float,
    frequency_penalty: float,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The penalised tokens (unique ids) and their new logits, in ``logits``' dtype; None when
    nothing applies. Only ``len(set(recent))`` values are touched, never the whole vocabulary."""
    if len(recent) == 0 or (repeat_penalty == 1.0 and presence_penalty == 0.0 and frequency_penalty == 0.0):
        return None
    return _penalized_counts(logits, Counter(recent), repeat_penalty, presence_penalty, frequency_penalty)


def _penalized_counts(logits: np.ndarray, counts: dict[int, int], repeat_penalty: float, presence_penalty: float,
                      frequency_penalty: float) -> tuple[np.ndarray, np.ndarray]:
    """:func:`penalized` for ``counts`` (token -> times seen; ids outside the vocabulary are
    left out). :meth:`Sampler.penalty` applies the same rule to single float32 values."""
    ids = np.fromiter(counts, dtype=np.intp, count=len(counts))
    if min(counts) < 0 or max(counts) >= len(logits):
        ids = ids[(ids >= 0) & (ids < len(logits))]
    vals = logits[ids]
    if repeat_penalty != 1.0:
        vals = np.where(vals <= 0, vals * repeat_penalty, vals / repeat_penalty)
    if frequency_penalty != 0.0 or presence_penalty != 0.0:
        seen = np.fromiter((counts[i] for i in ids.tolist()), dtype=np.int64, count=len(ids))
        vals = vals - (seen * frequency_penalty + presence_penalty)
    return ids, vals.astype(logits.dtype, copy=False)


_FLOAT32 = struct.Struct("f")


def _f32(x: float) -> float:
    """``x`` rounded to float32. A product or quotient of two float32 values computed in double
    and rounded once is the correctly rounded float32 result (double has more than 2 x 24 + 2
    bits), so this equals NumPy's float32 arithmetic without a NumPy call."""
    try:
        return _FLOAT32.unpack(_FLOAT32.pack(x))[0]
    except OverflowError:  # beyond float32's range: NumPy's float32 gives inf
        return math.copysign(math.inf, x)


def top_ids(logits: np.ndarray, k: int) -> np.ndarray:
    """The ids of the ``k`` largest logits, largest first, ties in id order: exactly
    ``np.argsort(-logits, kind="stable")[:k]``, without sorting the vocabulary.

    A threshold ``t`` no larger than the k-th largest logit picks the candidates
    (``logits >= t``), and only those are sorted. ``t`` is the k-th largest of the maxima of
    disjoint groups of the vocabulary (k groups each hold a logit >= t), one vectorised pass;
    for small vocabularies or large k, the k-th largest logit itself (``np.partition``).
    Tokens at -inf (masked by a grammar) are dropped when fewer than ``k`` are finite: they
    have probability 0 at any temperature.
    """
    return top_ids_values(logits, k)[0]


def top_ids_values(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`top_ids` and their logits (``logits[ids]``), from the same pass."""
    n = logits.shape[0]
    if k >= n:
        ids = np.argsort(-logits, kind="stable")
        return ids, logits[ids]
    width = 1 << max(10, (8 * k - 1).bit_length())  # groups: a power of two, at least 8k
    rows = n // width
    if rows >= 4:
        group_max = logits[: rows * width].reshape(rows, width).max(axis=0)
        t = np.partition(group_max, width - k)[width - k]
    else:
        t = np.partition(logits, n - k)[n - k]
    cand = (logits > -np.inf).nonzero()[0] if t == -np.inf else (logits >= t).nonzero()[0]
    vals = logits[cand]
    order = np.argsort(-vals, kind="stable")[:k]
    return cand[order], vals[order]


class Sampler:
    """Picks the next token from a row of logits; remembers accepted tokens for penalties.

    Usage: ``tok = sampler.sample(logits); sampler.accept(tok)``. Feed the prompt tokens to
    :meth:`accept` too (llama.cpp does) so penalties see them."""

    def __init__(self, options: SamplerOptions | None = None, *, num_ctx: int = 4096) -> None:
        o = options or SamplerOptions()
        self.options = o
        self.temperature = max(0.0, float(o.temperature))
        self.top_k = int(o.top_k)
        self.top_p = min(max(float(o.top_p), 0.0), 1.0)
        self.min_p = min(max(float(o.min_p), 0.0), 1.0)
        self.typical_p = min(max(float(o.typical_p), 0.0), 1.0)
        last_n = num_ctx if o.repeat_last_n < 0 else o.repeat_last_n
        self.penalize = last_n > 0 and (
            o.repeat_penalty != 1.0 or o.presence_penalty != 0.0 or o.frequency_penalty != 0.0
        )
        self.history: deque[int] = deque(maxlen=max(1, last_n))
        self._rp32 = _f32(o.repeat_penalty)  # NumPy's float32 arithmetic rounds it so
        self._counts: dict[int, int] = {}  # token -> times in ``history`` (the penalties' Counter)
        # Penalties that only lower logits keep the k best after them among the k + P best
        # before them (P penalised tokens): a token outside has k unpenalised tokens ahead of it.
        # Then greedy (k = 1) and top_k sampling without typical_p read only those (:meth:`_few`).
        lowering = o.repeat_penalty >= 1.0 and o.presence_penalty >= 0.0 and o.frequency_penalty >= 0.0
        self._few_k = 0
        if lowering and self.temperature == 0.0:
            self._few_k = 1
        elif lowering and self.top_k > 0 and not 0.0 < self.typical_p < 1.0:
            self._few_k = self.top_k
        #: whether :meth:`sample_top` can decide from a row's best logits (else it reads the row)
        self.reads_top = self._few_k > 0
        # Python's generator, not NumPy's: one draw a token, and NumPy's costs ~25 us right after
        # GGML has run (its code is out of the caches), Python's ~5 us
        self.rng = random.Random(None if o.seed == -1 else int(o.seed) & 0xFFFFFFFFFFFFFFFF)

    # --- history --------------------------------------------------------------------------------
    def accept(self, token: int) -> None:
        """Record ``token`` as generated (or part of the prompt) for the penalties."""
        token = int(token)
        history, counts = self.history, self._counts
        if len(history) == history.maxlen:
            old = history[0]
            left = counts[old] - 1
            if left:
                counts[old] = left
            else:
                del counts[old]
        history.append(token)
        counts[token] = counts.get(token, 0) + 1

    def accept_many(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.accept(t)

    def reset(self) -> None:
        self.history.clear()
        self._counts.clear()

    def penalties(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """:func:`penalized` for this sampler's history and options (from counts kept as tokens
        are accepted, not counted again per token); None when nothing applies."""
        if not self.penalize or not self._counts:
            return None
        o = self.options
        return _penalized_counts(logits, self._counts, o.repeat_penalty, o.presence_penalty, o.frequency_penalty)

    @property
    def counts(self) -> dict[int, int]:
        """Token -> times in the penalty window (empty when no penalty applies); read only."""
        return self._counts if self.penalize else {}

    def penalty(self, logit: float, count: int) -> float:
        """One logit (a float32 value) of a token seen ``count`` times after the penalties,
        rounded to float32 at each step exactly as :func:`penalized`'s NumPy float32 arithmetic
        rounds it (for the Python paths: after GGML has run, each NumPy call costs tens of
        microseconds)."""
        o = self.options
        if o.repeat_penalty != 1.0:
            logit = _f32(logit * self._rp32) if logit <= 0 else _f32(logit / self._rp32)
        if o.frequency_penalty != 0.0 or o.presence_penalty != 0.0:
            logit = _f32(logit - (count * o.frequency_penalty + o.presence_penalty))
        return logit

    # --- sampling -------------------------------------------------------------------------------
    def sample(self, logits: np.ndarray) -> int:
        """The next token id for ``logits`` (1-D float array over the vocabulary).

        ``logits`` is left as it was: when it is writeable the penalties are applied to the few
        penalised entries in place and undone before returning, so no vocabulary-sized copy is
        made. Raises ``ValueError`` for empty logits or logits that are all -inf, or hold NaN
        or +inf."""
        if logits.ndim != 1 or logits.size == 0:
            raise ValueError(f"sample: expected a 1-D logits vector, got shape {logits.shape}")
        need = self._few_k + len(self.counts)  # the k + P best hold the k best after penalties
        if self._few_k and self.temperature > 0.0 and need < logits.shape[0]:
            top = logits.max()
            if not math.isfinite(top):
                raise ValueError("sample: logits are NaN, +inf or all -inf, check model output")
            ids, vals = top_ids_values(logits, need)
            return self._few(ids.tolist(), vals.tolist())
        changed = self.penalties(logits)
        if changed is None:
            return self._pick(logits)
        ids, vals = changed
        if not logits.flags.writeable:
            logits = logits.copy()
            logits[ids] = vals
            return self._pick(logits)
        saved = logits[ids]
        logits[ids] = vals
        try:
            return self._pick(logits)
        finally:
            logits[ids] = saved

    def _pick(self, logits: np.ndarray) -> int:
        if self.temperature == 0.0:
            return int(np.argmax(logits))
        if not np.isfinite(logits.max()):
            raise ValueError("sample: logits are NaN, +inf or all -inf, check model output")
        n = logits.shape[0]
        if 0 < self.top_k < n or 0.0 < self.typical_p < 1.0:
            ids, probs = self._candidates(logits)
            return self._draw(ids, probs)
        return self._draw_sorted_prefix(logits)

    def sample_top(self, il: list[int], vl: list[float], full: Callable[[], np.ndarray]) -> int:
        """The token :meth:`sample` gives for the logits ``full()``, decided from the row's
        best logits alone when they suffice (ids ``il`` / logits ``vl``: the first ``K`` of a
        stable descending sort of the row with -inf left out, as ``best.c`` gives them):
        greedy or top_k sampling whose ``k + P`` best are the first ``k + P`` of them.
        Otherwise (other options, fewer than ``k + P`` candidates, +inf among them) ``full()``
        is read and sampled as usual."""
        need = self._few_k + len(self.counts)
        if self._few_k and need < len(il) and math.isfinite(sum(vl)):  # the sum shows +inf
            return self._few(il[:need], vl[:need])
        return self.sample(full())

    def _few(self, idl: list[int], vl: list[float]) -> int:
        """Greedy or top_k sampling from the ``k + P`` best raw logits (ids ``idl``, logits
        ``vl``, stable order): the penalties (float32, as :func:`penalized` computes them), the
        re-sort, then the argmax, or the softmax, top_p / min_p and the draw, in Python floats
        (after GGML has run, every NumPy call costs tens of microseconds). The cut and the draw
        work on the running sums of the unnormalised weights: a running sum of probabilities
        above ``top_p`` is one of weights above ``top_p * total``."""
        counts = self.counts
        k = self._few_k
        if counts and not counts.keys().isdisjoint(idl):
            penalty = self.penalty
            # the k best by logit, descending, ties by id
            order = sorted([(-penalty(v, counts[t]) if t in counts else -v, t) for t, v in zip(idl, vl)])[:k]
            idl, vl = [t for _, t in order], [-v for v, _ in order]
        if self.temperature == 0.0:
            return idl[0]
        temp = max(self.temperature, 1e-7)
        first = vl[0] / temp
        exp = math.exp
        weights = [exp(v / temp - first) for v in vl[:k]]  # the first is 1
        sums = list(accumulate(weights))
        total = sums[-1]
        if not math.isfinite(total) or total <= 0.0:
            raise ValueError("sample: logits sum to NaN, check model output")
        end = len(sums)
        if self.top_p < 1.0:
            end = min(end, bisect_right(sums, self.top_p * total) + 1)  # the first sum above the cut
        if self.min_p > 0.0:
            end = next((i for i in range(end) if weights[i] < self.min_p), end)  # min_p x the first
        return idl[min(bisect_left(sums, self.rng.random() * sums[end - 1], 0, end), end - 1)]

    def _draw(self, ids: np.ndarray, probs: np.ndarray) -> int:
        """One seeded draw from candidates ``ids`` (sorted by logit) with weights ``probs``."""
        if probs.size == 0 or not np.isfinite(probs).all():
            raise ValueError("sample: logits sum to NaN, check model output")
        cum = np.cumsum(probs, dtype=np.float64)
        r = self.rng.random() * cum[-1]
        idx = int(np.searchsorted(cum, r, side="left"))
        return int(ids[min(idx, len(ids) - 1)])

    def _draw_sorted_prefix(self, logits: np.ndarray) -> int:
        """top_k off: the draw a full sort by logit would give, from the shortest sorted prefix
        that decides it. The cumulative probabilities of a sorted prefix are those of the full
        sort, so the prefix decides when the top_p/min_p cut ends inside it, or (no cut) when the
        draw lands inside it; else the prefix grows 8x. A flat distribution may end up sorting
        everything; a peaked one sorts a few hundred tokens."""
        n = logits.shape[0]
        scale, log_z = self._softmax_scale(logits)
        cut = self.top_p < 1.0 or self.min_p > 0.0
        u = None if cut else self.rng.random()
        m = min(n, 256)
        while True:
            ids = top_ids(logits, m)
            probs = np.exp(logits[ids].astype(np.float64) / scale - log_z)
            if cut:
                cut_ids, cut_probs = self._cut(ids, probs)
                if m >= n or len(cut_ids) < m:
                    return self._draw(cut_ids, cut_probs)
            else:
                cum = np.cumsum(probs)
                if m >= n or u < cum[-1]:
                    idx = int(np.searchsorted(cum, u, side="left"))
                    return int(ids[min(idx, len(ids) - 1)])
            m = min(n, m * 8)

    def _softmax_scale(self, logits: np.ndarray) -> tuple[float, float]:
        """(temperature, log of the softmax's normaliser): ``p_i = exp(logit_i / temperature -
        log_z)``. The tokens that carry the mass (within e^-9 of the best) are summed in
        float64; the long tail comes from one float32 pass over the vocabulary (NumPy's float64
        ``exp`` is ~20x slower), with the float32 rounding of ``1/temperature`` and of the
        maximum corrected to first order. ``log_z`` is within ~1e-9 of an all-float64 softmax's."""
        temp = max(self.temperature, 1e-7)
        top = float(logits.max()) / temp
        scale32, top32 = np.float32(1.0 / temp), np.float32(top)
        shifted = np.empty(logits.shape, dtype=np.float32)
        np.multiply(logits, scale32, out=shifted, dtype=np.float32)
        np.subtract(shifted, top32, out=shifted)
        heavy = np.flatnonzero(shifted > -9.0)
        np.exp(shifted, out=shifted)
        shifted[heavy] = 0.0
        # exp(x*scale32 - top32) = exp(x/temp - top) * (1 + x*d_scale - d_top) to first order
        tail = float(np.sum(shifted, dtype=np.float64))
        if tail > 0.0:
            finite = logits if np.isfinite(logits).all() else np.where(np.isfinite(logits), logits, 0)
            moment = float(np.dot(shifted, finite))
            tail = tail * (1.0 + (float(top32) - top)) - (float(scale32) - 1.0 / temp) * moment
        z = tail + float(np.sum(np.exp(logits[heavy].astype(np.float64) / temp - top)))
        return temp, top + float(np.log(z))

    def _candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token ids sorted by logit (descending) after top_k/typical/top_p/min_p, and their
        probabilities (softmax at the temperature, over the top_k survivors)."""
        n = logits.shape[0]
        temp = max(self.temperature, 1e-7)
        k = self.top_k
        typical = 0.0 < self.typical_p < 1.0
        if 0 < k < n or typical:
            ids, vals = top_ids_values(logits, k if 0 < k < n else n)
            if typical:
                ids = self._typical(logits, ids)
                vals = logits[ids]
            scaled = np.divide(vals, temp, dtype=np.float64)
            probs = np.exp(scaled - scaled[0])
            probs /= probs.sum()
            return self._cut(ids, probs)
        # top_k off: softmax over everything, sort only as much as top_p/min_p need
        scale, log_z = self._softmax_scale(logits)
        m = min(n, 256)
        while True:
            ids = top_ids(logits, m)
            probs = np.exp(logits[ids].astype(np.float64) / scale - log_z)
            cut_ids, cut_probs = self._cut(ids, probs)
            if m >= n or len(cut_ids) < m:
                return cut_ids, cut_probs
            m = min(n, m * 8)

    def _typical(self, logits: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """Locally typical sampling over candidates ``ids`` (sorted by logit, descending):
        the survivors, still sorted by logit."""
        x = logits[ids].astype(np.float64)
        shifted = x - x[0]
        log_probs = shifted - np.log(np.exp(shifted).sum())
        probs = np.exp(log_probs)
        entropy = -float((probs * log_probs).sum())
        order = np.argsort(np.abs(-log_probs - entropy), kind="stable")
        over = np.flatnonzero(np.cumsum(probs[order]) > self.typical_p)
        keep = order[: int(over[0]) + 1] if over.size else order
        return ids[np.sort(keep)]

    def _cut(self, ids: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Apply top_p then min_p to sorted candidates (Ollama's rules)."""
        if self.top_p < 1.0:
            cum = np.cumsum(probs)
            over = np.flatnonzero(cum > self.top_p)
            if over.size:
                end = int(over[0]) + 1
                ids, probs = ids[:end], probs[:end]
        if self.min_p > 0.0 and probs.size:
            threshold = probs[0] * self.min_p
            below = np.flatnonzero(probs < threshold)
            if below.size:
                end = int(below[0])
                ids, probs = ids[:end], probs[:end]
        return ids, probs
