"""Images on the old engine (libmtmd), with gemma-3-270m and a random-weight gemma3 projector
(tests/mmproj.py): libmtmd's own prompt evaluation is the oracle for the greedy tokens after an
image; the slot cache keeps an image by identity, so a second turn neither encodes nor decodes it.
Random weights give junk text: the tests compare tokens and counts, never meaning."""

from __future__ import annotations

import ctypes
import dataclasses
import io
from pathlib import Path

import llama_cpp as L
import llama_cpp.mtmd_cpp as M
import numpy as np
import pytest
from PIL import Image as PILImage

import runner
from runner import config
from runner.api import InvalidModel, InvalidRequest, Message, NoVision, Options, Request
from runner.images import image_from_bytes
from tests.conftest import STORIES, collect
from tests.conftest import fresh_cache_dir
from tests.mmproj import MMProjSpec, write_mmproj
from tests.test_gemma3 import gemma3  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow
IMAGE_TOKENS = MMProjSpec().n_tokens  # 16
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "seed": 1}


def picture(width: int, height: int, fmt: str = "PNG", seed: int = 0) -> bytes:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PILImage.fromarray(pixels).save(buf, fmt)
    return buf.getvalue()


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory) -> Path:
    return write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-gemma3.gguf")


def _load(model: Path, projector: Path | None, **options):
    cfg = dataclasses.replace(config.load({}), new_engine=False, cache_dir=fresh_cache_dir())
    opts = Options().merged({"num_ctx": 512, "num_batch": 64, **options})
    return runner.load(runner.resolve(str(model), cfg, projector=str(projector) if projector else None), opts, cfg,
                       num_parallel=1)


@pytest.fixture(scope="module")
def vision(gemma3, mmproj):  # noqa: F811
    r = _load(gemma3, mmproj)
    yield r
    r.close()


def _oracle(r, prompt: bytes, data: bytes, n: int) -> list[int]:
    """Greedy tokens from libmtmd's own path: mtmd_tokenize the prompt with its media marker,
    mtmd_helper_eval_chunks into a fresh context of the same model and parameters, then argmax."""
    ctx = L.llama_init_from_model(r.model_engine._model, r.model_engine._cparams)
    assert ctx
    try:
        proj = r.model_engine.vision._ctx
        arr = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = M.mtmd_helper_bitmap_init_from_buf(proj, arr, len(data), False)
        chunks = M.mtmd_input_chunks_init()
        text = M.mtmd_input_text(prompt, len(prompt), True, True)
        assert M.mtmd_tokenize(proj, chunks, ctypes.byref(text), (M.mtmd_bitmap_p_ctypes * 1)(bitmap), 1) == 0
        n_past = L.llama_pos(0)
        assert M.mtmd_helper_eval_chunks(proj, ctx, chunks, 0, 0, r.num_batch, True, ctypes.byref(n_past)) == 0
        M.mtmd_input_chunks_free(chunks)
        M.mtmd_bitmap_free(bitmap)
        out: list[int] = []
        batch = L.llama_batch_init(1, 0, 1)
        pos, row = n_past.value, -1
        for _ in range(n):
            logits = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, row), shape=(r.n_vocab,))
            token = int(np.argmax(logits))
            if r.model_engine.is_eog(token):
                break
            out.append(token)
            batch.n_tokens = 1
            batch.token[0], batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = token, pos, 1, 0, 1
            assert L.llama_decode(ctx, batch) == 0
            pos, row = pos + 1, 0
        L.llama_batch_free(batch)
        return out
    finally:
        L.llama_free(ctx)


@pytest.mark.parametrize("size, fmt", [((224, 224), "PNG"), ((300, 120), "PNG"), ((97, 333), "JPEG")])
def test_greedy_tokens_after_an_image_match_libmtmd(vision, size, fmt):
    data = picture(*size, fmt=fmt, seed=size[0])
    prompt = "<start_of_turn>user\n{}What is in this picture?<end_of_turn>\n<start_of_turn>model\n"
    request = Request(prompt=prompt.format("[img-0]"), raw=True, images=[image_from_bytes(data)],
                      options=Options().merged({**GREEDY, "num_predict": 12}))
    chunks = list(vision.stream(request))
    final = chunks[-1]
    ours = final.context[final.metrics.prompt_tokens - IMAGE_TOKENS:]  # the context holds no image positions
    want = _oracle(vision, prompt.format(M.mtmd_default_marker().decode()).encode(), data, 12)
    assert ours[:len(want)] == want and len(want) > 0
    # the prompt counts the image's positions: BOS + text + <start_of_image> + 16 + <end_of_image> + text
    assert final.metrics.prompt_tokens == len(vision.tokenize(prompt.format(""))) + IMAGE_TOKENS + 2


def test_second_turn_reuses_the_image_without_encoding_it(vision):
    image = image_from_bytes(picture(128, 96, seed=7))
    opts = Options().merged({**GREEDY, "num_predict": 6})
    before = dataclasses.replace(vision.model_engine.vision.stats)
    messages = [Message("user", "Describe it.", images=[image])]
    text1, final1 = collect(vision.stream(Request(messages=messages, options=opts)))
    assert vision.model_engine.vision.stats.encodes == before.encodes + 1
    assert vision.model_engine.vision.stats.decodes == before.decodes + 1
    messages += [Message("assistant", text1), Message("user", "And the colours?")]
    _, final2 = collect(vision.stream(Request(messages=messages, options=opts)))
    assert vision.model_engine.vision.stats.encodes == before.encodes + 1  # no re-encode
    assert vision.model_engine.vision.stats.decodes == before.decodes + 1  # the slot held its positions
    assert final2.metrics.prompt_cached_count >= final1.metrics.prompt_tokens - 1
    # another picture is a different input: encoded and decoded once more
    other = [Message("user", "Describe it.", images=[image_from_bytes(picture(128, 96, seed=8))])]
    collect(vision.stream(Request(messages=other, options=opts)))
    assert vision.model_engine.vision.stats.encodes == before.encodes + 2


def test_a_conversation_with_an_image_resumes_from_the_prompt_store(vision):
    """The prompt store keys an image's positions by the image's identity: a conversation that lost
    the only slot to another comes back with its image's positions restored, not decoded again."""
    image = image_from_bytes(picture(96, 128, seed=21))
    opts = Options().merged({**GREEDY, "num_predict": 6})
    a = [Message("user", "What does this show?", images=[image])]
    text1, final1 = collect(vision.stream(Request(messages=a, options=opts)))
    collect(vision.stream(Request(messages=[Message("user", "Tell me about foxes and their dens.")],
                                  options=opts)))  # takes the slot: A goes to the store
    before = dataclasses.replace(vision.model_engine.vision.stats)
    a += [Message("assistant", text1), Message("user", "And the colours?")]
    _, final2 = collect(vision.stream(Request(messages=a, options=opts)))
    assert final2.metrics.prompt_cache_source == "ram"
    assert final2.metrics.prompt_cached_count >= final1.metrics.prompt_tokens - 1  # image positions included
    assert vision.model_engine.vision.stats.decodes == before.decodes  # its positions came back restored


def test_the_image_embedding_is_cached_across_slots_of_a_conversation(vision):
    """The same image later in a new conversation (its slot reused from scratch) is decoded again
    but not encoded: the embedding stays on the host."""
    image = image_from_bytes(picture(64, 64, seed=11))
    opts = Options().merged({**GREEDY, "num_predict": 2})
    collect(vision.stream(Request(messages=[Message("user", "one", images=[image])], options=opts)))
    before = dataclasses.replace(vision.model_engine.vision.stats)
    collect(vision.stream(Request(messages=[Message("system", "new conversation"),
                                          Message("user", "two", images=[image])], options=opts)))
    assert vision.model_engine.vision.stats.encodes == before.encodes
    assert vision.model_engine.vision.stats.decodes == before.decodes + 1


def test_an_image_for_a_model_without_vision_is_refused():
    r = _load(STORIES, None)
    try:
        assert not r.info.vision
        image = image_from_bytes(picture(32, 32))
        with pytest.raises(NoVision, match="this model is missing data required for image input"):
            r.stream(Request(messages=[Message("user", "hi", images=[image])]))
        with pytest.raises(NoVision):
            r.stream(Request(prompt="hi", images=[image]))
    finally:
        r.close()


def test_a_projector_must_be_a_clip_gguf(gemma3):  # noqa: F811
    with pytest.raises(InvalidModel, match="not a vision projector"):
        _load(gemma3, gemma3)
    with pytest.raises(InvalidModel, match="no such projector file"):
        _load(gemma3, Path("/nonexistent/mmproj.gguf"))


def test_an_image_needs_a_batch_that_holds_it(gemma3, mmproj):  # noqa: F811
    r = _load(gemma3, mmproj, num_batch=8)
    try:
        with pytest.raises(InvalidRequest, match="num_batch to at least 16"):
            r.stream(Request(prompt="x", images=[image_from_bytes(picture(32, 32))]))
    finally:
        r.close()


def _greedy_steps(r, messages, opts) -> list:
    """The greedy answer to ``messages``, one TokenLogprob (with the top two candidates) a token."""
    steps = []
    for chunk in r.stream(Request(messages=messages, options=opts, logprobs=True, top_logprobs=2)):
        steps.extend(chunk.logprobs or [])
    return steps


def _assert_same_answer(got: list, want: list, margin: float = 0.05) -> None:
    """Two greedy answers agree token for token, or up to a flip between two candidates that
    were tied within ``margin`` (random weights give near-flat logits, and llama.cpp's CPU
    kernels round a row differently with a different number of rows in its batch: which rows
    share a batch depends on timing when two slots decode at once)."""
    for k, (g, w) in enumerate(zip(got, want)):
        if g.token != w.token:
            top = w.top_logprobs
            assert len(top) >= 2 and {g.token, w.token} <= {t.token for t in top[:2]}, (k, g, w)
            assert abs(top[0].logprob - top[1].logprob) < margin, (k, top[:2])
            return
    assert len(got) == len(want)


@pytest.mark.parametrize("pipeline", [False, True], ids=["inline", "pipelined"])
def test_two_conversations_with_images_at_once_answer_as_alone(gemma3, mmproj, pipeline):  # noqa: F811
    """Two slots, each with its own image, decoding in the same batches: each answer equals the
    one it gets alone (an image decodes into its own KV stream while the other slot generates;
    with the pipelined loop, POLLAMA_PIPELINE, it waits for a moment when no batch decodes)."""
    import threading

    r = _load(gemma3, mmproj, num_ctx=256)
    r2 = None
    try:
        opts = Options().merged({**GREEDY, "num_predict": 10})
        prompts = [[Message("user", f"Picture {k}?", images=[image_from_bytes(picture(90, 70, seed=20 + k))])]
                   for k in range(2)]
        alone = [_greedy_steps(r, m, opts) for m in prompts]
        r.close()
        # a prompt store of its own: another test's runner may have stored these very conversations
        cfg = dataclasses.replace(config.load({}), new_engine=False, pipeline=pipeline, cache_dir=fresh_cache_dir())
        r2 = runner.load(runner.resolve(str(gemma3), cfg, projector=str(mmproj)),
                         Options().merged({"num_ctx": 256, "num_batch": 64}), cfg, num_parallel=2)
        together: list[list] = [[], []]

        def ask(k: int) -> None:
            together[k] = _greedy_steps(r2, prompts[k], opts)

        threads = [threading.Thread(target=ask, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        for got, want in zip(together, alone):
            _assert_same_answer(got, want)
        assert r2.model_engine.vision.stats.encodes == 2
    finally:
        r.close()
        if r2 is not None:
            r2.close()
