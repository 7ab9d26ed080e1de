"""Images on the new engine (our gemma3 encoder + the text model decoding its soft tokens), with
gemma-3-270m and a random-weight gemma3 projector (tests/mmproj.py): the old engine (libmtmd) and
libmtmd's own prompt evaluation are the oracles for the inputs and the greedy tokens after an
image, in one batch and split across batches; a second turn neither encodes nor decodes the image
again. Random weights give junk text: the tests compare tokens and counts, never meaning."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import ctypes

import llama_cpp as L
import llama_cpp.mtmd_cpp as M
import numpy as np
import pytest

import runner
from runner import config
from runner.api import Message, Options, Request
from runner.images import image_from_bytes
from runner.loop.slots import ImageInput
from runner.model.model import Batch
from tests.conftest import collect
from tests.mmproj import MMProjSpec, write_mmproj
from tests.test_gemma3 import gemma3  # noqa: F401  (the fixture)
from tests.test_vision_llama import GREEDY, _oracle, picture

pytestmark = pytest.mark.slow
N = MMProjSpec().n_tokens  # 16 soft tokens an image
PROMPT = "<start_of_turn>user\n{}What is in this picture?<end_of_turn>\n<start_of_turn>model\n"


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory) -> Path:
    return write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-gemma3.gguf")


def _load(model: Path, projector: Path | None, engine: str, **options):
    cfg = dataclasses.replace(config.load({}), new_engine=(engine == "new"))
    opts = Options().merged({"num_ctx": 512, "num_batch": 64, **options})
    r = runner.load(runner.resolve(str(model), cfg, projector=str(projector) if projector else None), opts, cfg,
                    num_parallel=1)
    assert r.engine == engine
    return r


@pytest.fixture(scope="module")
def new(gemma3, mmproj):  # noqa: F811
    r = _load(gemma3, mmproj, "new")
    yield r
    r.close()


@pytest.fixture(scope="module")
def old(gemma3, mmproj):  # noqa: F811
    r = _load(gemma3, mmproj, "old")
    yield r
    r.close()


def _generate(r, data: bytes, n: int = 12):
    request = Request(prompt=PROMPT.format("[img-0]"), raw=True, images=[image_from_bytes(data)],
                      options=Options().merged({**GREEDY, "num_predict": n}))
    return list(r.stream(request))[-1]


def test_the_new_engine_lays_an_image_out_as_libmtmd_does(new, old):
    image = image_from_bytes(picture(200, 150, seed=3))
    ours, theirs = new.model_engine.image_inputs(image), old.model_engine.image_inputs(image)
    assert ours == theirs  # <start_of_image>, 16 ImageInputs with the image's digest, <end_of_image>
    assert sum(isinstance(x, ImageInput) for x in ours) == N


@pytest.mark.parametrize("size, fmt", [((224, 224), "PNG"), ((300, 120), "PNG"), ((97, 333), "JPEG"),
                                       ((640, 480), "JPEG")])
def test_greedy_tokens_after_an_image_match_the_old_engine_and_libmtmd(new, old, size, fmt):
    data = picture(*size, fmt=fmt, seed=size[0])
    ours, theirs = _generate(new, data), _generate(old, data)
    assert ours.metrics.prompt_tokens == theirs.metrics.prompt_tokens
    assert ours.context == theirs.context
    want = _oracle(old, PROMPT.format(M.mtmd_default_marker().decode()).encode(), data, 12)
    generated = ours.context[ours.metrics.prompt_tokens - N:]
    assert generated[:len(want)] == want and len(want) > 0


def test_an_image_larger_than_the_batch_is_decoded_in_pieces_as_libmtmd_does(gemma3, mmproj, old):  # noqa: F811
    """num_batch 8 < 16 soft tokens: two pieces, the second seeing the first through the cache."""
    data = picture(256, 192, fmt="PNG", seed=5)
    split_new = _load(gemma3, mmproj, "new", num_batch=8)
    split_old = _load(gemma3, mmproj, "old", num_batch=8)  # libmtmd's context with n_batch 8
    try:
        ours = _generate(split_new, data)
        want = _oracle(split_old, PROMPT.format(M.mtmd_default_marker().decode()).encode(), data, 12)
        generated = ours.context[ours.metrics.prompt_tokens - N:]
        assert generated[:len(want)] == want and len(want) > 0
    finally:
        split_new.close()
        split_old.close()


def test_second_turn_reuses_the_image_without_encoding_it(new):
    stats = new.model_engine.vision.stats
    image = image_from_bytes(picture(128, 96, seed=7))
    opts = Options().merged({**GREEDY, "num_predict": 6})
    before = dataclasses.replace(stats)
    messages = [Message("user", "Describe it.", images=[image])]
    text1, final1 = collect(new.stream(Request(messages=messages, options=opts)))
    assert (stats.encodes, stats.decodes) == (before.encodes + 1, before.decodes + 1)
    messages += [Message("assistant", text1), Message("user", "And the colours?")]
    _, final2 = collect(new.stream(Request(messages=messages, options=opts)))
    assert (stats.encodes, stats.decodes) == (before.encodes + 1, before.decodes + 1)  # the slot held it
    assert final2.metrics.prompt_cached_count >= final1.metrics.prompt_tokens - 1
    # the same picture in a new conversation: decoded again, but its embedding stayed on the host
    collect(new.stream(Request(messages=[Message("system", "new conversation"),
                                       Message("user", "two", images=[image])], options=opts)))
    assert (stats.encodes, stats.decodes) == (before.encodes + 1, before.decodes + 2)


def test_a_text_only_request_on_the_vision_model_matches(new, old, gemma3):  # noqa: F811
    request = Request(prompt="Once upon a time", options=Options().merged({**GREEDY, "num_predict": 12}))
    ours = collect(new.stream(request))[1]
    plain = _load(gemma3, None, "new")
    try:
        alone = collect(plain.stream(request))[1]
    finally:
        plain.close()
    assert ours.context == alone.context
    assert ours.context == collect(old.stream(request))[1].context


def _prompt(r, data: bytes):
    """PROMPT around the image as inputs: (text before + <start_of_image>, the image's rows,
    <end_of_image> + text after)."""
    eng = r.model_engine
    before, after = PROMPT.split("{}")
    inputs = eng.image_inputs(image_from_bytes(data))
    return eng.tokenize(before) + [inputs[0]], inputs[1:-1], [inputs[-1]] + eng.tokenize(after, add_special=False)


def _llama_logits(old, head: list[int], embd: np.ndarray, tail: list[int], num_batch: int) -> np.ndarray:
    """llama.cpp's logits after ``head``, the image's embeddings ``embd`` given as llama_batch.embd
    in pieces of ``num_batch`` with causal attention off (what libmtmd says its helper does for
    gemma3), then ``tail``: a fresh context of the old engine's model."""
    ctx = L.llama_init_from_model(old.model_engine._model, old.model_engine._cparams)
    assert ctx

    try:
        _decode_tokens(ctx, head, 0)
        pos = len(head)
        L.llama_set_causal_attn(ctx, False)
        for first in range(0, len(embd), num_batch):
            piece = np.ascontiguousarray(embd[first:first + num_batch], dtype=np.float32)
            b = L.llama_batch_init(len(piece), piece.shape[1], 1)
            b.n_tokens = len(piece)
            ctypes.memmove(b.embd, piece.ctypes.data, piece.nbytes)
            for i in range(len(piece)):
                b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = pos + first + i, 1, 0, 0
            assert L.llama_decode(ctx, b) == 0
            L.llama_batch_free(b)
        L.llama_set_causal_attn(ctx, True)
        _decode_tokens(ctx, tail, pos + len(embd))
        return np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), shape=(old.n_vocab,)).copy()
    finally:
        L.llama_free(ctx)


def _decode_tokens(ctx, ts: list[int], pos: int, step: int = 8) -> None:
    for first in range(0, len(ts), step):
        _decode_piece(ctx, ts[first:first + step], pos + first)


def _decode_piece(ctx, ts: list[int], pos: int) -> None:
    b = L.llama_batch_init(len(ts), 0, 1)
    b.n_tokens = len(ts)
    for i, t in enumerate(ts):
        b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0], b.logits[i] = t, pos + i, 1, 0, int(i == len(ts) - 1)
    assert L.llama_decode(ctx, b) == 0
    L.llama_batch_free(b)


def _new_logits(r, head: list[int], rows: list, tail: list[int]) -> np.ndarray:
    """The logits after the prompt on the new engine, straight through its model and
    decode_image (a runner used for nothing else: its slot bookkeeping is bypassed)."""
    eng = r.model_engine
    eng.kv.seq_rm(0, 0, None)
    for first in range(0, len(head), 8):  # text in pieces of 8, as _decode_tokens
        eng.model.compute(Batch.sequence(head[first:first + 8], start=first))
    eng.decode_image(rows[0], len(head), 0)
    pos = len(head) + len(rows)
    for first in range(0, len(tail), 8):
        out = eng.model.compute(Batch.sequence(tail[first:first + 8], start=pos + first))
    return out[0].copy()


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max())


@pytest.mark.parametrize("num_batch", [64, 8])
def test_logits_after_an_image_equal_llama_cpps(gemma3, mmproj, num_batch):  # noqa: F811
    """The next-token logits after an image equal llama.cpp's decode of the same embeddings (max
    abs diff 0), in one batch (64) and split in two pieces (8: each sees the earlier piece
    through the cache); splitting changes them, so the split case is really checked."""
    data = picture(300, 200, fmt="JPEG", seed=9)
    ours_r, old_r = _load(gemma3, mmproj, "new", num_batch=num_batch), _load(gemma3, mmproj, "old", num_batch=num_batch)
    try:
        head, rows, tail = _prompt(ours_r, data)
        embd = ours_r.model_engine.vision.embedding(rows[0])
        ours, want = _new_logits(ours_r, head, rows, tail), _llama_logits(old_r, head, embd, tail, num_batch)
        print(f"num_batch {num_batch}: max abs diff {_diff(ours, want):.2e} of {np.abs(want).max():.1f}")
        assert _diff(ours, want) == 0.0
        if num_batch < N:
            whole_r = _load(gemma3, mmproj, "old")  # a context whose n_batch holds the image
            try:
                whole = _llama_logits(whole_r, head, embd, tail, N)
            finally:
                whole_r.close()
            print(f"split vs whole: max abs diff {_diff(whole, want):.2e}")
            assert _diff(whole, want) > 1e-3 * float(np.abs(want).max())
    finally:
        ours_r.close()
        old_r.close()
