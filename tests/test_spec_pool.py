"""The n-gram pool a model's sequences share (runner.spec.pool): llama.cpp's ngram-mod."""

from __future__ import annotations

import random

from runner.loop.slots import ImageInput
from runner.spec.ngram import PromptLookup
from runner.spec.pool import NgramPool


def test_chains_the_continuation_key_by_key():
    pool = NgramPool(key=3)
    pool.learn([1, 2, 3, 4, 5, 6, 7])
    assert pool.chain([9, 1, 2, 3], 10) == [4, 5, 6, 7]  # then "5 6 7" has nothing after it
    assert pool.chain([2, 3], 10) == []  # shorter than a key
    assert pool.chain([1, 2, 3], 2) == [4, 5]
    pool.learn([0, 1, 2, 3, 4, 5])  # the same text again: nothing changes
    assert pool.chain([1, 2, 3], 10) == [4, 5, 6, 7]
    assert len(pool) == 5  # 1 2 3, 2 3 4, 3 4 5, 4 5 6 from the first; then 0 1 2


def test_a_key_seen_with_two_continuations_guesses_nothing():
    """llama.cpp's latest-wins guessed the renamed word at the prompt's old name, and the other
    way round, whichever was learnt last; here the chain stops before such a key, and the
    sequence's own prompt lookup guesses there."""
    pool = NgramPool(key=3)
    pool.learn([1, 2, 3, 4, 5, 6, 7])
    pool.learn([0, 1, 2, 3, 8])  # "1 2 3" was followed by 8 too
    assert pool.chain([1, 2, 3], 3) == []
    assert pool.chain([0, 1, 2], 3) == [3]  # up to the ambiguous key
    pool.learn([1, 2, 3, 4])  # and stays so
    assert pool.chain([1, 2, 3], 3) == [] and pool.chain([2, 3, 4], 3) == [5, 6, 7]
    lookup = PromptLookup([1, 2, 3, 9, 1], sizes=(3,), pool=pool)
    assert lookup.propose([2, 3], 2) == [9, 1] and lookup.kind == "short"  # its own text: "1 2 3" -> 9


def test_learns_only_the_new_part_and_stays_within_its_floor():
    pool = NgramPool(key=2)
    tokens = [5, 6, 7]
    pool.learn(tokens)
    tokens += [8, 9]
    pool.learn(tokens, start=3)  # "6 7" -> 8 and "7 8" -> 9 are new; "5 6" -> 7 was learnt
    assert pool.chain([5, 6], 5) == [7, 8, 9]
    fresh = NgramPool(key=2)
    fresh.learn([1, 2, 3, 4, 5], floor=2)  # keys start at 3: nothing of "1 2" or "2 3"
    assert fresh.chain([1, 2], 3) == [] and fresh.chain([3, 4], 3) == [5]
    fresh.learn([1, 2, 3, 4, 5], stop=2)  # only "1 2" -> 3 is below stop... and 3 is at stop: none
    assert fresh.chain([1, 2], 3) == []


def test_forgotten_whole_when_full():
    pool = NgramPool(key=1, max_keys=4)
    pool.learn([1, 2, 3, 4])
    assert pool.chain([1], 5) == [2, 3, 4]
    pool.learn([7, 8, 9])  # 3 + 2 keys would pass 4: the pool starts over
    assert pool.chain([1], 5) == [] and pool.chain([7], 5) == [8, 9]
    pool.learn(list(range(20, 40)))  # longer than the pool holds: its last 4 keys
    assert len(pool) == 4 and pool.chain([35], 9) == [36, 37, 38, 39] and pool.chain([34], 9) == []


def test_a_second_request_is_drafted_from_the_first_one_s_answer():
    pool = NgramPool(key=4)
    prompt = [100, 101, 102, 103, 104]
    answer = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    first = PromptLookup(prompt, sizes=(4,), pool=pool)
    for i in range(1, len(answer) + 1):
        first.propose(answer[:i], 4)  # the sequence drafts as it goes: the pool learns its output
    # nothing in the prompt predicts the answer: a fresh lookup without the pool cannot draft it
    assert PromptLookup(prompt, sizes=(4,)).propose(answer[:1], 8) == []
    second = PromptLookup(prompt, sizes=(4,), pool=pool)
    # its history "102 103 104" + the pending 1: the first answer's continuation
    assert second.propose(answer[:1], 8) == [2, 3, 4, 5, 6, 7, 8, 9]


def test_the_pool_keeps_out_of_images_and_what_a_sequence_did_not_emit():
    img = [ImageInput("d", i, 2) for i in range(2)]
    pool = NgramPool(key=2)
    PromptLookup([1, 2] + img + [3, 4, 5], sizes=(2,), pool=pool)
    assert pool.chain([2, 3], 2) == [] and pool.chain([1, 2], 2) == []  # no key spans the image
    assert pool.chain([0, 3, 4], 2) == [5]
    lookup = PromptLookup([10, 11, 12], sizes=(2,), pool=pool)
    lookup.propose([13, 14], 2)  # 13 was emitted, 14 is pending (not decoded yet)
    assert pool.chain([11, 12], 3) == [13]
    assert pool.chain([12, 13], 3) == []


def test_agrees_with_a_scan_of_everything_learnt():
    rng = random.Random(3)
    for trial in range(40):
        key, vocab = rng.choice([1, 2, 3]), rng.choice([3, 6])
        pool, texts = NgramPool(key=key), []
        for _ in range(rng.randrange(1, 4)):
            text = [rng.randrange(vocab) for _ in range(rng.randrange(0, 30))]
            pool.learn(text)
            texts.append(text)
        tail, limit = [rng.randrange(vocab) for _ in range(key + 2)], rng.randrange(1, 8)
        want, window = [], list(tail[-key:])
        while len(want) < limit:  # what followed every occurrence of the window's last ``key`` tokens
            after = {text[end] for text in texts for end in range(key, len(text))
                     if text[end - key : end] == window[-key:]}
            if len(after) != 1:  # never seen, or seen with two continuations
                break
            nxt = after.pop()
            want.append(nxt)
            window.append(nxt)
        assert pool.chain(tail, limit) == want, trial
