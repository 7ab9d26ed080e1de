"""A verified draft's weight products computed as lone rows' (runner/ml/ggml/lone_rows.py), on
weights of each kind the op takes: a random-weight llama written with ``gguf`` whose matrices
are Q4_0 with rows a multiple of 8 (GGML repacks those on x86: its 8x8 layout), Q4_0 with 300
rows (not repacked: llamafile's tiles), Q5_0 and F16 (llamafile's tiles). For several rows GGML
sums each of these otherwise than for a row alone; with the op (whose Q5_0 products are its own
tiles' on x86), 17 rows decoded together (every row an output, as a verified draft) are bit for
bit the same tokens decoded one at a time, on both engines, and without it they are not.
gemma-3-270m's Q4_K, Q5_0 and Q6_K: test_spec_models.py."""

from __future__ import annotations

import dataclasses
import platform
from pathlib import Path

import numpy as np
import pytest

import runner
from runner import config
from runner.api import Options
from runner.ml.backend import BackendOptions
from runner.ml.ggml import lone_rows
from tests.test_ggml_models import random_tensors
from tests.test_spec_models import engine_rows_unlike_alone, rows_unlike_alone

N_VOCAB, N_EMBD, N_HEAD, HEAD_DIM, N_FF, N_LAYER = 300, 128, 4, 32, 256, 2


def _write(path: Path) -> None:
    import gguf
    from gguf.quants import quantize

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("random-lone-rows")
    w.add_context_length(1024)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(N_VOCAB)
    w.add_tokenizer_model("no_vocab")
    rnd, add = random_tensors(w, np.random.default_rng(3))

    def quantized(name: str, arr: np.ndarray, kind: str) -> None:
        t = getattr(gguf.GGMLQuantizationType, kind)
        q = quantize(arr, t)
        w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=t)

    add("token_embd.weight", rnd(N_VOCAB, N_EMBD, scale=0.5))
    add("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    quantized("output.weight", rnd(N_VOCAB, N_EMBD), "Q4_0")  # 300 rows: not repacked
    for i in range(N_LAYER):
        p = f"blk.{i}."
        add(p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        add(p + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_output"):
            quantized(p + name + ".weight", rnd(N_EMBD, N_EMBD), "Q4_0")  # repacked
        quantized(p + "attn_v.weight", rnd(N_EMBD, N_EMBD), "Q5_0")
        quantized(p + "ffn_gate.weight", rnd(N_FF, N_EMBD), "Q4_0")  # repacked
        add(p + "ffn_up.weight", rnd(N_FF, N_EMBD), "f16")
        add(p + "ffn_down.weight", rnd(N_EMBD, N_FF), "f16")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lone") / "random-lone-rows.gguf"
    _write(path)
    return path


def old_engine_rows_unlike_alone(path: Path, lone: bool) -> tuple[list[int], tuple[int, int, int]]:
    """rows_unlike_alone on the old engine, through its batch calls (no tokenizer needed): (the
    rows that differ, the products the eval callback took: Q4_1, attention, lone rows')."""
    from runner.engines.llamacpp.engine import LlamaEngine

    cfg = dataclasses.replace(config.load({}), new_engine=False, cache_ram=0, cache_disk=0)
    info = runner.resolve(str(path), cfg).info
    plan = runner.load_options(info, Options().merged({"num_ctx": 1024, "num_thread": 2}), cfg, 1)
    engine = LlamaEngine(info, plan, lone_rows=lone)
    try:
        return engine_rows_unlike_alone(engine, N_VOCAB)
    finally:
        engine.close()


def test_the_layouts_are_set_up_where_ggml_repacks_them():
    """On x86 every repacked layout GGML picks is 8 rows interleaved, and this library has each
    one's one-row function (elsewhere GGML picks other layouts: none is set up); the plain op
    takes every type of lone_rows.TYPES."""
    ops = lone_rows.ops()
    assert ops is not None and ops.plain and ops.repacked
    names = {t: n for n, t in lone_rows._type_ids().items()}
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    assert {names[t] for t in range(64) if ops.repacked_types >> t & 1} == (set(lone_rows.X86_LAYOUTS) if x86 else set())
    assert {names[t] for t in range(64) if ops.plain_types >> t & 1} == set(lone_rows.TYPES)


def test_the_q5_0_tiles_give_ggml_s_numbers_and_their_check_has_teeth():
    """On x86-64 with AVX2 the plain op takes Q5_0 weights to our tiles (4 weight rows by 4
    activation rows), the fastest variant this CPU runs, and every variant gives GGML's
    ggml_vec_dot_q5_0_q8_0 bit for bit on random blocks; against GGML's scalar reference (the
    same products summed in another order) the same check finds differences, so it compares
    bits. Elsewhere the op keeps GGML's one-row function."""
    from runner.ml.ggml import _lone_rows
    from runner.ml.ggml import bindings as g

    assert lone_rows.ops() is not None
    if not (platform.machine().lower() in ("x86_64", "amd64") and g.ggml_cpu_has_avx2()):
        assert lone_rows.q5_0_variant() == ""
        return
    variants = _lone_rows.q5_0_variants()
    assert variants and variants[0] == lone_rows.q5_0_variant() and "avx2" in variants
    for name in variants:
        assert _lone_rows.check_q5_0(g.cpu_function("ggml_vec_dot_q5_0_q8_0"), name) == 0
        assert _lone_rows.check_q5_0(g.cpu_function("ggml_vec_dot_q5_0_q8_0_generic"), name) > 0
    assert _lone_rows.check_q5_0(g.cpu_function("ggml_vec_dot_q5_0_q8_0"), "no-such-variant") == -1


def test_old_engine_drafted_rows_are_lone_rows_on_repacked_q4_0_q5_0_and_f16(model_path):
    differ, (_, attention, lone) = old_engine_rows_unlike_alone(model_path, lone=True)
    # per layer: q, k, output and gate (repacked Q4_0), v (Q5_0), up and down (F16); the output
    assert (differ, lone) == ([], 7 * N_LAYER + 1) and attention == 2 * N_LAYER
    assert old_engine_rows_unlike_alone(model_path, lone=False)[0] != []


def test_new_engine_drafted_rows_are_lone_rows_on_repacked_q4_0_q5_0_and_f16(model_path, monkeypatch):
    options = BackendOptions(num_threads=2, flash_attention=False)
    assert rows_unlike_alone(model_path, options) == []
    monkeypatch.setattr(lone_rows, "product", lambda c, w, b: None)
    assert rows_unlike_alone(model_path, options) != []

