"""Engine.batch_add's ``outputs``: a sampled token and K drafted ones in one call, every row read
back (the verification step of speculative decoding, runner.spec), on both engines.

The reference is the plain path: the same tokens decoded one per batch. Batched rows are not bit
for bit the same as one-row decodes on GGML's CPU kernels (one row takes vec_dot, several take
tinyBLAS, with another summation order; notes of issue 26, section C), so the rows are compared
with a tolerance that is far below the gaps between a row's best logits here, and their argmax
exactly. The rows must also be the right ones: each differs from its neighbours.
Then the rollback: ``kv.seq_rm`` of the rejected tail, and decoding goes on as if the rejected
tokens had never been there.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import runner
from runner import config
from runner.api import Options
from tests.conftest import STORIES
from tests.test_spec_models import gemma3_path  # noqa: F401  (the fixture)

PROMPT = "Once upon a time, there was a little girl named Lily. She liked to play"


def make_engine(kind: str):
    cfg = dataclasses.replace(config.load({}), new_engine=(kind == "new"))
    info = runner.resolve(str(STORIES), cfg).info
    plan = runner.load_options(info, Options().merged({"num_ctx": 256, "num_batch": 32, "num_thread": 1}), cfg, 1)
    if kind == "new":
        from runner.engines.ggml.engine import GGMLEngine

        return GGMLEngine(info, plan)
    from runner.engines.llamacpp.engine import LlamaEngine

    return LlamaEngine(info, plan)


@pytest.fixture(params=["old", "new"])
def engine(request):
    e = make_engine(request.param)
    yield e
    e.close()


def decode(engine, tokens: list[int], pos: int, outputs: int = 1) -> list[np.ndarray]:
    """Decode ``tokens`` at ``pos`` of sequence 0 in one batch; the last ``outputs`` rows' logits."""
    engine.batch_begin()
    last = engine.batch_add(tokens, pos, 0, outputs)
    engine.prepare()
    engine.decode()
    return [engine.logits(last - outputs + 1 + i).copy() for i in range(outputs)]


def plain(engine, prompt: list[int], steps: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy ``steps`` tokens after ``prompt``, one token a batch; the tokens and each one's
    logits (the logits after the prompt first)."""
    engine.kv.seq_rm(0, 0, None)
    rows = decode(engine, prompt, 0)
    tokens = [int(np.argmax(rows[-1]))]
    for k in range(steps):
        rows += decode(engine, [tokens[-1]], len(prompt) + k)
        tokens.append(int(np.argmax(rows[-1])))
    return tokens, rows


def test_rows_of_a_drafted_batch_read_back_and_the_tail_rolls_back(engine):
    prompt = engine.tokenize(PROMPT)
    K = 6
    tokens, ref = plain(engine, prompt, K + 4)
    # the target's own continuation as the draft, its last two tokens wrong
    draft = tokens[1 : K + 1]
    draft[-2:] = [(t + 7) % engine.n_vocab for t in draft[-2:]]
    engine.kv.seq_rm(0, 0, None)
    decode(engine, prompt, 0)
    rows = decode(engine, [tokens[0]] + draft, len(prompt), outputs=1 + K)
    assert len(rows) == 1 + K
    for i in range(K - 1):  # rows 0..K-2 follow an accepted prefix: they are the plain path's
        assert np.allclose(rows[i], ref[1 + i], atol=1e-3), i
        assert int(np.argmax(rows[i])) == tokens[1 + i]
        assert not np.array_equal(rows[i], rows[i + 1])
    # K-2 drafted tokens accepted: drop the rest and decode the target's token at the mismatch
    accepted = K - 2
    assert int(np.argmax(rows[accepted])) == tokens[accepted + 1] != draft[accepted]
    assert engine.kv.seq_rm(0, len(prompt) + 1 + accepted, None)
    pos = len(prompt) + 1 + accepted
    for k in range(3):
        (row,) = decode(engine, [tokens[accepted + 1 + k]], pos + k)
        assert np.allclose(row, ref[accepted + 2 + k], atol=1e-3)
        assert int(np.argmax(row)) == tokens[accepted + 2 + k]


def test_one_output_is_still_the_default(engine):
    prompt = engine.tokenize(PROMPT)
    engine.kv.seq_rm(0, 0, None)
    engine.batch_begin()
    last = engine.batch_add(prompt, 0, 0)
    engine.prepare()
    engine.decode()
    assert last == len(prompt) - 1 and engine.logits(last).shape == (engine.n_vocab,)


@pytest.mark.slow
def test_no_step_of_a_drafted_answer_grows_the_new_engine_s_compute_buffer(gemma3_path):  # noqa: F811
    """The new engine sizes its compute buffer at load for the worst prompt and the worst step
    verifying a draft (decoded rows have their own graph layout: a 33-row step of gemma-3-270m
    needed 80 KiB more than the prompt's worst case). Grown mid-answer, the buffer would make every
    built graph stale (built again, or under the pipeline a request failing). After a 509-token
    prompt, steps of 33, 17 and 5 decoded rows leave it as it was."""
    from runner.engines.ggml.engine import GGMLEngine

    cfg = dataclasses.replace(config.load({}), new_engine=True)
    info = runner.resolve(str(gemma3_path), cfg).info
    plan = runner.load_options(info, Options().merged({"num_ctx": 2048, "num_batch": 512, "num_thread": 2}), cfg, 1)
    engine = GGMLEngine(info, plan)
    try:
        backend = engine.model.backend
        size, generation = backend.compute_buffer_size, backend.generation
        ids = engine.tokenize(PROMPT * 60)[:560]
        decode(engine, ids[:509], 0)
        for n in (33, 17, 5):
            decode(engine, ids[509:509 + n], 509, n)
            engine.kv.seq_rm(0, 509, None)
        assert (backend.compute_buffer_size, backend.generation) == (size, generation)
    finally:
        engine.close()
