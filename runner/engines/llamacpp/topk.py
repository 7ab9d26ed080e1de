"""llama.cpp's sampler chain fed only the top_k candidates (the old engine, no grammar).

``llama_sampler_sample`` copies all ``n_vocab`` logits into candidates, then the chain's
penalties and top_k partly sort them: ~1.7 ms a token on a 262k vocabulary. With top_k on,
everything after top_k (typical, top_p, min_p, temperature, the seeded draw) sees only the k
best candidates, sorted. So the penalties are applied here (``runner.sample``'s rule, equal to
llama.cpp's ``penalties`` sampler) as scalar writes into the logits row and back (right after
a decode each NumPy call costs tens of microseconds), one pass of C (``runner/sample/best.c``)
writes the k best straight into llama.cpp's candidates array, and a chain of the remaining
llama.cpp samplers (same seed, same RNG) gets only those: the same tokens as the full chain.
One difference cannot show in practice: among exactly equal logits the order is by token id
here, by ``std::partial_sort``'s heap there.
"""

from __future__ import annotations

import ctypes
import random

import llama_cpp as L
import numpy as np

from ...api import Options
from ...sample._best import best
from ...sample.samplers import Sampler, SamplerOptions

assert ctypes.sizeof(L.llama_token_data) == 12  # best.c's record: int32 id, float32 logit, float32 p


def applies(opts: Options, has_grammar: bool, n_vocab: int) -> bool:
    """Whether :class:`TopKChain` samples ``opts`` (else: llama.cpp's full chain)."""
    return not has_grammar and opts.temperature > 0 and 0 < opts.top_k < n_vocab


def after_top_k(opts: Options) -> int:
    """A llama.cpp chain of the samplers that follow top_k in the full chain (the caller frees
    it)."""
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    add_after_top_k(chain, opts)
    return chain


def add_after_top_k(chain: int, opts: Options) -> None:
    """Append to ``chain`` what follows top_k in a sampled chain: typical, top_p, min_p,
    temperature, the seeded draw (one rule for the full chain and :class:`TopKChain`)."""
    if 0 < opts.typical_p < 1:
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_typical(opts.typical_p, 1))
    if 0 < opts.top_p < 1:
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_p(opts.top_p, 1))
    if opts.min_p > 0:
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_min_p(opts.min_p, 1))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(opts.temperature))
    seed = opts.seed if opts.seed >= 0 else random.getrandbits(32)
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(seed & 0xFFFFFFFF))


class TopKChain:
    """Samples like llama.cpp's chain (penalties, top_k, then :func:`after_top_k`'s samplers)
    while copying only ``top_k`` candidates out of the logits."""

    def __init__(self, opts: Options, prompt: list[int], num_ctx: int) -> None:
        self.k = int(opts.top_k)
        # penalties and their history: the shared sampler's (llama.cpp's rules, tested equal)
        self.penalties = Sampler(SamplerOptions.from_options(opts), num_ctx=num_ctx)
        if self.penalties.penalize:
            self.penalties.accept_many(prompt[-self.penalties.history.maxlen:])
        self.chain = after_top_k(opts)
        self._data = (L.llama_token_data * self.k)()
        self._array = L.llama_token_data_array(self._data, self.k, -1, True)
        self._array_ref = ctypes.byref(self._array)

    def sample(self, logits: np.ndarray, floats: ctypes.Array) -> int:
        """The next token for ``logits``; ``floats`` is a ctypes float array over the same
        memory, where the penalties go in place (a few scalar writes, undone after top_k)."""
        pen = self.penalties
        saved: list[tuple[int, float]] = []
        n = len(floats)
        try:
            for t, c in pen.counts.items():
                if 0 <= t < n:
                    v = floats[t]
                    saved.append((t, v))
                    floats[t] = pen.penalty(v, c)
            count = best(logits, self.k, self._data)  # sorted, p = 0
        finally:
            for t, v in saved:
                floats[t] = v
        arr = self._array
        arr.size = count
        arr.selected = -1
        arr.sorted = True
        L.llama_sampler_apply(self.chain, self._array_ref)
        if not 0 <= arr.selected < arr.size:
            raise ValueError("sample: no candidate selected, check model output")
        token = self._data[arr.selected].id
        if pen.penalize:
            pen.accept(token)
        return token

    def close(self) -> None:
        if self.chain:
            L.llama_sampler_free(self.chain)
            self.chain = None
