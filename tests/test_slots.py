"""The slot cache policy tables of reference §1.2–1.3 / §2.3 (Go's cache_test.go), on plain data.

The KV memory is a recording fake here: these tests isolate the policy. The same policy is
exercised on real models in test_llamarunner.py.
"""

from __future__ import annotations

import time

import pytest

from runner.loop.slots import InputCache, ReprocessInputs, Slot, count_common_prefix, shift_discard


class RecordingKv:
    def __init__(self, partial_erase: bool = True, shift_ok: bool = True, resume_ok: bool = True):
        self.calls: list[tuple] = []
        self.partial_erase, self.shift_ok, self.resume_ok = partial_erase, shift_ok, resume_ok

    def seq_rm(self, seq, begin, end):
        self.calls.append(("rm", seq, begin, end))
        return self.partial_erase or (begin == 0 and end is None)

    def seq_cp(self, src, dst, length):
        self.calls.append(("cp", src, dst, length))

    def shift(self, seq, keep, discard, length):
        self.calls.append(("shift", seq, keep, discard, length))
        return self.shift_ok

    def can_resume(self, seq, pos):
        return self.resume_ok


def make_cache(slots: list[Slot], multi_user: bool, kv=None) -> InputCache:
    cache = InputCache(kv or RecordingKv(), kv_size=2048 * len(slots), num_slots=len(slots), multi_user=multi_user)
    cache.slots = slots
    return cache


@pytest.mark.parametrize(
    "a,b,expected",
    [
        ([1, 2, 3], [1, 2, 3], 3),  # equal
        ([1, 2], [1, 2, 3, 4], 2),  # prefix
        ([1, 2, 3], [1, 5, 3], 1),  # mixed
        ([], [1, 2], 0),  # empty
        (list(range(1000)), list(range(999)) + [7], 999),  # long (chunked compare)
        (list(range(600)), list(range(600)), 600),
    ],
)
def test_count_common(a, b, expected):
    assert count_common_prefix(a, b) == expected


def _slots(spec):
    now = time.monotonic()
    out = []
    for i, (inputs, ago, in_use) in enumerate(spec):
        out.append(Slot(i, list(inputs), in_use=in_use, last_used=0.0 if ago is None else now - ago))
    return out


# (name, slots [(inputs, seconds ago | None=zero time, in_use)], prompt, longest->(slot,len), best->(slot,len))
FIND_CASES = [
    ("Empty", [([], None, False), ([], None, False)], [1], (0, 0), (0, 0)),
    ("Extend", [([1], 1, False), ([1, 2], 2, False)], [1, 2], (1, 2), (1, 2)),
    ("New", [([1, 2], 1, False), ([], None, False)], [2], (0, 0), (1, 0)),
    ("Fork", [([1, 2], 1, False), ([], None, False)], [1], (0, 1), (1, 1)),
    ("Evict", [([1], 1, False), ([1, 2], 2, False)], [2, 3], (0, 0), (1, 0)),
    ("In use", [([1, 2], 1, True), ([1], 2, False)], [1, 2], (1, 1), (1, 2)),
]


@pytest.mark.parametrize("name,spec,prompt,longest,best", FIND_CASES, ids=[c[0] for c in FIND_CASES])
def test_find_cache_slot(name, spec, prompt, longest, best):
    cache = make_cache(_slots(spec), multi_user=False)
    slot, n = cache.find_longest_slot(prompt)
    assert (slot.id, n) == longest

    kv = RecordingKv()
    cache = make_cache(_slots(spec), multi_user=True, kv=kv)
    slot, n = cache.find_best_slot(prompt)
    assert (slot.id, n) == best
    if name in ("Fork", "In use"):
        # the prefix was copied from slot 0 into slot 1
        assert ("cp", 0, 1, n) in kv.calls
        assert slot.inputs == prompt[:n]


def test_no_free_slot_is_an_error():
    cache = make_cache(_slots([([1], 1, True)]), multi_user=False)
    with pytest.raises(RuntimeError, match="no available cache slots"):
        cache.find_longest_slot([1])
    cache = make_cache(_slots([([1], 1, True)]), multi_user=True)
    with pytest.raises(RuntimeError, match="no available cache slots"):
        cache.find_best_slot([2])


@pytest.mark.parametrize(
    "num_keep,input_len,expected",
    [(5, 2048, 1021), (2047, 2048, 1), (0, 2048, 1024), (5, 5000, 3973), (2047, 5000, 2953), (5, 512, 0)],
)
def test_shift_discard(num_keep, input_len, expected):
    assert shift_discard(2048, input_len, num_keep) == expected


@pytest.mark.parametrize("multi_user", [False, True])
def test_load_slot_hit_leaves_one_input(multi_user):
    kv = RecordingKv()
    cache = make_cache(_slots([([1, 2, 3], 1, False), ([], None, False)]), multi_user, kv)
    slot, remaining = cache.load_slot([1, 2, 3, 4, 5])
    assert slot.id == 0 and remaining == [4, 5] and slot.inputs == [1, 2, 3] and slot.in_use
    cache.release(slot)
    # exact match: one input is left to evaluate so there are logits to sample
    slot, remaining = cache.load_slot([1, 2, 3])
    assert remaining == [3] and slot.inputs == [1, 2]
    assert kv.calls[-1] == ("rm", 0, 2, None)


def test_load_slot_without_partial_erase_starts_over():
    kv = RecordingKv(partial_erase=False)
    cache = make_cache(_slots([([1, 2, 3], 1, False)]), False, kv)
    slot, remaining = cache.load_slot([1, 2, 9])
    assert remaining == [1, 2, 9] and slot.inputs == []
    assert kv.calls[-2:] == [("rm", 0, 2, None), ("rm", 0, 0, None)]


def test_load_slot_cannot_resume_starts_over():
    cache = make_cache(_slots([([1, 2, 3], 1, False)]), False, RecordingKv(resume_ok=False))
    _, remaining = cache.load_slot([1, 2, 3, 4])
    assert remaining == [1, 2, 3, 4]


def test_shift_slot_in_place():
    kv = RecordingKv()
    cache = InputCache(kv, kv_size=10, num_slots=1, multi_user=False)
    slot = cache.slots[0]
    slot.inputs = list(range(10))
    assert cache.shift_slot(slot, num_keep=2) == 4
    assert slot.inputs == [0, 1, 6, 7, 8, 9]
    assert kv.calls == [("shift", 0, 2, 4, 10)]


def test_shift_slot_unsupported_reprocesses():
    kv = RecordingKv(shift_ok=False)
    cache = InputCache(kv, kv_size=10, num_slots=1, multi_user=False)
    slot = cache.slots[0]
    slot.inputs = list(range(10))
    with pytest.raises(ReprocessInputs) as err:
        cache.shift_slot(slot, num_keep=2)
    assert err.value.inputs == [0, 1, 6, 7, 8, 9]
    assert slot.inputs == []
    assert kv.calls[-1] == ("rm", 0, 0, None)


def test_shift_slot_num_keep_too_large():
    cache = InputCache(RecordingKv(), kv_size=10, num_slots=1, multi_user=False)
    with pytest.raises(ValueError):
        cache.shift_slot(cache.slots[0], num_keep=10)


def test_at_least_one_cell_per_slot():
    with pytest.raises(ValueError, match="at least one kv cache entry"):
        InputCache(RecordingKv(), kv_size=1, num_slots=2, multi_user=False)


# A prompt that reuses nothing (embeddings, cache_prompt off) takes the least valuable free slot:
# an empty one first, else the least recently used; never a warm slot while an empty one is free.
# (name, slots [(inputs, seconds ago | None=zero time, in_use)], expected slot)
SCRATCH_CASES = [
    ("Empty beside warm", [([1, 2, 3], 1, False), ([], None, False)], 1),
    ("Emptied just now", [([1, 2, 3], 5, False), ([], 0, False)], 1),
    ("Warm in use", [([1, 2], 1, True), ([7], 1, False), ([], 2, False)], 2),
    ("Least recently used", [([1, 2, 3], 1, False), ([4, 5], 3, False)], 1),
]


@pytest.mark.parametrize("multi_user", [False, True])
@pytest.mark.parametrize("name,spec,expected", SCRATCH_CASES, ids=[c[0] for c in SCRATCH_CASES])
def test_a_prompt_that_reuses_nothing_takes_the_least_valuable_slot(name, spec, expected, multi_user):
    kv = RecordingKv()
    cache = make_cache(_slots(spec), multi_user, kv)
    warm = {s.id: list(s.inputs) for s in cache.slots if s.id != expected}
    slot, remaining = cache.load_slot([1, 2, 9], cache_prompt=False)
    assert slot.id == expected and remaining == [1, 2, 9] and slot.inputs == []
    assert {s.id: s.inputs for s in cache.slots if s.id != expected} == warm  # nothing else evicted
    assert not any(call[0] == "cp" for call in kv.calls)  # nor forked into the scratch slot
    assert ("rm", expected, 0, None) in kv.calls
