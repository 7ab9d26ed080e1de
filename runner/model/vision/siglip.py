"""SigLIP's vision transformer (Zhai et al. 2023; a ViT, Dosovitskiy et al. 2021), as gemma3's
projector files carry it (llama.cpp's ``clip`` GGUF: tensors ``v.*``, keys ``clip.vision.*``).

    x = PatchEmbedding(pixels)                    # P x P patches -> width, row-major patch order
    x = x + position_embedding                    # learned, one row per patch
    for each block:
        x = x + Attention(LayerNorm(x))           # multi-head, bidirectional (no mask), biases
        x = x + MLP(LayerNorm(x))                 # up, GELU (tanh), down; biases
    x = LayerNorm(x)                              # post-layernorm

Hidden states are GGML ``[width, n_patches]``. The patch embedding is a stride-``P`` convolution,
computed as GGML's ``conv_2d`` computes it: the image is cut into patches on the host
(:func:`patchify`, one row of ``3 * P * P`` values per patch, in f16 as GGML's ``im2col`` writes
them) and multiplied with the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from runner.ml.ggml.backend import GGMLTensor as Tensor
from runner.ml.ggml.backend import GraphContext
from runner.model.gguf_weights import GGUFError, GGUFFile, Weights
from runner.model.nn import LayerNorm, Linear, scaled_dot_product_attention

__all__ = ["SigLIPConfig", "VisionTransformer", "patchify"]


@dataclass(frozen=True)
class SigLIPConfig:
    """Hyperparameters, from the projector's ``clip.vision.*`` keys."""

    image_size: int
    patch_size: int
    n_embd: int
    n_ff: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    eps: float
    image_mean: tuple[float, float, float]
    image_std: tuple[float, float, float]

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @property
    def n_patches(self) -> int:
        return self.patches_per_side**2

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> SigLIPConfig:
        def req(key: str) -> int:
            value = f.get(f"clip.vision.{key}")
            if value is None:
                raise GGUFError(f"missing clip.vision.{key}")
            return int(value)

        if not f.get("clip.has_vision_encoder", False):
            raise GGUFError("the projector has no vision encoder (clip.has_vision_encoder)")
        if not f.get("clip.use_gelu", False):  # clip.cpp's default would be quick-GELU
            raise GGUFError("only projectors with a GELU MLP (clip.use_gelu) are supported")
        n_embd, n_head = req("embedding_length"), req("attention.head_count")
        image_size, patch_size = req("image_size"), req("patch_size")
        if n_head < 1 or patch_size < 1 or image_size % patch_size:
            raise GGUFError(f"bad vision shape: image {image_size}, patch {patch_size}, {n_head} heads")
        mean, std = f.get("clip.vision.image_mean"), f.get("clip.vision.image_std")
        if mean is None or std is None or len(mean) < 3 or len(std) < 3:
            raise GGUFError("missing clip.vision.image_mean / image_std")
        return cls(
            image_size=image_size,
            patch_size=patch_size,
            n_embd=n_embd,
            n_ff=req("feed_forward_length"),
            n_layer=req("block_count"),
            n_head=n_head,
            n_head_kv=int(f.get("clip.vision.attention.head_count_kv", n_head)),
            head_dim=int(f.get("clip.vision.attention.head_dim", 0) or n_embd // n_head),
            eps=float(f.get("clip.vision.attention.layer_norm_epsilon", 1e-6)),
            image_mean=tuple(float(x) for x in mean[:3]),  # type: ignore[arg-type]
            image_std=tuple(float(x) for x in std[:3]),  # type: ignore[arg-type]
        )


def patchify(pixels: np.ndarray, patch_size: int) -> np.ndarray:
    """``pixels (3, h, w)`` -> ``(n_patches, 3 * P * P)`` float16: patch ``(py, px)`` is row
    ``py * (w / P) + px``, its values ordered channel, row, column (GGML's ``im2col``)."""
    c, h, w = pixels.shape
    p = patch_size
    x = pixels.reshape(c, h // p, p, w // p, p).transpose(1, 3, 0, 2, 4)  # (py, px, c, ky, kx)
    return np.ascontiguousarray(x.reshape((h // p) * (w // p), c * p * p), dtype=np.float16)


# ----------------------------------------------------------------------------------- the blocks
class PatchEmbedding:
    """``Conv2d(3, width, kernel=P, stride=P)``: the kernel ``[P, P, 3, width]`` as a
    ``[3 * P * P, width]`` matrix against the patches, then the bias."""

    def __init__(self, w: Weights, c: SigLIPConfig) -> None:
        self.kernel = w["v.patch_embd.weight"]
        self.bias = w.get("v.patch_embd.bias")
        p = c.patch_size
        if self.kernel.ne != (p, p, 3, c.n_embd):
            raise GGUFError(f"v.patch_embd.weight is {list(self.kernel.shape)}, expected {[p, p, 3, c.n_embd]}")

    def __call__(self, ctx: GraphContext, patches: Tensor) -> Tensor:
        p, _, _, width = self.kernel.ne
        kernel = self.kernel.on(ctx).reshape(p * p * 3, width)
        x = patches.mulmat(kernel).transpose().contiguous()  # [width, n_patches]
        return x + self.bias if self.bias is not None else x


class SelfAttention:
    """Multi-head attention among all patches (no mask), with biased projections."""

    def __init__(self, w: Weights, i: int, c: SigLIPConfig) -> None:
        p = f"v.blk.{i}"
        self.q = Linear.load(w, f"{p}.attn_q")
        self.k = Linear.load(w, f"{p}.attn_k")
        self.v = Linear.load(w, f"{p}.attn_v")
        self.o = Linear.load(w, f"{p}.attn_out")
        self.n_head, self.n_head_kv, self.head_dim = c.n_head, c.n_head_kv, c.head_dim
        # 1 / sqrtf(head_dim) in single precision, as clip.cpp computes it: for Gemma 3's 72-wide
        # heads the double-precision value rounds to the next float, and the tokens move by ~1e-3
        self.scale = float(np.float32(1.0) / np.sqrt(np.float32(c.head_dim)))

    def __call__(self, x: Tensor, n: int, flash: bool) -> Tensor:
        q = self.q(x).reshape(self.head_dim, self.n_head, n)
        k = self.k(x).reshape(self.head_dim, self.n_head_kv, n)
        v = self.v(x).reshape(self.head_dim, self.n_head_kv, n)
        if flash:  # the fused kernel, K and V in f16 laid out head by head (as clip.cpp casts them)
            k = k.permute(0, 2, 1, 3).cast("f16")  # [head_dim, n, n_head_kv]
            v = v.permute(0, 2, 1, 3).cast("f16")
            out = q.permute(0, 2, 1, 3).flash_attention(k, v, None, self.scale)  # [head_dim, n_head, n]
            return self.o(out.reshape(self.head_dim * self.n_head, n))
        return self.o(scaled_dot_product_attention(q, k, v, None, self.scale, flash=False))


class MLP:
    """``down(gelu(up(x)))`` with biases. Older converters swapped the names of ``ffn_up`` and
    ``ffn_down``; as in clip.cpp, the one whose input is ``width`` is ``up``."""

    def __init__(self, w: Weights, i: int, c: SigLIPConfig) -> None:
        p = f"v.blk.{i}"
        self.up = Linear.load(w, f"{p}.ffn_up")
        self.down = Linear.load(w, f"{p}.ffn_down")
        if self.down.weight.dim(0) == c.n_embd and self.up.weight.dim(0) != c.n_embd:
            self.up, self.down = self.down, self.up

    def __call__(self, x: Tensor) -> Tensor:
        return self.down(self.up(x).gelu())


class Block:
    """Pre-norm transformer layer: attention and MLP, each after a LayerNorm, with residuals."""

    def __init__(self, w: Weights, i: int, c: SigLIPConfig) -> None:
        self.ln1 = LayerNorm.load(w, f"v.blk.{i}.ln1", c.eps)
        self.attn = SelfAttention(w, i, c)
        self.ln2 = LayerNorm.load(w, f"v.blk.{i}.ln2", c.eps)
        self.mlp = MLP(w, i, c)

    def __call__(self, x: Tensor, n: int, flash: bool) -> Tensor:
        x = self.attn(self.ln1(x), n, flash) + x
        return x + self.mlp(self.ln2(x))


# ------------------------------------------------------------------------------------ the tower
class VisionTransformer:
    """The whole tower: patches (f16 ``[3 * P * P, n_patches]``) -> ``[width, n_patches]``."""

    def __init__(self, w: Weights, c: SigLIPConfig) -> None:
        self.config = c
        self.patch_embedding = PatchEmbedding(w, c)
        self.position_embedding = w["v.position_embd.weight"]  # [width, n_patches]
        if self.position_embedding.ne[:2] != (c.n_embd, c.n_patches):
            raise GGUFError(
                f"v.position_embd.weight is {list(self.position_embedding.shape)}, expected {[c.n_embd, c.n_patches]}"
            )
        self.pre_ln = LayerNorm.load(w, "v.pre_ln", c.eps) if "v.pre_ln.weight" in w else None
        self.blocks = [Block(w, i, c) for i in range(c.n_layer)]
        self.post_ln = LayerNorm.load(w, "v.post_ln", c.eps) if "v.post_ln.weight" in w else None

    def __call__(self, ctx: GraphContext, patches: Tensor, flash: bool) -> Tensor:
        n = self.config.n_patches
        x = self.patch_embedding(ctx, patches) + self.position_embedding
        if self.pre_ln is not None:
            x = self.pre_ln(x)
        for block in self.blocks:
            x = block(x, n, flash)
        return self.post_ln(x) if self.post_ln is not None else x
