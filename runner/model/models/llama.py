"""LLaMA (Touvron et al. 2023): a pre-norm decoder-only transformer.

    h = embed(tokens)
    for each block:
        h = h + Attention(RMSNorm(h))          # grouped-query attention, RoPE on q and k
        h = h + MLP(RMSNorm(h))                # SwiGLU: down(silu(gate(x)) * up(x))
    logits = output(RMSNorm(h))                # output tied to embed when the file has none

Tensors are in GGML order (ne0 first): hidden states are ``[n_embd, n_tokens]``, a head-split
projection ``[head_dim, n_heads, n_tokens]``. The same code serves every model that differs only
in hyperparameters and in which optional tensors exist (biases on q/k/v/o, RoPE frequency
factors, head sizes that are not ``n_embd / n_head`` as mistral-style files give them);
``qwen2.py`` sets NeoX-style RoPE, ``qwen3.py`` adds q/k norms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from runner.kvcache.cache import Cache, LayerShape
from runner.ml.ggml.backend import GGMLBackend, GraphContext
from runner.ml.ggml.backend import GGMLTensor as Tensor
from runner.model.gguf_weights import GGUFError, GGUFFile, Weights
from runner.model.model import BatchInputs, Model
from runner.model.nn import Linear, RMSNorm, Rotary, SwiGLU, attention

__all__ = ["Block", "Llama", "LlamaConfig", "SelfAttention"]


@dataclass(frozen=True)
class LlamaConfig:
    """Hyperparameters, from the GGUF's ``{arch}.*`` keys."""

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
    rope_base: float
    rope_scale: float  # multiplies positions (1 / linear scaling factor)
    rope_neox: bool  # rotate (i, i + d/2) pairs instead of (2i, 2i + 1)
    context_length: int
    attn_scale: float

    @classmethod
    def from_gguf(cls, f: GGUFFile, weights: Weights, *, rope_neox: bool) -> LlamaConfig:
        def req(key: str) -> int:
            value = f.arch_get(key)
            if value is None:
                raise GGUFError(f"missing {f.arch}.{key}")
            return one(key, value)

        def one(key: str, value: object) -> int:
            """A count given once, or per layer (an array): this model needs one value."""
            if isinstance(value, (int, float)):
                return int(value)
            values = {int(x) for x in value}  # type: ignore[attr-defined]
            if len(values) != 1:
                raise GGUFError(f"per-layer {f.arch}.{key} is not supported")
            return values.pop()

        n_embd = req("embedding_length")
        n_head = req("attention.head_count")
        n_head_kv = one("attention.head_count_kv", f.arch_get("attention.head_count_kv", n_head))
        # mistral-style files give the head size (which need not be n_embd / n_head) here
        head_dim = int(f.arch_get("attention.key_length", n_embd // n_head))
        v_head_dim = int(f.arch_get("attention.value_length", head_dim))
        embd = weights["token_embd.weight"]
        scaling = f.arch_get("rope.scaling.type", "none")
        factor = float(f.arch_get("rope.scaling.factor", 0.0) or 0.0)
        if scaling not in ("none", "linear") and factor not in (0.0, 1.0):
            raise GGUFError(f"rope scaling {scaling!r} is not supported")
        attn_scale = float(f.arch_get("attention.scale", 0.0) or 0.0)
        return cls(
            n_vocab=embd.dim(1),
            n_embd=n_embd,
            n_layer=req("block_count"),
            n_head=n_head,
            n_head_kv=int(n_head_kv),
            head_dim=head_dim,
            v_head_dim=v_head_dim,
            n_ff=req("feed_forward_length"),
            norm_eps=float(f.arch_get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_dims=int(f.arch_get("rope.dimension_count", head_dim)),
            rope_base=float(f.arch_get("rope.freq_base", 10000.0)),
            rope_scale=1.0 / factor if factor > 0 else 1.0,
            rope_neox=rope_neox,
            context_length=int(f.arch_get("context_length", 0) or 0),
            attn_scale=attn_scale or 1.0 / math.sqrt(head_dim),
        )


# ----------------------------------------------------------------------------------- the blocks
class SelfAttention:
    """Grouped-query self-attention: ``n_head`` query heads share ``n_head_kv`` K/V heads."""

    def __init__(self, w: Weights, i: int, c: LlamaConfig, rope: Rotary) -> None:
        self.q = Linear.load(w, f"blk.{i}.attn_q")
        self.k = Linear.load(w, f"blk.{i}.attn_k")
        self.v = Linear.load(w, f"blk.{i}.attn_v")
        self.o = Linear.load(w, f"blk.{i}.attn_output")
        self.rope = rope
        self.n_head, self.n_head_kv = c.n_head, c.n_head_kv
        self.head_dim, self.v_head_dim = c.head_dim, c.v_head_dim
        self.scale = c.attn_scale

    def __call__(self, ctx: GraphContext, x: Tensor, positions: Tensor, cache: Cache, n_tokens: int) -> Tensor:
        q = self.q(x).reshape(self.head_dim, self.n_head, n_tokens)
        k = self.k(x).reshape(self.head_dim, self.n_head_kv, n_tokens)
        v = self.v(x).reshape(self.v_head_dim, self.n_head_kv, n_tokens)
        q = self.rope(q, positions)
        k = self.rope(k, positions)
        out = attention(ctx, q, k, v, cache, self.scale)  # [v_head_dim * n_head, n_tokens]
        return self.o(out)


class Block:
    """One transformer layer: pre-norm attention and MLP, each with a residual."""

    def __init__(self, w: Weights, i: int, c: LlamaConfig, attn: SelfAttention) -> None:
        self.attn_norm = RMSNorm(w[f"blk.{i}.attn_norm.weight"], c.norm_eps)
        self.attn = attn
        self.ffn_norm = RMSNorm(w[f"blk.{i}.ffn_norm.weight"], c.norm_eps)
        self.mlp = SwiGLU(w, f"blk.{i}")

    def __call__(
        self, ctx: GraphContext, h: Tensor, positions: Tensor, cache: Cache, n_tokens: int, outputs: Tensor | None
    ) -> Tensor:
        a = self.attn(ctx, self.attn_norm(h), positions, cache, n_tokens)
        if outputs is not None:  # last layer: only the rows whose logits are wanted go on
            a, h = a.rows(outputs), h.rows(outputs)
        h = h + a
        return h + self.mlp(self.ffn_norm(h))


# ------------------------------------------------------------------------------------ the model
class Llama(Model):
    rope_neox = False  # LLaMA rotates (2i, 2i + 1) pairs

    def __init__(self, gguf: GGUFFile, weights: Weights, backend: GGMLBackend) -> None:
        super().__init__(gguf, weights, backend)
        c = self.config = LlamaConfig.from_gguf(gguf, weights, rope_neox=self.rope_neox)
        self.n_vocab = c.n_vocab
        self.n_embd = c.n_embd
        self.rope = Rotary(
            c.rope_dims,
            c.rope_base,
            scale=c.rope_scale,
            neox=c.rope_neox,
            factors=weights.get("rope_freqs.weight"),
            original_context=c.context_length,
        )
        self.embed = weights["token_embd.weight"]
        self.blocks = [Block(weights, i, c, self.attention(weights, i)) for i in range(c.n_layer)]
        self.norm = RMSNorm(weights["output_norm.weight"], c.norm_eps)
        tied = "output.weight" not in weights  # no output matrix: reuse the embedding
        self.output = Linear(self.embed if tied else weights["output.weight"], weights.get("output.bias"))

    def attention(self, w: Weights, i: int) -> SelfAttention:
        """Layer ``i``'s attention."""
        return SelfAttention(w, i, self.config, self.rope)

    def forward(self, ctx: GraphContext, batch: BatchInputs) -> Tensor:
        assert batch.tokens is not None  # no architecture here takes given embeddings
        h = self.embed.rows(batch.tokens)  # [n_embd, n_tokens]
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            self.cache.set_layer(i)
            outputs = batch.outputs if i == last else None
            h = block(ctx, h, batch.positions, self.cache, batch.n_tokens, outputs)
        h = self.norm(h)
        if batch.embeddings:
            return h  # [n_embd, n_outputs]
        return self.output(h)  # [n_vocab, n_outputs]

    def shift(self, ctx: GraphContext, layer: int, key: Tensor, delta: Tensor) -> Tensor:
        return self.rope(key, delta)

    def kv_layout(self) -> list[LayerShape]:
        c = self.config
        return [(c.head_dim, c.v_head_dim, c.n_head_kv)] * c.n_layer
