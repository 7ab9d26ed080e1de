"""OpenAI's Responses API (``/v1/responses``) end to end: a real ``pollama serve`` with SmolLM2
(plain, and given Qwen2.5's tool template or DeepSeek-R1's reasoning template), through the
official ``openai`` client's ``responses.create``, ``responses.stream``, ``responses.retrieve``,
and raw HTTP where the wire is the point; every response object is validated against the
OpenResponses specification's JSON Schema (``tests/data/openresponses/``)."""

from __future__ import annotations

import base64
import io
import json
import shutil
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest
from PIL import Image as PILImage

from conftest import SMOLLM2
from ggufcopy import with_chat_template
from serverproc import ServerProcess
from test_server_tools import PROMPTS, TOOLS, _gguf_blob, _install

TEMPLATES = Path(__file__).parent / "data" / "templates"
SMOL = "smollm2:135m"
# Responses' tools are flat: {"type": "function", "name", "description", "parameters"}
FLAT = [{"type": "function", **t["function"]} for t in TOOLS]
REQUIRED = {"get_weather": {"city"}, "add": {"a", "b"}}
SCHEMA = json.loads((Path(__file__).parent / "data" / "openresponses" / "response.schema.json").read_text())
ITEM = {"$ref": "#/$defs/ItemField", "$defs": SCHEMA["$defs"]}


def valid(obj: dict, schema: dict = SCHEMA) -> dict:
    """``obj``, after checking it against the OpenResponses schema (the response object, or
    ``ITEM`` for an output item); the error names the failing path."""
    jsonschema.Draft202012Validator(schema).validate(obj)
    return obj


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
    assert message.role == "assistant" and message.content[0].type == "output_text"
    assert out.output_text
    usage = out.usage
    assert usage.output_tokens <= 12 and usage.input_tokens > 10
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    # cut off by max_output_tokens: incomplete, as OpenAI says it (the message too)
    if usage.output_tokens == 12:
        assert out.status == message.status == "incomplete" and out.incomplete_details.reason == "max_output_tokens"
    else:
        assert out.status == message.status == "completed" and out.incomplete_details is None
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
        ({"input": "hi", "conversation": "conv_1"}, "conversation is not supported"),
        ({"input": "hi", "background": True}, "background is not supported"),
        ({"input": "hi", "truncation": "sometimes"}, "truncation"),
        ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]}, "input_file"),
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


# --------------------------------------------------------------------- OpenResponses compliance
def _post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/responses", json=body, timeout=120)


def _raw_events(server, body: dict) -> list[tuple[str | None, dict | str]]:
    """A streamed response's (``event:`` name, ``data:``) pairs; ``[DONE]`` stays a string."""
    out: list[tuple[str | None, dict | str]] = []
    with httpx.stream("POST", server.url + "/v1/responses", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
                out.append((name, data if data == "[DONE]" else json.loads(data)))
                name = None
    return out


def test_response_objects_follow_the_openresponses_schema(server):
    # every field the schema requires, defaults as OpenAI's, and what the request set echoed
    plain = valid(_post(server, {"model": SMOL, "input": "Hi", "temperature": 0, "max_output_tokens": 4}).json())
    assert plain["presence_penalty"] == plain["frequency_penalty"] == 0 and plain["top_logprobs"] == 0
    assert plain["max_tool_calls"] is plain["user"] is plain["safety_identifier"] is plain["prompt_cache_key"] is None
    assert plain["store"] is True and plain["previous_response_id"] is None and plain["metadata"] == {}
    echoed = valid(_post(server, {
        "model": SMOL, "input": "Hi", "temperature": 0, "max_output_tokens": 4, "presence_penalty": 0.5,
        "frequency_penalty": 0.25, "top_logprobs": 0, "max_tool_calls": 3, "user": "u1", "safety_identifier": "s1",
        "prompt_cache_key": "k1", "metadata": {"topic": "greeting"}}).json())
    assert (echoed["presence_penalty"], echoed["frequency_penalty"], echoed["max_tool_calls"], echoed["user"],
            echoed["safety_identifier"], echoed["prompt_cache_key"], echoed["metadata"]) == (
        0.5, 0.25, 3, "u1", "s1", "k1", {"topic": "greeting"})
    call = valid(_post(server, {"model": "smoltools", "input": PROMPTS[0], "tools": FLAT, "tool_choice": "required",
                                "temperature": 0, "max_output_tokens": 60}).json())
    assert [o["type"] for o in call["output"]] == ["function_call"]
    thought = valid(_post(server, {"model": "smolr1", "input": "Hi", "reasoning": {"effort": "low"}, "temperature": 0,
                                   "max_output_tokens": 6}).json())
    assert thought["output"][0]["type"] == "reasoning"

    # streamed: each event's name is its type, objects and items are valid, [DONE] comes last
    for body in ({"model": SMOL, "input": "Tell me a story.", "temperature": 0, "max_output_tokens": 5},
                 {"model": "smoltools", "input": PROMPTS[2], "tools": FLAT, "tool_choice": "required",
                  "temperature": 0, "max_output_tokens": 60}):
        events = _raw_events(server, body)
        assert events[-1] == (None, "[DONE]") and all(data != "[DONE]" for _, data in events[:-1])
        for name, data in events[:-1]:
            assert name == data["type"], (name, data)
            if "response" in data:
                valid(data["response"])
            if "item" in data:
                valid(data["item"], ITEM)
        assert events[-2][1]["type"] in ("response.completed", "response.incomplete")
        assert [d["sequence_number"] for _, d in events[:-1]] == list(range(len(events) - 1))


def test_input_image_parts_are_taken_as_chat_completions_takes_them(server):
    buf = io.BytesIO()
    PILImage.new("RGB", (16, 16), (200, 30, 30)).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    def ask(part: dict) -> httpx.Response:
        return _post(server, {"model": SMOL, "max_output_tokens": 2, "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "What is this?"}, part]}]})

    # decoded and checked: a model without vision refuses it as Ollama does (on both APIs)
    r = ask({"type": "input_image", "image_url": url, "detail": "auto"})
    chat = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={"model": SMOL, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                     {"type": "image_url", "image_url": {"url": url}}]}]})
    assert r.status_code == chat.status_code == 400
    assert r.json()["error"]["message"] == chat.json()["error"]["message"] == \
        "this model is missing data required for image input"
    for part, words in [({"type": "input_image", "image_url": "https://example.com/cat.png"},
                         "remote image URLs are not supported"),
                        ({"type": "input_image", "image_url": "data:image/png;base64,%%%"}, "not valid base64"),
                        ({"type": "input_image", "file_id": "file-1"}, "file_id images are not supported")]:
        r = ask(part)
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error", r.text
        assert words in r.json()["error"]["message"] and "input[0].content[1]" in r.json()["error"]["message"]


# ------------------------------------------------------------------------ stored responses
def test_previous_response_id_continues_the_conversation_from_the_cache(server, client):
    first = client.responses.create(model=SMOL, input="My name is Ann. Remember it.", temperature=0,
                                    max_output_tokens=8)
    second = client.responses.create(model=SMOL, previous_response_id=first.id, input="What is my name?",
                                     temperature=0, max_output_tokens=8)
    assert second.previous_response_id == first.id
    # the prompt extends the earlier one: the slot's cache holds all of it (and the answer)
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    # it is the conversation resent in full: the same prompt, the same greedy answer
    resent = client.responses.create(model=SMOL, temperature=0, max_output_tokens=8, input=[
        {"role": "user", "content": "My name is Ann. Remember it."},
        {"role": "assistant", "content": [{"type": "output_text", "text": first.output_text}]},
        {"role": "user", "content": "What is my name?"}])
    assert resent.usage.input_tokens == second.usage.input_tokens
    assert resent.usage.input_tokens_details.cached_tokens == resent.usage.input_tokens - 1
    assert resent.output_text == second.output_text
    # chains go on; GET answers the stored object
    third = client.responses.create(model=SMOL, previous_response_id=second.id, input="Thanks!", temperature=0,
                                    max_output_tokens=4)
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    got = httpx.get(server.url + f"/v1/responses/{second.id}", timeout=30)
    assert got.status_code == 200 and valid(got.json()) == json.loads(second.model_dump_json(exclude_unset=True))
    assert client.responses.retrieve(second.id).output_text == second.output_text
    # a streamed response is kept too
    with client.responses.stream(model=SMOL, input="Hi", temperature=0, max_output_tokens=4) as stream:
        final = list(stream)[-1].response  # response.incomplete: cut off at 4 tokens
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_unkept_and_deleted_responses_are_404s(server, client):
    def missing(r: httpx.Response, message: str, param: str | None = None, code: str | None = None) -> None:
        assert r.status_code == 404, r.text
        assert r.json() == {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                      "code": code}}

    unkept = client.responses.create(model=SMOL, input="Hi", store=False, max_output_tokens=2)
    assert unkept.store is False
    missing(httpx.get(server.url + f"/v1/responses/{unkept.id}"), f"Response with id '{unkept.id}' not found.")
    missing(_post(server, {"model": SMOL, "input": "Hi", "previous_response_id": unkept.id}),
            f"Previous response with id '{unkept.id}' not found.", "previous_response_id", "previous_response_not_found")
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unkept.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=SMOL, input="Hi", previous_response_id="resp_nope")
    kept = client.responses.create(model=SMOL, input="Hi", max_output_tokens=2)
    r = httpx.delete(server.url + f"/v1/responses/{kept.id}")
    assert r.status_code == 200 and r.json() == {"id": kept.id, "object": "response", "deleted": True}
    missing(httpx.get(server.url + f"/v1/responses/{kept.id}"), f"Response with id '{kept.id}' not found.")
    missing(httpx.delete(server.url + f"/v1/responses/{kept.id}"), f"Response with id '{kept.id}' not found.")


def test_the_store_keeps_the_most_recently_used_within_its_bounds():
    from runner.server.responsestore import ResponseStore

    store = ResponseStore(max_count=2, max_bytes=1000)
    for ident in "abc":
        store.put(ident, {"id": ident, "output": [{"type": "message"}]}, [{"role": "user", "content": ident}])
        if ident == "b":
            assert store.get("a") is not None  # "a" is now more recent than "b"
    assert store.get("b") is None and len(store) == 2
    assert store.get("a").conversation() == [{"role": "user", "content": "a"}, {"type": "message"}]
    big = [{"content": "x" * 400}]
    assert store.put("d", {"output": []}, big) and store.put("e", {"output": []}, big)
    assert len(store) == 2 and store.get("a") is None and store.bytes <= 1000  # by bytes: a and c went
    assert not store.put("huge", {"output": []}, [{"content": "x" * 1000}]) and store.get("huge") is None
    assert store.delete("d") and not store.delete("d") and len(store) == 1
    assert store.bytes == store.get("e").size
