"""The runner contract on real models, per engine: slot cache across turns, fork, context shift,
truncation, stop sequences, num_predict, cancellation, JSON format, embeddings."""

from __future__ import annotations

import json
import threading

import pytest

from runner.api import DoneReason, InvalidRequest, Message, Options, PromptTooLong, Request, coerce_option
from tests.conftest import STORIES, TINYSTORIES, collect, load

GREEDY = dict(temperature=0.0, repeat_penalty=1.0)


def chat(r, messages, **opts):
    return collect(r.stream(Request(messages=messages, options=Options().merged({**GREEDY, **opts}))))


def generate(r, prompt, raw=True, **kw):
    opts = kw.pop("options", {})
    return collect(r.stream(Request(prompt=prompt, raw=raw, options=Options().merged({**GREEDY, **opts}), **kw)))


@pytest.fixture
def smollm(engine):
    r = load(None, engine)
    yield r
    r.close()


def test_multi_turn_reuses_the_slot(smollm):
    msgs = [Message("user", "What is the capital of France?")]
    a1, f1 = chat(smollm, msgs, num_predict=30)
    m1 = f1.metrics
    assert m1.prompt_cached_count == 0 and m1.prompt_eval_count > 20
    prompt1 = m1.prompt_eval_count
    msgs += [Message("assistant", a1), Message("user", "And of Italy?")]
    new_tokens = len(smollm.tokenize("<|im_end|>\n<|im_start|>user\nAnd of Italy?<|im_end|>\n<|im_start|>assistant\n"))
    a2, f2 = chat(smollm, msgs, num_predict=30)
    m2 = f2.metrics
    # turn 2 evaluates only what is new: the end of turn 1's answer and the new message
    assert m2.prompt_cached_count >= prompt1 + m1.eval_count - 2
    assert m2.prompt_eval_count <= new_tokens + 2
    assert m2.prompt_eval_count + m2.prompt_cached_count == len(smollm.tokenize(smollm.render_chat(msgs)))
    assert a2.strip()


def test_exact_repeat_evaluates_one_token(smollm):
    msgs = [Message("user", "Say one word.")]
    _, f1 = chat(smollm, msgs, num_predict=1)
    _, f2 = chat(smollm, msgs, num_predict=1)
    assert f2.metrics.prompt_eval_count == 1
    assert f2.metrics.prompt_cached_count == f1.metrics.prompt_eval_count - 1


def test_num_predict_is_exact(smollm):
    text, final = generate(smollm, "The history of the Roman empire", options={"num_predict": 10})
    assert final.done_reason is DoneReason.LENGTH and final.metrics.eval_count == 10
    assert len(final.context) == final.metrics.prompt_eval_count + 10


def test_stop_trims_output_and_cached_history(smollm):
    prompt = "Count from one to ten: one, two, three,"
    full, _ = generate(smollm, prompt, options={"num_predict": 12})
    assert " five" in full, full
    cut, final = generate(smollm, prompt, options={"num_predict": 12, "stop": [" five"]})
    assert final.done_reason is DoneReason.STOP
    assert cut == full[: full.index(" five")]
    # The slot now ends where the returned text ends: continuing from it is a pure cache hit.
    _, again = generate(smollm, prompt + cut + " five", options={"num_predict": 1})
    cached = again.metrics.prompt_cached_count
    assert cached >= len(smollm.tokenize(prompt + cut)) - 1
    assert again.metrics.prompt_eval_count <= 3


def test_context_exhaustion_shifts(engine):
    r = load(STORIES, engine, num_ctx=128)
    try:
        text, final = generate(r, "Once upon a time", options={"num_predict": 400, "temperature": 0.7, "seed": 1})
        assert final.done_reason is DoneReason.LENGTH and final.metrics.eval_count == 400
        assert len(text) > 400
    finally:
        r.close()


def test_no_shift_stops_at_context(engine):
    r = load(STORIES, engine, num_ctx=64)
    try:
        request = Request(prompt="Once upon a time", raw=True, shift=False,
                          options=Options().merged({**GREEDY, "num_predict": 400}))
        _, final = collect(r.stream(request))
        assert final.done_reason is DoneReason.LENGTH and final.metrics.eval_count < 64
    finally:
        r.close()


def test_truncation_on_and_off(engine):
    r = load(STORIES, engine, num_ctx=64)
    try:
        long_prompt = "Once upon a time there was a little dog. " * 20
        n = len(r.tokenize(long_prompt))
        assert n > 64
        _, final = generate(r, long_prompt, options={"num_predict": 4})
        assert final.metrics.prompt_eval_count == 64  # kept num_keep + the tail that fits
        with pytest.raises(PromptTooLong, match="exceeds the context length"):
            generate(r, long_prompt, truncate=False, options={"num_predict": 4})
    finally:
        r.close()


def test_multiuser_fork_matches_cold_evaluation(engine):
    """With OLLAMA_MULTIUSER_CACHE and 2 slots a shared prefix is forked into the other slot;
    the answer is token-for-token the one a cold evaluation gives."""
    base = "Once upon a time there was a little girl named Lily. She"
    r = load(TINYSTORIES, engine, num_parallel=2, multiuser=True, num_ctx=256)
    try:
        generate(r, base + " liked to play", options={"num_predict": 8})  # fills slot 0
        prompt = base + " went to the park"
        forked, f = generate(r, prompt, options={"num_predict": 24})
        assert f.metrics.prompt_cached_count > 0  # the shared prefix came from the other slot
    finally:
        r.close()
    cold_runner = load(TINYSTORIES, engine, num_ctx=256)
    try:
        cold, c = generate(cold_runner, prompt, options={"num_predict": 24})
        assert c.metrics.prompt_cached_count == 0
    finally:
        cold_runner.close()
    assert f.context == c.context and forked == cold


def assert_parallel_matches_serial(r, prompts, num_predict):
    """Each prompt alone, then all at once from threads: the same greedy texts."""
    serial = [generate(r, p, options={"num_predict": num_predict})[0] for p in prompts]
    results = [None] * len(prompts)

    def worker(i):
        results[i] = generate(r, prompts[i], options={"num_predict": num_predict})[0]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == serial


def test_parallel_sequences_match_serial(engine):
    r = load(TINYSTORIES, engine, num_parallel=3, num_ctx=256)
    try:
        assert_parallel_matches_serial(r, ["Once upon a time", "The little dog", "Lily wanted to"], 20)
    finally:
        r.close()


def test_cancel_frees_the_slot(smollm):
    request = Request(prompt="Write a long story about a dragon.", options=Options().merged({**GREEDY, "num_predict": 500}))
    stream = smollm.stream(request)
    first = next(stream)
    assert not first.done
    request.cancel.set()
    rest = list(stream)
    assert rest and rest[-1].done and rest[-1].done_reason is DoneReason.CONNECTION_CLOSED
    assert smollm.pending() == 0
    # closing an iterator early cancels as well
    stream = smollm.stream(Request(prompt="Tell me a story.", options=Options().merged({**GREEDY, "num_predict": 500})))
    next(stream)
    stream.close()
    _, final = generate(smollm, "Hi", options={"num_predict": 2})
    assert final.done and smollm.pending() == 0


def test_format_json(smollm):
    request = Request(messages=[Message("user", "Give me a JSON object describing a cat with a name and an age.")],
                      format="json", options=Options().merged({**GREEDY, "num_predict": 80}))
    text, final = collect(smollm.stream(request))
    assert final.done_reason is DoneReason.STOP, text
    assert isinstance(json.loads(text), dict)


def test_bad_input(smollm):
    with pytest.raises(InvalidRequest):
        smollm.stream(Request(prompt="", raw=True))
    with pytest.raises(InvalidRequest):
        Options().merged({"temperature": "hot"})
    # as Ollama: unknown (or dropped) names are ignored, null values leave the default
    assert Options().merged({"nonsense": 1, "mirostat": 2, "temperature": None}) == Options()
    with pytest.raises(InvalidRequest, match="invalid option"):
        coerce_option("nonsense", 1)  # the CLI's -o stays strict


def test_embeddings_are_normalised(smollm):
    out = smollm.embed(["The cat sat on the mat.", "A dog barked.", "The cat sat on the mat."])
    import numpy as np

    vecs = np.array(out.vectors)
    assert vecs.shape == (3, smollm.info.embedding_length)
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    # the same text in another lane of the same batch: equal but for the rounding of its rows
    assert vecs[0] @ vecs[2] > 0.99999 and vecs[0] @ vecs[1] < 0.999
    # generation still works after an embedding batch
    _, final = generate(smollm, "Hello", options={"num_predict": 3})
    assert final.metrics.eval_count == 3


def test_cache_prompt_off_evaluates_everything(smollm):
    msgs = [Message("user", "Hello there, how are you?")]
    _, first = chat(smollm, msgs, num_predict=2)
    request = Request(messages=msgs, cache_prompt=False, options=Options().merged({**GREEDY, "num_predict": 2}))
    _, again = collect(smollm.stream(request))
    assert again.metrics.prompt_cached_count == 0
    assert again.metrics.prompt_eval_count == first.metrics.prompt_eval_count


def test_closed_runner_and_bad_token_ids_raise_clear_errors(engine):
    from runner.api import LoadError

    r = load(STORIES, engine, num_ctx=64)
    with pytest.raises(InvalidRequest, match="invalid token ids"):
        r.detokenize([r.n_vocab + 5])
    r.close()
    for call in (lambda: r.tokenize("hi"), lambda: r.stream(Request(prompt="hi", raw=True)),
                 lambda: r.detokenize([1])):
        with pytest.raises(LoadError, match="unloaded"):
            call()


class _Inbox:
    """What ``submit`` delivers, with the thread each item arrived on."""

    def __init__(self):
        self.items, self.threads, self.ended = [], set(), threading.Event()

    def __call__(self, item):
        self.items.append(item)
        self.threads.add(threading.current_thread().name)
        if isinstance(item, Exception) or item.done:
            self.ended.set()

    def wait(self):
        assert self.ended.wait(120), "the stream never ended"
        return self.items


def test_submit_pushes_the_stream_from_the_loop_thread(engine):
    r = load(TINYSTORIES, engine, num_ctx=256)
    try:
        text, _ = generate(r, "Once upon a time", options={"num_predict": 16})
        inbox = _Inbox()
        r.submit(Request(prompt="Once upon a time", raw=True,
                         options=Options().merged({**GREEDY, "num_predict": 16})), inbox)
        items = inbox.wait()
        assert "".join(c.text for c in items) == text
        assert items[-1].done_reason is DoneReason.LENGTH and items[-1].metrics.eval_count == 16
        assert sum(c.done for c in items) == 1
        assert inbox.threads == {r._thread.name}  # no thread per stream: the batch loop delivers
        with pytest.raises(PromptTooLong):  # bad requests fail at submit, not in the stream
            r.submit(Request(prompt="Once upon a time " * 100, raw=True, truncate=False), _Inbox())
    finally:
        r.close()


def test_cancelled_before_a_slot_still_ends_its_stream(engine):
    """One slot: B waits behind A. Cancelling B ends B's stream at once (pushed or iterated)."""
    r = load(STORIES, engine, num_ctx=512)  # greedy stories260K never says EOS here: A keeps its slot
    try:
        long = Options().merged({**GREEDY, "num_predict": -1})  # 10 × num_ctx tokens, through shifts
        a = Request(prompt="Once upon a time", raw=True, options=long)
        a_inbox = _Inbox()
        r.submit(a, a_inbox)
        b = Request(prompt="The little dog", raw=True, options=long)
        b_inbox = _Inbox()
        r.submit(b, b_inbox)
        c = Request(prompt="Lily wanted to", raw=True, options=long)
        c_stream = r.stream(c)
        b.cancel.set()
        c.cancel.set()
        (b_last,) = b_inbox.wait()
        assert b_last.done and b_last.done_reason is DoneReason.CONNECTION_CLOSED and b_last.metrics.eval_count == 0
        c_items = list(c_stream)  # an iterator whose request is cancelled while it waits ends too
        assert c_items[-1].done_reason is DoneReason.CONNECTION_CLOSED
        assert not a_inbox.ended.is_set()  # A kept its slot and is still generating
        a.cancel.set()
        assert a_inbox.wait()[-1].done_reason is DoneReason.CONNECTION_CLOSED
        assert r.pending() == 0
        # a runner that closes ends the pushed streams it holds with an error
        d_inbox = _Inbox()
        r.submit(Request(prompt="Once upon a time", raw=True, options=long), d_inbox)
        r.close()
        assert isinstance(d_inbox.wait()[-1], Exception)
    finally:
        r.close()


def test_old_engine_batches_live_slots_in_slot_order(monkeypatch):
    """llama.cpp (one KV stream per slot) evaluates a batch as one ubatch only while its sequence
    ids run consecutively; in round-robin order four streams would take several passes."""
    from runner.engines.llamacpp.engine import LlamaEngine

    seen: list[list[int]] = []
    decode = LlamaEngine.decode

    def recording(self, started=None):
        seen.append(self._prepared.seq[: self._prepared.n].tolist())
        decode(self, started)

    monkeypatch.setattr(LlamaEngine, "decode", recording)
    r = load(STORIES, "old", num_parallel=4, num_ctx=256)
    try:
        # 160 tokens each (not 24): long enough that all four run at once on a busy machine too
        assert_parallel_matches_serial(r, ["Once upon a time", "The little dog", "Lily wanted to", "One day a bird"], 160)
    finally:
        r.close()
    shared = [ids for ids in seen if len(set(ids)) > 1]
    assert shared, "the four streams never shared a batch"
    assert all(ids == sorted(ids) for ids in seen)
    assert max(len(set(ids)) for ids in shared) == 4


def test_embedding_is_not_starved_by_a_generation_in_a_lower_slot(engine):
    """Token and embedding batches take turns, whichever slots the two sequences hold."""
    r = load(STORIES, engine, num_parallel=2, num_ctx=512)
    try:
        request = Request(prompt="Once upon a time", raw=True, options=Options().merged({**GREEDY, "num_predict": -1}))
        stream = r.stream(request)  # thousands of tokens through shifts: holds a slot for a while
        next(stream)
        vectors = r.embed(["the sky is blue"]).vectors
        assert len(vectors) == 1 and r.pending() == 1  # the embedding went through meanwhile
        request.cancel.set()
        assert list(stream)[-1].done_reason is DoneReason.CONNECTION_CLOSED
    finally:
        r.close()


@pytest.mark.parametrize("penalties", [{}, {"repeat_penalty": 1.5, "repeat_last_n": 16, "presence_penalty": 0.5,
                                           "frequency_penalty": 0.3}])
def test_old_engine_greedy_matches_llama_cpp_sampler_chain(penalties):
    """Greedy requests use the shared NumPy sampler; top_k 1 at a temperature goes through
    llama.cpp's own chain (penalties, top-k, draw) and must pick the same tokens."""
    r = load(None, "old", num_ctx=1024)
    try:
        msgs = [Message("user", "Write a poem about the sea.")]

        def cold_chat(**opts):  # both from an empty slot: a re-evaluated last prompt token (a batch
            # of 1 instead of the prompt's batch) moves logits by float rounding, enough to flip a
            # near-tie dozens of tokens later; this test compares samplers, not cache paths
            options = Options().merged({**GREEDY, "num_predict": 80, **penalties, **opts})
            return collect(r.stream(Request(messages=msgs, options=options, cache_prompt=False)))

        greedy, _ = cold_chat(temperature=0.0)
        chain, _ = cold_chat(temperature=0.7, top_k=1, seed=3)
        assert greedy == chain and len(greedy) > 100
    finally:
        r.close()


TOPK_OPTION_SETS = [
    {},  # pollama's defaults: temperature 0.8, top_k 40, top_p 0.9, repeat 1.1
    {"temperature": 1.3, "top_k": 200, "top_p": 0.95, "min_p": 0.02, "repeat_last_n": -1},  # k > 128: bucket sort
    {"temperature": 0.9, "top_k": 60, "typical_p": 0.7, "top_p": 1.0, "presence_penalty": 0.5,
     "frequency_penalty": 0.3, "repeat_penalty": 1.3, "repeat_last_n": 16},
    {"temperature": 2.0, "top_k": 5, "top_p": 1.0, "repeat_penalty": 1.0},
]


def old_engine_chain_tokens(r, monkeypatch, opts: dict, prompt: str, num_predict: int) -> tuple[list[int], list[int]]:
    """The old engine's tokens for ``prompt`` sampled by the top_k-fed chain, then by llama.cpp's
    full chain (``topk.applies`` patched off), both from an empty slot."""
    import runner.engines.llamacpp.topk as topk

    def tokens() -> list[int]:
        seen: list[int] = []
        sample = r.model_engine.sample

        def recording(sampler, row):
            token = sample(sampler, row)
            seen.append(token)
            return token

        options = Options().merged({"num_predict": num_predict, "seed": 11, **opts})
        with monkeypatch.context() as m:
            m.setattr(r.model_engine, "sample", recording)
            collect(r.stream(Request(prompt=prompt, raw=True, options=options, cache_prompt=False)))
        return seen

    fed = tokens()
    with monkeypatch.context() as m:
        m.setattr(topk, "applies", lambda *a: False)
        full = tokens()
    return fed, full


@pytest.mark.parametrize("opts", TOPK_OPTION_SETS, ids=["default", "k200-minp", "typical-penalties", "k5-hot"])
def test_old_engine_top_k_chain_matches_llama_cpp_full_chain(opts, monkeypatch):
    """Sampled requests with top_k give llama.cpp's chain only the top_k candidates (penalties
    in NumPy): the same tokens, seed for seed, as the full chain over the whole vocabulary."""
    r = load(None, "old", num_ctx=1024)
    try:
        fed, full = old_engine_chain_tokens(r, monkeypatch, opts, "The old lighthouse keeper", 64)
        assert fed == full and len(fed) == 64
    finally:
        r.close()


def test_an_embedding_leaves_a_warm_chat_slot_alone_while_another_is_free(engine):
    """Two slots: a chat warms one, an embedding comes, the next turn still finds its cache."""
    r = load(None, engine, num_parallel=2)
    try:
        msgs = [Message("user", "What is the capital of France?")]
        a1, f1 = chat(r, msgs, num_predict=8)
        # the template's opening tokens too: a longest-prefix choice would pick the chat's slot
        r.embed([r.render_chat(msgs), "a dog barked"])
        msgs += [Message("assistant", a1), Message("user", "And of Italy?")]
        _, f2 = chat(r, msgs, num_predict=8)
        assert f2.metrics.prompt_cached_count >= f1.metrics.prompt_eval_count
    finally:
        r.close()


class _DecodeCounter:
    """Counts the forward passes an engine runs (llama.cpp's llama_decode; our Model.execute)."""

    def __init__(self, r, monkeypatch):
        self.calls = 0
        self.cancel_at: tuple[int, threading.Event] | None = None  # set the event at that call
        if r.engine == "old":
            import runner.engines.llamacpp.engine as lr

            decode = lr.L.llama_decode

            def counting(*args):
                self._count()
                return decode(*args)

            monkeypatch.setattr(lr.L, "llama_decode", counting)
        else:
            model = r.model_engine.model
            execute = model.execute

            def counting(*args):
                self._count()
                return execute(*args)

            monkeypatch.setattr(model, "execute", counting)

    def _count(self) -> None:
        self.calls += 1
        if self.cancel_at is not None and self.calls == self.cancel_at[0]:
            self.cancel_at[1].set()


def test_embedding_inputs_share_forward_passes(engine, monkeypatch):
    """Many short inputs go through a few decodes, not one each; long ones span several."""
    import numpy as np

    r = load(None, engine, num_batch=64)
    try:
        words = [f"word number {i}" for i in range(24)]
        texts = words + ["a long text about the sea and the sky " * 12]  # > num_batch tokens
        counter = _DecodeCounter(r, monkeypatch)
        together = r.embed(texts)
        passes = counter.calls
        alone = [r.embed([t]).vectors[0] for t in texts]
        tokens = [len(r.tokenize(t)) for t in texts]
        assert together.prompt_eval_count == sum(tokens)
        assert max(tokens) > 64 and passes <= sum(tokens) // 64 + 3, passes
        assert counter.calls - passes >= len(texts)  # one at a time: at least a pass each
        # GGML's kernels round a token's row a little differently at other batch rows
        together, alone = np.array(together.vectors), np.array(alone)
        assert np.min(np.sum(together * alone, axis=1)) > 0.9999
        assert np.allclose(together, alone, atol=3e-3)
    finally:
        r.close()


def test_cancelling_an_embedding_stops_its_work_and_frees_its_slot(engine, monkeypatch):
    from runner.api import Cancelled

    r = load(STORIES, engine, num_ctx=512, num_batch=32)
    try:
        counter = _DecodeCounter(r, monkeypatch)
        texts = [f"{i} " + "Once upon a time there was a little girl " * 6 for i in range(400)]  # ~2 a decode
        cancel = threading.Event()
        counter.cancel_at = (10, cancel)  # the client leaves during the 10th of ~200 decodes
        with pytest.raises(Cancelled):
            r.embed(texts, cancel=cancel)
        assert counter.calls <= 12, counter.calls  # it stops at its next batch
        assert r.pending() == 0
        _, final = generate(r, "Once upon a time", options={"num_predict": 4})
        assert final.metrics.eval_count == 4
        with pytest.raises(Cancelled):  # cancelled before it started: nothing is evaluated
            before = counter.calls
            r.embed(["hello"], cancel=cancel)
        assert counter.calls == before
    finally:
        r.close()
