"""Images in the slot cache: an image is inputs with an identity (the sha256 of its bytes), so a
prompt that repeats an image reuses its cached positions, a different image does not, and no
prefix or context shift cuts an image in half. Plain data, as test_slots.py."""

from __future__ import annotations

from runner.loop.slots import ImageInput, InputCache, Slot, count_common_prefix, image_end, image_start, text_tokens
from tests.test_slots import RecordingKv


def image(digest: str, count: int = 4) -> list[ImageInput]:
    return [ImageInput(digest, i, count) for i in range(count)]


def cache_with(inputs, kv=None) -> InputCache:
    cache = InputCache(kv or RecordingKv(), kv_size=64, num_slots=1, multi_user=False)
    cache.slots = [Slot(0, list(inputs))]
    return cache


def test_same_image_is_a_common_prefix_and_another_is_not():
    a = [1, 2] + image("aa") + [3]
    assert count_common_prefix(a, [1, 2] + image("aa") + [3, 4]) == 7
    assert count_common_prefix(a, [1, 2] + image("bb") + [3]) == 2


def test_turn_two_reuses_the_cached_image():
    turn1 = [1, 2] + image("aa") + [3, 4, 5]
    cache = cache_with(turn1)
    slot, remaining = cache.load_slot(turn1 + [6, 7])
    assert remaining == [6, 7]
    assert slot.inputs == turn1


def test_a_prefix_ending_inside_an_image_goes_back_to_its_start():
    # the slot holds the first half of an image's positions only (e.g. a shift or a cut turn)
    cached = [1, 2] + image("aa")[:2]
    kv = RecordingKv()
    cache = cache_with(cached, kv)
    prompt = [1, 2] + image("aa") + [3]
    slot, remaining = cache.load_slot(prompt)
    assert slot.inputs == [1, 2]
    assert remaining == image("aa") + [3]
    assert ("rm", 0, 2, None) in kv.calls


def test_a_prompt_that_is_all_cached_still_evaluates_its_last_token_not_the_image():
    prompt = [1] + image("aa") + [9]
    cache = cache_with(prompt)
    _, remaining = cache.load_slot(prompt)
    assert remaining == [9]


def test_shift_drops_whole_images():
    inputs = [1, 2, 3] + image("aa", 6) + list(range(10, 30))
    kv = RecordingKv()
    cache = InputCache(kv, kv_size=32, num_slots=1, multi_user=False)
    slot = Slot(0, list(inputs))
    cache.slots = [slot]
    # keep 5 lands inside the image: the whole image goes (keep 3); the discard ends on a token
    discarded = cache.shift_slot(slot, num_keep=5)
    assert not any(isinstance(x, ImageInput) for x in slot.inputs)
    assert slot.inputs[:3] == [1, 2, 3]
    assert kv.calls[-1][:3] == ("shift", 0, 3)
    assert discarded == len(inputs) - len(slot.inputs)


def test_helpers():
    inputs = [7] + image("aa", 3) + [8]
    assert image_start(inputs, 2) == 1 and image_start(inputs, 1) == 1 and image_start(inputs, 4) == 4
    assert image_end(inputs, 2) == 4 and image_end(inputs, 4) == 4
    assert text_tokens(inputs) == [7, 8]
