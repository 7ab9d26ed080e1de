"""Gemma 3 (Gemma Team 2025), text: a pre- and post-norm decoder whose layers alternate between
local (sliding-window) and global attention.

    h = embed(tokens) * sqrt(n_embd)
    for each block i:
        a = Attention_i(RMSNorm(h))                   # q/k RMSNorm per head, RoPE, q scaled
        h = h + RMSNorm(a)                            # post-attention norm
        m = GeGLU(RMSNorm(h))                         # down(gelu(gate(x)) * up(x))
        h = h + RMSNorm(m)                            # post-feed-forward norm
    logits = embed^T RMSNorm(h)                       # output tied to the embedding

Five of every six layers are local: they attend to the last ``sliding_window`` tokens only
(including the token itself) and rotate with a base of 10000; every sixth layer is global, with
the file's ``rope.freq_base`` and linear ``rope.scaling.factor``. A file may list the local
layers itself (``attention.sliding_window_pattern``). The KV cache follows the same split: a
sliding-window cache for the local layers, which keeps only the window of each sequence, and a
full-history cache for the global ones, behind one :class:`~runner.kvcache.WrapperCache`.

Queries are scaled by ``1/sqrt(head_dim)`` before attention (by ``1/sqrt(n_embd / n_head)`` for
the 62-layer 27B, as its checkpoint expects; ``attention.scale`` in the file wins), and the
attention itself runs unscaled. Norm weights in GGUF already include Gemma's ``1 +``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runner.kvcache.cache import Cache, LayerShape
from runner.kvcache.causal import CausalCache
from runner.kvcache.wrapper import WrapperCache
from runner.ml.ggml.backend import GGMLBackend, GraphContext
from runner.ml.ggml.backend import GGMLTensor as Tensor
from runner.model.gguf_weights import GGUFError, GGUFFile, Weights
from runner.model.model import BatchInputs, Model
from runner.model.nn import GeGLU, Linear, RMSNorm, Rotary, attention
from runner.model.sliding import SlidingWindow, gemma3_local_layers

__all__ = ["Gemma3", "Gemma3Config"]

LOCAL, GLOBAL = 0, 1  # layer types: index into the wrapper cache's caches
LOCAL_ROPE_BASE = 10000.0
LAYERS_27B = 62


@dataclass(frozen=True)
class Gemma3Config:
    """Hyperparameters, from the GGUF's ``gemma3.*`` keys."""

    n_vocab: int
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    v_head_dim: int
    n_ff: int
    norm_eps: float
    rope_dims: int
    rope_base: float  # global layers
    rope_scale: float  # global layers: multiplies positions (1 / linear scaling factor)
    context_length: int
    sliding_window: int  # tokens a local layer sees, itself included
    layer_types: tuple[int, ...]  # LOCAL or GLOBAL per layer
    query_scale: float

    @classmethod
    def from_gguf(cls, f: GGUFFile, weights: Weights) -> Gemma3Config:
        def req(key: str) -> int:
            value = f.arch_get(key)
            if value is None:
                raise GGUFError(f"missing {f.arch}.{key}")
            return int(value)

        n_layer = req("block_count")
        n_embd = req("embedding_length")
        n_head = req("attention.head_count")
        head_dim = int(f.arch_get("attention.key_length", 256))
        window = req("attention.sliding_window")
        if window < 1:
            raise GGUFError(f"{f.arch}.attention.sliding_window must be positive, got {window}")
        local = gemma3_local_layers(n_layer, f.arch_get("attention.sliding_window_pattern"))
        types = tuple(LOCAL if is_local else GLOBAL for is_local in local)
        factor = float(f.arch_get("rope.scaling.factor", 0.0) or 0.0)
        scaling = f.arch_get("rope.scaling.type", "linear") or "linear"
        if scaling not in ("none", "linear") and factor not in (0.0, 1.0):
            raise GGUFError(f"rope scaling {scaling!r} is not supported")
        query_scale = float(f.arch_get("attention.scale", 0.0) or 0.0)
        if not query_scale:
            per_head = n_embd // n_head if n_layer == LAYERS_27B else head_dim
            query_scale = 1.0 / math.sqrt(per_head)
        return cls(
            n_vocab=weights["token_embd.weight"].dim(1),
            n_embd=n_embd,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=int(f.arch_get("attention.head_count_kv", n_head)),
            head_dim=head_dim,
            v_head_dim=int(f.arch_get("attention.value_length", head_dim)),
            n_ff=req("feed_forward_length"),
            norm_eps=float(f.arch_get("attention.layer_norm_rms_epsilon", 1e-6)),
            rope_dims=int(f.arch_get("rope.dimension_count", head_dim)),
            rope_base=float(f.arch_get("rope.freq_base", 1_000_000.0)),
            rope_scale=1.0 / factor if factor > 0 else 1.0,
            context_length=int(f.arch_get("context_length", 0) or 0),
            sliding_window=window,
            layer_types=types,
            query_scale=query_scale,
        )


# ----------------------------------------------------------------------------------- the blocks
class SelfAttention:
    """Grouped-query attention with per-head RMSNorm on queries and keys, pre-scaled queries."""

    def __init__(self, w: Weights, i: int, c: Gemma3Config, rope: Rotary) -> None:
        p = f"blk.{i}"
        self.q = Linear.load(w, f"{p}.attn_q")
        self.k = Linear.load(w, f"{p}.attn_k")
        self.v = Linear.load(w, f"{p}.attn_v")
        self.o = Linear.load(w, f"{p}.attn_output")
        self.q_norm = RMSNorm(w[f"{p}.attn_q_norm.weight"], c.norm_eps)
        self.k_norm = RMSNorm(w[f"{p}.attn_k_norm.weight"], c.norm_eps)
        self.rope = rope
        self.n_head, self.n_head_kv = c.n_head, c.n_head_kv
        self.head_dim, self.v_head_dim = c.head_dim, c.v_head_dim
        self.query_scale = c.query_scale

    def __call__(self, ctx: GraphContext, x: Tensor, positions: Tensor, cache: Cache, n_tokens: int) -> Tensor:
        q = self.q_norm(self.q(x).reshape(self.head_dim, self.n_head, n_tokens))
        k = self.k_norm(self.k(x).reshape(self.head_dim, self.n_head_kv, n_tokens))
        v = self.v(x).reshape(self.v_head_dim, self.n_head_kv, n_tokens)
        q = self.rope(q, positions).scale(self.query_scale)
        k = self.rope(k, positions)
        out = attention(ctx, q, k, v, cache, 1.0)  # [v_head_dim * n_head, n_tokens]
        return self.o(out)


class Block:
    """One layer: attention and feed-forward, each normed before and after, with residuals."""

    def __init__(self, w: Weights, i: int, c: Gemma3Config, rope: Rotary) -> None:
        p = f"blk.{i}"
        self.attn_norm = RMSNorm(w[f"{p}.attn_norm.weight"], c.norm_eps)
        self.attn = SelfAttention(w, i, c, rope)
        self.post_attn_norm = RMSNorm(w[f"{p}.post_attention_norm.weight"], c.norm_eps)
        self.ffn_norm = RMSNorm(w[f"{p}.ffn_norm.weight"], c.norm_eps)
        self.mlp = GeGLU(w, p)
        self.post_ffn_norm = RMSNorm(w[f"{p}.post_ffw_norm.weight"], c.norm_eps)

    def __call__(
        self, ctx: GraphContext, h: Tensor, positions: Tensor, cache: Cache, n_tokens: int, outputs: Tensor | None
    ) -> Tensor:
        a = self.post_attn_norm(self.attn(ctx, self.attn_norm(h), positions, cache, n_tokens))
        if outputs is not None:  # last layer: only the rows whose logits are wanted go on
            a, h = a.rows(outputs), h.rows(outputs)
        h = a + h
        return self.post_ffn_norm(self.mlp(self.ffn_norm(h))) + h


# ------------------------------------------------------------------------------------ the model
class Gemma3(Model):
    def __init__(self, gguf: GGUFFile, weights: Weights, backend: GGMLBackend) -> None:
        super().__init__(gguf, weights, backend)
        c = self.config = Gemma3Config.from_gguf(gguf, weights)
        self.n_vocab = c.n_vocab
        self.n_embd = c.n_embd
        local = Rotary(c.rope_dims, LOCAL_ROPE_BASE, neox=True, original_context=c.context_length)
        glob = Rotary(c.rope_dims, c.rope_base, scale=c.rope_scale, neox=True, original_context=c.context_length)
        self.ropes = [glob if t == GLOBAL else local for t in c.layer_types]
        self.embed = weights["token_embd.weight"]
        self.blocks = [Block(weights, i, c, self.ropes[i]) for i in range(c.n_layer)]
        self.norm = RMSNorm(weights["output_norm.weight"], c.norm_eps)
        tied = "output.weight" not in weights  # gemma ties the output to the embedding
        self.output = Linear(self.embed if tied else weights["output.weight"])

    def new_cache(self) -> WrapperCache:
        # The cache's window counts the positions before a token that it may see; Gemma's
        # sliding_window counts the token itself (as llama.cpp and Hugging Face mask it).
        window = SlidingWindow(self.config.sliding_window, ()).cache_window
        local = CausalCache(shift=self.shift, swa_window=window)
        return WrapperCache(local, CausalCache(shift=self.shift), layer_types=self.config.layer_types)

    def forward(self, ctx: GraphContext, batch: BatchInputs) -> Tensor:
        cache = self.cache
        assert isinstance(cache, WrapperCache)
        if batch.embeds is not None:
            h = batch.embeds  # an image's soft tokens: not scaled (as llama.cpp takes them)
        else:
            assert batch.tokens is not None
            h = self.embed.rows(batch.tokens).scale(math.sqrt(self.n_embd))  # [n_embd, n_tokens]
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            cache.set_layer(i)
            cache.set_layer_type(self.config.layer_types[i])
            outputs = batch.outputs if i == last else None
            h = block(ctx, h, batch.positions, cache, batch.n_tokens, outputs)
        h = self.norm(h)
        if batch.embeddings:
            return h  # [n_embd, n_outputs]
        return self.output(h)  # [n_vocab, n_outputs]

    def shift(self, ctx: GraphContext, layer: int, key: Tensor, delta: Tensor) -> Tensor:
        return self.ropes[layer](key, delta)

    def kv_layout(self) -> list[LayerShape]:
        c = self.config
        return [(c.head_dim, c.v_head_dim, c.n_head_kv)] * c.n_layer
