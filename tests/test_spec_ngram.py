"""Prompt lookup (runner.spec.ngram): ngram-simple's choice from an incremental index."""

from __future__ import annotations

import random

from runner.loop.slots import ImageInput
from runner.spec.ngram import PromptLookup


def scan(history: list[int], pending: int, sizes, limit: int) -> list[int]:
    """llama.cpp's way, a backward scan per key size, then a copy of what followed that may read
    its own output (LZ77's overlapping copy: a text that repeats goes on repeating): the
    reference."""
    seq = history + [pending]
    for n in sorted(sizes, reverse=True):
        if len(seq) < n:
            continue
        key = seq[-n:]
        for j in range(len(history) - n, -1, -1):  # an occurrence with a token after it in history
            if history[j : j + n] == key and j + n < len(history):
                text = list(seq)
                for i in range(limit):
                    text.append(text[j + n + i])
                return text[len(seq):]
    return []


def test_longest_key_first_most_recent_occurrence():
    # "1 2 3 4" is followed by 5 first and by 9 later: the most recent wins;
    # with "7 1 2 3 4" the longer key picks the occurrence that had 7 before it
    prompt = [7, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 9, 8, 0, 7, 1, 2, 3]
    lookup = PromptLookup(prompt, sizes=(5, 4))
    assert lookup.propose([4], 3) == [5, 6, 0]
    lookup = PromptLookup(prompt[:-4] + [8, 1, 2, 3], sizes=(5, 4))
    assert lookup.propose([4], 3) == [9, 8, 0]


def test_keys_of_12_tokens_guess_long_and_shorter_ones_share_one_kind():
    """The controller learns acceptance per kind: 12-token keys' guesses apart from the rest,
    and the 4-, 6- and 8-token keys' together (one record learns from their failures at once)."""
    text = list(range(100, 120))
    lookup = PromptLookup(text + [50] + text[:11], sizes=(12, 8, 6, 4))
    assert lookup.kinds == ("long", "short")
    assert lookup.propose([text[11]], 3) == text[12:15] and lookup.kind == "long"
    for key in (8, 6, 4):
        lookup = PromptLookup(text + [50, 51, 52, 53, 54, 55] + text[12 - key : 11], sizes=(12, 8, 6, 4))
        assert lookup.propose([text[11]], 3) == text[12:15] and lookup.kind == "short"


def test_continuation_up_to_the_limit_and_past_the_history_end():
    lookup = PromptLookup([1, 2, 3, 4, 5, 6, 1, 2, 3], sizes=(4,))
    # what followed "1 2 3 4" runs into the pending 4: the text repeats every 6 tokens, and the
    # guess goes on repeating it
    assert lookup.propose([4], 10) == [5, 6, 1, 2, 3, 4, 5, 6, 1, 2]
    assert lookup.propose([4], 2) == [5, 6]
    assert lookup.propose([4], 0) == []
    assert PromptLookup([1, 2, 3], sizes=(4,)).propose([4], 5) == []


def test_a_loop_is_guessed_as_deep_as_asked():
    """A model caught in a loop of 6 tokens: every key's latest occurrence is one period back, so
    what followed it runs into the present after 5 tokens; the guess continues the period
    (llama.cpp's lookup stops there, and 5-token guesses cap the gain)."""
    loop = [11, 12, 13, 14, 15, 16]
    lookup = PromptLookup([1, 2, 3], sizes=(12, 4))
    generated = loop * 3
    assert lookup.propose(generated, 16) == (loop * 4)[:16]
    assert lookup.kind == "long"


def test_only_emitted_tokens_enter_the_history():
    lookup = PromptLookup([10, 11, 12, 13, 14, 15], sizes=(3,))
    assert lookup.propose([20], 4) == []
    # the output so far: 20 21 22, then 10 11 pending 12 → the prompt's 13 14 15 and what
    # came after them (the output's 20)
    generated = [20, 21, 22, 10, 11, 12]
    assert lookup.propose(generated, 4) == [13, 14, 15, 20]
    # the model wrote 20 21 again: the key "20 21 22" now finds the output's own occurrence
    generated += [13, 14, 15, 20, 21, 22]
    assert lookup.propose(generated, 4) == [10, 11, 12, 13]


def test_images_are_barriers():
    img = [ImageInput("d", i, 3) for i in range(3)]
    prompt = [1, 2, 3, 4, 5] + img + [1, 2, 3, 4, 6, 7] + img + [8]
    lookup = PromptLookup(prompt, sizes=(4, 2))
    # "2 3 4 | 5" before the first image, "2 3 4 6 7" before the second: the latest wins, and its
    # continuation stops at the image
    assert lookup.propose([1, 2, 3, 4], 9) == [6, 7]
    # no key spans an image: "x x img 8 9" has only the short key "8 9" (not in the history)
    assert PromptLookup([1, 2] + img + [8], sizes=(4, 2)).propose([9], 4) == []
    # an occurrence followed by an image drafts nothing, it does not hide an older one
    lookup = PromptLookup([5, 6, 7, 1, 5, 6] + img, sizes=(2,))
    assert lookup.propose([1, 5, 6], 2) == [7, 1]


def test_agrees_with_a_backward_scan():
    rng = random.Random(7)
    for trial in range(60):
        vocab = rng.choice([3, 5, 12])
        history = [rng.randrange(vocab) for _ in range(rng.randrange(1, 80))]
        sizes = rng.choice([(4,), (6, 3), (12, 8, 6, 4), (2, 1)])
        lookup = PromptLookup(history[: rng.randrange(len(history) + 1)], sizes=sizes)
        prompt_len = len(lookup._history)
        generated: list[int] = []
        for step in range(20):
            pending = rng.randrange(vocab)
            generated.append(pending)
            full = history[:prompt_len] + generated[:-1]
            limit = rng.randrange(1, 9)
            assert lookup.propose(generated, limit) == scan(full, pending, sizes, limit), (trial, step)


def test_a_long_history_forgets_its_oldest_half():
    lookup = PromptLookup([1, 2, 3, 4, 5], sizes=(1,), max_history=8)
    generated = [9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 1]
    assert lookup.propose(generated, 3) == []  # the prompt's "1 2 3" is forgotten
    assert len(lookup._history) <= 16
    generated += [2, 7, 1]
    assert lookup.propose(generated, 3) == [2, 7, 1]  # learnt from the output after forgetting
