"""Sampling of the next token from logits (greedy, temperature, top_k, top_p, min_p, seed,
repetition penalties). See :mod:`.samplers`."""

from __future__ import annotations

from .samplers import Sampler, SamplerOptions, apply_penalties

__all__ = ["Sampler", "SamplerOptions", "apply_penalties"]
