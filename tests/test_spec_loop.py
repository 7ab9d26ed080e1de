"""Speculative decoding in the batch loop decides exactly as plain decoding does (issue 26).

On the fake engine (tests/fakeengine.py), whose logits do not depend on the batch a token is
computed in, a request with drafts (``draft_num_predict`` > 0) must give the same chunks as with
none: text, logprobs, done reason, context, stop, counts; and at temperature > 0 with a seed the
same tokens, because the sampler is called for the same positions in the same order. Through
stops, ``num_predict``, end of generation, UTF-8 split across tokens, a ``format``, and context
shifts while drafts fill the context, inline and pipelined. Real models are checked in
test_spec_models.py.
"""

from __future__ import annotations

import pytest

from runner.api import ChatTemplate, Options, Request
from runner.loop.pipeline import ThreadDecoder
from runner.loop.runner import BatchRunner
from runner.spec.controller import Speculation, StepCost
from tests.fakeengine import FakeEngine

CODE = ("def add(a, b):\n    total = a + b\n    return total\n\n"
        "def sub(a, b):\n    total = a - b\n    return total\n\n"
        "def mul(a, b):\n    total = a * b\n    return total\n\n# rename total to result\n\ndef add(a, b):\n")
UTF8 = "un café a 3 €, deux cafés a 6 €, trois cafés a 9 €, un café a 3 €, deux "
EOG = "the cat sat. the dog ran. the cat sat. the dog ran# the cat sat. the"  # "#": end of generation
GREEDY = dict(temperature=0.0, repeat_penalty=1.0, draft_num_predict=16)  # drafts on: off by default (runner/api.py)

CASES = [
    ("code", CODE, dict(num_predict=120)),
    ("num_predict", CODE, dict(num_predict=37)),
    ("stop", CODE, dict(num_predict=120, stop=["):ult", "sub("])),
    ("stop_utf8", UTF8, dict(num_predict=80, stop=["€, deux"])),
    ("stop_prefix", UTF8, dict(num_predict=80, stop=["deux caf  d d"])),  # its start comes, is held back, goes
    ("utf8", UTF8, dict(num_predict=90)),
    ("eog", EOG, dict(num_predict=60)),
    ("penalties", CODE, dict(num_predict=80, temperature=0.0, repeat_penalty=1.3, repeat_last_n=16)),
    ("sampled", CODE, dict(num_predict=100, temperature=0.7, seed=42, top_k=20)),
    ("sampled_utf8", UTF8, dict(num_predict=80, temperature=1.0, seed=7, top_p=0.95)),
]

# the default controller, and one that drafts as deep as allowed at every step (rows cost
# nothing), so that failing drafts are verified too
SPECS = {
    "default": lambda: Speculation(),
    "eager": lambda: Speculation(cost=StepCost(((1, 1.0), (64, 1.0)))),
}


class Run:
    def __init__(self, speculation: Speculation, num_ctx: int = 256, pipeline: bool = False,
                 num_parallel: int = 1) -> None:
        self.engine = FakeEngine(num_ctx, num_parallel)
        self.runner = BatchRunner(self.engine, template=ChatTemplate("plain", "", "test"), num_ctx=num_ctx,
                                  num_parallel=num_parallel, num_batch=64, multi_user=False,
                                  decoder=ThreadDecoder() if pipeline else None, speculation=speculation)
        self.runner.start()

    def __call__(self, prompt: str, logprobs: bool = False, fmt=None, **opts):
        options = Options().merged({**GREEDY, **opts})
        request = Request(prompt=prompt, raw=True, options=options, logprobs=logprobs,
                          top_logprobs=3 if logprobs else 0, format=fmt)
        self.engine.samples.clear()
        chunks = list(self.runner.stream(request))
        return [view(c) for c in chunks], list(self.engine.samples), chunks[-1].metrics

    def close(self) -> None:
        self.runner.close()


def view(chunk):
    """A chunk without its durations and draft counts (what must not differ)."""
    m = chunk.metrics
    counts = None if m is None else (m.prompt_eval_count, m.prompt_cached_count, m.eval_count)
    return (chunk.text, chunk.thinking, chunk.tool_calls, chunk.logprobs, chunk.done, chunk.done_reason,
            chunk.context, chunk.stop, counts)


def once(speculation: Speculation, prompt: str, num_ctx: int = 256, pipeline: bool = False, **opts):
    """One request on a runner of its own (so that no slot holds an earlier prompt)."""
    run = Run(speculation, num_ctx, pipeline)
    try:
        return run(prompt, **opts)
    finally:
        run.close()


@pytest.fixture
def plain():
    return lambda prompt, **opts: once(Speculation(enabled=False), prompt, **opts)


@pytest.fixture(params=["default", "eager"])
def spec(request):
    return lambda prompt, **opts: once(SPECS[request.param](), prompt, **opts)


@pytest.mark.parametrize("name,prompt,opts", CASES, ids=[c[0] for c in CASES])
def test_drafts_change_nothing(plain, spec, name, prompt, opts):
    want, want_samples, base = plain(prompt, **opts)
    got, got_samples, metrics = spec(prompt, **opts)
    assert got == want
    assert got_samples == want_samples  # the same positions sampled, in the same order
    assert base.draft_n == 0
    assert metrics.draft_n >= metrics.draft_n_accepted


def test_drafts_are_made_accepted_and_rejected(spec):
    """The cases above exercise drafts, both ways (not a test of the controller's choices)."""
    totals = [0, 0]
    for _, prompt, opts in CASES:
        _, _, m = spec(prompt, **opts)
        totals[0] += m.draft_n
        totals[1] += m.draft_n_accepted
    assert totals[1] > 50 and totals[0] - totals[1] > 5


@pytest.mark.parametrize("kind", ["default", "eager"])
@pytest.mark.parametrize("depth", [0, 3])
def test_draft_num_predict_caps_the_rows(kind, depth):
    run = Run(SPECS[kind]())
    try:
        _, _, m = run(CODE, num_predict=60, draft_num_predict=depth)
        prompt_batches = -(-len(run.engine.tokenize(CODE)) // 64)
        steps = run.engine.decodes[prompt_batches:]
        assert max(steps) == 1 + depth  # the sampled token and at most ``depth`` drafted ones
        assert (m.draft_n > 0) == (depth > 0)
    finally:
        run.close()


def test_logprobs(plain, spec):
    for prompt in (CODE, UTF8):
        assert spec(prompt, logprobs=True, num_predict=50)[0] == plain(prompt, logprobs=True, num_predict=50)[0]


def test_format(plain, spec):
    """The toy grammar forbids some drafted tokens: they fail to match, nothing else changes."""
    for opts in (dict(num_predict=60), dict(num_predict=60, temperature=0.8, seed=3)):
        want = plain(CODE, fmt="json", **opts)
        got = spec(CODE, fmt="json", **opts)
        assert got[:2] == want[:2]


@pytest.mark.parametrize("kind", ["default", "eager"])
@pytest.mark.parametrize("pipeline", [False, True], ids=["inline", "pipelined"])
def test_context_shift_while_drafting(kind, pipeline):
    """A context of 64 and 200 tokens: the slot shifts several times; drafts never pass the end
    of the context, and what a shift keeps is the same."""
    for prompt in (CODE[-50:], UTF8[:40]):
        for opts in (dict(num_predict=200), dict(num_predict=150, temperature=0.9, seed=11)):
            want = once(Speculation(enabled=False), prompt, 64, pipeline, **opts)
            got = once(SPECS[kind](), prompt, 64, pipeline, **opts)
            assert got[:2] == want[:2]
            assert got[2].draft_n_accepted > 0


@pytest.mark.parametrize("name,prompt,opts", CASES[:7], ids=[c[0] for c in CASES[:7]])
def test_pipelined(plain, name, prompt, opts):
    assert once(SPECS["eager"](), prompt, pipeline=True, **opts)[:2] == plain(prompt, **opts)[:2]


def test_no_drafts_beside_another_sequence(plain):
    """This first version drafts only for a sequence alone in the runner; the answers stay the
    same. (The long one makes 2,000 tokens: with 200, the loop thread, which holds the GIL while it
    decodes, once made them all before the short request was in.)"""
    run = Run(SPECS["eager"](), num_parallel=2)
    try:
        long = run.runner.stream(Request(prompt=CODE, raw=True, options=Options().merged({**GREEDY, "num_predict": 2000})))
        first = next(long)  # the long one is generating
        short = run(UTF8, num_predict=30)
        rest = list(long)
        assert short[2].draft_n == 0 and short[0] == plain(UTF8, num_predict=30)[0]
        want = plain(CODE, num_predict=2000)[0]
        assert [view(c) for c in [first] + rest] == want
    finally:
        run.close()


def test_drafts_without_num_predict(plain):
    """``num_predict`` 0 (no limit, as in Ollama's runner): drafts are bounded by the context
    alone."""
    for kind in SPECS:
        got = once(SPECS[kind](), EOG, num_predict=0)
        assert got[:2] == plain(EOG, num_predict=0)[:2]
        assert got[2].draft_n_accepted > 0
