"""The new engine's Q4_1 kernels (runner/ml/ggml/q4_1.c): several rows at a time, GGML's numbers.

They replace GGML's one-row dot products only where they give the same bits: checked against
GGML's own ``ggml_vec_dot_q4_1_q8_1`` when first used, and here through a real model, whose logits
must not move by one bit with the kernels on or off, for a prompt and for a step of drafted rows.
How much faster they are: ``bench/bench_rows.py`` (``--engines new,new-ggml``).
"""

from __future__ import annotations

import platform

import numpy as np
import pytest

from runner.ml.backend import BackendOptions
from runner.ml.ggml import bindings as g
from runner.ml.ggml import q4_1
from runner.model.models import Batch
from runner.model.models import load as load_model
from tests.conftest import SMOLLM2

X86_AVX2 = platform.machine() in ("x86_64", "AMD64") and bool(g.ggml_cpu_has_avx2())


def test_the_kernels_run_where_they_can_and_their_check_has_teeth():
    """On an x86-64 machine with AVX2 the kernels pass their check against GGML's dot product;
    against GGML's scalar reference (the same sums in another order) the same check finds
    differences, so it compares bits, not closeness. Elsewhere they step aside (GGML's own
    products: the kernels are written for AVX2)."""
    if not X86_AVX2:
        assert q4_1.variant() == "" and q4_1.kernels() is None
        return
    from runner.ml.ggml import _q4_1

    assert q4_1.variant() in ("avx2", "avx512-vnni")
    runs = _q4_1.variants()
    assert runs[0] == q4_1.variant() and "avx2" in runs  # a VNNI machine checks the AVX2 tiles too
    for variant in runs:
        assert _q4_1.check(g.cpu_function("ggml_vec_dot_q4_1_q8_1"), variant) == 0
        assert _q4_1.check(g.cpu_function("ggml_vec_dot_q4_1_q8_1_generic"), variant) > 0


def _logits(row_kernels: bool, flash: bool, monkeypatch) -> tuple[np.ndarray, np.ndarray, list[tuple[int, bool]]]:
    """SmolLM2's logits for every row of a 300-token prompt and of a 17-row step after it, and
    the Q4_1 products asked of our kernels: (rows, whether they took it)."""
    recorded = []
    product = q4_1.product

    def counting(c, w, b):
        ptr = product(c, w, b)
        recorded.append((b.ne[1], ptr is not None))
        return ptr

    monkeypatch.setattr(q4_1, "product", counting)
    rng = np.random.default_rng(7)
    prompt = [int(t) for t in rng.integers(100, 20000, 300)]
    step = [int(t) for t in rng.integers(100, 20000, 17)]
    model = load_model(SMOLLM2, BackendOptions(num_threads=2, flash_attention=flash, row_kernels=row_kernels))
    try:
        model.init_cache(num_ctx=1024, num_parallel=1, num_batch=512)
        first = model.compute(Batch.sequence(prompt, all_logits=True)).copy()
        drafted = model.compute(Batch.sequence(step, start=300, all_logits=True)).copy()
    finally:
        model.close()
    return first, drafted, recorded


@pytest.mark.parametrize("flash", [False, True], ids=["nofa", "fa"])
def test_smollm2_s_logits_are_the_same_bits_with_the_kernels(flash, monkeypatch):
    """SmolLM2-135M Q4_1: 210 of its matrices are Q4_1 (7 a layer). With the kernels, every
    product of several rows in a prompt and in a step of drafted rows is theirs (one row stays
    GGML's), and no logit of any row differs from GGML's own products in any bit (so the
    logits stay llama.cpp's, as test_ggml_models checks against llama.cpp itself)."""
    first, drafted, asked = _logits(True, flash, monkeypatch)
    first_ggml, drafted_ggml, not_asked = _logits(False, flash, monkeypatch)
    if X86_AVX2:
        assert all(taken == (rows > 1) for rows, taken in asked)
        assert sum(taken for _, taken in asked) >= 2 * 7 * 30 and not not_asked
    assert np.array_equal(first, first_ggml) and np.array_equal(drafted, drafted_ggml)


def _old_engine_logits(row_kernels: bool, flash: bool) -> tuple[list[np.ndarray], list[np.ndarray], int]:
    """The old engine's SmolLM2 logits for every row of a 300-token prompt and of a 17-row step
    after it (all rows outputs, as a verified draft), and the Q4_1 products our kernels took."""
    import dataclasses

    import runner
    from runner import config
    from runner.api import Options
    from tests.conftest import fresh_cache_dir

    cfg = dataclasses.replace(config.load({}), new_engine=False, row_kernels=row_kernels, flash_attention=flash,
                              cache_dir=fresh_cache_dir())
    r = runner.load(runner.resolve(str(SMOLLM2), cfg), Options().merged({"num_ctx": 1024}), cfg)
    engine = r.model_engine
    rng = np.random.default_rng(7)
    prompt = [int(t) for t in rng.integers(100, 20000, 300)]
    step = [int(t) for t in rng.integers(100, 20000, 17)]
    try:
        rows = []
        for tokens, pos in ((prompt, 0), (step, 300)):
            engine.batch_begin()
            last = engine.batch_add(tokens, pos, 0, len(tokens))
            engine.prepare()
            engine.decode()
            rows.append([engine.logits(last - len(tokens) + 1 + i).copy() for i in range(len(tokens))])
        return rows[0], rows[1], engine._ops.taken[0] if engine._ops is not None else 0
    finally:
        r.close()


@pytest.mark.parametrize("flash", [False, True], ids=["nofa", "fa"])
def test_the_old_engine_s_logits_are_the_same_bits_with_the_kernels(flash):
    """The old engine hands llama.cpp an eval callback that has our kernels compute its Q4_1
    products of several rows (runner/engines/llamacpp/graph_ops.py): all 7 a layer, 30 layers,
    in the prompt and in the drafted step, and no logit of any row moves by one bit from
    llama.cpp's own products (POLLAMA_ROW_KERNELS=0)."""
    first, drafted, taken = _old_engine_logits(True, flash)
    first_ggml, drafted_ggml, not_taken = _old_engine_logits(False, flash)
    if X86_AVX2:
        assert taken == 2 * 7 * 30 and not_taken == 0
    assert all(np.array_equal(a, b) for a, b in zip(first, first_ggml))
    assert all(np.array_equal(a, b) for a, b in zip(drafted, drafted_ggml))


def test_a_gpu_build_gets_no_graph_ops(monkeypatch):
    """A llama.cpp built with a GPU backend computes some of the CPU's layers' products on the GPU
    too, and a GPU backend has no custom ops: the old engine hands such a build no callback (the
    path proven on real hardware). On this CPU build it gets one where our kernels run."""
    import llama_cpp

    from runner.engines.llamacpp.graph_ops import GraphOps

    on_cpu = GraphOps.create(row_kernels=True, attention=True, lone=True)
    try:
        assert (on_cpu is not None) == X86_AVX2 and (on_cpu is None or (on_cpu.q4_1 and on_cpu.lone))
    finally:
        if on_cpu is not None:
            on_cpu.close()
    monkeypatch.setattr(llama_cpp, "llama_supports_gpu_offload", lambda: True)
    assert GraphOps.create(row_kernels=True, attention=True, lone=True) is None


def _old_engine_embeddings(row_kernels: bool) -> tuple[list[list[float]], int]:
    """The old engine's SmolLM2 embeddings of a few texts, and the Q4_1 products our kernels took
    in its embedding context."""
    import dataclasses

    import runner
    from runner import config
    from runner.api import Options
    from tests.conftest import fresh_cache_dir

    cfg = dataclasses.replace(config.load({}), new_engine=False, row_kernels=row_kernels, cache_dir=fresh_cache_dir())
    r = runner.load(runner.resolve(str(SMOLLM2), cfg), Options().merged({"num_ctx": 1024}), cfg)
    try:
        texts = ["The old stone bridge has five arches.", "A lighthouse keeper finds a bottle. " * 8, "hello"]
        vectors = r.embed(texts).vectors
        ops = r.model_engine._embed._ops
        return vectors, ops.taken[0] if ops is not None else 0
    finally:
        r.close()


def test_the_old_engine_s_embeddings_are_the_same_bits_with_the_kernels():
    """The old engine's embedding context (a llama.cpp context of its own) takes its Q4_1
    products to our kernels too, through its own eval callback: the vectors are llama.cpp's own
    (POLLAMA_ROW_KERNELS=0) bit for bit."""
    vectors, taken = _old_engine_embeddings(True)
    vectors_ggml, not_taken = _old_engine_embeddings(False)
    if X86_AVX2:
        assert taken >= 7 * 30 and not_taken == 0
    assert vectors == vectors_ggml
