"""Speculative decoding on real models (issue 26): greedy answers with drafts equal those without.

The decision procedure is proved exact on the batch-invariant fake engine (test_spec_loop.py).
Real engines add one caveat: some of GGML's CPU kernels compute a row's logits in another summation
order in a batch of several rows than alone, so a drafted row's logits may differ from the one-row
decode's in their last bits, and a greedy choice whose two best logits are that close may flip.
Measured (17 rows against one): attention without flash attention does in GGML's own products
(SmolLM2's story parted at character ~470 on both engines; a batch of decoded tokens' attention is
now summed as lone rows' on both, by the new engine's graph and the old engine's eval callback,
tested at the end), flash attention does for one row once
the cache spans 512 cells (split across threads) and for 64 rows or more (tiled), and so do the
matrix products of weights GGML multiplies by llamafile's tiles from 2 rows on (F32, F16, BF16,
Q4_0, Q5_0, IQ4_NL: most of gemma-3-270m's; Q8_0's sum in the one-row order on x86), and of
repacked ones (Q4_K, 4 rows at a time); with flash attention and within 256 cells, SmolLM2's Q4_1
rows are bit-identical on both engines, and its story is held to byte equality below.
POLLAMA_BATCH_INVARIANT takes every row to the one-row kernels and lays a sliding window's cells
round the cache, so a lone row and a batch's meet them in one order (tested at the end).

The other checks are on an input-grounded prompt, a short code file rewritten with one rename, where
the model's choices are far from ties and the answers held equal token for token on both engines
with drafts of 4, 8 and 16 over 150 tokens (SmolLM2 and gemma-3-270m, measured when this was
written). They check that the loop wires the drafts, the verification and the KV rollback right on a
real engine: a prompt that flips says the kernels differ, and must not be "fixed" by loosening the
check.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import numpy as np
import pytest

import runner
from runner import config
from runner.api import Message, Options, Request, Tool, ToolChoice
from runner.images import image_from_bytes
from runner.ml.backend import BackendOptions
from runner.ml.ggml.backend import GGMLBackend
from runner.model.models import Batch
from runner.model.models import load as load_model
from runner.spec.controller import MAX_DRAFT, Speculation
from tests.conftest import SHARED, SMOLLM2, fresh_cache_dir, load
from tests.ggufcopy import with_chat_template
from tests.mmproj import write_mmproj

FETCH = SHARED / "models" / "fetch-gemma3.sh"
MODEL_DIR = Path.home() / ".cache" / "pollama-test-models"  # read before tests isolate HOME

TEMPLATES = Path(__file__).parent / "data" / "templates"
BENCH_DATA = Path(__file__).parent.parent / "bench" / "data"
CODE = "".join(f"def f{i}(x, y):\n    total = x + y * {i}\n    return total\n\n" for i in range(6))
REWRITE = "Rewrite this code, renaming total to result. Output only the code.\n\n" + CODE
# CJK, Cyrillic and emoji: SmolLM2 spells most of these characters in several byte tokens, and the
# model copies the line, so prompt lookup drafts tokens that each hold part of a character
UTF8 = "Copy this text exactly, three times:\n" + "我喜欢猫 🐱 и собак 🐶, café 北京 🚀!\n" * 4


class Recording(Speculation):
    """The loop's speculation, recording each verified draft: (tokens generated before it,
    drafted, accepted)."""

    def __init__(self, pool: bool = False) -> None:
        super().__init__(pool=pool)
        self.drafts: list[tuple[int, int, int]] = []

    def verified(self, seq, generated, proposed, accepted):
        self.drafts.append((generated, proposed, accepted))
        super().verified(seq, generated, proposed, accepted)


def chat(r, content: str, depth: int, tools=(), choice: str = "auto", **opts):
    """(chunks without tool call ids, final chunk, the drafts verified) of a greedy chat."""
    r.speculation = Recording()  # between requests: the loop reads it only while one runs
    request = Request(messages=[Message("user", content)], cache_prompt=False, tools=list(tools),
                      tool_choice=ToolChoice(choice),
                      options=Options().merged(dict(temperature=0.0, repeat_penalty=1.0, draft_num_predict=depth,
                                                    **opts)))
    chunks = list(r.stream(request))
    seen = [(c.text, [(t.name, t.arguments, t.index) for t in c.tool_calls or []], c.done_reason, c.context,
             c.stop) for c in chunks]  # a call's id is random
    return seen, chunks[-1], r.speculation.drafts


def answer(r, depth: int, num_predict: int):
    request = Request(messages=[Message("user", REWRITE)], cache_prompt=False,  # each run evaluates it whole
                      options=Options().merged(dict(temperature=0.0, repeat_penalty=1.0, num_predict=num_predict,
                                                    draft_num_predict=depth)))
    chunks = list(r.stream(request))
    final = chunks[-1]
    return "".join(c.text for c in chunks), final.context, final.metrics


@pytest.fixture(scope="module", params=["old", "new"])
def smollm(request):
    r = load(SMOLLM2, request.param, num_ctx=1024)
    yield r
    r.close()


@pytest.mark.parametrize("depth", [4, pytest.param(8, marks=pytest.mark.slow)])
def test_smollm2_rewrite_is_the_same_with_drafts(smollm, depth):
    text, context, m = answer(smollm, 0, 100)
    assert m.draft_n == 0
    got_text, got_context, got = answer(smollm, depth, 100)
    assert got_context == context and got_text == text
    assert got.draft_n_accepted >= 5  # the rename's answer repeats its input: drafts are taken
    assert got.eval_count == m.eval_count


STORY = "Write a long story about a lighthouse keeper and a storm."


@pytest.mark.parametrize("engine,flash", [("old", True), pytest.param("new", True, marks=pytest.mark.slow), ("new", False),
                                          ("old", False)],
                         ids=["old-fa", "new-fa", "new-nofa", "old-nofa"])
def test_an_open_ended_story_is_byte_identical(engine, flash):
    """With flash attention, while the cache spans under 512 cells (GGML's CPU kernel splits one
    row's cells across threads from there), a query row's attention is computed on its own, and
    SmolLM2's Q4_1 matrix products take each row's dot products in one order whatever the batch:
    a drafted row's logits are the one-row decode's bit for bit, so a story full of near-ties
    comes out the same (its ~40-token prompt and 150 tokens stay within 256 cells). Without flash
    attention GGML's K·Q and V products of a batch sum in another order than one row's, and this
    story parted at character ~470; both engines now sum a verified draft's attention as lone rows'
    (the tests at the end), and the story is the same without flash attention too."""
    cfg = dataclasses.replace(config.load({}), new_engine=engine == "new", flash_attention=flash,
                              cache_dir=fresh_cache_dir())
    r = runner.load(runner.resolve(str(SMOLLM2), cfg), Options().merged({"num_ctx": 1024}), cfg, num_parallel=1)
    try:
        assert r.engine == engine
        plain, _, _ = chat(r, STORY, 0, num_predict=150)
        got, final, drafts = chat(r, STORY, 16, num_predict=150)
        assert got == plain
        assert final.metrics.draft_n > 0 and drafts  # guesses were made and verified
    finally:
        r.close()


@pytest.mark.parametrize("which,engine", [("smollm2", "old"), pytest.param("smollm2", "new", marks=pytest.mark.slow),
                                          pytest.param("gemma3", "old", marks=pytest.mark.slow),
                                          pytest.param("gemma3", "new", marks=pytest.mark.slow)])
def test_a_repeated_request_is_drafted_from_the_first_answer(which, engine, request):
    """By default a model's requests share an n-gram pool (``POLLAMA_NGRAM_POOL``), which holds
    the first answer: asked again, the story (nothing in its prompt to look up) is drafted from it
    nearly whole, and both answers come out as decoding without drafts gives them, byte for byte
    (a guessed row's numbers are a lone row's, without flash attention too: the tests at the end).
    The pool is all a request leaves for the next one's drafts (each sequence learns its own
    acceptance afresh), so more accepted the second time is the pool's doing. gemma-3-270m, a
    base model, loops over a sentence, which prompt lookup drafts on the first request already."""
    path = SMOLLM2 if which == "smollm2" else request.getfixturevalue("gemma3_path")
    r = load(path, engine, num_ctx=1024)
    try:
        assert r.speculation.pool is not None  # the default

        def ask(**opts):
            chunks = list(r.stream(Request(messages=[Message("user", STORY)], cache_prompt=False, options=Options().merged(
                dict(temperature=0.0, repeat_penalty=1.0, num_predict=120, **opts)))))
            return "".join(c.text for c in chunks), chunks[-1].metrics

        plain, _ = ask(draft_num_predict=0)
        (first, m1), (again, m2) = ask(), ask()  # pollama's default draft_num_predict
        assert first == again == plain
        assert m2.draft_n_accepted > m1.draft_n_accepted
        assert m2.draft_n_accepted >= 0.8 * m2.eval_count  # the answer, drafted from the first
    finally:
        r.close()


@pytest.fixture(scope="module")
def gemma3_path() -> Path:
    """gemma-3-270m (Q4_K_M; sliding-window layers: the rollback goes through both caches)."""
    done = subprocess.run(["bash", str(FETCH), str(MODEL_DIR)], capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        pytest.fail(f"fetch-gemma3.sh failed: {done.stderr.strip()[-500:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["old", "new"])
def test_gemma3_rewrite_is_the_same_with_drafts(gemma3_path, engine):
    r = load(gemma3_path, engine, num_ctx=1024)
    try:
        text, context, m = answer(r, 0, 100)
        got_text, got_context, got = answer(r, 8, 100)
        assert got_context == context and got_text == text
        assert got.draft_n_accepted > 30
    finally:
        r.close()


@pytest.mark.slow
def test_utf8_split_across_drafted_tokens(smollm):
    want, _, _ = chat(smollm, UTF8, 0, num_predict=90)
    got, final, drafts = chat(smollm, UTF8, 8, num_predict=90)
    assert got == want
    pieces = [smollm.model_engine.piece(t) for t in final.context[-90:]]
    assert sum(not _utf8(p) for p in pieces) > 10  # characters were split across tokens ...
    assert final.metrics.draft_n_accepted > 40  # ... and drafted


def _utf8(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


@pytest.mark.slow
def test_a_stop_inside_an_accepted_draft(smollm):
    """The stop's last token comes from a row after accepted drafted ones, before the draft's
    end: the rest of the draft is dropped, and the text is cut as without drafts. (The stop ends in
    the second line's "北京", inside an 8-token draft of which it takes 5.)"""
    stop = ["!\n我喜欢猫 🐱, café 北京"]
    want, _, _ = chat(smollm, UTF8, 0, num_predict=60, stop=stop)
    got, final, drafts = chat(smollm, UTF8, 8, num_predict=60, stop=stop)
    assert got == want and final.stop == stop[0]
    generated, proposed, accepted = drafts[-1]
    assert 1 <= accepted < proposed and final.metrics.eval_count == generated + accepted + 1


@pytest.mark.slow
def test_num_predict_inside_a_draft(smollm):
    """A draft is cut where ``num_predict`` ends the answer; its last row is the last token."""
    want, _, _ = chat(smollm, UTF8, 0, num_predict=62)
    got, final, drafts = chat(smollm, UTF8, 8, num_predict=62)
    assert got == want and final.done_reason.value == "length"
    generated, proposed, accepted = drafts[-1]
    assert proposed < 8 and accepted == proposed and generated + proposed + 1 == 62


WEATHER = Tool("get_weather", "Get the current weather in a city",
               {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                "required": ["city"]})
ADD = Tool("add", "Add two numbers", {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                                      "required": ["a", "b"]})


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["old", "new"])
def test_a_tool_call(tmp_path, engine):
    """SmolLM2 with Qwen2.5's tool template, the call forced (a grammar over the drafted rows):
    the model copies the tool's name from the prompt, which lookup drafts."""
    path = with_chat_template(SMOLLM2, tmp_path / "smol-qwen.gguf", (TEMPLATES / "qwen2.5.jinja").read_text())
    r = load(path, engine, num_ctx=1024)
    try:
        want, _, _ = chat(r, "Add 17 and 25.", 0, tools=[WEATHER, ADD], choice="required", num_predict=60)
        got, final, _ = chat(r, "Add 17 and 25.", 8, tools=[WEATHER, ADD], choice="required", num_predict=60)
        assert got == want
        assert [c for chunk in got for c in chunk[1]] == [("add", {"a": 17, "b": 25}, 0)]
        assert final.metrics.draft_n_accepted > 0
    finally:
        r.close()


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["old", "new"])
def test_an_image_in_the_prompt(gemma3_path, tmp_path, engine):
    """gemma-3-270m with a random projector (tests/mmproj.py): the line before the image comes
    again after it, so lookup drafts from both sides of the image; no key spans it and no draft
    holds its positions."""
    from tests.test_vision_llama import picture

    mmproj = write_mmproj(tmp_path / "mmproj.gguf")
    cfg = dataclasses.replace(config.load({}), new_engine=(engine == "new"), cache_dir=fresh_cache_dir())
    r = runner.load(runner.resolve(str(gemma3_path), cfg, projector=str(mmproj)),
                    Options().merged({"num_ctx": 512, "num_batch": 64}), cfg, num_parallel=1)
    assert r.engine == engine
    count = "one two three four five six seven eight nine ten "
    prompt = (f"<start_of_turn>user\nRepeat this line three times: {count}\n[img-0]<end_of_turn>\n"
              f"<start_of_turn>model\n{count}\n{count}\n")
    image = image_from_bytes(picture(96, 96, seed=3))
    try:
        def run(depth):
            r.speculation = Recording()
            request = Request(prompt=prompt, raw=True, images=[image], cache_prompt=False,
                              options=Options().merged(dict(temperature=0.0, repeat_penalty=1.0, num_predict=40,
                                                            draft_num_predict=depth)))
            chunks = list(r.stream(request))
            return [(c.text, c.context) for c in chunks], chunks[-1].metrics
        want, _ = run(0)
        got, metrics = run(8)
        assert got == want
        assert metrics.draft_n_accepted > 0
    finally:
        r.close()


MILLBROOK = "\n\n".join((
    "The town of Millbrook sits where the Arden river bends east toward the sea. It was founded in 1742 by a "
    "group of millers who used the fast water to turn their wheels, and for a century the town lived on flour, "
    "timber and wool.",
    "The old stone bridge was built in 1811 after the wooden one was carried away by a spring flood. It has five "
    "arches, each a little wider than the one before, and the townspeople say that the middle arch was left "
    "unfinished for a year because the mason refused to work until he was paid.",
    "In 1868 the railway reached Millbrook, and with it came a station, two hotels and a brass band that still "
    "plays on the first Sunday of every month. The mills closed one by one after the First World War, and the "
    "last of them became a museum in 1974.",
    "Today Millbrook is known for its autumn fair, its library, which holds the letters of the founding "
    "families, and the walking path that follows the river from the bridge to the old lighthouse at the estuary."))
ACCOUNT_REWRITE = ("Rewrite this Python code, renaming balance to funds everywhere. Output only the code.\n\n"
                   "```python\n" + (BENCH_DATA / "account.py.txt").read_text() + "```")  # bench_spec's rewrite
QUOTE = ("Read the document and answer by quoting it word for word: what does it say about the old stone bridge "
         "and about the railway? Quote both paragraphs exactly.\n\n" + MILLBROOK)


def invariant_runner(path: Path):
    """A runner of the new engine with POLLAMA_BATCH_INVARIANT and flash attention."""
    cfg = dataclasses.replace(config.load({"POLLAMA_BATCH_INVARIANT": "1"}), new_engine=True, flash_attention=True,
                              cache_dir=fresh_cache_dir())
    return runner.load(runner.resolve(str(path), cfg), Options().merged({"num_ctx": 2048}), cfg, num_parallel=1)


@pytest.mark.slow
def test_batch_invariant_drafts_keep_the_answer_byte_identical():
    """POLLAMA_BATCH_INVARIANT on the new engine (GGML's reference kernels: a lone row's flash
    attention not split across threads past 512 cells, no fused ops): a drafted row is computed
    as it would be alone, and the answer with guesses is the one without, byte for byte. Without
    the mode this quote (300 tokens) parted at character 129 when this was written."""
    r = invariant_runner(SMOLLM2)
    try:
        plain, _, _ = chat(r, QUOTE, 0, num_predict=300)
        got, final, drafts = chat(r, QUOTE, 16, num_predict=300)
        assert got == plain
        assert final.metrics.draft_n_accepted > 50 and drafts  # the quote is drafted from the document
    finally:
        r.close()


@pytest.mark.slow
def test_batch_invariant_drafts_keep_gemma3_s_answer_byte_identical_past_its_window(gemma3_path):
    """The mode on gemma-3-270m, whose weights GGML multiplies by other kernels for a batch than
    for a row alone, and whose answer here runs past its 512-position sliding window: the
    answer with guesses is the one without, byte for byte. bench_spec's rewrite, this one, parted
    (at character ~1,120) while the window's cells were the lowest free ones."""
    r = invariant_runner(gemma3_path)
    try:
        plain, _, _ = chat(r, ACCOUNT_REWRITE, 0, num_predict=300)
        got, final, _ = chat(r, ACCOUNT_REWRITE, 31, num_predict=300)
        assert got == plain
        assert final.metrics.draft_n_accepted > 200 and final.metrics.prompt_eval_count + 300 > 600
    finally:
        r.close()


@pytest.mark.parametrize("which", ["smollm2", pytest.param("gemma3", marks=pytest.mark.slow)])
def test_batch_invariant_rows_equal_rows_decoded_alone(which, request):
    """The mode's contract at the model: the deepest draft's 63 tokens verified as one batch give, row by row, the
    logits of the same tokens decoded one at a time, bit for bit, after a 500-token prompt (flash
    attention), so across gemma3's 512-position sliding window. gemma-3-270m's weights are mostly
    Q5_0 and Q8_0, which GGML multiplies by llamafile's tiles for 2 rows or more and by one-row
    dot products for one: without the mode's strided rows, 0 of 17 rows were equal (after 200
    tokens; logits up to 2.7 apart). Past the window, a one-token step took the lowest free cell
    (position 512 in cell 0) and the batch the cells after the window: rows 512-516 differed
    (up to 1.9) until the mode's table placed cells round the cache."""
    path = SMOLLM2 if which == "smollm2" else request.getfixturevalue("gemma3_path")
    assert rows_unlike_alone(path, BackendOptions(num_threads=2, flash_attention=True, batch_invariant=True)) == []


def rows_unlike_alone(path: Path, options: BackendOptions, history: int = 500, rows: int = 1 + MAX_DRAFT) -> list[int]:
    """After a ``history``-token prompt, the rows of a batch of ``rows`` (by default the deepest
    verified draft's; every row an output) whose logits differ in any bit from the same tokens
    decoded one at a time."""
    model = load_model(path, options)
    try:
        model.init_cache(num_ctx=1024, num_parallel=1, num_batch=512)
        rng = np.random.default_rng(7)
        low, high = (100, 20000) if model.n_vocab >= 20000 else (1, model.n_vocab)  # a tiny random model's
        prompt = [int(t) for t in rng.integers(low, high, history)]
        tokens = [int(t) for t in rng.integers(low, high, rows)]
        model.compute(Batch.sequence(prompt))
        alone = [model.compute(Batch.sequence([t], start=history + i, decode=True))[0].copy()
                 for i, t in enumerate(tokens)]
        model.cache.remove(0, 0, None)  # a window's early cells are gone: the prompt again
        model.compute(Batch.sequence(prompt))
        together = model.compute(Batch.sequence(tokens, start=history, decode=True))
        return [i for i, (a, b) in enumerate(zip(alone, together)) if not np.array_equal(a, b)]
    finally:
        model.close()


def test_drafted_rows_are_the_rows_decoded_alone_without_flash_attention(monkeypatch):
    """The new engine by default, without flash attention (SmolLM2's default): a graph of decoded
    tokens (``Backend.new_context(decoded=True)``: a sampled one with drafted ones) sums
    attention's K·Q and V products of each row as GGML sums a lone row's (our f16 kernels,
    test_f16_rows.py); with weights whose products give a row in a batch its lone
    numbers (SmolLM2's: Q4_1 by our kernels, its Q8_0 output by llamafile's tiles, which on x86
    sum in the one-row order) each of the 63 rows of the deepest verified draft is the row decoded alone,
    bit for bit, also across 512 cells (the batch attends to 768 cells, the first lone rows to
    512: the cells past the history add exact zeros). GGML's own products take a batch to
    llamafile's tiles, which sum in another order: then all rows differed when this was
    written (17 of them then; logits up to 0.55 apart)."""
    options = BackendOptions(num_threads=2, flash_attention=False)
    assert rows_unlike_alone(SMOLLM2, options) == []
    new_context = GGMLBackend.new_context
    monkeypatch.setattr(GGMLBackend, "new_context", lambda self, decoded=False, max_nodes=None: new_context(self))
    assert rows_unlike_alone(SMOLLM2, options) != []


def test_with_flash_attention_the_deepest_draft_is_its_lone_rows_under_512_cells():
    """With flash attention GGML's CPU kernel computes a row as it computes a lone one while the
    cells attended to (a multiple of 256) are under 512 and the batch has under 64 rows
    (GGML_FA_TILE_Q; 64 or more go to tiles that sum otherwise), which is why a draft has at
    most 62 tokens (MAX_DRAFT): its 63 rows are their lone selves, bit for bit; 64 rows are not
    (nor are 63 after a 300-token prompt, 512 cells: all differed when this was written)."""
    options = BackendOptions(num_threads=2, flash_attention=True)
    assert 1 + MAX_DRAFT < 64
    assert rows_unlike_alone(SMOLLM2, options, history=100) == []
    assert rows_unlike_alone(SMOLLM2, options, history=100, rows=64) != []


def old_engine_rows_unlike_alone(r) -> tuple[list[int], tuple[int, int, int]]:
    """:func:`rows_unlike_alone` on a loaded old-engine runner (1024 cells), through the engine's
    own batch calls: (the rows that differ, the products our kernels took: Q4_1, attention,
    lone rows')."""
    return engine_rows_unlike_alone(r.model_engine, 20000)


def engine_rows_unlike_alone(engine, n_vocab: int) -> tuple[list[int], tuple[int, int, int]]:
    """:func:`old_engine_rows_unlike_alone` on an old engine (``LlamaEngine``) of its own, whose
    tokens are below ``n_vocab`` (a tiny random model's: no tokenizer, no runner)."""

    def step(tokens: list[int], pos: int, outputs: int) -> int:
        engine.batch_begin()
        last = engine.batch_add(tokens, pos, 0, outputs)
        engine.prepare()
        engine.decode()
        return last

    rng = np.random.default_rng(7)
    low, high = (100, 20000) if n_vocab >= 20000 else (1, n_vocab)
    prompt = [int(t) for t in rng.integers(low, high, 500)]
    tokens = [int(t) for t in rng.integers(low, high, 1 + MAX_DRAFT)]
    engine.kv.seq_rm(0, 0, None)
    for start in range(0, len(prompt), 256):
        step(prompt[start:start + 256], start, 1)
    alone = [engine.logits(step([t], 500 + i, 1)).copy() for i, t in enumerate(tokens)]
    engine.kv.seq_rm(0, 500, None)
    first = step(tokens, 500, len(tokens)) - len(tokens) + 1
    together = [engine.logits(first + i).copy() for i in range(len(tokens))]
    taken = engine._ops.taken if engine._ops is not None else (0, 0, 0)
    return [i for i, (a, b) in enumerate(zip(alone, together)) if not np.array_equal(a, b)], taken


def test_old_engine_drafted_rows_are_the_rows_decoded_alone_without_flash_attention(monkeypatch):
    """The old engine without flash attention (its default): llama.cpp multiplies a batch's
    attention with llamafile's tiles, a lone row's with ggml_vec_dot_f16, and the two sum in other
    orders. For a batch of decoded tokens its eval callback has llama.cpp compute those two
    products (K·Q and V by the scores, 30 layers each) as lone rows' instead, with our f16 kernels
    (runner/engines/llamacpp/graph_ops.py): each of the 63 rows of the deepest verified draft is then the row decoded alone, bit
    for bit, across 512 cells too. Without the callback all differed when this was written
    (17 rows then; logits up to 0.55 apart)."""
    from runner.engines.llamacpp.graph_ops import GraphOps

    r = load(SMOLLM2, "old", num_ctx=1024)
    try:
        differ, (_, attention, lone) = old_engine_rows_unlike_alone(r)
        assert (differ, attention, lone) == ([], 60, 0)  # Q4_1 and Q8_0 weights: no lone rows' products
    finally:
        r.close()
    monkeypatch.setattr(GraphOps, "create", classmethod(lambda cls, **_: None))
    r = load(SMOLLM2, "old", num_ctx=1024)
    try:
        assert old_engine_rows_unlike_alone(r)[0] != []
    finally:
        r.close()


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["old", "new"])
def test_gemma3_s_drafted_rows_are_the_rows_decoded_alone(engine, gemma3_path, monkeypatch):
    """gemma-3-270m's weights are mostly Q5_0, Q4_K (repacked) and Q6_K, which GGML multiplies
    for several rows with llamafile's tiles, its repacked kernels (4 rows at a time) and its
    tiled K-quants, each summing a row otherwise than its one-row functions. In a batch of
    decoded tokens both engines have those products computed by the one-row functions, row by
    row (runner/ml/ggml/lone_rows.py; the old engine through its eval callback): without flash
    attention (the default) the 63 rows of the deepest verified draft are the rows decoded alone, bit for
    bit, across the model's 512-position window too. Without them all differ (17 of 17 when this was written)."""
    from runner.engines.llamacpp.graph_ops import GraphOps
    from runner.ml.ggml import lone_rows

    def differ() -> list[int]:
        if engine == "new":
            return rows_unlike_alone(gemma3_path, BackendOptions(num_threads=2, flash_attention=False))
        r = load(gemma3_path, "old", num_ctx=1024)
        try:
            rows, (_, attention, lone) = old_engine_rows_unlike_alone(r)
            assert attention > 0 and (lone > 0) == (rows == [])
            return rows
        finally:
            r.close()

    assert differ() == []
    create = GraphOps.create.__func__
    monkeypatch.setattr(GraphOps, "create", classmethod(lambda cls, **kw: create(cls, **{**kw, "lone": False})))
    monkeypatch.setattr(lone_rows, "product", lambda c, w, b: None)
    assert len(differ()) == 1 + MAX_DRAFT


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["old", "new"])
def test_gemma3_s_rewrite_with_guesses_is_the_rewrite_without(engine, gemma3_path):
    """bench_spec's rewrite on gemma-3-270m, by default (no flash attention): with guesses
    verified as lone rows (above) the answer is the one without guesses, byte for byte. Before,
    the old engine's parted at character 1,125 of 1,177 (bench_spec.py)."""
    r = load(gemma3_path, engine, num_ctx=2048)
    try:
        plain, _, _ = chat(r, ACCOUNT_REWRITE, 0, num_predict=400)
        got, final, _ = chat(r, ACCOUNT_REWRITE, 31, num_predict=400)
        assert got == plain
        assert final.metrics.draft_n_accepted > 200
    finally:
        r.close()
