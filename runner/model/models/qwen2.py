"""Qwen2 (Qwen Team 2024): LLaMA's block with biases on the q/k/v projections and NeoX-style
RoPE (features ``i`` and ``i + head_dim/2`` rotate together).

The biases need no code of their own: :class:`~runner.model.nn.Linear` adds
``blk.N.attn_{q,k,v}.bias`` when the file has them, and ``output.bias`` likewise.
"""

from __future__ import annotations

from .llama import Llama

__all__ = ["Qwen2"]


class Qwen2(Llama):
    rope_neox = True
