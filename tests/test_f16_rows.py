"""The new engine's f16 kernels (runner/ml/ggml/f16_rows.c): a drafted step's attention, several
rows at a time, each row's numbers GGML's for the row alone.

They replace laying a decoded batch's attention rows apart (GGML's one-row dot products) only
where they give the same bits: checked against the loaded library's own ``ggml_vec_dot_f16`` when
first used, and here through real models, whose logits for a step of drafted rows must not move
by one bit between the kernels and the rows laid apart. That those are the rows decoded alone:
test_spec_models.test_drafted_rows_are_the_rows_decoded_alone_without_flash_attention. How much
faster: ``bench/bench_attention_rows.py`` (``--apart`` for the other way).
"""

from __future__ import annotations

import platform
from pathlib import Path

import numpy as np
import pytest

from runner.ml.backend import BackendOptions
from runner.ml.ggml import bindings as g
from runner.ml.ggml import f16_rows
from runner.model.models import Batch
from runner.model.models import load as load_model
from tests.conftest import SMOLLM2
from tests.test_spec_models import gemma3_path  # noqa: F401  (the fixture)

X86_AVX2 = platform.machine() in ("x86_64", "AMD64") and bool(g.ggml_cpu_has_avx2())


def test_the_kernels_run_where_they_can_and_their_check_has_teeth():
    """On an x86-64 machine with AVX2 a variant passes its check against GGML's dot product:
    the one the library was built for (AVX-512 or AVX2, whose sums take different trees). Where
    the CPU runs both, the other one, the same sums in another order, fails the same check, so
    it compares bits, not closeness; and each variant's columns and tiles of several products give
    its own single products' bits (so the variant the library was not built for is checked too,
    for the machines that run it). Elsewhere the kernels step aside (rows laid apart)."""
    if not X86_AVX2:
        assert f16_rows.variant() == "" and f16_rows.kernels() is None
        return
    from runner.ml.ggml import _f16_rows

    chosen = f16_rows.variant()
    runs = _f16_rows.variants()
    assert chosen in runs and "avx2" in runs
    vec_dot = g.cpu_function("ggml_vec_dot_f16")
    assert _f16_rows.check(vec_dot, chosen) == 0
    for other in set(runs) - {chosen}:
        assert _f16_rows.check(vec_dot, other) > 0
    for variant in runs:  # each variant's columns and tiles of several products are its single ones
        assert _f16_rows.check(_f16_rows.reference(variant), variant) == 0


def _drafted_logits(path: Path, kernels: bool, monkeypatch) -> tuple[np.ndarray, list[bool]]:
    """A model's logits for a step of 17 decoded rows after a 800-token prompt (no flash
    attention: its products are the ones in question), and for each attention product of the
    step, whether the kernels took it."""
    taken = []
    product = f16_rows.product

    def counting(c, a, b):
        ptr = product(c, a, b) if kernels else None
        taken.append(ptr is not None)
        return ptr

    monkeypatch.setattr(f16_rows, "product", counting)
    rng = np.random.default_rng(11)
    prompt = [int(t) for t in rng.integers(100, 20000, 800)]
    step = [int(t) for t in rng.integers(100, 20000, 17)]
    model = load_model(path, BackendOptions(num_threads=2, flash_attention=False))
    try:
        model.init_cache(num_ctx=1024, num_parallel=1, num_batch=512)
        for at in range(0, len(prompt), 512):
            model.compute(Batch.sequence(prompt[at:at + 512], start=at))
        taken.clear()  # the prompt's products are GGML's: only a decoded batch asks
        return model.compute(Batch.sequence(step, start=800, decode=True)).copy(), taken
    finally:
        model.close()


@pytest.mark.parametrize("which", ["smollm2", pytest.param("gemma3", marks=pytest.mark.slow)])
def test_a_drafted_step_is_the_same_bits_by_the_kernels_as_with_its_rows_apart(which, request, monkeypatch):
    """SmolLM2 (9 query heads on 3 KV heads, 64 numbers a head) and gemma-3-270m (4 on 1, 256
    a head, sliding-window layers whose views start at cell 256): every attention product of a
    17-row step is the kernels' (K·Q and V, each layer), and no logit of any row differs from
    those of the same step with the rows laid apart for GGML's one-row dot products."""
    path = SMOLLM2 if which == "smollm2" else request.getfixturevalue("gemma3_path")
    ours, asked = _drafted_logits(path, True, monkeypatch)
    apart, _ = _drafted_logits(path, False, monkeypatch)
    if X86_AVX2:
        layers = 30 if which == "smollm2" else 18
        assert asked == [True] * 2 * layers
    assert np.array_equal(ours, apart)
