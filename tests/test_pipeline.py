"""Pipelined decoding (runner.loop.pipeline.ThreadDecoder): the next batch is built and prepared
while one decodes, its sampled tokens filled in afterwards. Same answers as the inline decoder,
on both engines, through stops, context shifts, parallel sequences and cancellation."""

from __future__ import annotations

import threading

import pytest

from runner.api import DoneReason, Options, Request
from tests.conftest import TINYSTORIES, collect, load

GREEDY = dict(temperature=0.0, repeat_penalty=1.0)
PROMPTS = ["Once upon a time", "The little dog", "Lily wanted to"]


def run(r, prompt, **opts):
    text, final = collect(r.stream(Request(prompt=prompt, raw=True, options=Options().merged({**GREEDY, **opts}))))
    return text, final.done_reason, final.metrics.eval_count, final.context


@pytest.fixture
def pair(engine):
    """The same model loaded twice: decoding inline, and pipelined (with its fills counted)."""
    inline = load(TINYSTORIES, engine, num_parallel=3, num_ctx=128)
    piped = load(TINYSTORIES, engine, num_parallel=3, num_ctx=128, pipeline=True)
    fills = []
    fill = piped.model_engine.fill

    def counting(row, token):
        fills.append(token)
        fill(row, token)

    piped.model_engine.fill = counting  # type: ignore[method-assign]
    try:
        yield inline, piped, fills
    finally:
        inline.close()
        piped.close()


def test_pipelined_answers_match_inline_ones(pair):
    inline, piped, fills = pair
    for prompt in PROMPTS:
        # 300 tokens in a context of 128: several shifts, where the pipeline waits for the batch
        for opts in ({"num_predict": 24}, {"num_predict": 300}, {"num_predict": 80, "stop": ["."]}):
            assert run(piped, prompt, **opts) == run(inline, prompt, **opts), (prompt, opts)
    assert len(fills) > 100  # sampled tokens went into batches built ahead


def test_pipelined_parallel_sequences_match_inline_serial(pair):
    inline, piped, fills = pair
    serial = [run(inline, p, num_predict=40)[0] for p in PROMPTS]
    results: list[str | None] = [None] * len(PROMPTS)

    def worker(i: int) -> None:
        results[i] = run(piped, PROMPTS[i], num_predict=40)[0]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == serial and fills


def test_pipelined_cancel_frees_the_slot_and_keeps_the_cache_right(pair):
    inline, piped, _ = pair
    request = Request(prompt="Once upon a time", raw=True, options=Options().merged({**GREEDY, "num_predict": -1}))
    stream = piped.stream(request)
    for _ in range(5):
        next(stream)
    request.cancel.set()
    assert list(stream)[-1].done_reason is DoneReason.CONNECTION_CLOSED
    assert piped.pending() == 0
    # the slot's cache holds what was decoded, nothing of the batch dropped when it was cancelled
    again = run(piped, "Once upon a time there was", num_predict=16)
    assert again == run(inline, "Once upon a time there was", num_predict=16)
