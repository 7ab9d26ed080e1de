"""The new engine's sequence state export/import (CacheKv over Cache.export_seq/import_seq) and the
prompt store on it, on SmolLM2 and gemma-3-270m.

As in test_kvstore_llama.py, the baseline is the live sequence, not a recompute: K/V rows depend
on how the prompt was split into batches, and attention on where the cells sit, so "exact" means
a restored sequence continues bit for bit like the sequence it was exported from, fed the same
batches. The engine is driven directly (no batch loop), one sequence a batch.

Where the cells sit: all sequences share one pool of cells. A state goes back to the cells it was
exported from when they are free (the slot was emptied, or another took it and let go: always with
one slot), and then decodes bit for bit in every layout. When they are taken (the exported sequence
is still live beside it), it goes to the lowest free cells: with flash attention still bit for bit
(GGML's kernel skips masked cells and sums the others in cell order, which stays position order);
without it the attention's sums over the padded cell range (softmax, then V times the weights)
group the terms in SIMD lanes by where the cells sit, and the quantized matmuls that follow amplify
those last bits. Measured on SmolLM2 for three prompts: the turn's logits differ by at most
0.41-0.63 (a recompute of the prompt into those cells differs from the live one by 0.40 too), and
the greedy tokens agree for 5 to 8 steps, then may part. The test checks the rows arrived exactly
and bounds that difference; bitwise is what the cells it was exported from give.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import runner
from runner import config
from runner.api import Message, Options
from runner.engines.ggml.engine import GGMLEngine
from runner.kvcache import NotSupported, WrapperCache, snapshot
from runner.kvstore.key import Fingerprint
from runner.kvstore.ram import RamStore
from runner.kvstore.store import PromptStore
from runner.loop.slots import InputCache
from tests.conftest import fresh_cache_dir

from test_gemma3 import gemma3  # noqa: F401  (fetches gemma-3-270m once per session)
from kvturns import NUM_BATCH, evaluate, greedy, turn

STORY = ("The lighthouse keeper climbed the spiral stairs every evening, counting the steps as his "
         "father had taught him. There were one hundred and twelve of them, worn smooth in the middle "
         "by a century of boots. At the top he trimmed the wick, polished the great lens until it "
         "caught the last of the sunset, and wrote the weather into the log: wind from the west, sea "
         "moderate, a fishing boat returning late. ")
TURN = " The keeper asked himself what the sea would bring tomorrow, and answered:"
#: (kv_cache_type, flash_attention): q8_0 needs flash attention, permuted V (no FA) needs f16
LAYOUTS = [("f16", False), ("f16", True), ("q8_0", True)]


def make_engine(kv_type: str = "f16", flash: bool = False, *, model: str | None = None, num_parallel: int = 2,
                num_ctx: int = 512) -> GGMLEngine:
    cfg = dataclasses.replace(config.load({}), new_engine=True, flash_attention=flash, kv_cache_type=kv_type)
    info = runner.resolve(model, cfg).info
    plan = runner.load_options(info, Options().merged({"num_ctx": num_ctx, "num_batch": NUM_BATCH, "num_thread": 1}),
                               cfg, num_parallel)
    assert plan.kv_cache_type == kv_type and plan.flash_attention == flash
    return GGMLEngine(info, plan)


@pytest.fixture(scope="module", params=LAYOUTS, ids=["f16", "f16-fa", "q8_0-fa"])
def engine(request):
    e = make_engine(*request.param)
    yield e
    e.close()


def held(engine: GGMLEngine, seq: int, part: int = 0) -> tuple[list[int], list[int]]:
    """(positions, cells) that ``seq`` holds, ascending by position (``part``: which cache of a
    wrapper)."""
    cache = engine.model.cache
    table = (cache.caches[part] if isinstance(cache, WrapperCache) else cache).table
    pairs = sorted(zip(table.seq_positions(seq), table.seq_cells(seq)))
    return [p for p, _ in pairs], [c for _, c in pairs]


def converse(engine: GGMLEngine, seq: int, prompt: list[int], answer: int) -> int:
    """A conversation in the empty ``seq``: the prompt, then ``answer`` greedy tokens; its length."""
    first = evaluate(engine, prompt, 0, seq)
    tokens, _ = greedy(engine, first, len(prompt), seq, answer)
    return len(prompt) + len(tokens)


def continues(engine: GGMLEngine, seq: int, n: int, steps: int = 8) -> tuple[np.ndarray, list[int], list[np.ndarray]]:
    """The next turn in ``seq`` (which holds ``n`` positions): the turn's logits, then greedy."""
    turn = engine.tokenize(TURN, add_special=False)
    logits = evaluate(engine, turn, n, seq)
    return (logits, *greedy(engine, logits, n + len(turn), seq, steps))


def same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def rows_of(state) -> list[bytes]:
    """The K and V rows a state holds, per layer (not its cells)."""
    s = snapshot.read(state)
    return [b"".join((s.k_rows(i).tobytes(), s.v_rows(i).tobytes())) for i in range(len(s.geometry.layers))]


def empty(engine: GGMLEngine, *seqs: int) -> None:
    for seq in seqs:
        assert engine.kv.seq_rm(seq, 0, None)


# -------------------------------------------------------------------------------------- SmolLM2
def test_restored_sequence_continues_bit_for_bit(engine):
    kv = engine.kv
    empty(engine, 0, 1)
    prompt = engine.tokenize(STORY)
    n = converse(engine, 0, prompt, 5)
    assert held(engine, 0) == (list(range(n)), list(range(n)))
    state = kv.export_seq(0)
    per_cell = engine.model.cache.geometry().cell_bytes  # SmolLM2: 30 layers, K+V 768 B f16, 408 B q8_0
    assert len(state) > n * per_cell and per_cell == 30 * (768 if engine.model.cache.dtype == "f16" else 408)
    live, live_tokens, live_rows = continues(engine, 0, n)

    # another slot takes the state while its cells are free again (the exported slot was emptied)
    empty(engine, 0)
    assert kv.import_seq(1, state)
    assert held(engine, 1) == (list(range(n)), list(range(n)))
    assert kv.export_seq(1) == state  # the same bytes in the same cells
    logits, tokens, rows = continues(engine, 1, n)
    assert np.array_equal(logits, live) and tokens == live_tokens and same(rows, live_rows)

    # the same slot, emptied (another conversation took it), gets its state back
    empty(engine, 1)
    assert kv.import_seq(0, bytes(state))  # an immutable copy imports too
    logits, tokens, rows = continues(engine, 0, n)
    assert np.array_equal(logits, live) and tokens == live_tokens and same(rows, live_rows)

    # a restored state cuts back like a computed one: continue from a shorter prefix
    empty(engine, 0)
    assert kv.import_seq(1, state)
    assert kv.seq_rm(1, len(prompt), None)
    assert held(engine, 1)[0] == list(range(len(prompt)))


def test_restored_beside_the_live_sequence(engine):
    """The exported cells are taken: the state lands in the lowest free cells."""
    kv = engine.kv
    empty(engine, 0, 1)
    n = converse(engine, 0, engine.tokenize(STORY), 5)
    state = kv.export_seq(0)
    assert kv.import_seq(1, state)
    assert held(engine, 1) == (list(range(n)), list(range(n, 2 * n)))
    assert rows_of(kv.export_seq(1)) == rows_of(state)  # the same rows, in other cells

    live, live_tokens, live_rows = continues(engine, 0, n)
    logits, tokens, rows = continues(engine, 1, n)
    if engine.model.cache.config.permuted_v:  # no flash attention: see the module's doc
        assert float(np.abs(logits - live).max()) < 1.5  # measured 0.41-0.63; garbage is 10+
    else:
        assert np.array_equal(logits, live) and tokens == live_tokens and same(rows, live_rows)


def test_damaged_or_foreign_state_is_refused_and_leaves_the_slot_empty(engine):
    kv = engine.kv
    empty(engine, 0, 1)
    prompt = engine.tokenize(STORY)[:40]
    evaluate(engine, prompt, 0, 0)
    state = kv.export_seq(0)
    evaluate(engine, prompt[:20], 0, 1)
    other = kv.export_seq(1)

    def refused(data) -> None:
        assert not kv.import_seq(1, data)
        assert held(engine, 1) == ([], [])
        assert held(engine, 0)[0] == list(range(40)) and kv.export_seq(0) == state  # untouched
        assert kv.import_seq(1, other)  # seq 1 holds something the next refusal must drop

    refused(state[: len(state) // 2])
    refused(b"")
    for at in (0, 4):  # the magic, the version (a K/V byte is data: the store's files carry the checksum)
        bad = bytearray(state)
        bad[at] ^= 0x01
        refused(bad)
    kv_type, flash = engine.model.cache.dtype, not engine.model.cache.config.permuted_v
    foreign = make_engine(*(("f16", not flash) if kv_type == "f16" else ("f16", True)), num_parallel=1)
    try:
        assert foreign.kv.state_layout != kv.state_layout
        evaluate(foreign, prompt, 0, 0)
        refused(foreign.kv.export_seq(0))  # another V layout or dtype
        assert not foreign.kv.import_seq(0, state) and held(foreign, 0) == ([], [])
    finally:
        foreign.close()
    assert kv.import_seq(1, state)  # the intact state still imports


# ---------------------------------------------------------------------------------------- pages
def page_bounds(n: int, block: int = 16) -> list[int]:
    return [*range(0, n, block), n]


def test_a_state_cut_into_pages_joins_back_to_its_bytes(engine):
    kv = engine.kv
    empty(engine, 0, 1)
    n = converse(engine, 1, engine.tokenize(STORY)[:60], 3)
    state = kv.export_seq(1)
    parts = kv.split_state(state, page_bounds(n))
    assert parts is not None and len(parts) == (n + 15) // 16
    assert kv.join_states(parts) == state  # the same bytes, cells included
    assert kv.import_seq(0, parts[0]) and held(engine, 0)[0] == list(range(16))  # a page is a state of its own
    assert kv.import_seq(0, kv.join_states(parts[:3])) and held(engine, 0)[0] == list(range(48))
    assert kv.split_state(state, page_bounds(n - 1)) is None  # not exactly its positions: kept whole
    assert kv.split_state(snapshot.pack([state]), page_bounds(n)) is None  # a wrapper's: kept whole
    with pytest.raises(ValueError):
        kv.join_states([parts[1], parts[0]])  # positions must ascend
    # the prompt store's new pages of a conversation it holds the start of: exported from there,
    # the same bytes a cut of the whole state gives, in a buffer of their own
    tail = kv.export_seq(1, 32)
    assert tail == kv.split_state(state, [0, 32, n], {0})[1] and len(tail) < len(state) // 2
    assert kv.join_states([parts[0], parts[1], (tail, 0, n - 32)]) == state


def test_a_shared_prefix_s_pages_serve_another_conversation(engine):
    """B restored from A's pages of their shared start and its own after: it continues as B's
    live sequence does, up to rounding: A computed its rows for the shared start in its own cells
    (B in others: the attention's sums round by where the cells sit, see the module's doc), and
    the restored B's cells are A's for the shared start, B's after, with the next turn in the
    gap between them."""
    kv = engine.kv
    empty(engine, 0, 1)
    system = engine.tokenize(STORY)[:64]  # 4 blocks
    a = system + engine.tokenize(" Who climbed the stairs every evening?", add_special=False)
    b = system + engine.tokenize(" What did the keeper write into the log?", add_special=False)
    evaluate(engine, a, 0, 0)
    evaluate(engine, b, 0, 1)
    pages_a = kv.split_state(kv.export_seq(0), page_bounds(len(a)))
    pages_b = kv.split_state(kv.export_seq(1), page_bounds(len(b)))
    mixed = kv.join_states(pages_a[:4] + pages_b[4:])
    live, live_tokens, _ = continues(engine, 1, len(b))
    empty(engine, 0, 1)  # the cells both were exported from are free: the pages go back to them
    assert kv.import_seq(0, mixed)
    logits, tokens, _ = continues(engine, 0, len(b))
    assert float(np.abs(logits - live).max()) < 1.5  # measured 0.35-0.57 (garbage is 10+)
    assert tokens[:5] == live_tokens[:5]  # measured: all 8 agree


# ----------------------------------------------------------------------- the prompt store, runner
DOC = ("The lighthouse keeper climbed the spiral stairs every evening, counting the steps as his father "
       "had taught him. There were one hundred and twelve of them, worn smooth by a century of boots. ") * 4
OTHER = ("A recipe for bread: flour, water, salt and yeast, kneaded for ten minutes, left to rise "
         "twice, then baked hot until the crust sings when it cools. ") * 4


def load_new(cache_ram: int, pipeline: bool = False, cache_disk: int = 0, cache_dir=None):
    """SmolLM2 on the new engine, one slot; RAM store only unless ``cache_disk`` (MiB) is given."""
    cfg = dataclasses.replace(config.load({}), new_engine=True, cache_ram=cache_ram, pipeline=pipeline,
                              cache_disk=cache_disk, cache_dir=cache_dir or fresh_cache_dir())
    r = runner.load(runner.resolve(None, cfg), Options().merged({"num_ctx": 1024, "num_thread": 1}), cfg,
                    num_parallel=1)
    assert r.engine == "new"
    return r


A = [Message("user", "Read this and tell me how many steps there were.\n\n" + DOC)]
B = [Message("user", "Summarise this recipe.\n\n" + OTHER)]
A_NEXT = "And who taught him to count them?"


@pytest.fixture(scope="module")
def warm():
    """A's two turns on a runner without a store, whose one slot keeps A warm: (first turn, second
    turn), each (text, metrics, logprobs)."""
    plain = load_new(0)
    try:
        assert plain.cache.store is None
        first = turn(plain, A)
        second = turn(plain, A + [Message("assistant", first[0]), Message("user", A_NEXT)])
    finally:
        plain.close()
    return first, second


@pytest.mark.parametrize("pipeline", [False, True], ids=["inline", "pipeline"])
def test_an_evicted_conversation_resumes_from_ram_exactly(warm, pipeline):
    """One slot with a RAM store, decoding inline or on a compute thread (the store is used between
    decodes, on the loop thread, either way): A, then B (which takes the slot: A's state goes to
    RAM), then A's next turn (restored) caches as much and gives the same greedy tokens with
    bitwise equal log-probabilities as A's warm slot."""
    (answer, m1, _), (want_text, want, want_lp) = warm
    stored = load_new(64, pipeline=pipeline)
    try:
        assert stored.cache.store is not None
        assert turn(stored, A)[0] == answer and m1.prompt_eval_count > 100

        _, mb, _ = turn(stored, B)  # B takes the only slot: A goes to RAM
        assert mb.prompt_cached_count < m1.prompt_eval_count / 2
        assert stored.cache.store.used > 0

        got_text, got, got_lp = turn(stored, A + [Message("assistant", answer), Message("user", A_NEXT)])
        assert got.prompt_cached_count == want.prompt_cached_count > m1.prompt_eval_count
        assert got.prompt_eval_count == want.prompt_eval_count
        assert got_text == want_text
        assert got_lp == want_lp  # bitwise: floats compared exactly

        # B comes back too (A's longer state went to RAM when B took the slot back)
        _, mb2, _ = turn(stored, B + [Message("assistant", "Bread."), Message("user", "How long does it bake?")])
        assert mb2.prompt_cached_count >= mb.prompt_eval_count
    finally:
        stored.close()


def test_a_conversation_resumes_from_disk_after_an_unload(warm):
    """The disk tier on the new engine: a runner that unloads writes its slot's state; the next
    load of the same model and settings restores it for A's next turn, bit for bit."""
    (answer, m1, _), (want_text, want, want_lp) = warm
    folder = fresh_cache_dir()
    first = load_new(0, cache_disk=64, cache_dir=folder)
    try:
        assert turn(first, A)[0] == answer
    finally:
        first.close()  # the unload writes the slot to disk before it returns
    assert list((folder / "kv").glob("*.kv"))
    second = load_new(0, cache_disk=64, cache_dir=folder)
    try:
        got_text, got, got_lp = turn(second, A + [Message("assistant", answer), Message("user", A_NEXT)])
        assert got.prompt_cache_source == "disk"
        assert got.prompt_cached_count == want.prompt_cached_count > m1.prompt_eval_count
        assert (got_text, got_lp) == (want_text, want_lp)  # bitwise
    finally:
        second.close()


# ------------------------------------------------------------------------- gemma3: sliding window
@pytest.fixture(scope="module")
def gemma(gemma3):  # noqa: F811
    # one slot, num_ctx 1024: the window layers keep 511 positions (+ a batch) in 768 cells
    e = make_engine(model=str(gemma3), num_parallel=1, num_ctx=1024)
    yield e
    e.close()


@pytest.mark.slow
def test_a_sliding_window_state_resumes_bit_for_bit(gemma):
    kv = gemma.kv
    empty(gemma, 0)
    window = gemma.model.cache.caches[0].table.swa_window
    prompt = gemma.tokenize(STORY * 8)[:600]
    n = converse(gemma, 0, prompt, 200)  # one token a step past the 768 cells: the ring wraps
    assert n > window + NUM_BATCH
    local, full = held(gemma, 0, 0), held(gemma, 0, 1)
    assert local[0] == list(range(n - 1 - window, n)) and full[0] == list(range(n))  # the window kept
    assert local[1] != sorted(local[1])  # its cells wrapped around: not in position order
    state = kv.export_seq(0)
    assert kv.split_state(state, [*range(0, n, 16), n]) is None  # a window is kept whole, not as pages
    with pytest.raises(NotSupported):
        kv.export_seq(0, 16)  # nor exported in part
    live, live_tokens, live_rows = continues(gemma, 0, n)

    empty(gemma, 0)
    assert kv.import_seq(0, state)
    assert held(gemma, 0, 0) == local and held(gemma, 0, 1) == full  # the same cells, wrapped as they were
    # it serves its end, and the one position before (the window of n - 1 starts at n - 1 - window),
    # never a shorter prefix: those windows need cells it no longer holds
    assert kv.can_resume(0, n) and kv.can_resume(0, n - 1) and not kv.can_resume(0, n - 2)
    logits, tokens, rows = continues(gemma, 0, n)
    assert np.array_equal(logits, live) and tokens == live_tokens and same(rows, live_rows)

    smol = make_engine(num_parallel=1)
    try:  # a causal cache's state is not a wrapper's, nor the other way round
        evaluate(smol, smol.tokenize(STORY)[:20], 0, 0)
        assert not kv.import_seq(0, smol.kv.export_seq(0)) and held(gemma, 0, 1) == ([], [])
        assert not smol.kv.import_seq(0, state) and held(smol, 0) == ([], [])
    finally:
        smol.close()


@pytest.mark.slow
def test_the_slot_cache_resumes_a_stored_window_only_at_its_end(gemma):
    """The slot cache over the store (as the runner holds them): a conversation longer than the
    window, evicted, comes back from the store for its next turn; a prompt that shares only an
    earlier prefix of it imports the state, then ``can_resume`` says no and it is recomputed."""
    empty(gemma, 0)
    fp = Fingerprint("new", gemma.kv.state_layout, "gemma", "", "f16", False, 1024)
    store = PromptStore(fp, RamStore(1 << 30))
    slots = InputCache(gemma.kv, 1024, 1, multi_user=False, store=store)

    def run(prompt: list[int]) -> int:
        slot, todo = slots.load_slot(prompt)
        evaluate(gemma, todo, len(prompt) - len(todo), slot.id)
        slot.inputs = list(prompt)
        slots.release(slot)
        return len(prompt) - len(todo)  # reused

    a = gemma.tokenize(STORY * 8)[:600]
    b = gemma.tokenize("A recipe for bread: flour, water, salt and yeast, kneaded for ten minutes.")
    assert run(a) == 0
    assert run(b) == 0 and store.used > 0  # (the shared BOS is out of A's window); A went to the store
    more = gemma.tokenize(TURN, add_special=False)
    assert run(a + more) == len(a)  # A back from the store: only the new turn is evaluated
    assert run(b) == len(b) - 1  # B back from the store too (its last token is evaluated again)
    edited = a[:500] + more  # shares 500 inputs with A's state, but their window is gone
    slot, todo = slots.load_slot(edited)
    assert todo == edited and held(gemma, slot.id, 0) == ([], [])
    slots.release(slot)
    assert store.lookup(a + more + more).n == len(a + more)  # A's state stays stored for A
