"""The layers architectures share (Ollama's ``ml/nn``): each one a few lines of math over
``runner.ml`` tensors, with its weights as plain attributes.

Tensors are in GGML order (ne0 first): hidden states ``[n_embd, n_tokens]``, a head-split
projection ``[head_dim, n_heads, n_tokens]``, a linear layer's weight ``[n_in, n_out]``.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.kvcache.cache import Cache
from runner.ml.ggml.backend import GGMLTensor as Tensor
from runner.ml.ggml.backend import GraphContext
from runner.model.gguf_weights import Weights

__all__ = [
    "GeGLU",
    "LayerNorm",
    "Linear",
    "RMSNorm",
    "Rotary",
    "SwiGLU",
    "attention",
    "scaled_dot_product_attention",
]


class Linear:
    """``y = W x (+ b)``; ``W`` stored ``[n_in, n_out]`` in its file type."""

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        self.weight = weight
        self.bias = bias

    @classmethod
    def load(cls, w: Weights, name: str) -> Linear:
        """``{name}.weight`` and, when the file has it, ``{name}.bias``."""
        return cls(w[f"{name}.weight"], w.get(f"{name}.bias"))

    def __call__(self, x: Tensor) -> Tensor:
        y = self.weight.mulmat(x)
        return y + self.bias if self.bias is not None else y


class RMSNorm:
    """``x / sqrt(mean(x^2) + eps) * weight`` over ``ne0`` (``weight`` broadcasts, so a
    ``[head_dim]`` weight normalises each head of ``[head_dim, n_heads, n_tokens]``)."""

    def __init__(self, weight: Tensor, eps: float) -> None:
        self.weight = weight
        self.eps = eps

    def __call__(self, x: Tensor) -> Tensor:
        return x.rms_norm(self.eps) * self.weight


class LayerNorm:
    """``(x - mean(x)) / sqrt(var(x) + eps) * weight + bias`` over ``ne0`` (the bias when the
    file has one)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, eps: float) -> None:
        self.weight = weight
        self.bias = bias
        self.eps = eps

    @classmethod
    def load(cls, w: Weights, name: str, eps: float) -> LayerNorm:
        """``{name}.weight`` and, when the file has it, ``{name}.bias``."""
        return cls(w[f"{name}.weight"], w.get(f"{name}.bias"), eps)

    def __call__(self, x: Tensor) -> Tensor:
        y = x.norm(self.eps) * self.weight
        return y + self.bias if self.bias is not None else y


@dataclass(frozen=True)
class Rotary:
    """RoPE: rotate the first ``dims`` features of each head by ``pos * scale * base^(-2i/dims)``
    (divided by ``factors[i]`` when given). ``neox``: rotate pairs ``(i, i + dims/2)`` instead of
    ``(2i, 2i + 1)``. ``original_context`` is the trained context (for scaled variants)."""

    dims: int
    base: float
    scale: float = 1.0
    neox: bool = False
    factors: Tensor | None = None
    original_context: int = 0

    def __call__(self, x: Tensor, positions: Tensor) -> Tensor:
        return x.rope(
            positions,
            self.dims,
            self.base,
            neox=self.neox,
            scale=self.scale,
            factors=self.factors,
            original_context=self.original_context,
        )


class SwiGLU:
    """Gated feed-forward with SiLU (LLaMA): ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, w: Weights, prefix: str) -> None:
        self.gate = Linear.load(w, f"{prefix}.ffn_gate")
        self.up = Linear.load(w, f"{prefix}.ffn_up")
        self.down = Linear.load(w, f"{prefix}.ffn_down")

    def __call__(self, x: Tensor) -> Tensor:
        return self.down(self.gate(x).swiglu(self.up(x)))


class GeGLU:
    """Gated feed-forward with GELU (tanh approximation; Gemma): ``down(gelu(gate(x)) * up(x))``."""

    def __init__(self, w: Weights, prefix: str) -> None:
        self.gate = Linear.load(w, f"{prefix}.ffn_gate")
        self.up = Linear.load(w, f"{prefix}.ffn_up")
        self.down = Linear.load(w, f"{prefix}.ffn_down")

    def __call__(self, x: Tensor) -> Tensor:
        return self.down(self.gate(x).geglu(self.up(x)))


def attention(ctx: GraphContext, q: Tensor, k: Tensor, v: Tensor, cache: Cache, scale: float) -> Tensor:
    """Attention through the KV cache (Ollama's ``nn.Attention``).

    ``q [head_dim, n_heads, n_tokens]``, ``k [head_dim, n_kv_heads, n_tokens]``,
    ``v [v_head_dim, n_kv_heads, n_tokens]`` (RoPE already applied). Stores this batch's K/V
    (``cache.put``), then attends over the history the cache returns (``cache.get`` -> K, V,
    mask), laid out as ``cache.config`` says: ``softmax(scale * K^T Q + mask) V``.
    Returns ``[v_head_dim * n_heads, n_tokens]``."""
    cache.put(ctx, k, v)
    k, v, mask = cache.get(ctx)
    return scaled_dot_product_attention(
        q, k, v, mask, scale, flash=ctx.backend.flash_attention, v_permuted=cache.config.permuted_v
    )


def scaled_dot_product_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None,
    scale: float,
    *,
    flash: bool,
    v_permuted: bool = False,
) -> Tensor:
    """``softmax(scale * K^T Q + mask) V`` per head, grouped-query (``n_heads`` a multiple of
    ``n_kv_heads``). ``q [d, n_heads, n_tokens]``, ``k [d, n_kv_heads, n_kv]``,
    ``v [d_v, n_kv_heads, n_kv]`` (or ``[n_kv, d_v, n_kv_heads]`` when ``v_permuted``),
    ``mask [n_kv, n_tokens]``. Returns ``[d_v * n_heads, n_tokens]``."""
    n_heads, n_tokens = q.dim(1), q.dim(2)
    q = q.permute(0, 2, 1, 3)  # [d, n_tokens, n_heads]
    k = k.permute(0, 2, 1, 3)  # [d, n_kv, n_kv_heads]
    if v_permuted:
        v_t = v  # [n_kv, d_v, n_kv_heads]
        v = v.permute(1, 0, 2, 3)  # [d_v, n_kv, n_kv_heads] (a view)
    else:
        v = v.permute(0, 2, 1, 3)  # [d_v, n_kv, n_kv_heads]
        v_t = None
    d_v = v.dim(0)
    if flash:
        out = q.flash_attention(k, v, mask, scale)  # [d_v, n_heads, n_tokens]
        return out.reshape(d_v * n_heads, n_tokens)
    scores = k.mulmat_f32(q).softmax(mask, scale)  # [n_kv, n_tokens, n_heads]
    if v_t is None:
        v_t = v.transpose().contiguous()  # [n_kv, d_v, n_kv_heads]
    out = v_t.mulmat(scores)  # [d_v, n_tokens, n_heads]
    return out.permute(0, 2, 1, 3).contiguous(d_v * n_heads, n_tokens)
