"""The prompt store in the batch loop, on the old engine and SmolLM2 (OLLAMA_CACHE_RAM on).

One slot, two conversations taking turns: A, then B (which takes the slot: A's state goes to
RAM), then A's next turn (restored). The baseline is A's next turn on a runner without a store
whose slot still holds A: the restored turn must cache as much and produce the same greedy tokens
with bitwise equal log-probabilities (the same cells, the same batches: K/V depend on the batch
split, so a recompute is not the baseline).
"""

from __future__ import annotations

import dataclasses

import pytest

import runner
from runner import config
from runner.api import Message, Options
from kvturns import turn


DOC = ("The lighthouse keeper climbed the spiral stairs every evening, counting the steps as his father "
       "had taught him. There were one hundred and twelve of them, worn smooth by a century of boots. ") * 4
OTHER = ("A recipe for bread: flour, water, salt and yeast, kneaded for ten minutes, left to rise "
         "twice, then baked hot until the crust sings when it cools. ") * 4


def load_old(cache_ram: int, pipeline: bool = False):
    # one thread each: two runners' llama.cpp threads spinning against each other on 2 cores took 45 s
    cfg = dataclasses.replace(config.load({}), new_engine=False, cache_ram=cache_ram, pipeline=pipeline,
                              cache_disk=0)  # RAM only here (the disk tier: tests/test_kvstore_disk.py)
    r = runner.load(runner.resolve(None, cfg), Options().merged({"num_ctx": 2048, "num_thread": 1}), cfg,
                    num_parallel=1)
    assert r.engine == "old"
    return r


@pytest.fixture(scope="module", params=[False, True], ids=["inline", "pipeline"])
def runners(request):
    """(a runner with a RAM store, one without), one slot each; the stored one decodes inline or
    on a compute thread (the store is used between decodes, on the loop thread, either way)."""
    stored, plain = load_old(64, pipeline=request.param), load_old(0)
    yield stored, plain
    stored.close()
    plain.close()


def test_an_evicted_conversation_resumes_from_ram_exactly(runners):
    stored, plain = runners
    assert stored.cache.store is not None and plain.cache.store is None
    a = [Message("user", "Read this and tell me how many steps there were.\n\n" + DOC)]
    answer, m1, _ = turn(plain, a)
    assert turn(stored, a)[0] == answer and m1.prompt_eval_count > 100

    b = [Message("user", "Summarise this recipe.\n\n" + OTHER)]
    _, mb, _ = turn(stored, b)  # B takes the only slot: A goes to RAM
    assert mb.prompt_cached_count < m1.prompt_eval_count / 2
    assert stored.cache.store.used > 0

    a2 = a + [Message("assistant", answer), Message("user", "And who taught him to count them?")]
    want_text, want, want_lp = turn(plain, a2)  # A's slot is still warm
    got_text, got, got_lp = turn(stored, a2)  # A is restored from RAM
    assert got.prompt_cached_count == want.prompt_cached_count > m1.prompt_eval_count
    assert got.prompt_eval_count == want.prompt_eval_count
    assert got_text == want_text
    assert got_lp == want_lp  # bitwise: floats compared exactly

    # B comes back too (A's longer state went to RAM when B took the slot back)
    b2 = b + [Message("assistant", "Bread."), Message("user", "How long does it bake?")]
    _, mb2, _ = turn(stored, b2)
    assert mb2.prompt_cached_count >= mb.prompt_eval_count
