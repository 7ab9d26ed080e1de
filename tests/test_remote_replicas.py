"""Remote models without a network: the replica policy (runner.remote.replicas) as tables, the
upstream URL rules, and both dialects' requests and stream parsing on hand-written lines."""

from __future__ import annotations

import json

import pytest

from runner.api import DoneReason, InvalidRequest, Message, Options, Request, Tool, ToolCall, ToolChoice, UpstreamError
from runner.remote.ollama_wire import OllamaDialect
from runner.remote.openai_wire import OpenAIDialect
from runner.remote.replicas import MAX_KEYS, Replicas
from runner.remote.runner import prefix_key
from runner.remote.upstream import OLLAMA, OPENAI, RemoteModel, Upstream


# ------------------------------------------------------------------------------------ policy
def run(policy: Replicas, steps: list[tuple]) -> list:
    """Apply ``steps`` ("pick", key[, now[, exclude]]) / ("start", i, key) / ("finish", i) /
    ("down", i, now) / ("up", i); the picks' results in order."""
    out = []
    for step in steps:
        op = step[0]
        if op == "pick":
            key = step[1]
            now = step[2] if len(step) > 2 else 0.0
            exclude = frozenset(step[3]) if len(step) > 3 else frozenset()
            out.append(policy.pick(key, now, exclude))
        elif op == "take":  # pick and start, as the runner does
            i = policy.pick(step[1], step[2] if len(step) > 2 else 0.0)
            if i is not None:
                policy.start(i, step[1])
            out.append(i)
        elif op == "finish":
            policy.finish(step[1])
        elif op == "down":
            policy.down(step[1], step[2])
        elif op == "up":
            policy.up(step[1])
    return out


POLICY_TABLE = [
    # (name, replicas, limit, imbalance, steps, expected picks)
    ("new conversations spread to the least-served replica", 3, 8, 4,
     [("take", "a"), ("finish", 0), ("take", "b"), ("finish", 1), ("take", "c"), ("finish", 2), ("take", "d")],
     [0, 1, 2, 0]),
    ("a conversation returns to its replica while others are idle", 3, 8, 4,
     [("take", "a"), ("finish", 0), ("take", "b"), ("finish", 1), ("take", "a"), ("take", "a")],
     [0, 1, 0, 0]),
    ("within the imbalance the remembered replica keeps it", 2, 8, 2,
     [("take", "a"), ("take", "a"), ("take", "a")],
     [0, 0, 0]),
    ("past the imbalance it moves to the least busy, and is remembered there", 2, 8, 2,
     [("take", "a"), ("take", "a"), ("take", "a"), ("take", "a"), ("finish", 0), ("finish", 0), ("take", "a")],
     [0, 0, 0, 1, 1]),
    ("a replica at its limit takes no more; all full is None", 2, 1, 4,
     [("take", "a"), ("take", "a"), ("take", "b")],
     [0, 1, None]),
    ("a slot freed is taken again", 2, 1, 4,
     [("take", "a"), ("take", "b"), ("finish", 0), ("take", "c")],
     [0, 1, 0]),
    ("a down replica is skipped, even for its own conversations", 2, 8, 4,
     [("take", "a"), ("finish", 0), ("down", 0, 0.0), ("pick", "a", 1.0)],
     [0, 1]),
    ("a down mark ends with time", 2, 8, 4,
     [("take", "a"), ("finish", 0), ("down", 0, 0.0), ("pick", "a", 31.0)],
     [0, 0]),
    ("a health check brings it back at once", 2, 8, 4,
     [("take", "a"), ("finish", 0), ("down", 0, 0.0), ("up", 0), ("pick", "a", 1.0)],
     [0, 0]),
    ("all down: the one whose mark ends first is tried", 3, 8, 4,
     [("down", 0, 5.0), ("down", 1, 2.0), ("down", 2, 9.0), ("pick", "x", 10.0)],
     [1]),
    ("replicas that failed this request are not tried again", 3, 8, 4,
     [("pick", "a", 0.0, [0]), ("pick", "a", 0.0, [0, 1]), ("pick", "a", 0.0, [0, 1, 2])],
     [1, 2, None]),
    ("no key: least busy, nothing remembered", 2, 8, 4,
     [("take", None), ("take", None), ("take", None)],
     [0, 1, 0]),
]


@pytest.mark.parametrize("name,count,limit,imbalance,steps,expected", POLICY_TABLE, ids=[t[0] for t in POLICY_TABLE])
def test_replica_policy(name, count, limit, imbalance, steps, expected):
    assert run(Replicas(count, limit=limit, imbalance=imbalance, down_for=30.0), steps) == expected


def test_affinity_memory_is_bounded_least_recent_first():
    policy = Replicas(2)
    for n in range(MAX_KEYS + 10):
        i = policy.pick(f"k{n}", 0.0)
        policy.start(i, f"k{n}")
        policy.finish(i)
    assert len(policy.affinity) == MAX_KEYS
    assert "k0" not in policy.affinity and f"k{MAX_KEYS + 9}" in policy.affinity


def test_prefix_key_is_the_conversation_not_its_later_turns():
    first = [Message("system", "be brief"), Message("user", "hi")]
    later = first + [Message("assistant", "hello"), Message("user", "more")]
    assert prefix_key(Request(messages=first)) == prefix_key(Request(messages=later))
    assert prefix_key(Request(messages=first)) != prefix_key(Request(messages=[Message("user", "other")]))
    assert prefix_key(Request(messages=first)) != prefix_key(Request(messages=first, tools=[Tool("f")]))


# ------------------------------------------------------------------------------------ URLs
URLS = [
    ("http://gpu-box:8000/v1", "http://gpu-box:8000/v1", OPENAI),
    ("HTTP://GPU-Box:8000/v1/", "http://gpu-box:8000/v1", OPENAI),
    ("https://api.example.com/proxy/v1", "https://api.example.com/proxy/v1", OPENAI),
    ("http://other-box:11434", "http://other-box:11434", OLLAMA),
    ("http://[::1]:11434/", "http://[::1]:11434", OLLAMA),
]


@pytest.mark.parametrize("text,url,api", URLS)
def test_upstream_urls(text, url, api):
    upstream = Upstream.parse(text)
    assert (upstream.url, upstream.api) == (url, api)


@pytest.mark.parametrize("text,why", [
    ("ftp://box/v1", "http(s)"),
    ("http://user:secret@box:8000/v1", "POLLAMA_REMOTE_API_KEY"),
    ("http://box:8000/v1?key=1", "no query"),
    ("http://:8000/v1", "http(s)"),
    ("http://box:99999/v1", "invalid remote URL"),
    ("http://../victim/x", "not a host name"),
    ("https://host/../x", "no . or .. in its path"),
    ("http://a_b.example/v1", "not a host name"),
])
def test_bad_upstream_urls_are_refused(text, why):
    with pytest.raises(InvalidRequest) as err:
        Upstream.parse(text)
    assert why in str(err.value)
    assert "secret" not in str(err.value)


def test_replicas_must_share_one_api_and_be_distinct():
    with pytest.raises(InvalidRequest, match="one API"):
        RemoteModel((Upstream.parse("http://a:1/v1"), Upstream.parse("http://b:1")), "m")
    with pytest.raises(InvalidRequest, match="twice"):
        RemoteModel((Upstream.parse("http://a:1/v1"), Upstream.parse("http://a:1/v1/")), "m")


def test_config_round_trip_and_remotes_rule():
    model = RemoteModel((Upstream.parse("http://a:1/v1"), Upstream.parse("http://b:2/v1")), "m", ("completion", "tools"),
                        context_length=4096)
    config = model.config()
    assert config["remote_host"] == "http://a:1/v1" and config["remote_model"] == "m"
    assert RemoteModel.from_config(config) == model
    assert RemoteModel.from_config({"model_format": "gguf"}) is None
    assert model.refusal(("a", "b")) is None
    assert "OLLAMA_REMOTES=b" in model.refusal(("a",))


# ------------------------------------------------------------------------------- requests
def prepared(**fields) -> Request:
    options = fields.pop("options", {})
    return Request(options=Options().merged(options), options_set=frozenset(options), **fields)


def test_openai_body_maps_the_options_set_and_leaves_defaults_out():
    request = prepared(messages=[Message("user", "hi")], system="sys",
                       options={"temperature": 0.0, "num_predict": 5, "top_k": 1, "stop": ["\n"], "num_ctx": 8192,
                                "seed": 3},
                       format={"type": "object"}, think="low", tools=[Tool("f")], tool_choice=ToolChoice("required"))
    body = OpenAIDialect("u").chat_body(request, "m")
    assert body["messages"] == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert {k: body[k] for k in ("temperature", "max_tokens", "top_k", "stop", "seed")} == \
        {"temperature": 0.0, "max_tokens": 5, "top_k": 1, "stop": ["\n"], "seed": 3}
    assert "top_p" not in body and "num_ctx" not in body  # a default, and a local-only option
    assert body["response_format"]["json_schema"]["schema"] == {"type": "object"}
    assert body["reasoning_effort"] == "low" and body["tool_choice"] == "required"


def test_openai_refuses_options_it_has_not():
    with pytest.raises(InvalidRequest, match="repeat_penalty, typical_p"):
        OpenAIDialect("u").chat_body(prepared(prompt="x", options={"repeat_penalty": 1.3, "typical_p": 0.5}), "m")


def test_ollama_body_forwards_options_by_name_and_refuses_a_forced_tool():
    body = OllamaDialect("u").chat_body(prepared(prompt="hi", options={"num_ctx": 8192, "repeat_penalty": 1.2},
                                                 think=True, format="json"), "m")
    assert body["options"] == {"num_ctx": 8192, "repeat_penalty": 1.2}
    assert body["messages"] == [{"role": "user", "content": "hi"}] and body["think"] is True and body["format"] == "json"
    with pytest.raises(InvalidRequest, match="tool_choice"):
        OllamaDialect("u").chat_body(prepared(prompt="x", tools=[Tool("f")], tool_choice=ToolChoice("required")), "m")


@pytest.mark.parametrize("fields,why", [({"raw": True}, "raw"), ({"template": "{{ .Prompt }}"}, "template"),
                                        ({"context": [1, 2]}, "context")])
def test_what_only_a_local_template_can_do_is_refused(fields, why):
    with pytest.raises(InvalidRequest, match=why):
        OpenAIDialect("u").chat_body(prepared(prompt="x", **fields), "m")


def test_openai_tool_messages_are_paired_with_their_calls():
    messages = [Message("user", "weather?"), Message("assistant", "", tool_calls=[ToolCall("w", {"c": "Paris"})]),
                Message("tool", "sunny", tool_name="w")]
    body = OpenAIDialect("u").chat_body(prepared(messages=messages), "m")
    call_id = body["messages"][1]["tool_calls"][0]["id"]
    assert body["messages"][1]["tool_calls"][0]["function"] == {"name": "w", "arguments": '{"c": "Paris"}'}
    assert body["messages"][2]["tool_call_id"] == call_id


# ------------------------------------------------------------------------------- streams
def sse(event) -> bytes:
    return b"data: " + json.dumps(event).encode()


def test_openai_reader_passes_text_and_assembles_tool_calls():
    reader = OpenAIDialect("u").reader()
    out = []
    for line in [b": keep-alive", sse({"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}}]}),
                 sse({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}),
                 sse({"choices": [{"index": 0, "delta": {"tool_calls": [
                     {"index": 0, "id": "call_1", "function": {"name": "w", "arguments": '{"c": '}}]}}]}),
                 sse({"choices": [{"index": 0, "delta": {"tool_calls": [
                     {"index": 0, "function": {"arguments": '"Paris"}'}}]}, "finish_reason": "tool_calls"}]}),
                 sse({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 4,
                                               "prompt_tokens_details": {"cached_tokens": 5}}}),
                 b"data: [DONE]"]:
        out.extend(reader.read(line))
    assert [(c.thinking, c.text) for c in out[:2]] == [("hmm", ""), ("", "Hi")]
    assert out[2].tool_calls == [ToolCall("w", {"c": "Paris"}, index=0, id="call_1")]
    final = out[-1]
    assert final.done and final.done_reason is DoneReason.STOP
    m = final.metrics
    assert (m.prompt_eval_count, m.prompt_cached_count, m.eval_count) == (4, 5, 4)


def test_readers_refuse_a_cut_stream_and_garbage():
    reader = OpenAIDialect("u").reader()
    reader.read(sse({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}))
    with pytest.raises(UpstreamError, match="before the answer was complete"):
        reader.end()
    with pytest.raises(UpstreamError, match="not JSON"):
        OpenAIDialect("u").reader().read(b"data: {nope")
    with pytest.raises(UpstreamError, match="failed: boom"):
        OllamaDialect("u").reader().read(b'{"error": "boom"}')
    with pytest.raises(UpstreamError, match="before the answer was complete"):
        OllamaDialect("u").reader().end()


def test_ollama_reader_passes_counts_and_durations():
    reader = OllamaDialect("u").reader()
    out = reader.read(b'{"message": {"role": "assistant", "content": "Hi"}, "done": false}')
    out += reader.read(json.dumps({"message": {"role": "assistant", "content": ""}, "done": True,
                                   "done_reason": "length", "prompt_eval_count": 12, "prompt_eval_duration": 5,
                                   "eval_count": 3, "eval_duration": 7}).encode())
    assert out[0].text == "Hi" and out[-1].done and out[-1].done_reason is DoneReason.LENGTH
    m = out[-1].metrics
    assert (m.prompt_eval_count, m.prompt_eval_duration, m.eval_count, m.eval_duration) == (12, 5, 3, 7)
