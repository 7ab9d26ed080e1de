"""OpenAI's Responses API (``/v1/responses``) end to end: a real ``pollama serve`` with SmolLM2
(plain, and given Qwen2.5's tool template or DeepSeek-R1's reasoning template), through the
official ``openai`` client's ``responses.create`` and ``responses.stream``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import httpx
import pytest

from conftest import SMOLLM2
from ggufcopy import with_chat_template
from serverproc import ServerProcess
from test_server_tools import PROMPTS, TOOLS, _gguf_blob, _install

TEMPLATES = Path(__file__).parent / "data" / "templates"
SMOL = "smollm2:135m"
# Responses' tools are flat: {"type": "function", "name", "description", "parameters"}
FLAT = [{"type": "function", **t["function"]} for t in TOOLS]
REQUIRED = {"get_weather": {"city"}, "add": {"a", "b"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    copy = with_chat_template(SMOLLM2, tmp_path_factory.mktemp("gguf") / "smol-qwen.gguf",
                              (TEMPLATES / "qwen2.5.jinja").read_text())
    _install(models, "smoltools", _gguf_blob(models, copy))
    plain = _gguf_blob(models, shutil.copy(SMOLLM2, tmp_path_factory.mktemp("g2") / "smol.gguf"))
    _install(models, "smolr1", plain, (TEMPLATES / "deepseek-r1-distill-qwen.jinja").read_text())
    proc = ServerProcess({"OLLAMA_CONTEXT_LENGTH": "2048"}, models_dir=str(models)).start()
    yield proc
    assert proc.stop() == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=server.url + "/v1", api_key="unused")


def _chat_text(server, model: str, messages: list[dict], max_tokens: int, tools: list | None = None) -> str:
    r = httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": messages, "temperature": 0, "max_tokens": max_tokens, "tools": tools})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def _as_chat(server, ask, model: str, messages: list[dict], max_tokens: int, tools: list | None = None):
    """``ask()`` (a Responses call) renders the prompt that ``messages`` render on
    /v1/chat/completions, token for token (the slot the chat request left reuses all of it but
    the last token), and from the same cache state answers the same greedy text."""
    _chat_text(server, model, messages, max_tokens, tools)
    out = ask()
    assert out.usage.input_tokens_details.cached_tokens == out.usage.input_tokens - 1, out.usage
    assert out.output_text == _chat_text(server, model, messages, max_tokens, tools)
    return out


def test_plain_text_is_the_chat_answer(server, client):
    out = _as_chat(server, lambda: client.responses.create(
        model=SMOL, input="What is the capital of France?", instructions="Be brief.", temperature=0,
        max_output_tokens=12), SMOL, [{"role": "system", "content": "Be brief."},
                                      {"role": "user", "content": "What is the capital of France?"}], 12)
    assert out.object == "response" and out.id.startswith("resp_") and out.model == SMOL
    assert [item.type for item in out.output] == ["message"]
    message = out.output[0]
    assert message.role == "assistant" and message.status == "completed" and message.content[0].type == "output_text"
    assert out.output_text
    usage = out.usage
    assert usage.output_tokens <= 12 and usage.input_tokens > 10
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    # cut off by max_output_tokens: incomplete, as OpenAI says it
    if usage.output_tokens == 12:
        assert out.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    else:
        assert out.status == "completed" and out.incomplete_details is None
    # input as items: input_text parts, an earlier assistant turn with output_text
    _as_chat(server, lambda: client.responses.create(model=SMOL, temperature=0, max_output_tokens=8, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Hi, I am Ann."}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello Ann!"}]},
        {"role": "user", "content": "What is my name?"}]), SMOL, [
        {"role": "user", "content": "Hi, I am Ann."}, {"role": "assistant", "content": "Hello Ann!"},
        {"role": "user", "content": "What is my name?"}], 8)


def test_forced_tool_call_and_its_round_trip(server, client):
    for prompt in PROMPTS:
        out = client.responses.create(model="smoltools", input=prompt, tools=FLAT, tool_choice="required",
                                      temperature=0, max_output_tokens=60)
        calls = [item for item in out.output if item.type == "function_call"]
        assert len(calls) == 1 and out.status == "completed", (prompt, out.output)
        call = calls[0]
        assert call.name in REQUIRED and call.call_id.startswith("call_") and call.id.startswith("fc_")
        assert call.status == "completed" and set(json.loads(call.arguments)) == REQUIRED[call.name]
    # a named function
    out = client.responses.create(model="smoltools", input=PROMPTS[2], tools=FLAT, temperature=0,
                                  tool_choice={"type": "function", "name": "add"}, max_output_tokens=60)
    (call,) = [item for item in out.output if item.type == "function_call"]
    assert call.name == "add"
    # the call and its output go back as items; the model answers in text, as on /v1/chat/completions
    back = [{"role": "user", "content": PROMPTS[2]},
            {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
            {"type": "function_call_output", "call_id": call.call_id, "output": "5"}]
    answer = _as_chat(server, lambda: client.responses.create(
        model="smoltools", input=back, tools=FLAT, temperature=0, max_output_tokens=20), "smoltools", [
        {"role": "user", "content": PROMPTS[2]},
        {"role": "assistant", "content": "", "tool_calls": [{"id": call.call_id, "type": "function",
                                                             "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.call_id, "content": "5"}], 20, TOOLS)
    assert answer.output[0].type == "message" and answer.output_text


def test_streamed_events(server, client):
    story = [{"role": "user", "content": "Tell me a story."}]
    _chat_text(server, SMOL, story, 10)  # the same cache state for the stream and the oracle (_as_chat)
    with client.responses.stream(model=SMOL, input="Tell me a story.", temperature=0, max_output_tokens=10) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.status == "incomplete" and final.usage.output_tokens == 10
    assert deltas and final.output_text == deltas == _chat_text(server, SMOL, story, 10)
    # a forced call, streamed (stream=True): one function_call item with its arguments
    raw = list(client.responses.create(model="smoltools", input=PROMPTS[0], tools=FLAT, tool_choice="required",
                                       temperature=0, max_output_tokens=60, stream=True))
    kinds = [e.type for e in raw]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    added, done = raw[2].item, raw[5].item
    assert added.type == done.type == "function_call" and added.id == done.id and added.call_id == done.call_id
    assert raw[3].delta == raw[4].arguments == done.arguments and set(json.loads(done.arguments)) == {"city"}
    assert [item.type for item in raw[-1].response.output] == ["function_call"]
    # the stream helper accumulates the same call into its final response
    with client.responses.stream(model="smoltools", input=PROMPTS[0], tools=FLAT, tool_choice="required",
                                 temperature=0, max_output_tokens=60) as stream:
        final = stream.get_final_response()
    assert [(o.type, o.name, o.arguments) for o in final.output] == [("function_call", done.name, done.arguments)]


def test_reasoning_items(server, client):
    # DeepSeek-R1's prompt opens <think>: what SmolLM2 writes is reasoning
    out = client.responses.create(model="smolr1", input="What is 2+2?", reasoning={"effort": "low"},
                                  temperature=0, max_output_tokens=10)
    assert [item.type for item in out.output] == ["reasoning", "message"]
    thought = out.output[0].summary[0].text
    assert thought and out.output_text == ""
    raw = list(client.responses.create(model="smolr1", input="What is 2+2?", reasoning={"effort": "low"},
                                       temperature=0, max_output_tokens=10, stream=True))
    assert "".join(e.delta for e in raw if e.type == "response.reasoning_summary_text.delta") == thought
    # sent back, the reasoning item is the assistant turn's thinking (the template drops it: same answer)
    back = client.responses.create(model="smolr1", temperature=0, max_output_tokens=6, input=[
        {"role": "user", "content": "What is 2+2?"},
        {"type": "reasoning", "id": out.output[0].id, "summary": [{"type": "summary_text", "text": thought}]},
        {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}])
    assert back.output[0].type == "reasoning"


def test_bad_input_is_a_400_in_openais_shape(server):
    def post(body):
        return httpx.post(server.url + "/v1/responses", json={"model": SMOL, **body}, timeout=60)

    cases = [
        ({}, "input"),
        ({"input": ""}, "input must not be empty"),
        ({"input": []}, "input must not be empty"),
        ({"input": [{"type": "nonsense"}]}, "input[0]"),
        ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "unknown content type"),
        ({"input": [{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{not json"}]}, "arguments"),
        ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "only \"function\" tools"),
        ({"input": "hi", "tools": FLAT, "tool_choice": {"type": "function", "name": "nope"}}, "not one of the tools"),
        ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
        ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning_effort"),
        ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format"),
        ({"input": "hi", "tools": FLAT}, "does not support tools"),
    ]
    for body, words in cases:
        r = post(body)
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
        assert words in error["message"], (body, error)
    r = post({"model": "no-such-model", "input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
