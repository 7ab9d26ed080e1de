"""OpenAI's wire shapes on ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``
against a real ``pollama serve``: SmolLM2 plain, with Qwen2.5's tool template (``smoltools``) and
with DeepSeek-R1's reasoning template (``smolr1``). Raw SSE where the lines on the wire are the
point, the official ``openai`` client where what a client reads is."""

from __future__ import annotations

import json

import httpx
import ollama
import openai
import pytest

from conftest import SMOLLM2
from test_server_responses import server  # noqa: F401  (the same models: smoltools, smolr1)
from test_server_tools import PROMPTS, TOOLS

SMOL = "smollm2:135m"


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def sse(server, path: str, body: dict) -> list[dict | str]:
    """The ``data:`` payloads of a streamed answer, parsed (``[DONE]`` stays a string)."""
    out: list[dict | str] = []
    with httpx.stream("POST", server.url + path, json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        for line in r.iter_lines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                out.append(data if data == "[DONE]" else json.loads(data))
            else:
                assert line == "", line
    return out


# ------------------------------------------------------------------------- chat completions
def _deltas(events: list) -> tuple[list[dict], list]:
    """The chunks' choices[0] (without the usage chunk) and what follows the last of them."""
    choices = [e["choices"][0] for e in events if isinstance(e, dict) and e["choices"]]
    return choices, events[len(choices):]


def test_chat_stream_sends_the_role_once_then_deltas_then_the_finish(server):
    """OpenAI's order: a first chunk with the role (and empty content), content deltas without
    the role, a chunk with finish_reason and an empty delta, the usage chunk, ``[DONE]``."""
    events = sse(server, "/v1/chat/completions", {
        "model": SMOL, "messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0,
        "max_tokens": 6, "stream_options": {"include_usage": True}})
    choices, tail = _deltas(events)
    assert choices[0]["delta"] == {"role": "assistant", "content": ""} and choices[0]["finish_reason"] is None
    middle = choices[1:-1]
    assert middle and all(set(c["delta"]) == {"content"} and c["delta"]["content"] for c in middle), middle
    assert all(c["finish_reason"] is None for c in middle)
    assert choices[-1]["delta"] == {} and choices[-1]["finish_reason"] == "length"
    usage, done = tail
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6 and done == "[DONE]"
    # with include_usage, every other chunk carries "usage": null (as OpenAI's do)
    assert all(e["usage"] is None for e in events[:-2])
    assert len({e["id"] for e in events[:-1]}) == 1 and all(e["object"] == "chat.completion.chunk" for e in events[:-1])
    # without include_usage: no usage chunk, no usage field
    events = sse(server, "/v1/chat/completions", {
        "model": SMOL, "messages": [{"role": "user", "content": "Tell me a story."}], "temperature": 0, "max_tokens": 3})
    choices, tail = _deltas(events)
    assert tail == ["[DONE]"] and choices[-1]["delta"] == {} and not any("usage" in e for e in events[:-1])
    assert sum(1 for c in choices if "role" in c["delta"]) == 1


def test_chat_stream_tool_call_and_reasoning_deltas(server, oai):
    events = sse(server, "/v1/chat/completions", {
        "model": "smoltools", "messages": [{"role": "user", "content": PROMPTS[2]}], "tools": TOOLS,
        "tool_choice": {"type": "function", "function": {"name": "add"}}, "temperature": 0, "max_tokens": 60})
    choices, tail = _deltas(events)
    assert tail == ["[DONE]"]
    assert [c["delta"] for c in choices[:1]] == [{"role": "assistant", "content": ""}]
    calls = [c["delta"] for c in choices[1:-1]]
    assert len(calls) == 1 and set(calls[0]) == {"tool_calls"}, calls
    (call,) = calls[0]["tool_calls"]
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "add" and set(json.loads(call["function"]["arguments"])) == {"a", "b"}
    assert choices[-1] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "tool_calls"}
    # reasoning deltas carry the reasoning only (no role, no empty content)
    events = sse(server, "/v1/chat/completions", {
        "model": "smolr1", "messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "low",
        "temperature": 0, "max_tokens": 6})
    choices, _ = _deltas(events)
    thoughts = choices[1:-1]
    assert thoughts and all(set(c["delta"]) == {"reasoning", "reasoning_content"} for c in thoughts), thoughts
    # the client reads the same: one role, then the reasoning
    chunks = list(oai.chat.completions.create(model="smolr1", messages=[{"role": "user", "content": "Hi"}],
                                              reasoning_effort="low", temperature=0, max_tokens=6, stream=True))
    assert [c.choices[0].delta.role for c in chunks][:2] == ["assistant", None]
    assert "".join(c.choices[0].delta.model_extra.get("reasoning_content", "") for c in chunks) == \
        "".join(c["delta"].get("reasoning_content", "") for c in choices)


def test_completions_stream_shape(server):
    events = sse(server, "/v1/completions", {"model": SMOL, "prompt": "Once upon a time", "temperature": 0,
                                             "max_tokens": 5, "stream_options": {"include_usage": True}})
    choices, tail = _deltas(events)
    assert all(e["object"] == "text_completion" for e in events[:-1])
    assert all(c["text"] and c["finish_reason"] is None for c in choices[:-1])
    assert choices[-1]["text"] == "" and choices[-1]["finish_reason"] == "length"
    assert tail[0]["choices"] == [] and tail[0]["usage"]["completion_tokens"] == 5 and tail[1] == "[DONE]"


# ---------------------------------------------------------------------- speculative decoding
def test_asked_again_the_answer_is_drafted_from_the_first_and_timings_count_it(server, oai):
    """A client that asks the same thing twice (a retry, a second agent): the model's shared
    n-gram pool, on by default, drafts the second answer from the first, and ``timings`` carry
    llama-server's draft counts. Every answer is the one decoding without guesses gives, which
    the ``ollama`` client asks for with ``draft_num_predict 0``."""
    messages = [{"role": "user", "content": "Write a long story about a lighthouse keeper named Ada and a "
                                            "winter storm."}]  # no other test's: the pool has not seen it
    replies = [oai.chat.completions.create(model=SMOL, messages=messages, temperature=0, max_tokens=120)
               for _ in range(2)]
    plain = ollama.Client(host=server.url).chat(model=SMOL, messages=messages, options={
        "temperature": 0, "top_p": 1.0, "num_predict": 120, "draft_num_predict": 0})
    texts = [r.choices[0].message.content for r in replies]
    assert texts[0] == texts[1] == plain.message.content
    first, again = (r.model_extra["timings"] for r in replies)
    assert again["predicted_n"] == 120 and again["draft_n_accepted"] >= 0.8 * 120  # the first answer, drafted
    assert again["draft_n_accepted"] > first["draft_n_accepted"]
    assert 0 < again["draft_n"] and again["draft_n_accepted"] <= again["draft_n"]


# ------------------------------------------------------------------------------- embeddings
def test_embeddings_take_token_arrays(server, oai):
    """OpenAI's token-array inputs are embedded as given: a text's vector is its token ids'."""
    from runner.model import load_tokenizer

    tok = load_tokenizer(SMOLLM2)
    texts = ["The cat sat on the mat.", "A dog barked."]
    ids = [tok.encode(t, add_special=True, parse_special=True) for t in texts]  # as the runner tokenizes
    by_text = oai.embeddings.create(model=SMOL, input=texts)
    one = oai.embeddings.create(model=SMOL, input=ids[0])
    many = oai.embeddings.create(model=SMOL, input=ids)
    assert len(one.data) == 1 and len(many.data) == 2
    assert one.data[0].embedding == pytest.approx(by_text.data[0].embedding, abs=1e-6)
    for a, b in zip(many.data, by_text.data):
        assert a.embedding == pytest.approx(b.embedding, abs=1e-6)
    assert many.usage.prompt_tokens == by_text.usage.prompt_tokens == sum(map(len, ids))
    # ids outside the vocabulary, empty arrays, mixed lists: 400 in OpenAI's shape
    for bad, words in [([tok.n_vocab], "token ids must be in [0, "), ([[1, 2], [-1]], "input[1]"), ([], "non-empty"),
                       ([[]], "non-empty"), ([[1], []], "non-empty"), ([1, "a"], "invalid input type"),
                       ([True, 2], "invalid input type"), ([1.5], "invalid input type")]:
        r = httpx.post(server.url + "/v1/embeddings", json={"model": SMOL, "input": bad}, timeout=60)
        assert r.status_code == 400, (bad, r.text)
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and words in error["message"], (bad, error)
