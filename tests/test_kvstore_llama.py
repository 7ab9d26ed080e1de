"""The old engine's sequence state export/import (LlamaKv.export_seq/import_seq) on SmolLM2.

The baseline is the live sequence, not a recompute: K/V rows depend on how the prompt was split
into batches (a different split moves logits), so "exact" means a restored sequence continues
bit for bit like the sequence it was exported from, fed the same batches. The engine is driven
directly (no batch loop), one sequence a batch, so both runs see the same splits.
"""

from __future__ import annotations

import dataclasses

import llama_cpp as L
import numpy as np
import pytest

import runner
from runner import config
from runner.api import Options
from runner.engines.llamacpp.engine import LlamaEngine
from kvturns import NUM_BATCH, evaluate, greedy

STORY = ("The lighthouse keeper climbed the spiral stairs every evening, counting the steps as his "
         "father had taught him. There were one hundred and twelve of them, worn smooth in the middle "
         "by a century of boots. At the top he trimmed the wick, polished the great lens until it "
         "caught the last of the sunset, and wrote the weather into the log: wind from the west, sea "
         "moderate, a fishing boat returning late. ") * 3


def make_engine(num_parallel: int) -> LlamaEngine:
    # one thread: llama.cpp's threads spin at every barrier, and on a busy 2-core machine a
    # second thread made this file take minutes instead of seconds
    cfg = dataclasses.replace(config.load({}), new_engine=False)
    info = runner.resolve(None, cfg).info
    plan = runner.load_options(info, Options().merged({"num_ctx": 1024, "num_batch": NUM_BATCH, "num_thread": 1}),
                               cfg, num_parallel)
    return LlamaEngine(info, plan)


@pytest.fixture(scope="module")
def engine():
    e = make_engine(2)
    yield e
    e.close()


def positions(engine: LlamaEngine, seq: int) -> tuple[int, int]:
    mem = engine.kv.mem
    return L.llama_memory_seq_pos_min(mem, seq), L.llama_memory_seq_pos_max(mem, seq)


def test_restored_sequence_continues_bit_for_bit(engine):
    kv = engine.kv
    for seq in (0, 1):
        kv.seq_rm(seq, 0, None)
    prompt = engine.tokenize(STORY)
    assert len(prompt) > 3 * NUM_BATCH
    first = evaluate(engine, prompt, 0, 0)
    answer, _ = greedy(engine, first, len(prompt), 0, 7)  # a conversation: prompt, then an answer
    n = len(prompt) + len(answer)
    assert positions(engine, 0) == (0, n - 1)

    state = kv.export_seq(0)
    assert state is not None and len(state) > n * 1000  # SmolLM2: ~22.5 KiB a token in f16
    assert kv.import_seq(1, state)
    assert positions(engine, 1) == (0, n - 1)

    turn = engine.tokenize(" The keeper asked himself what the sea would bring tomorrow, and answered:")
    live = evaluate(engine, turn, n, 0)
    live_tokens, live_rows = greedy(engine, live, n + len(turn), 0, 12)

    restored = evaluate(engine, turn, n, 1)
    assert np.array_equal(restored, live)
    tokens, rows = greedy(engine, restored, n + len(turn), 1, 12)
    assert tokens == live_tokens
    assert all(np.array_equal(a, b) for a, b in zip(rows, live_rows))

    # the same slot, emptied (another conversation took it), gets its state back
    assert kv.import_seq(0, bytes(state))  # an immutable copy imports too
    assert positions(engine, 0) == (0, n - 1)
    again = evaluate(engine, turn, n, 0)
    assert np.array_equal(again, live)
    tokens, rows = greedy(engine, again, n + len(turn), 0, 12)
    assert tokens == live_tokens
    assert all(np.array_equal(a, b) for a, b in zip(rows, live_rows))

    # a restored state cuts back like a computed one: continue from a shorter prefix
    assert kv.import_seq(1, state)
    assert kv.seq_rm(1, len(prompt), None)
    assert positions(engine, 1) == (0, len(prompt) - 1)


def test_damaged_or_foreign_state_is_refused_and_leaves_the_slot_empty(engine):
    kv = engine.kv
    kv.seq_rm(0, 0, None)
    prompt = engine.tokenize(STORY)[:100]
    evaluate(engine, prompt, 0, 0)
    state = kv.export_seq(0)
    kv.seq_rm(1, 0, None)
    evaluate(engine, prompt, 0, 1)  # seq 1 holds something the failed import must drop

    assert not kv.import_seq(1, state[: len(state) // 2])
    assert positions(engine, 1)[1] == -1
    assert not kv.import_seq(1, b"")
    bad = bytearray(state)
    bad[0] ^= 0xFF  # the magic
    assert not kv.import_seq(1, bad)
    assert positions(engine, 1)[1] == -1
    assert kv.import_seq(1, state)  # the intact state still imports

    other = make_engine(1)  # one KV stream, not two: llama.cpp's blob is tied to the count
    try:
        assert other.kv.state_layout != kv.state_layout
        assert not other.kv.import_seq(0, state)
        assert positions(other, 0)[1] == -1
    finally:
        other.close()


# ------------------------------------------------------------------------------------- pages
def page_bounds(n: int, block: int = 16) -> list[int]:
    return [*range(0, n, block), n]


@pytest.fixture(scope="module", params=[False, True], ids=["v-trans", "fa"])
def paged(request):
    """Two streams, flash attention off (V transposed in the state) or on."""
    cfg = dataclasses.replace(config.load({}), new_engine=False, flash_attention=request.param)
    info = runner.resolve(None, cfg).info
    plan = runner.load_options(info, Options().merged({"num_ctx": 1024, "num_batch": NUM_BATCH, "num_thread": 1}),
                               cfg, 2)
    assert plan.flash_attention == request.param
    e = LlamaEngine(info, plan)
    yield e
    e.close()


def test_a_state_cut_into_pages_joins_back_to_its_bytes(paged):
    kv = paged.kv
    for seq in (0, 1):
        kv.seq_rm(seq, 0, None)
    prompt = paged.tokenize(STORY)[:150]
    first = evaluate(paged, prompt, 0, 1)
    greedy(paged, first, len(prompt), 1, 3)
    n = len(prompt) + 3
    state = kv.export_seq(1)
    parts = kv.split_state(state, page_bounds(n))
    assert parts is not None and len(parts) == (n + 15) // 16
    assert kv.join_states(parts) == state  # the same bytes
    three = bytes(kv.join_states(parts[:3]))  # a join is valid until the next (the buffer is reused)
    assert three == kv.join_states([kv.join_states(parts[:2]), parts[2]])
    assert kv.import_seq(0, parts[0]) and positions(paged, 0) == (0, 15)  # a page is a state of its own
    assert kv.import_seq(0, kv.join_states(parts[:4])) and positions(paged, 0) == (0, 63)
    assert kv.split_state(state, page_bounds(n - 1)) is None  # not exactly its positions: kept whole
    assert kv.split_state(b"not a state", page_bounds(n)) is None
    with pytest.raises(ValueError):
        kv.join_states([parts[1], parts[0]])  # positions must ascend
    tail = kv.export_seq(1, 32)  # the prompt store's new pages: llama.cpp exports all, cut from 32 on
    assert tail == kv.split_state(state, [0, 32, n], {0})[1]
    assert kv.join_states([parts[0], parts[1], (tail, 0, n - 32)]) == state


def test_a_shared_prefix_s_pages_serve_another_conversation(paged):
    """B restored from A's pages of their shared start and its own after: it continues as B's
    live sequence does, up to the batch rounding of the rows A computed for B."""
    kv = paged.kv
    for seq in (0, 1):
        kv.seq_rm(seq, 0, None)
    system = paged.tokenize(STORY)[:96]  # 6 blocks
    a = system + paged.tokenize(" Who climbed the stairs every evening?", add_special=False)
    b = system + paged.tokenize(" What did the keeper write into the log?", add_special=False)
    evaluate(paged, a, 0, 0)
    evaluate(paged, b, 0, 1)
    pages_a = kv.split_state(kv.export_seq(0), page_bounds(len(a)))
    pages_b = kv.split_state(kv.export_seq(1), page_bounds(len(b)))
    mixed = kv.join_states(pages_a[:6] + pages_b[6:])
    turn = paged.tokenize(" He answered:", add_special=False)
    live = evaluate(paged, turn, len(b), 1)
    live_tokens, _ = greedy(paged, live, len(b) + len(turn), 1, 8)
    assert kv.import_seq(0, mixed)
    got = evaluate(paged, turn, len(b), 0)
    tokens, _ = greedy(paged, got, len(b) + len(turn), 0, 8)
    assert float(np.abs(got - live).max()) < 1.5 and tokens == live_tokens  # measured: 0.0 (FA on and off)
