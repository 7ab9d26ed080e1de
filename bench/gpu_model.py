"""Write a random-weight llama GGUF big enough for offload to show (default ~0.7B parameters,
F16, 1.4 GB), with stories260K's tokenizer so text prompts tokenize: the GPU check needs a model
whose layers weigh something, and no model that size can travel to a machine with no internet.

    python bench/gpu_model.py OUT.gguf [--layers 16] [--embd 2048] [--ff 5632]

Random weights: speed and placement only; its text means nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import gguf
import numpy as np

STORIES = Path(__file__).resolve().parents[2] / "shared" / "models" / "stories260K.gguf"


def tokenizer_fields(src: Path) -> list[tuple[str, object, gguf.GGUFValueType, gguf.GGUFValueType]]:
    reader = gguf.GGUFReader(str(src))
    out = []
    for name, fld in reader.fields.items():
        if name.startswith("tokenizer."):
            out.append((name, fld.contents(), fld.types[0], fld.types[-1]))
    return out


def write(path: Path, tokenizer: Path, n_layer: int, n_embd: int, n_ff: int, n_head: int, n_head_kv: int) -> None:
    rng = np.random.default_rng(0)
    fields = tokenizer_fields(tokenizer)
    n_vocab = len(next(v for k, v, _, _ in fields if k == "tokenizer.ggml.tokens"))
    hd = n_embd // n_head
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("random-llama-gpu-check")
    w.add_context_length(4096)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(hd)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    for name, value, kind, sub in fields:
        if kind == gguf.GGUFValueType.ARRAY:
            w.add_key_value(name, value, kind, sub_type=sub)
        else:
            w.add_key_value(name, value, kind)

    def rnd(*shape: int, scale: float = 0.02, dtype: type = np.float16) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)

    w.add_tensor("token_embd.weight", rnd(n_vocab, n_embd, scale=1.0))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    w.add_tensor("output.weight", rnd(n_vocab, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}"
        w.add_tensor(f"{p}.attn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(f"{p}.attn_q.weight", rnd(n_embd, n_embd))
        w.add_tensor(f"{p}.attn_k.weight", rnd(n_head_kv * hd, n_embd))
        w.add_tensor(f"{p}.attn_v.weight", rnd(n_head_kv * hd, n_embd))
        w.add_tensor(f"{p}.attn_output.weight", rnd(n_embd, n_embd))
        w.add_tensor(f"{p}.ffn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(f"{p}.ffn_gate.weight", rnd(n_ff, n_embd))
        w.add_tensor(f"{p}.ffn_up.weight", rnd(n_ff, n_embd))
        w.add_tensor(f"{p}.ffn_down.weight", rnd(n_embd, n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--tokenizer", type=Path, default=STORIES)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--embd", type=int, default=2048)
    ap.add_argument("--ff", type=int, default=5632)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=4)
    a = ap.parse_args()
    write(a.out, a.tokenizer, a.layers, a.embd, a.ff, a.heads, a.kv_heads)
    print(f"{a.out}: {a.out.stat().st_size / 1e9:.2f} GB, {a.layers} layers")


if __name__ == "__main__":
    main()
