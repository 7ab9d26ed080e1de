"""Tools and thinking end to end: a real ``pollama serve`` with SmolLM2 given real tool and
reasoning templates (a GGUF copy whose ``tokenizer.chat_template`` is Qwen2.5's, store models
whose TEMPLATE layer is Qwen3's or DeepSeek-R1's Jinja, and one whose TEMPLATE is the Go template
Ollama's library ships for qwen2.5), through the official clients."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import httpx
import pytest

from conftest import SMOLLM2
from ggufcopy import with_chat_template
from serverproc import ServerProcess
from test_template_selection import _blob

TEMPLATES = Path(__file__).parent / "data" / "templates"
SMOL = "smollm2:135m"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city"}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two numbers",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
PROMPTS = ["What is the weather in Paris?", "How warm is it in Tokyo today?", "What is 2 plus 3?",
           "Is it raining in London?", "Add 17 and 25."]


def _install(models: Path, name: str, gguf_layer: dict, template: str | None = None, params: dict | None = None) -> None:
    layers = [{"mediaType": "application/vnd.ollama.image.model", **gguf_layer}]
    if template is not None:
        layers.append({"mediaType": "application/vnd.ollama.image.template", **_blob(models, template.encode())})
    if params is not None:
        layers.append({"mediaType": "application/vnd.ollama.image.params", **_blob(models, json.dumps(params).encode())})
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **_blob(models, b"{}")},
                "layers": layers}
    path = models / "manifests" / "registry.ollama.ai" / "library" / name / "latest"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))


def _gguf_blob(models: Path, src: Path) -> dict:
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    (models / "blobs").mkdir(parents=True, exist_ok=True)
    shutil.move(str(src), models / "blobs" / f"sha256-{digest}")
    return {"digest": f"sha256:{digest}", "size": (models / "blobs" / f"sha256-{digest}").stat().st_size}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    copy = with_chat_template(SMOLLM2, tmp_path_factory.mktemp("gguf") / "smol-qwen.gguf",
                              (TEMPLATES / "qwen2.5.jinja").read_text())
    _install(models, "smoltools", _gguf_blob(models, copy))  # tools from the GGUF's own template
    plain = _gguf_blob(models, shutil.copy(SMOLLM2, tmp_path_factory.mktemp("g2") / "smol.gguf"))
    _install(models, "smolqwen3", plain, (TEMPLATES / "qwen3.jinja").read_text())
    _install(models, "smolr1", plain, (TEMPLATES / "deepseek-r1-distill-qwen.jinja").read_text())
    _install(models, "smolgo", plain, (TEMPLATES / "ollama-qwen2.5.gotmpl").read_text())  # Ollama's Go TEMPLATE
    proc = ServerProcess({"OLLAMA_CONTEXT_LENGTH": "2048"}, models_dir=str(models)).start()
    yield proc
    assert proc.stop() == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


def test_capabilities(server):
    def caps(model):
        return httpx.post(server.url + "/api/show", json={"model": model}, timeout=60).json()["capabilities"]

    assert caps(SMOL) == ["completion"]
    assert caps("smoltools") == ["completion", "tools"]
    assert caps("smolqwen3") == ["completion", "tools", "thinking"]
    assert caps("smolr1") == ["completion", "thinking"]
    assert caps("smolgo") == ["completion", "tools"]


@pytest.mark.slow
def test_go_template_tool_calls(server):
    """Ollama's Go TEMPLATE shows the tools to the model and writes its calls back, and the call
    syntax derived from it parses (and, forced, constrains) what the model writes."""
    import ollama

    client = ollama.Client(host=server.url)
    for prompt in PROMPTS[:3]:
        r = httpx.post(server.url + "/api/chat", timeout=120, json={
            "model": "smolgo", "messages": [{"role": "user", "content": prompt}], "tools": TOOLS, "stream": False,
            "tool_choice": "required", "options": {"temperature": 0, "num_predict": 60}})
        calls = r.json()["message"].get("tool_calls") or []
        assert len(calls) == 1 and calls[0]["function"]["name"] in ("get_weather", "add"), r.json()
        required = {"get_weather": {"city"}, "add": {"a", "b"}}[calls[0]["function"]["name"]]
        assert set(calls[0]["function"]["arguments"]) == required
    # the call and its result go back through the Go template; the model answers in text
    messages = [{"role": "user", "content": PROMPTS[0]},
                {"role": "assistant", "content": "", "tool_calls": [{"function": calls[0]["function"]}]},
                {"role": "tool", "content": "18 degrees and sunny", "tool_name": calls[0]["function"]["name"]}]
    answer = client.chat(model="smolgo", messages=messages, tools=TOOLS, options={"temperature": 0, "num_predict": 20})
    assert answer.message.content and not answer.message.tool_calls
    assert answer.prompt_eval_count > 150  # the tools' descriptions and the call are in the prompt


def test_refusals_have_ollamas_messages(server):
    def chat(body, path="/api/chat"):
        return httpx.post(server.url + path, json={"messages": [{"role": "user", "content": "hi"}], **body}, timeout=60)

    r = chat({"model": SMOL, "tools": [WEATHER]})
    assert r.status_code == 400 and r.json() == {"error": f'"{SMOL}" does not support tools'}
    r = chat({"model": SMOL, "tools": [WEATHER]}, "/v1/chat/completions")
    assert r.status_code == 400 and r.json()["error"]["message"] == f'"{SMOL}" does not support tools'
    r = chat({"model": "smoltools", "think": True})
    assert r.status_code == 400 and r.json() == {"error": '"smoltools" does not support thinking'}
    r = chat({"model": "smoltools", "tools": [{"type": "function", "function": {}}]})
    assert r.status_code == 400 and "invalid tools[0]" in r.json()["error"]
    r = chat({"model": "smoltools", "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
             "/v1/chat/completions")
    assert r.status_code == 400 and "not one of the tools" in r.json()["error"]["message"]
    # tool_choice "none": no tools offered, so a model without tools answers
    r = chat({"model": SMOL, "tools": [WEATHER], "tool_choice": "none", "max_tokens": 2}, "/v1/chat/completions")
    assert r.status_code == 200


@pytest.mark.slow
def test_openai_required_tool_calls_are_well_formed(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    for prompt in PROMPTS:
        out = client.chat.completions.create(model="smoltools", messages=[{"role": "user", "content": prompt}],
                                             tools=TOOLS, tool_choice="required", temperature=0, max_tokens=60)
        choice = out.choices[0]
        assert choice.finish_reason == "tool_calls", (prompt, choice)
        calls = choice.message.tool_calls
        assert len(calls) == 1 and calls[0].function.name in ("get_weather", "add") and calls[0].id.startswith("call_")
        args = json.loads(calls[0].function.arguments)
        required = {"get_weather": {"city"}, "add": {"a", "b"}}[calls[0].function.name]
        assert set(args) == required, (prompt, args)
    # a named function, streamed: one delta carries the whole call, then finish_reason tool_calls
    stream = client.chat.completions.create(
        model="smoltools", messages=[{"role": "user", "content": PROMPTS[2]}], tools=TOOLS, stream=True,
        tool_choice={"type": "function", "function": {"name": "add"}}, temperature=0, max_tokens=60)
    deltas = [c for c in stream]
    calls = [tc for c in deltas if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(c.index, c.function.name) for c in calls] == [(0, "add")] and calls[0].id.startswith("call_")
    assert set(json.loads(calls[0].function.arguments)) == {"a", "b"}
    assert deltas[-1].choices[0].finish_reason == "tool_calls"


def test_an_answer_that_is_only_a_json_call_is_a_call(server):
    """What small models such as Qwen2.5-Coder-0.5B answer given tools: the call's JSON without
    the template's <tool_call> tag. SmolLM2 is made to write exactly that by a format schema."""
    from openai import OpenAI

    call = {"type": "object", "additionalProperties": False, "required": ["name", "arguments"], "properties": {
        "name": {"const": "get_weather"},
        "arguments": {"type": "object", "properties": {"city": {"const": "Paris"}}, "required": ["city"],
                      "additionalProperties": False}}}
    r = httpx.post(server.url + "/api/chat", timeout=120, json={
        "model": "smoltools", "messages": [{"role": "user", "content": PROMPTS[0]}], "tools": TOOLS,
        "format": call, "stream": False, "options": {"temperature": 0, "num_predict": 60}})
    message = r.json()["message"]
    assert message["content"] == "" and [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert message["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    # streamed through OpenAI's API: held back, then one tool_calls delta and finish_reason tool_calls
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    deltas = list(client.chat.completions.create(
        model="smoltools", messages=[{"role": "user", "content": PROMPTS[0]}], tools=TOOLS, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "call", "schema": call}},
        temperature=0, max_tokens=60))
    assert not "".join(c.choices[0].delta.content or "" for c in deltas if c.choices)
    calls = [tc for c in deltas if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(c.index, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (0, "get_weather", {"city": "Paris"})]
    assert deltas[-1].choices[0].finish_reason == "tool_calls"
    # the same JSON without tools is the answer
    r = httpx.post(server.url + "/api/chat", timeout=120, json={
        "model": "smoltools", "messages": [{"role": "user", "content": PROMPTS[0]}],
        "format": call, "stream": False, "options": {"temperature": 0, "num_predict": 60}})
    assert json.loads(r.json()["message"]["content"]) == {"name": "get_weather", "arguments": {"city": "Paris"}}
    assert not r.json()["message"].get("tool_calls")


@pytest.mark.slow
def test_ollama_native_tool_calls_and_round_trip(server):
    import ollama

    client = ollama.Client(host=server.url)
    # forced (pollama's tool_choice on /api/chat), streamed: the call arrives as one chunk
    lines = []
    with httpx.stream("POST", server.url + "/api/chat", timeout=120, json={
            "model": "smoltools", "messages": [{"role": "user", "content": PROMPTS[0]}], "tools": TOOLS,
            "tool_choice": "required", "options": {"temperature": 0, "num_predict": 60}}) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    calls = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert len(calls) == 1 and calls[0]["function"]["name"] == "get_weather"
    assert calls[0]["function"]["index"] == 0 and isinstance(calls[0]["function"]["arguments"], dict)
    assert lines[-1]["done"] and lines[-1]["done_reason"] == "stop"
    # the client sends the call and the tool's answer back (tool_name), and the model goes on
    messages = [{"role": "user", "content": PROMPTS[0]},
                {"role": "assistant", "content": "", "tool_calls": [{"function": calls[0]["function"]}]},
                {"role": "tool", "content": "18 degrees and sunny", "tool_name": "get_weather"}]
    answer = client.chat(model="smoltools", messages=messages, tools=TOOLS,
                         options={"temperature": 0, "num_predict": 30})
    assert answer.message.content and not answer.message.tool_calls
    # unforced, every answer is either text or calls the client can read
    for prompt in PROMPTS[:2]:
        out = client.chat(model="smoltools", messages=[{"role": "user", "content": prompt}], tools=TOOLS,
                          options={"temperature": 0, "num_predict": 40})
        for call in out.message.tool_calls or []:
            assert call.function.name in ("get_weather", "add") and isinstance(call.function.arguments, dict)


@pytest.mark.slow
def test_langchain_bind_tools_and_structured_output(server):
    from langchain_core.messages import HumanMessage
    from langchain_openai import ChatOpenAI
    from pydantic import BaseModel, Field

    llm = ChatOpenAI(model="smoltools", base_url=server.url + "/v1", api_key="unused", temperature=0, max_tokens=60)
    bound = llm.bind_tools([WEATHER, ADD], tool_choice="required")
    message = bound.invoke([HumanMessage(PROMPTS[3])])
    assert len(message.tool_calls) == 1 and message.tool_calls[0]["name"] in ("get_weather", "add")

    class City(BaseModel):
        """A city and its country."""
        name: str = Field(description="the city's name")
        country: str = Field(description="the country it is in")

    city = llm.with_structured_output(City, method="function_calling").invoke("Paris is in France.")
    assert isinstance(city, City) and city.name and city.country


@pytest.mark.slow
def test_thinking_is_separated(server):
    import ollama
    from openai import OpenAI

    client = ollama.Client(host=server.url)
    # DeepSeek-R1's prompt opens <think>: what SmolLM2 writes (it never closes it) is reasoning
    out = client.chat(model="smolr1", messages=[{"role": "user", "content": "What is 2+2?"}], think=True,
                      options={"temperature": 0, "num_predict": 12})
    assert out.message.thinking and out.message.content == ""
    out = client.generate(model="smolr1", prompt="What is 2+2?", think="high", options={"temperature": 0, "num_predict": 12})
    assert out.thinking and out.response == ""
    # streamed: thinking deltas come separately
    chunks = list(client.chat(model="smolr1", messages=[{"role": "user", "content": "Hi"}], stream=True,
                              options={"temperature": 0, "num_predict": 8}))
    assert "".join(c.message.thinking or "" for c in chunks) and not "".join(c.message.content for c in chunks)
    # Qwen3 with think false: the template closes an empty block, the answer is content
    out = client.chat(model="smolqwen3", messages=[{"role": "user", "content": "Say hi."}], think=False,
                      options={"temperature": 0, "num_predict": 8})
    assert out.message.content and not out.message.thinking
    # OpenAI: reasoning_effort; the reasoning comes as reasoning_content
    oa = OpenAI(base_url=server.url + "/v1", api_key="unused")
    res = oa.chat.completions.create(model="smolr1", messages=[{"role": "user", "content": "Hi"}],
                                     reasoning_effort="low", temperature=0, max_tokens=8)
    assert res.choices[0].message.model_extra.get("reasoning_content") and not res.choices[0].message.content
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
        "model": SMOL, "messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "high"})
    assert r.status_code == 400 and r.json()["error"]["message"] == f'"{SMOL}" does not support thinking'


@pytest.mark.slow
def test_anthropic_messages_with_tools_and_thinking(server):
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
              "input_schema": t["function"]["parameters"]} for t in TOOLS]
    out = client.messages.create(model="smoltools", max_tokens=60, extra_body={"temperature": 0}, tools=tools,
                                 tool_choice={"type": "any"}, messages=[{"role": "user", "content": PROMPTS[0]}])
    assert out.stop_reason == "tool_use"
    uses = [b for b in out.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and set(uses[0].input) == {"city"}
    # the result goes back as a tool_result block; the model answers in text
    # (the anthropic client no longer takes temperature: it goes in the body as is)
    follow = client.messages.create(model="smoltools", max_tokens=20, extra_body={"temperature": 0}, tools=tools,
                                    messages=[
        {"role": "user", "content": PROMPTS[0]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": uses[0].id, "name": uses[0].name,
                                           "input": uses[0].input}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "18 degrees"}]}])
    assert follow.stop_reason in ("end_turn", "max_tokens") and follow.content[0].type == "text"
    # streamed, with reasoning (DeepSeek-R1's template): thinking deltas, then the stop
    with client.messages.stream(model="smolr1", max_tokens=10, extra_body={"temperature": 0}, system="Be brief.",
                                thinking={"type": "enabled", "budget_tokens": 1024},
                                messages=[{"role": "user", "content": "Hi"}]) as stream:
        kinds = [e.delta.type for e in stream if e.type == "content_block_delta"]
        final = stream.get_final_message()
    assert kinds and set(kinds) == {"thinking_delta"} and final.content[0].type == "thinking"
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 10
    # errors have Anthropic's shape
    r = httpx.post(server.url + "/v1/messages", timeout=30, json={
        "model": SMOL, "max_tokens": 5, "tools": tools, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json() == {
        "type": "error", "error": {"type": "invalid_request_error", "message": f'"{SMOL}" does not support tools'}}
