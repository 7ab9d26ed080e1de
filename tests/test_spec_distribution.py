"""Speculative decoding at temperature > 0 keeps the output distribution (issue 26).

The loop samples each verified row with the sequence's own sampler, in order, and keeps a drafted
token only when the sampler drew it: for a deterministic draft (prompt lookup) that is speculative
sampling, accept with the target's probability, on rejection a draw from the rest. Here a tiny
real model (stories260K) continues a repetitive prompt at temperature 1, with a repeat penalty
(1.1, Ollama's before v0.33: the sampler's counts must follow the accepted tokens alone, and the
answers spread over more categories than unpenalised), so drafts are proposed at every step and
both accepted and rejected; many seeds give an empirical distribution of short
answers with drafts and one without (other seeds: two independent samples), and a two-sample
chi-square test finds no difference. The same test tells a broken verifier apart: one that keeps
every drafted token (accept-always) moves the answers towards the draft, and the test rejects it
by a wide margin. The seeds are fixed, so the statistics are the same at every run.
"""

from __future__ import annotations

import collections
import math

import pytest

import runner.loop.runner as loop_runner
from runner.api import Options, Request
from runner.spec.controller import Speculation, StepCost
from runner.spec.verify import Verified
from tests.conftest import STORIES, load

PROMPT = "Once upon a time, there was a little cat. " * 3 + "Once upon a time, there"
N = 200  # answers per sample
TOKENS = 5  # tokens per answer


def answers(r, seeds, depth: int) -> tuple[list[tuple[int, ...]], int, int]:
    """(the answers' tokens, drafted, accepted) for ``seeds`` at temperature 1."""
    # rows cost nothing: draft as deep as lookup allows at every step, also after rejections
    r.speculation = Speculation(cost=StepCost(((1, 1.0), (64, 1.0))))
    out, drafted, accepted = [], 0, 0
    for seed in seeds:
        request = Request(prompt=PROMPT, raw=True, options=Options().merged(
            dict(temperature=1.0, top_k=0, top_p=1.0, seed=seed, num_predict=TOKENS, draft_num_predict=depth,
                 repeat_penalty=1.1)))
        final = list(r.stream(request))[-1]
        out.append(tuple(final.context[-TOKENS:]))
        drafted += final.metrics.draft_n
        accepted += final.metrics.draft_n_accepted
    return out, drafted, accepted


def chi_square(a: list, b: list, least: int = 10) -> tuple[float, int]:
    """Two-sample chi-square statistic of homogeneity and its degrees of freedom; categories
    seen fewer than ``least`` times in both samples together are pooled into one."""
    ca, cb = collections.Counter(a), collections.Counter(b)
    pooled: dict[object, list[int]] = collections.defaultdict(lambda: [0, 0])
    for key in set(ca) | set(cb):
        cell = key if ca[key] + cb[key] >= least else "rest"
        pooled[cell][0] += ca[key]
        pooled[cell][1] += cb[key]
    na, nb = len(a), len(b)
    stat = 0.0
    for x, y in pooled.values():
        total = x + y
        for seen, n in ((x, na), (y, nb)):
            expected = total * n / (na + nb)
            stat += (seen - expected) ** 2 / expected
    return stat, len(pooled) - 1


def p_value(stat: float, df: int) -> float:
    """P(chi-square with ``df`` degrees of freedom >= ``stat``), by Wilson and Hilferty's normal
    approximation (good to a few percent in the tail that matters here)."""
    v = 2.0 / (9.0 * df)
    z = ((stat / df) ** (1.0 / 3.0) - (1.0 - v)) / math.sqrt(v)
    return 0.5 * math.erfc(z / math.sqrt(2.0))


def accept_always(draft, sample, emit):
    """A broken verifier: every drafted token stands, only the row after the draft is sampled."""
    tokens = []
    for i in range(len(draft) + 1):
        token = draft[i] if i < len(draft) else sample(i)
        tokens.append(token)
        if not emit(i, token):
            return Verified(tokens, i, True)
    return Verified(tokens, len(draft), False)


def test_chi_square_helpers():
    assert chi_square([1, 2] * 50, [1, 2] * 50) == (0.0, 1)
    assert abs(p_value(3.841, 1) - 0.05) < 0.01 and abs(p_value(18.31, 10) - 0.05) < 0.005
    stat, df = chi_square([1] * 60 + [2] * 40, [1] * 40 + [2] * 60)
    assert df == 1 and abs(stat - 8.0) < 1e-9


# the new engine's first dozen requests of a load take seconds each here (later ones milliseconds)
@pytest.fixture(scope="module", params=["old", pytest.param("new", marks=pytest.mark.slow)])
def stories(request):
    r = load(STORIES, request.param, num_ctx=256)
    yield r
    r.close()


def test_drafts_keep_the_distribution_and_accept_always_does_not(stories, monkeypatch):
    plain, _, _ = answers(stories, range(N), 0)
    drafted, n, accepted = answers(stories, range(N, 2 * N), 4)
    assert accepted > N and n - accepted > N  # drafts every answer, accepted and rejected
    stat, df = chi_square(plain, drafted)
    assert df >= 5
    assert p_value(stat, df) > 1e-3, (stat, df)

    monkeypatch.setattr(loop_runner, "verify", accept_always)
    broken, _, _ = answers(stories, range(2 * N, 3 * N), 4)
    stat, df = chi_square(plain, broken)
    assert p_value(stat, df) < 1e-9, (stat, df)
