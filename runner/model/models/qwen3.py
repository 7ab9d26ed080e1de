"""Qwen3 (Qwen Team 2025): Qwen2 without the q/k/v biases, with an RMSNorm on every query and
key head before RoPE:

    q = RoPE(RMSNorm_q(W_q x))      k = RoPE(RMSNorm_k(W_k x))      v = W_v x

The rest of the block (pre-norm residuals, SwiGLU, NeoX RoPE) is LLaMA's / Qwen2's.
"""

from __future__ import annotations

from runner.kvcache.cache import Cache
from runner.ml.ggml.backend import GGMLTensor as Tensor
from runner.ml.ggml.backend import GraphContext
from runner.model.gguf_weights import Weights
from runner.model.nn import RMSNorm, Rotary, attention

from .llama import Llama, LlamaConfig, SelfAttention

__all__ = ["Qwen3", "Qwen3Attention"]


class Qwen3Attention(SelfAttention):
    """Grouped-query attention with per-head RMSNorm on queries and keys."""

    def __init__(self, w: Weights, i: int, c: LlamaConfig, rope: Rotary) -> None:
        super().__init__(w, i, c, rope)
        self.q_norm = RMSNorm(w[f"blk.{i}.attn_q_norm.weight"], c.norm_eps)
        self.k_norm = RMSNorm(w[f"blk.{i}.attn_k_norm.weight"], c.norm_eps)

    def __call__(self, ctx: GraphContext, x: Tensor, positions: Tensor, cache: Cache, n_tokens: int) -> Tensor:
        q = self.q_norm(self.q(x).reshape(self.head_dim, self.n_head, n_tokens))
        k = self.k_norm(self.k(x).reshape(self.head_dim, self.n_head_kv, n_tokens))
        v = self.v(x).reshape(self.v_head_dim, self.n_head_kv, n_tokens)
        q = self.rope(q, positions)
        k = self.rope(k, positions)
        out = attention(ctx, q, k, v, cache, self.scale)  # [v_head_dim * n_head, n_tokens]
        return self.o(out)


class Qwen3(Llama):
    rope_neox = True

    def attention(self, w: Weights, i: int) -> SelfAttention:
        return Qwen3Attention(w, i, self.config, self.rope)
