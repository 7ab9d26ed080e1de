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

Work is proportional to what survives: top_k uses ``argpartition`` (O(vocab)), and with top_k
off the sort is done on a growing candidate prefix until top_p/min_p are decided, so a 49k
vocabulary is not fully sorted per token unless the distribution really is that flat.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

__all__ = ["Sampler", "SamplerOptions", "apply_penalties"]


@dataclass(frozen=True)
class SamplerOptions:
    """Sampling parameters, with Ollama's names and defaults (``runner.api.Options``)."""

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    typical_p: float = 1.0
    seed: int = -1
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64  # 0: off, -1: the whole context (num_ctx)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

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
    if len(recent) == 0 or (repeat_penalty == 1.0 and presence_penalty == 0.0 and frequency_penalty == 0.0):
        return logits
    ids, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
    keep = (ids >= 0) & (ids < len(logits))
    ids, counts = ids[keep], counts[keep]
    out = logits.copy()
    vals = out[ids]
    if repeat_penalty != 1.0:
        vals = np.where(vals <= 0, vals * repeat_penalty, vals / repeat_penalty)
    vals = vals - (counts * frequency_penalty + presence_penalty)
    out[ids] = vals.astype(out.dtype, copy=False)
    return out


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
        self.rng = np.random.default_rng(None if o.seed == -1 else int(o.seed) & 0xFFFFFFFFFFFFFFFF)

    # --- history --------------------------------------------------------------------------------
    def accept(self, token: int) -> None:
        """Record ``token`` as generated (or part of the prompt) for the penalties."""
        self.history.append(int(token))

    def accept_many(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            self.history.append(int(t))

    def reset(self) -> None:
        self.history.clear()

    # --- sampling -------------------------------------------------------------------------------
    def sample(self, logits: np.ndarray) -> int:
        """The next token id for ``logits`` (1-D float array over the vocabulary; not modified).

        Raises ``ValueError`` for empty logits or logits that are all -inf/NaN."""
        if logits.ndim != 1 or logits.size == 0:
            raise ValueError(f"sample: expected a 1-D logits vector, got shape {logits.shape}")
        o = self.options
        if self.penalize and self.history:
            logits = apply_penalties(logits, self.history, o.repeat_penalty, o.presence_penalty, o.frequency_penalty)
        if self.temperature == 0.0:
            return int(np.argmax(logits))
        ids, probs = self._candidates(logits)
        if probs.size == 0 or not np.isfinite(probs).all():
            raise ValueError("sample: logits sum to NaN, check model output")
        cum = np.cumsum(probs, dtype=np.float64)
        r = self.rng.random() * cum[-1]
        idx = int(np.searchsorted(cum, r, side="left"))
        return int(ids[min(idx, len(ids) - 1)])

    def _candidates(self, logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Token ids sorted by logit (descending) after top_k/top_p/min_p, and their
        probabilities (softmax at the temperature, over the top_k survivors)."""
        n = logits.shape[0]
        temp = max(self.temperature, 1e-7)
        k = self.top_k
        typical = 0.0 < self.typical_p < 1.0
        if 0 < k < n or typical:
            if 0 < k < n:
                part = np.argpartition(logits, n - k)[n - k :]
                ids = part[np.argsort(-logits[part], kind="stable")]
            else:
                ids = np.argsort(-logits, kind="stable")
            if typical:
                ids = self._typical(logits, ids)
            scaled = logits[ids].astype(np.float64) / temp
            probs = np.exp(scaled - scaled[0])
            probs /= probs.sum()
            return self._cut(ids, probs)
        # top_k off: softmax over everything, sort only as much as top_p/min_p need
        scaled = logits.astype(np.float64) / temp
        e = np.exp(scaled - scaled.max())
        all_probs = e / e.sum()
        if self.top_p >= 1.0 and self.min_p <= 0.0:
            ids = np.argsort(-logits, kind="stable")
            return ids, all_probs[ids]
        m = min(n, 256)
        while True:
            if m >= n:
                ids = np.argsort(-logits, kind="stable")
            else:
                part = np.argpartition(logits, n - m)[n - m :]
                ids = part[np.argsort(-logits[part], kind="stable")]
            probs = all_probs[ids]
            cut_ids, cut_probs = self._cut(ids, probs)
            # decided when the cut ended inside the prefix (or the prefix is everything)
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
