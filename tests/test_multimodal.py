"""The input-stream layout of images and the mask that gives image rows llama.cpp's attention
(``runner.model.multimodal``): pure functions, checked against tables and against a replay of
how llama.cpp + libmtmd decode a prompt with an image (text chunks causal, image chunks in
batches of their own with causal attention off). The layout itself is checked against libmtmd's
tokenization in ``tests/test_vision.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from runner.model.multimodal import (
    GEMMA3_END_OF_IMAGE,
    GEMMA3_START_OF_IMAGE,
    ImageInput,
    Input,
    attention_mask,
    gemma3_post_tokenize,
)

SOI, EOI = GEMMA3_START_OF_IMAGE, GEMMA3_END_OF_IMAGE


def test_gemma3_wraps_each_image_in_its_markers() -> None:
    img = ImageInput("abc", 3)
    got = gemma3_post_tokenize([2, 10, img, 11, ImageInput("def", 1)])
    assert got == [
        Input(2),
        Input(10),
        Input(SOI, same_batch=4),
        Input(image="abc", row=0, ahead=2),
        Input(image="abc", row=1, ahead=1),
        Input(image="abc", row=2, ahead=0),
        Input(EOI),
        Input(11),
        Input(SOI, same_batch=2),
        Input(image="def", row=0, ahead=0),
        Input(EOI),
    ]
    assert got[3].key == (0, "abc", 0) != got[9].key
    with pytest.raises(ValueError):
        ImageInput("x", 0)


def test_mask_in_one_batch_table() -> None:
    """text t0 t1, SOI, 3 rows, EOI, t2 in one batch of one sequence (positions 0..7)."""
    layout = gemma3_post_tokenize([5, 6, ImageInput("a", 3), 7])
    n = len(layout)
    mask = attention_mask(range(n), [0] * n, [x.ahead for x in layout], range(n), [{0}] * n)
    seen = (mask == 0).astype(int)
    assert seen.tolist() == [
        [1, 0, 0, 0, 0, 0, 0, 0],  # t0
        [1, 1, 0, 0, 0, 0, 0, 0],  # t1
        [1, 1, 1, 0, 0, 0, 0, 0],  # SOI: causal, does not see the rows
        [1, 1, 1, 1, 1, 1, 0, 0],  # row 0 sees the whole image, not EOI
        [1, 1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 1, 1, 1, 1, 0],  # EOI: causal
        [1, 1, 1, 1, 1, 1, 1, 1],
    ]
    assert mask.dtype == np.float32 and np.isneginf(mask[0, 1])


def test_mask_keeps_sequences_apart_and_applies_the_window() -> None:
    # cells: seq 0 at positions 0..5, seq 1 at 0..2, one free cell, a cell shared by both at 6
    cell_pos = [0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 6]
    cell_seq = [{0}] * 6 + [{1}] * 3 + [set()] + [{0, 1}]
    # batch: seq 0 row at pos 3 seeing 2 ahead, seq 1 text at pos 2, seq 0 text at 6
    mask = attention_mask([3, 2, 6], [0, 1, 0], [2, 0, 0], cell_pos, cell_seq, window=2)
    seen = (mask == 0).astype(int).tolist()
    assert seen[0] == [0, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0]  # window 2 behind, 2 ahead
    assert seen[1] == [0, 0, 0, 0, 0, 0, 1, 1, 1, 0, 0]
    assert seen[2] == [0, 0, 0, 0, 1, 1, 0, 0, 0, 0, 1]  # the shared cell at 6 too


# ------------------------------------------------------------------- replay of llama.cpp
def llama_cpp_visible(layout: list[Input], n_batch: int, window: int | None) -> list[set[int]]:
    """What each position sees when llama.cpp + libmtmd decode ``layout`` (one sequence from
    position 0): text chunks in batches of ``n_batch``, causal; each image's rows in batches of
    ``n_batch`` of their own with causal attention off (a token sees every cell of its
    sequence in the cache, the batch included); the sliding window applies throughout."""
    in_cache: list[int] = []
    seen: list[set[int]] = [set() for _ in layout]
    chunks: list[tuple[bool, list[int]]] = []
    for i, x in enumerate(layout):
        is_row = x.image is not None
        if chunks and chunks[-1][0] == is_row and (not is_row or layout[chunks[-1][1][-1]].image == x.image):
            chunks[-1][1].append(i)
        else:
            chunks.append((is_row, [i]))
    for non_causal, idx in chunks:
        for b in range(0, len(idx), n_batch):
            batch = idx[b : b + n_batch]
            in_cache.extend(batch)
            for i in batch:
                seen[i] = {
                    j for j in in_cache if (non_causal or j <= i) and (window is None or j >= i - window)
                }
    return seen


def ours_visible(layout: list[Input], batches: list[list[int]], window: int | None) -> list[set[int]]:
    """What each position sees through :func:`attention_mask` with our batches."""
    in_cache: list[int] = []
    seen: list[set[int]] = [set() for _ in layout]
    for batch in batches:
        in_cache.extend(batch)
        mask = attention_mask(batch, [0] * len(batch), [layout[i].ahead for i in batch], in_cache,
                              [{0}] * len(in_cache), window)
        for row, i in enumerate(batch):
            seen[i] = {in_cache[j] for j in np.flatnonzero(mask[row] == 0)}
    return seen


def same_batch_batches(layout: list[Input], n_batch: int) -> list[list[int]]:
    """Our batching: up to ``n_batch`` inputs, an input's ``same_batch`` group kept whole (the
    batch grows for it, as in Ollama's runner)."""
    batches: list[list[int]] = []
    cur: list[int] = []
    i = 0
    while i < len(layout):
        group = list(range(i, min(len(layout), i + 1 + layout[i].same_batch)))
        if cur and len(cur) + len(group) > n_batch:
            batches.append(cur)
            cur = []
        cur.extend(group)
        i = group[-1] + 1
    if cur:
        batches.append(cur)
    return batches


def llama_cpp_batches(layout: list[Input], n_batch: int) -> list[list[int]]:
    """llama.cpp's split points: a break before and after each image, its rows by ``n_batch``."""
    out: list[list[int]] = []
    cur: list[int] = []
    for i, x in enumerate(layout):
        boundary = i > 0 and (x.image != layout[i - 1].image)
        if cur and (boundary or len(cur) == n_batch):
            out.append(cur)
            cur = []
        cur.append(i)
    out.append(cur)
    return out


PROMPTS = {
    "one image": [2, 10, 11, ImageInput("a", 16), 12, 13],
    "two images": [2, ImageInput("a", 5), 7, 8, 9, ImageInput("b", 7), 3],
    "image first": [ImageInput("a", 9), 4, 5],
}


@pytest.mark.parametrize("name", PROMPTS)
@pytest.mark.parametrize("window", [None, 4])
def test_one_batch_per_image_gives_llama_cpps_attention(name: str, window: int | None) -> None:
    """An image kept in one batch with its markers and the text around it (same_batch): each
    position sees what it sees in llama.cpp, whose image batch holds only the rows."""
    layout = gemma3_post_tokenize(PROMPTS[name])
    for n_batch in (32, 20, 6):
        ours = ours_visible(layout, same_batch_batches(layout, n_batch), window)
        assert ours == llama_cpp_visible(layout, max(n_batch, 16), window), n_batch


@pytest.mark.parametrize("name", PROMPTS)
@pytest.mark.parametrize("n_batch", [1, 3, 4, 7])
def test_image_split_like_llama_cpp_gives_its_attention(name: str, n_batch: int) -> None:
    """An image split across batches where llama.cpp splits it: the same visibility, rows of a
    later batch unseen by earlier rows."""
    layout = gemma3_post_tokenize(PROMPTS[name])
    ours = ours_visible(layout, llama_cpp_batches(layout, n_batch), None)
    want = llama_cpp_visible(layout, n_batch, None)
    assert ours == want
    if name == "one image" and n_batch == 4:
        first_row = 4  # BOS, 10, 11, SOI, then row 0
        assert want[first_row] == set(range(first_row + 4))  # its own batch of 4 rows, not the rest
