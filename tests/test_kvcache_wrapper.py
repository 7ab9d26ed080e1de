"""The slot cache over a gemma-style WrapperCache(sliding window, full history): whether a prompt
may resume from its cached prefix (Ollama's ``CanResume``, reference §2.3-2.5), as a table in the
style of the seed's ``TestCanResume`` / ``TestCanResumeSWAMem``.

Bookkeeping only: the caches are initialised against a backend that only states its layout, and
no tensor is ever stored (``start_forward`` records cells; nothing calls ``put``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from runner.loop.slots import InputCache
from runner.kvcache.causal import CausalCache
from runner.kvcache.wrapper import WrapperCache
from runner.ml.backend import CacheConfig
from runner.engines.ggml.kv import CacheKv


class _LayoutOnly:
    """A backend as far as the cells need one: its layout."""

    def cache_config(self) -> CacheConfig:
        return CacheConfig(cache_padding=1)


@dataclass
class _Batch:
    positions: list[int]
    sequences: list[int]
    causal_except: tuple[int, ...] = ()


def _slots(window: int, parallel: int, ctx: int = 32) -> InputCache:
    cache = WrapperCache(CausalCache(swa_window=window), CausalCache(), layer_types=[0, 1])
    cache.init(_LayoutOnly(), "f16", parallel, ctx, 8)
    return InputCache(CacheKv(cache), ctx * parallel, parallel, multi_user=False)


def _fill(slots: InputCache, tokens: list[int]) -> None:
    """Decode ``tokens`` into slot 0 as the batch loop does: the prompt in one batch, then one
    token per batch (the window slides with every batch)."""
    slot, todo = slots.load_slot(tokens)
    cache = slots.kv.cache  # type: ignore[attr-defined]
    first = len(tokens) - 3
    cache.start_forward(None, _Batch(list(range(first)), [0] * first), False)
    for pos in range(first, len(tokens)):
        cache.start_forward(None, _Batch([pos], [0]), False)
    slot.inputs = list(tokens)
    slots.release(slot)


CONVERSATION = list(range(100, 110))  # ten tokens at positions 0..9; the last batch was position 9

CASES = [
    # name, cache window, parallel, next prompt, tokens reused
    ("continues-at-the-end", 4, 1, CONVERSATION + [1, 2], 10),
    ("one-back-fits-the-window", 4, 1, CONVERSATION[:9] + [1], 9),
    ("two-back-window-gone", 4, 1, CONVERSATION[:8] + [1], 0),
    ("edit-at-the-start", 4, 1, CONVERSATION[:2] + [1], 0),
    ("same-prompt-leaves-one", 4, 1, CONVERSATION, 9),
    ("parallel-keeps-one-more", 4, 2, CONVERSATION[:8] + [1], 8),
    ("parallel-three-back-gone", 4, 2, CONVERSATION[:7] + [1], 0),
    ("window-covers-everything", 16, 1, CONVERSATION[:2] + [1], 2),
]


@pytest.mark.parametrize("name,window,parallel,prompt,reused", CASES, ids=[c[0] for c in CASES])
def test_can_resume_through_the_slot_cache(name: str, window: int, parallel: int, prompt: list[int],
                                           reused: int) -> None:
    slots = _slots(window, parallel)
    _fill(slots, CONVERSATION)
    slot, todo = slots.load_slot(prompt)
    assert len(prompt) - len(todo) == reused
    assert slot.inputs == prompt[:reused]
    cache = slots.kv.cache  # type: ignore[attr-defined]
    if reused == 0:  # started over: neither the window cache nor the full one keeps anything
        assert all(c.table.seq_positions(slot.id) == [] for c in cache.caches)
    else:  # kept exactly the reused prefix in the full cache, and its tail in the window cache
        assert cache.caches[1].table.seq_positions(slot.id) == list(range(reused))
        assert max(cache.caches[0].table.seq_positions(slot.id)) == reused - 1
