"""Anthropic's Messages API through the official ``anthropic`` client against a real ``pollama
serve``: usage in the stream (input tokens in ``message_start``, final counts and the slot
cache's share in ``message_delta``), ``/v1/messages/count_tokens``, ``thinking`` dropped for a
model that cannot think, and ``stop_reason: "stop_sequence"``. SmolLM2-135M, a few tokens each."""

from __future__ import annotations

from pathlib import Path

import anthropic
import httpx
import pytest

from conftest import SMOLLM2
from serverproc import ServerProcess
from test_template_selection import install

SMOL = "smollm2:135m"
TEMPLATES = Path(__file__).parent / "data" / "templates"
GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "Get the current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    install(models, "smoltools", SMOLLM2, (TEMPLATES / "qwen2.5.jinja").read_text())  # renders tools
    proc = ServerProcess({"OLLAMA_NUM_PARALLEL": "1", "OLLAMA_CONTEXT_LENGTH": "2048"},
                         models_dir=str(models)).start()
    yield proc
    assert proc.stop() == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120)


def _prompt(usage) -> int:
    """The whole prompt of a reply: Anthropic's input_tokens leave out what came from the cache."""
    return usage.input_tokens + (usage.cache_read_input_tokens or 0)


def test_stream_reports_input_tokens_and_cache_reads(client):
    messages = [{"role": "user", "content": "Name a colour."}]
    with client.messages.stream(model=SMOL, max_tokens=3, extra_body=GREEDY, system="Be brief.",
                                messages=messages) as stream:
        events = list(stream)
        final = stream.get_final_message()
    start = next(e for e in events if e.type == "message_start")
    delta = next(e for e in events if e.type == "message_delta")
    # message_start already knows the prompt; message_delta has the final counts
    assert start.message.usage.input_tokens > 10 and start.message.usage.output_tokens == 0
    assert delta.usage.input_tokens == start.message.usage.input_tokens
    assert delta.usage.output_tokens == 3 and delta.usage.cache_read_input_tokens is not None
    whole = _prompt(final.usage)
    assert final.usage.input_tokens > 10 and final.usage.output_tokens == 3
    # the same conversation again: its prompt comes from the slot's cache, and is still counted whole
    again = client.messages.create(model=SMOL, max_tokens=3, extra_body=GREEDY, system="Be brief.",
                                   messages=messages)
    assert again.usage.cache_read_input_tokens > 10 and _prompt(again.usage) == whole
    assert again.usage.input_tokens < final.usage.input_tokens and again.usage.output_tokens == 3


def test_count_tokens_counts_what_a_request_would(client):
    kwargs = {"system": "You are terse.", "messages": [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
        {"role": "user", "content": [{"type": "text", "text": "What is 2+2?"}]}]}
    counted = client.messages.count_tokens(model=SMOL, **kwargs)
    reply = client.messages.create(model=SMOL, max_tokens=1, extra_body=GREEDY, **kwargs)
    assert counted.input_tokens > 20 and counted.input_tokens == _prompt(reply.usage)
    # tools are part of the prompt (Qwen2.5's template lists them)
    tools = dict(kwargs, tools=[WEATHER])
    with_tools = client.messages.count_tokens(model="smoltools", **tools)
    reply = client.messages.create(model="smoltools", max_tokens=1, extra_body=GREEDY, **tools)
    assert with_tools.input_tokens == _prompt(reply.usage)
    assert with_tools.input_tokens > client.messages.count_tokens(model="smoltools", **kwargs).input_tokens


def test_count_tokens_errors_have_anthropics_shape(server, client):
    with pytest.raises(anthropic.NotFoundError):
        client.messages.count_tokens(model="nosuchmodel", messages=[{"role": "user", "content": "hi"}])
    r = httpx.post(server.url + "/v1/messages/count_tokens", timeout=60, json={
        "model": SMOL, "tools": [WEATHER], "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json() == {"type": "error", "error": {
        "type": "invalid_request_error", "message": f'"{SMOL}" does not support tools'}}
    r = httpx.post(server.url + "/v1/messages/count_tokens", timeout=60, json={"model": SMOL, "messages": []})
    assert r.status_code == 400 and r.json()["type"] == "error"


def test_thinking_is_dropped_for_a_model_that_cannot_think(server, client):
    # Claude-Code-style clients ask every model to think: Ollama's /v1/messages answers anyway
    out = client.messages.create(model=SMOL, max_tokens=3, extra_body=GREEDY,
                                 thinking={"type": "enabled", "budget_tokens": 1024},
                                 messages=[{"role": "user", "content": "Hi"}])
    assert [b.type for b in out.content] == ["text"] and out.usage.output_tokens == 3
    counted = client.messages.count_tokens(model=SMOL, thinking={"type": "enabled", "budget_tokens": 1024},
                                           messages=[{"role": "user", "content": "Hi"}])
    assert counted.input_tokens == _prompt(out.usage)
    # /api/chat's think stays a demand
    r = httpx.post(server.url + "/api/chat", timeout=60, json={
        "model": SMOL, "think": True, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 400 and r.json()["error"] == f'"{SMOL}" does not support thinking'


def test_stop_sequence_that_matched_is_the_stop_reason(client):
    messages = [{"role": "user", "content": "Write a sentence about the sea."}]
    free = client.messages.create(model=SMOL, max_tokens=8, extra_body=GREEDY, messages=messages)
    assert free.stop_reason == "max_tokens" and free.stop_sequence is None
    text = free.content[0].text
    word = text.split()[1]  # a word the model writes early on
    stops = ["zzqqxx", word]
    out = client.messages.create(model=SMOL, max_tokens=8, extra_body=GREEDY, messages=messages,
                                 stop_sequences=stops)
    assert out.stop_reason == "stop_sequence" and out.stop_sequence == word
    assert out.content[0].text == text[:text.index(word)]
    with client.messages.stream(model=SMOL, max_tokens=8, extra_body=GREEDY, messages=messages,
                                stop_sequences=stops) as stream:
        delta = next(e for e in stream if e.type == "message_delta")
        final = stream.get_final_message()
    assert delta.delta.stop_reason == "stop_sequence" and delta.delta.stop_sequence == word
    assert final.stop_reason == "stop_sequence" and final.stop_sequence == word
    # a model's own end is end_turn, with no stop sequence
    done = client.messages.create(model=SMOL, max_tokens=40, extra_body=GREEDY,
                                  messages=[{"role": "user", "content": "Say OK."}])
    assert done.stop_reason == "end_turn" and done.stop_sequence is None
