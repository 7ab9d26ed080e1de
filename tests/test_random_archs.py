"""qwen3 and mistral-style llama on the new engine, judged against llama.cpp on random-weight
GGUFs written with the ``gguf`` package (no small real GGUF of either is at hand).

- **qwen3**: NeoX RoPE, an RMSNorm on every query and key head, no biases, and a head size that
  is not ``n_embd / n_head`` (as in the real models: 128 x 16 heads over a 1024 embedding).
- **mistral-style llama**: ``llama`` with ``attention.key_length``/``value_length`` giving a head
  size that is not ``n_embd / n_head``, so the q/k/v and output projections are not square, and
  a separate ``output.weight``.

For each: next-token logits of a 37-token batch (max abs diff, top-5 overlap, every row) and 64
greedy tokens through the KV cache, with and without flash attention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import llama_cpp
import numpy as np
import pytest

from runner.model.models import Batch
from tests.test_ggml_models import LlamaCppRef, _compare, _greedy, _open, random_tensors

N_VOCAB, N_EMBD, N_HEAD, N_HEAD_KV, HEAD_DIM, N_FF, N_LAYER = 300, 80, 4, 2, 32, 128, 3


def _write(path: Path, arch: str, *, qk_norm: bool, seed: int) -> None:
    import gguf

    rng = np.random.default_rng(seed)
    e, v, f, hd = N_EMBD, N_VOCAB, N_FF, HEAD_DIM
    q_out, kv_out = N_HEAD * hd, N_HEAD_KV * hd
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"random-{arch}")
    w.add_context_length(512)
    w.add_embedding_length(e)
    w.add_feed_forward_length(f)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_key_length(hd)  # the head size the extra metadata gives (not n_embd / n_head = 20)
    w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0 if arch == "llama" else 1_000_000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(v)
    w.add_tokenizer_model("no_vocab")

    rnd, add = random_tensors(w, rng)

    add("token_embd.weight", rnd(v, e, scale=1.0), "f16")
    add("output_norm.weight", 1.0 + rnd(e, scale=0.1))
    add("output.weight", rnd(v, e), "f16")
    for i in range(N_LAYER):
        p = f"blk.{i}"
        add(f"{p}.attn_norm.weight", 1.0 + rnd(e, scale=0.1))
        add(f"{p}.attn_q.weight", rnd(q_out, e), "f16")
        add(f"{p}.attn_k.weight", rnd(kv_out, e), "f16")
        add(f"{p}.attn_v.weight", rnd(kv_out, e), "f32")
        if qk_norm:
            add(f"{p}.attn_q_norm.weight", 1.0 + rnd(hd, scale=0.3))
            add(f"{p}.attn_k_norm.weight", 1.0 + rnd(hd, scale=0.3))
        add(f"{p}.attn_output.weight", rnd(e, q_out), "f16")
        add(f"{p}.ffn_norm.weight", 1.0 + rnd(e, scale=0.1))
        add(f"{p}.ffn_gate.weight", rnd(f, e), "f16")
        add(f"{p}.ffn_up.weight", rnd(f, e), "f16")
        add(f"{p}.ffn_down.weight", rnd(e, f), "q8_0")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module", params=["qwen3", "llama"], ids=["qwen3", "mistral-style-llama"])
def model_path(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    arch = request.param
    path = tmp_path_factory.mktemp(arch) / f"random-{arch}.gguf"
    _write(path, arch, qk_norm=arch == "qwen3", seed=11)
    yield path


@pytest.fixture(params=[True, False], ids=["fa", "nofa"])
def flash(request: pytest.FixtureRequest) -> bool:
    return request.param


def test_random_model_matches_llama_cpp(model_path: Path, flash: bool) -> None:
    ref = LlamaCppRef(model_path, flash=flash)
    model = _open(model_path, flash, num_ctx=512)
    try:
        c = model.config  # type: ignore[attr-defined]
        assert c.head_dim == HEAD_DIM != N_EMBD // N_HEAD
        if "qwen3" in model_path.name:
            assert c.rope_neox and model.blocks[0].attn.q.bias is None  # type: ignore[attr-defined]
            assert model.blocks[0].attn.q_norm is not None  # type: ignore[attr-defined]
        else:
            assert not c.rope_neox and model.output.weight is not model.embed  # type: ignore[attr-defined]
        rng = np.random.default_rng(1)
        tokens = rng.integers(0, N_VOCAB, size=37).tolist()
        want = ref.decode_seq(tokens, 0, all_logits=True)
        got = model.compute(Batch.sequence(tokens, all_logits=True)).copy()
        diff, overlap = _compare(got, want, f"{model_path.name} fa={flash}")
        assert overlap == 5 and diff < 1e-3 * max(1.0, float(np.abs(want).max()))
        model.cache.remove(0, 0, None)
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ref.ctx), True)
        want_first = ref.decode_seq(tokens, 0)[0]
        got_first = model.compute(Batch.sequence(tokens))[0].copy()
        want_toks = _greedy(lambda t, p: ref.decode_seq([t], p)[0], want_first, len(tokens), 64)
        got_toks = _greedy(lambda t, p: model.compute(Batch.sequence([t], start=p))[0], got_first, len(tokens), 64)
        assert got_toks == want_toks
    finally:
        model.close()
        ref.close()
