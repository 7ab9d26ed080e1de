"""A minimal random-weight gemma3 multimodal projector (``mmproj``) GGUF, in llama.cpp's
``tools/mtmd/clip.cpp`` format, sized for gemma-3-270m: a SigLIP tower of image 224, patch 14,
width 128, 2 blocks, pooled 4×4 to 16 image tokens projected to the text width 640.

Random weights give junk text; the file exists so libmtmd (the oracle) loads a real projector and
the image paths of the runner, the store and the APIs run end to end. (The vision helper writes a
fuller one in ``tests/mmproj.py``; the coordinator unifies the two.)
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

IMAGE_SIZE = 224
PATCH_SIZE = 14
WIDTH = 128
FFN = 256
BLOCKS = 2
HEADS = 4
TEXT_WIDTH = 640  # gemma-3-270m's embedding_length
SCALE_FACTOR = 4
IMAGE_TOKENS = ((IMAGE_SIZE // PATCH_SIZE) // SCALE_FACTOR) ** 2  # 16


def write_mmproj(path: Path, seed: int = 0, text_width: int = TEXT_WIDTH) -> Path:
    """Write the projector to ``path`` (numpy shapes are GGML's dimensions reversed)."""
    rng = np.random.default_rng(seed)

    def rand(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return (1.0 + rng.standard_normal(n) * 0.01).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.name", "random gemma3 mmproj")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_string("clip.projector_type", "gemma3")
    w.add_uint32("clip.vision.image_size", IMAGE_SIZE)
    w.add_uint32("clip.vision.patch_size", PATCH_SIZE)
    w.add_uint32("clip.vision.embedding_length", WIDTH)
    w.add_uint32("clip.vision.feed_forward_length", FFN)
    w.add_uint32("clip.vision.block_count", BLOCKS)
    w.add_uint32("clip.vision.attention.head_count", HEADS)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_uint32("clip.vision.projection_dim", text_width)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    w.add_uint32("clip.vision.projector.scale_factor", SCALE_FACTOR)

    patches = (IMAGE_SIZE // PATCH_SIZE) ** 2
    w.add_tensor("v.patch_embd.weight", rand(WIDTH, 3, PATCH_SIZE, PATCH_SIZE, scale=0.05))
    w.add_tensor("v.patch_embd.bias", rand(WIDTH))
    w.add_tensor("v.position_embd.weight", rand(patches, WIDTH))
    for i in range(BLOCKS):
        p = f"v.blk.{i}"
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"{p}.{name}.weight", rand(WIDTH, WIDTH, scale=0.08))
            w.add_tensor(f"{p}.{name}.bias", rand(WIDTH))
        w.add_tensor(f"{p}.ln1.weight", ones(WIDTH))
        w.add_tensor(f"{p}.ln1.bias", rand(WIDTH))
        w.add_tensor(f"{p}.ln2.weight", ones(WIDTH))
        w.add_tensor(f"{p}.ln2.bias", rand(WIDTH))
        w.add_tensor(f"{p}.ffn_up.weight", rand(FFN, WIDTH, scale=0.08))
        w.add_tensor(f"{p}.ffn_up.bias", rand(FFN))
        w.add_tensor(f"{p}.ffn_down.weight", rand(WIDTH, FFN, scale=0.06))
        w.add_tensor(f"{p}.ffn_down.bias", rand(WIDTH))
    w.add_tensor("v.post_ln.weight", ones(WIDTH))
    w.add_tensor("v.post_ln.bias", rand(WIDTH))
    w.add_tensor("mm.soft_emb_norm.weight", rand(WIDTH, scale=0.1))
    w.add_tensor("mm.input_projection.weight", rand(WIDTH, text_width, scale=0.08))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


if __name__ == "__main__":
    import sys

    print(write_mmproj(Path(sys.argv[1] if len(sys.argv) > 1 else "mmproj-gemma3-random.gguf")))
