"""A random-weight gemma3 vision projector (``mmproj``) GGUF, in llama.cpp's ``tools/mtmd/clip.cpp``
format, for judging our vision encoder against libmtmd (no real vision GGUF can be downloaded
here).

The layout is what ``clip.cpp`` (llama-cpp-python 0.3.36) reads for ``clip.projector_type =
gemma3``: a SigLIP ViT (``v.*``: patch embedding as a conv kernel ``[P, P, 3, width]``, learned
position embedding, pre-norm blocks with LayerNorm weights and biases, separate q/k/v/out
projections with biases, a GELU MLP, a post-LayerNorm) and the gemma3 projector (``mm.*``: the
soft-embedding RMSNorm weight and the input projection ``[text_width, width]``). Matrices are
f16, as in the published ``mmproj-*-f16.gguf`` files; norms, biases and the position embedding
f32.

The default size fits gemma-3-270m (text width 640): image 224, patch 14, width 144 in 2 heads of
72 (Gemma 3's SigLIP head size, whose ``1/sqrt(72)`` rounds differently in single and double
precision), 2 blocks, ``scale_factor`` 4, so an image becomes ``(224 / 14 / 4)^2 = 16`` tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = ["MMProjSpec", "write_mmproj"]


@dataclass(frozen=True)
class MMProjSpec:
    """The hyperparameters of a random gemma3 projector."""

    text_width: int = 640  # gemma-3-270m's embedding_length
    image_size: int = 224
    patch_size: int = 14
    width: int = 144
    n_ff: int = 256
    n_head: int = 2
    n_layer: int = 2
    scale_factor: int = 4
    eps: float = 1e-6
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)  # gemma3's (SigLIP) values
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)

    @property
    def n_tokens(self) -> int:
        """Image tokens after pooling: ``(image_size / patch_size / scale_factor)^2``."""
        return (self.image_size // self.patch_size // self.scale_factor) ** 2


def write_mmproj(path: Path, spec: MMProjSpec = MMProjSpec(), seed: int = 0) -> Path:
    """Write a random-weight gemma3 ``mmproj`` GGUF to ``path`` and return ``path``."""
    import gguf

    s = spec
    side = s.image_size // s.patch_size
    if s.image_size % s.patch_size or side % s.scale_factor:
        raise ValueError(f"{side} patches per side must divide by scale_factor {s.scale_factor}")
    rng = np.random.default_rng(seed)

    def rnd(*shape: int, scale: float) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_name("random-gemma3-mmproj")
    w.add_string("clip.projector_type", "gemma3")
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)  # SigLIP's MLP: gelu (tanh); without it clip.cpp uses quick-gelu
    w.add_uint32("clip.vision.image_size", s.image_size)
    w.add_uint32("clip.vision.patch_size", s.patch_size)
    w.add_uint32("clip.vision.embedding_length", s.width)
    w.add_uint32("clip.vision.feed_forward_length", s.n_ff)
    w.add_uint32("clip.vision.block_count", s.n_layer)
    w.add_uint32("clip.vision.attention.head_count", s.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", s.eps)
    w.add_uint32("clip.vision.projection_dim", s.text_width)
    w.add_uint32("clip.vision.projector.scale_factor", s.scale_factor)
    w.add_array("clip.vision.image_mean", [float(x) for x in s.image_mean])
    w.add_array("clip.vision.image_std", [float(x) for x in s.image_std])

    # NumPy shapes are GGML's reversed: a linear layer y = W x with W [n_out, n_in] is GGML [n_in, n_out].
    e, f, p = s.width, s.n_ff, s.patch_size
    w.add_tensor("v.patch_embd.weight", rnd(e, 3, p, p, scale=0.05).astype(np.float16))  # GGML [P, P, 3, e]
    w.add_tensor("v.patch_embd.bias", rnd(e, scale=0.1))
    w.add_tensor("v.position_embd.weight", rnd(side * side, e, scale=0.5))
    for i in range(s.n_layer):
        b = f"v.blk.{i}"
        w.add_tensor(f"{b}.ln1.weight", 1.0 + rnd(e, scale=0.1))
        w.add_tensor(f"{b}.ln1.bias", rnd(e, scale=0.1))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"{b}.{name}.weight", rnd(e, e, scale=0.15).astype(np.float16))
            w.add_tensor(f"{b}.{name}.bias", rnd(e, scale=0.05))
        w.add_tensor(f"{b}.ln2.weight", 1.0 + rnd(e, scale=0.1))
        w.add_tensor(f"{b}.ln2.bias", rnd(e, scale=0.1))
        w.add_tensor(f"{b}.ffn_up.weight", rnd(f, e, scale=0.15).astype(np.float16))  # GGML [e, f]
        w.add_tensor(f"{b}.ffn_up.bias", rnd(f, scale=0.05))
        w.add_tensor(f"{b}.ffn_down.weight", rnd(e, f, scale=0.1).astype(np.float16))  # GGML [f, e]
        w.add_tensor(f"{b}.ffn_down.bias", rnd(e, scale=0.05))
    w.add_tensor("v.post_ln.weight", 1.0 + rnd(e, scale=0.1))
    w.add_tensor("v.post_ln.bias", rnd(e, scale=0.1))
    w.add_tensor("mm.soft_emb_norm.weight", 1.0 + rnd(e, scale=0.1))
    w.add_tensor("mm.input_projection.weight", rnd(e, s.text_width, scale=0.1).astype(np.float16))  # GGML [640, e]

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
