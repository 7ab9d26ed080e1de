"""Byte-stable prompts (issue 25): a conversation sent again renders to the same tokens, so the
slot's cache (and the prompt store behind it) covers all of it.

Without a model:

- one conversation (a system prompt, a question, an answer with reasoning and a tool call, the
  tool's result) written in each API's wire shape, ``/api/chat``, ``/v1/chat/completions``,
  ``/v1/messages`` and ``/v1/responses``, translates to calls whose arguments keep their keys'
  order (nested objects too) and renders byte-identical prompts through Jinja and Go templates;
  the arguments are written with the template's own JSON spacing (``tojson``'s ``", "`` and
  ``": "``, encoding/json's compact form for Go), whatever spacing the client sent, and a
  template written for OpenAI's string arguments gets their JSON;
- turn N+1's prompt starts with turn N's prompt and answer, template by template; where it does
  not, the table says what the template does instead (a generation prompt that opens a reasoning
  block the history does not keep; tools listed in the last user turn only);
- reasoning is stripped or kept exactly as the template says, and the reply parsers leave the
  whitespace a template writes back itself (around reasoning, before a call) out of the parts.

End to end, through a real ``pollama serve`` (SmolLM2, one slot, ``OLLAMA_DEBUG=1``: the server
logs each prompt it renders and how much of it the slot had cached) and the official clients:

- a call the model makes (forced: a grammar puts the keys in the schema's order, ``zeta`` before
  ``alpha``, ``b`` before ``a``) reaches each client in that order and, sent back with its
  result, is rendered in that order: turn 2's prompt is exactly turn 1's followed by the call and
  the result as the template writes them, and the cache covers all of turn 1's prompt (the
  call's own text differs where the model spaced its JSON otherwise than the template does);
- re-sending a conversation with its answer hits the cache for all of turn 1's prompt and answer
  (at least prompt + answer - 1 tokens: the last token sampled is never evaluated); where the
  model wrote a word in other tokens than the tokenizer makes of its text, the cache stops
  exactly there, the one limit no server removes (the prompt is text, tokenized afresh);
- reasoning: DeepSeek-R1's template strips it, so the cache covers exactly the tokens turn 1 and
  turn 2 share (the generation prompt's ``<think>`` is not in turn 2); a Qwen3-Thinking template
  keeps it in the tool loop, so the cache covers all of it, and every API sends it back the same.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import httpx
import pytest

from conftest import SMOLLM2
from runner.api import ChatTemplate, Message, ToolCall
from runner.model import load_tokenizer
from runner.model.ggufmeta import read_gguf_header
from runner.reply.thinking import ThinkingParser, ThinkTags
from runner.reply.toolcalls import ToolCallParser
from runner.server import anthropic_api, ollama_api, openai_api, responses_api, toolwire
from runner.template import prompt
from runner.template.features import features
from serverproc import ServerProcess
from test_server_tools import _gguf_blob, _install

TEMPLATES = Path(__file__).parent / "data" / "templates"
SMOL = "smollm2:135m"

ARGS = {"zeta": 1, "alpha": {"b": 2, "a": 1}}  # deliberately not in sorted order
JINJA_ARGS = '{"zeta": 1, "alpha": {"b": 2, "a": 1}}'  # as tojson writes it
GO_ARGS = '{"zeta":1,"alpha":{"b":2,"a":1}}'  # as Ollama's Go templates write it (encoding/json)
PARAMS = {"type": "object", "additionalProperties": False, "required": ["zeta", "alpha"], "properties": {
    "zeta": {"type": "integer"},
    "alpha": {"type": "object", "additionalProperties": False, "required": ["b", "a"],
              "properties": {"b": {"type": "integer"}, "a": {"type": "integer"}}}}}
TOOL = {"type": "function", "function": {"name": "configure", "description": "Configure the device",
                                         "parameters": PARAMS}}
TOOLS = toolwire.parse_tools([TOOL])
THOUGHT = "I will call configure."


def jinja(name: str) -> ChatTemplate:
    return ChatTemplate("jinja", (TEMPLATES / f"{name}.jinja").read_text(), "test")


def go(name: str) -> ChatTemplate:
    return ChatTemplate("go", (TEMPLATES / f"{name}.gotmpl").read_text(), "test")


def smollm2() -> ChatTemplate:
    return ChatTemplate("jinja", read_gguf_header(SMOLLM2).metadata["tokenizer.chat_template"], "SmolLM2's GGUF")


def qwen3_thinking() -> str:
    """Qwen3's template with the generation prompt of Qwen3-Thinking-2507's: it opens ``<think>``
    (so SmolLM2's answer is reasoning), and the history keeps the reasoning of the turns after
    the last question (the tool loop) and strips it before."""
    source = (TEMPLATES / "qwen3.jinja").read_text()
    generation = ("{{- '<|im_start|>assistant\\n' }}\n    {%- if enable_thinking is defined and enable_thinking is false %}"
                  "\n        {{- '<think>\\n\\n</think>\\n\\n' }}\n    {%- endif %}")
    assert generation in source
    return source.replace(generation, "{{- '<|im_start|>assistant\\n<think>\\n' }}")


def render(template: ChatTemplate, messages: list[Message], **kw: Any) -> str:
    return prompt.render(template, messages, bos_token="<s>", eos_token="</s>", **kw)


# ------------------------------------------------------- one conversation, four wire shapes
def ollama_wire() -> list[Message]:
    body = {"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Configure it."},
        {"role": "assistant", "content": "", "thinking": THOUGHT,
         "tool_calls": [{"id": "call_1", "function": {"name": "configure", "arguments": ARGS}}]},
        {"role": "tool", "content": "done", "tool_name": "configure"}]}
    return ollama_api.chat_messages(ollama_api.ChatBody.model_validate(json.loads(json.dumps(body))).messages)


def openai_wire() -> list[Message]:
    body = {"model": "m", "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Configure it."},
        {"role": "assistant", "content": None, "reasoning_content": THOUGHT, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "configure", "arguments": '{"zeta":1,"alpha":{"b":2,"a":1}}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"}]}
    return openai_api.chat_messages(openai_api.ChatCompletionBody.model_validate(json.loads(json.dumps(body))).messages)


def anthropic_wire() -> list[Message]:
    body = {"model": "m", "max_tokens": 1, "system": "Be brief.", "messages": [
        {"role": "user", "content": "Configure it."},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": THOUGHT, "signature": ""},
                                          {"type": "tool_use", "id": "call_1", "name": "configure", "input": ARGS}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "done"}]}]}
    return anthropic_api.to_messages(anthropic_api.MessagesBody.model_validate(json.loads(json.dumps(body))))


def responses_wire() -> list[Message]:
    body = {"model": "m", "instructions": "Be brief.", "input": [
        {"type": "message", "role": "user", "content": "Configure it."},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": THOUGHT}]},
        {"type": "function_call", "call_id": "call_1", "name": "configure",
         "arguments": '{ "zeta" : 1 , "alpha" : { "b" : 2 , "a" : 1 } }'},
        {"type": "function_call_output", "call_id": "call_1", "output": "done"}]}
    parsed = responses_api.ResponsesBody.model_validate(json.loads(json.dumps(body)))
    return responses_api.to_messages(parsed.instructions, responses_api.input_items(parsed))


WIRES = {"/api/chat": ollama_wire, "/v1/chat/completions": openai_wire, "/v1/messages": anthropic_wire,
         "/v1/responses": responses_wire}


def test_every_api_keeps_the_arguments_key_order():
    for api, wire in WIRES.items():
        calls = [c for m in wire() for c in m.tool_calls]
        assert [(c.name, list(c.arguments), list(c.arguments["alpha"])) for c in calls] == [
            ("configure", ["zeta", "alpha"], ["b", "a"])], api


@pytest.mark.parametrize("template, args", [
    (jinja("qwen2.5"), JINJA_ARGS), (jinja("qwen3"), JINJA_ARGS), (jinja("llama-3.3"), JINJA_ARGS),
    (go("ollama-qwen2.5"), GO_ARGS), (go("ollama-llama3.1"), GO_ARGS),
], ids=["qwen2.5", "qwen3", "llama-3.3", "ollama-qwen2.5", "ollama-llama3.1"])
def test_every_api_renders_the_same_prompt_with_the_arguments_in_order(template, args):
    """The same conversation from each API renders to the same bytes, the call's arguments in
    the order they came in and with the template's spacing (not the client's: OpenAI's string
    was compact, the Responses one spaced out)."""
    prompts = {api: render(template, wire(), tools=TOOLS) for api, wire in WIRES.items()}
    assert len(set(prompts.values())) == 1, prompts
    assert prompts["/api/chat"].count(args) == 1, prompts["/api/chat"]


def test_go_templates_range_over_arguments_in_their_order():
    source = ("{{- range .Messages }}{{ range .ToolCalls }}{{ range $k, $v := .Function.Arguments }}{{ $k }}={{ $v }};"
              "{{ end }}|{{ json .Function.Arguments }}{{ end }}{{ end }}")
    out = render(ChatTemplate("go", source, "test"), ollama_wire())
    assert out == "zeta=1;alpha=map[a:1 b:2];|" + GO_ARGS  # a nested map prints as Go prints maps


def test_templates_made_for_string_arguments_get_their_json():
    """DeepSeek-R1's template adds the arguments to a string (OpenAI's shape); others print them
    with ``{{ }}`` or ``~``: the text is the JSON ``tojson`` writes, in the keys' order."""
    calls = [Message("user", "Configure it."), Message("assistant", "", tool_calls=[ToolCall("configure", ARGS)])]
    r1 = render(jinja("deepseek-r1-distill-qwen"), calls)
    assert "<｜tool▁sep｜>configure\n```json\n" + JINJA_ARGS + "\n```<｜tool▁call▁end｜>" in r1
    source = ("{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.arguments }}|"
              "{{ c.function.arguments ~ '' }}|{{ c.function.arguments | tojson }}|{{ c.function.arguments is mapping }}"
              "{% endfor %}{% endfor %}")
    assert render(ChatTemplate("jinja", source, "test"), calls) == "|".join([JINJA_ARGS] * 3) + "|True"


def test_calls_go_out_to_clients_in_the_order_the_model_wrote():
    call = ToolCall("configure", dict(ARGS), id="call_1")
    assert json.dumps(toolwire.ollama_calls([call])[0]["function"]["arguments"]) == JINJA_ARGS
    assert toolwire.openai_calls([call], False)[0]["function"]["arguments"] == JINJA_ARGS
    assert responses_api._call_item("fc_1", call, "completed")["arguments"] == JINJA_ARGS


# ------------------------------------------------------------- turn N+1 extends turn N
TURN1 = [Message("system", "Be brief."), Message("user", "Hi")]
TURN2 = TURN1 + [Message("assistant", "Hello!"), Message("user", "Bye")]


@pytest.mark.parametrize("template", [smollm2(), jinja("qwen2.5"), jinja("qwen3"), jinja("llama-3.3"),
                                      jinja("mistral-small-3.1"), go("ollama-qwen2.5"), go("ollama-llama3.1"),
                                      go("ollama-phi4-mini")],
                         ids=["smollm2", "qwen2.5", "qwen3", "llama-3.3", "mistral-small-3.1", "ollama-qwen2.5",
                              "ollama-llama3.1", "ollama-phi4-mini"])
def test_the_next_turn_starts_with_the_last_prompt_and_answer(template):
    assert render(template, TURN2).startswith(render(template, TURN1) + "Hello!")


def test_a_generation_prompt_that_opens_reasoning_is_all_that_changes():
    """DeepSeek-R1's generation prompt opens ``<think>``; the history keeps only the answer."""
    p1, p2 = render(jinja("deepseek-r1-distill-qwen"), TURN1), render(jinja("deepseek-r1-distill-qwen"), TURN2)
    assert p1.endswith("<｜Assistant｜><think>\n")
    assert p2.startswith(p1.removesuffix("<think>\n") + "Hello!<｜end▁of▁sentence｜>")


CALL = ToolCall("configure", dict(ARGS), id="call_123456789")
CALLED = [Message("user", "Configure it."), Message("assistant", "", tool_calls=[CALL]),
          Message("tool", "done", tool_name="configure", tool_call_id=CALL.id)]


@pytest.mark.parametrize("template, written", [
    (jinja("qwen2.5"), '<tool_call>\n{"name": "configure", "arguments": ' + JINJA_ARGS + "}\n</tool_call><|im_end|>"),
    (jinja("qwen3"), '<tool_call>\n{"name": "configure", "arguments": ' + JINJA_ARGS + "}\n</tool_call><|im_end|>"),
    (jinja("llama-3.3"), '{"name": "configure", "parameters": ' + JINJA_ARGS + "}<|eot_id|>"),
    (jinja("mistral-small-3.1"), '[TOOL_CALLS] [{"name": "configure", "arguments": ' + JINJA_ARGS
     + ', "id": "123456789"}]</s>'),
    (go("ollama-qwen2.5"), '<tool_call>\n{"name": "configure", "arguments": ' + GO_ARGS + "}\n</tool_call><|im_end|>"),
], ids=["qwen2.5", "qwen3", "llama-3.3", "mistral-small-3.1", "ollama-qwen2.5"])
def test_a_call_extends_the_prompt_it_answered(template, written):
    """A call written as the template writes it (what its syntax makes the model write) is the
    start of the next turn: turn 1's prompt, the call, then the result."""
    assert render(template, CALLED, tools=TOOLS).startswith(render(template, CALLED[:1], tools=TOOLS) + written)


def test_tools_listed_in_the_last_user_turn_move_on():
    """Ollama's Llama 3.1 template lists the tools in the last user turn only: once the tool's
    result is last they are gone, and the next prompt shares turn 1's up to that turn."""
    p1, p2 = render(go("ollama-llama3.1"), CALLED[:1], tools=TOOLS), render(go("ollama-llama3.1"), CALLED, tools=TOOLS)
    shared = p1.index("<|start_header_id|>user<|end_header_id|>")
    assert p2[:shared] == p1[:shared] and "configure" in p1[shared:] and '"description"' not in p2


# ------------------------------------------------------------------ reasoning and whitespace
THINK = ThinkTags("<think>", "</think>")


def parse(out: str) -> tuple[str, str, list[ToolCall]]:
    """(thinking, content, calls) of a whole output as the server parses it for Qwen's tags,
    streamed a character at a time."""
    thinking = ThinkingParser(THINK)
    calls = ToolCallParser(features(jinja("qwen3")).tools, frozenset({"configure"}))
    parts: list[list[Any]] = [[], [], []]
    for i in range(len(out) + 1):
        t, c = thinking.feed(out[i:i + 1], final=i == len(out))
        c, found = calls.feed(c, final=i == len(out))
        parts[0].append(t), parts[1].append(c), parts[2].extend(found)
    return "".join(parts[0]), "".join(parts[1]), parts[2]


QWEN_CALL = '<tool_call>\n{"name": "configure", "arguments": ' + JINJA_ARGS + "}\n</tool_call>"


@pytest.mark.parametrize("template", [jinja("qwen2.5"), jinja("qwen3")], ids=["qwen2.5", "qwen3"])
def test_text_before_a_call_comes_back_as_the_model_wrote_it(template):
    """Qwen writes ``"\\n"`` between an answer's text and its call; the model writing the same must
    not get it twice when the answer comes back."""
    out = "Sure." + "\n" + QWEN_CALL
    thinking, content, calls = parse(out)
    assert (thinking, content, [(c.name, c.arguments) for c in calls]) == ("", "Sure.", [("configure", ARGS)])
    p1 = render(template, [Message("user", "Configure it.")], tools=TOOLS)
    p2 = render(template, [Message("user", "Configure it."), Message("assistant", content, tool_calls=calls),
                           Message("tool", "done", tool_name="configure")], tools=TOOLS)
    assert p2.startswith(p1 + out + "<|im_end|>")


def test_qwen3_keeps_reasoning_in_the_tool_loop_and_strips_it_before_the_last_question():
    out = "<think>\n" + THOUGHT + "\n</think>\n\n" + QWEN_CALL
    thinking, content, calls = parse(out)
    assert (thinking, content, len(calls)) == (THOUGHT, "", 1)
    answered = [Message("user", "Configure it."), Message("assistant", content, thinking=thinking, tool_calls=calls),
                Message("tool", "done", tool_name="configure")]
    p1 = render(jinja("qwen3"), answered[:1], tools=TOOLS, think=True)
    # the tool loop: the reasoning goes back exactly as the model wrote it
    assert render(jinja("qwen3"), answered, tools=TOOLS, think=True).startswith(p1 + out + "<|im_end|>")
    # a new question: the turns before it lose their reasoning, as the template says
    asked = answered + [Message("assistant", "Done.", thinking="It worked."), Message("user", "Thanks!")]
    p2 = render(jinja("qwen3"), asked, tools=TOOLS, think=True)
    assert THOUGHT not in p2 and "It worked." not in p2
    assert p2.startswith(p1 + QWEN_CALL + "<|im_end|>\n<|im_start|>user\n<tool_response>\ndone\n</tool_response>"
                         "<|im_end|>\n<|im_start|>assistant\nDone.<|im_end|>")


# =========================================================================== end to end
@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    plain = _gguf_blob(models, shutil.copy(SMOLLM2, tmp_path_factory.mktemp("gguf") / "smol.gguf"))
    _install(models, "smoltools", plain, (TEMPLATES / "qwen2.5.jinja").read_text())
    _install(models, "smolgo", plain, (TEMPLATES / "ollama-qwen2.5.gotmpl").read_text())
    _install(models, "smolr1", plain, (TEMPLATES / "deepseek-r1-distill-qwen.jinja").read_text())
    # the answers the tests below were written around need the repeat penalty Ollama applied before
    # v0.33 (a Modelfile PARAMETER, a params layer, as Ollama's remedy for a model that wants one)
    penalised = {"repeat_penalty": 1.1}
    _install(models, "smolthink", plain, qwen3_thinking(), params=penalised)
    _install(models, "smolpen", plain, params=penalised)
    proc = ServerProcess({"OLLAMA_CONTEXT_LENGTH": "2048", "OLLAMA_NUM_PARALLEL": "1", "OLLAMA_CACHE_RAM": "0",
                          "OLLAMA_DEBUG": "1"}, models_dir=str(models)).start()
    yield proc
    assert proc.stop() == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


@pytest.fixture(scope="module")
def tokenizer():
    """SmolLM2's tokenizer (pollama's own, the same tokens as the server's llama.cpp one)."""
    return load_tokenizer(SMOLLM2)


@pytest.fixture(scope="module")
def tokenize(tokenizer):
    return lambda text: tokenizer.encode(text, add_special=True, parse_special=True)


_PROMPT = re.compile(r"prompt: (\d+) inputs, text (.*)$")
_SLOT = re.compile(r"slot \d+: prompt (\d+) tokens, cached (\d+), evaluating")


def served(server: ServerProcess) -> tuple[str, int, int]:
    """The last prompt the server rendered, its size and how much of it the slot had cached
    (its debug lines)."""
    log = server.log().splitlines()
    text = [json.loads(m.group(2)) for m in map(_PROMPT.search, log) if m][-1]
    size, cached = [(int(m.group(1)), int(m.group(2))) for m in map(_SLOT.search, log) if m][-1]
    return text, size, cached


def shared(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


ASK = "Set zeta to 3, and alpha to b 2 and a 1."
RESULT = "<|im_start|>user\n<tool_response>\ndone\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
MODELS = ["smoltools", "smolgo"]  # Qwen2.5's Jinja template, and Ollama's Go template for it


def call_turn(model: str, args: dict[str, Any]) -> str:
    """What turn 2 adds to turn 1's prompt: the call as the model's template writes it, then its result."""
    text = json.dumps(args, separators=(",", ":") if model == "smolgo" else None)
    return '<tool_call>\n{"name": "configure", "arguments": ' + text + "}\n</tool_call><|im_end|>\n" + RESULT


def check_call(model: str, server: ServerProcess, turn1: tuple[str, int, int], args: dict[str, Any]) -> int:
    """The client got the arguments in the order the grammar made the model write them, and turn
    2's prompt is turn 1's plus that call and its result. Returns turn 2's cached count."""
    assert list(args) == ["zeta", "alpha"] and list(args["alpha"]) == ["b", "a"], args
    prompt1, size1, _ = turn1
    prompt2, _, cached = served(server)
    assert prompt2 == prompt1 + call_turn(model, args)
    assert cached >= size1  # all of turn 1's prompt: the call's own text is the model's spacing
    return cached


@pytest.mark.parametrize("model", MODELS)
def test_api_chat_round_trip(server, model):
    import ollama

    client = ollama.Client(host=server.url)
    # ollama's client has no tool_choice: a format makes the model answer with the call's JSON
    call = {"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
            "properties": {"name": {"const": "configure"}, "arguments": PARAMS}}
    ask = [{"role": "user", "content": ASK}]
    first = client.chat(model=model, messages=ask, tools=[TOOL], format=call,
                        options={"temperature": 0, "num_predict": 60})
    turn1 = served(server)
    assert turn1[1] == first.prompt_eval_count and first.message.tool_calls, first
    again = ask + [first.message, {"role": "tool", "content": "done", "tool_name": "configure"}]
    client.chat(model=model, messages=again, tools=[TOOL], options={"temperature": 0, "num_predict": 2})
    check_call(model, server, turn1, first.message.tool_calls[0].function.arguments)


@pytest.mark.parametrize("model", MODELS)
def test_chat_completions_round_trip(server, model):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    ask = [{"role": "user", "content": ASK}]
    first = client.chat.completions.create(model=model, messages=ask, tools=[TOOL], tool_choice="required",
                                           temperature=0, max_tokens=60)
    turn1 = served(server)
    assert turn1[1] == first.usage.prompt_tokens
    message = first.choices[0].message
    again = ask + [message, {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "done"}]
    second = client.chat.completions.create(model=model, messages=again, tools=[TOOL], temperature=0, max_tokens=2)
    cached = check_call(model, server, turn1, json.loads(message.tool_calls[0].function.arguments))
    assert second.usage.prompt_tokens_details.cached_tokens == cached


@pytest.mark.parametrize("model", MODELS)
def test_messages_round_trip(server, model):
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    tools = [{"name": "configure", "description": "Configure the device", "input_schema": PARAMS}]
    ask = [{"role": "user", "content": ASK}]
    first = client.messages.create(model=model, max_tokens=60, tools=tools, tool_choice={"type": "any"},
                                   messages=ask, extra_body={"temperature": 0})
    turn1 = served(server)
    assert turn1[1] == first.usage.input_tokens + first.usage.cache_read_input_tokens
    use = next(b for b in first.content if b.type == "tool_use")
    again = ask + [{"role": "assistant", "content": first.content},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "done"}]}]
    second = client.messages.create(model=model, max_tokens=2, tools=tools, messages=again,
                                    extra_body={"temperature": 0})
    assert second.usage.cache_read_input_tokens == check_call(model, server, turn1, use.input)


@pytest.mark.parametrize("model", MODELS)
def test_responses_round_trip(server, model):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    tools = [{"type": "function", "name": "configure", "description": "Configure the device", "parameters": PARAMS}]
    ask = [{"role": "user", "content": ASK}]
    first = client.responses.create(model=model, input=ask, tools=tools, tool_choice="required", temperature=0,
                                    max_output_tokens=60)
    turn1 = served(server)
    assert turn1[1] == first.usage.input_tokens
    item = next(i for i in first.output if i.type == "function_call")
    result = {"type": "function_call_output", "call_id": item.call_id, "output": "done"}
    second = client.responses.create(model=model, input=ask + list(first.output) + [result], tools=tools,
                                     temperature=0, max_output_tokens=2)
    cached = check_call(model, server, turn1, json.loads(item.arguments))
    assert second.usage.input_tokens_details.cached_tokens == cached
    # the same turn through previous_response_id renders the same prompt (and hits all of it)
    client.responses.create(model=model, previous_response_id=first.id, input=[result], tools=tools,
                            temperature=0, max_output_tokens=2)
    prompt2, size2, cached2 = served(server)
    assert prompt2 == turn1[0] + call_turn(model, json.loads(item.arguments)) and cached2 >= size2 - 1


# ----------------------------------------------------- a conversation re-sent with its answer
def check_answer(server: ServerProcess, turn1: tuple[str, int, int], answer: str, answered: int) -> int:
    """Turn 2's prompt is turn 1's, its answer and the next question; the cache covers all of
    turn 1's prompt and answer. Returns turn 2's cached count."""
    prompt1, size1, _ = turn1
    prompt2, _, cached = served(server)
    assert answer and prompt2.startswith(prompt1 + answer + "<|im_end|>\n<|im_start|>user\n")
    assert cached >= size1 + answered - 1, (size1, answered, cached)
    return cached


def test_api_chat_conversation_hits_the_cache(server):
    import ollama

    client = ollama.Client(host=server.url)
    ask = [{"role": "user", "content": "Name three colors."}]
    first = client.chat(model=SMOL, messages=ask, options={"temperature": 0, "num_predict": 12})
    turn1 = served(server)
    client.chat(model=SMOL, messages=ask + [first.message, {"role": "user", "content": "And three fruits?"}],
                options={"temperature": 0, "num_predict": 2})
    check_answer(server, turn1, first.message.content, first.eval_count)


def test_chat_completions_conversation_hits_the_cache(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    ask = [{"role": "user", "content": "Name three fruits."}]
    first = client.chat.completions.create(model=SMOL, messages=ask, temperature=0, max_tokens=12)
    turn1 = served(server)
    second = client.chat.completions.create(
        model=SMOL, messages=ask + [first.choices[0].message, {"role": "user", "content": "And three nuts?"}],
        temperature=0, max_tokens=2)
    cached = check_answer(server, turn1, first.choices[0].message.content, first.usage.completion_tokens)
    assert second.usage.prompt_tokens_details.cached_tokens == cached


def test_messages_conversation_hits_the_cache(server):
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    ask = [{"role": "user", "content": "Name three rivers."}]
    first = client.messages.create(model=SMOL, max_tokens=12, messages=ask, extra_body={"temperature": 0})
    turn1 = served(server)
    second = client.messages.create(model=SMOL, max_tokens=2, extra_body={"temperature": 0}, messages=ask + [
        {"role": "assistant", "content": first.content}, {"role": "user", "content": "And three lakes?"}])
    cached = check_answer(server, turn1, first.content[0].text, first.usage.output_tokens)
    assert second.usage.cache_read_input_tokens == cached


def test_responses_conversation_hits_the_cache(server):
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    ask = [{"role": "user", "content": "Name three mountains."}]
    first = client.responses.create(model=SMOL, input=ask, temperature=0, max_output_tokens=12)
    turn1 = served(server)
    second = client.responses.create(model=SMOL, temperature=0, max_output_tokens=2,
                                     input=ask + list(first.output) + [{"role": "user", "content": "And three hills?"}])
    cached = check_answer(server, turn1, first.output_text, first.usage.output_tokens)
    assert second.usage.input_tokens_details.cached_tokens == cached


def test_an_answer_split_otherwise_than_the_tokenizer_would_is_cached_up_to_the_split(server, tokenizer):
    """The limit no server removes: the prompt is text, tokenized afresh each turn, so where the
    model wrote a word in other tokens than the tokenizer makes of the text (SmolLM2's " c" "atus"
    where the tokenizer makes " cat" "us"), the cache stops, exactly there."""
    from openai import OpenAI

    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    ask = [{"role": "user", "content": "Name three animals."}]
    first = client.chat.completions.create(model="smolpen", messages=ask, temperature=0, max_tokens=12, logprobs=True)
    prompt1, size1, _ = served(server)
    answer = first.choices[0].message.content
    written = [bytes(t.bytes) for t in first.choices[0].logprobs.content]
    split = shared(written, [tokenizer.token_to_piece(t) for t in tokenizer.encode(answer)])
    assert b"".join(written).decode() == answer and split < len(written) - 1
    second = client.chat.completions.create(
        model="smolpen", messages=ask + [first.choices[0].message, {"role": "user", "content": "And three birds?"}],
        temperature=0, max_tokens=2)
    prompt2, _, cached = served(server)
    assert prompt2.startswith(prompt1 + answer + "<|im_end|>\n")
    assert cached == size1 + split == second.usage.prompt_tokens_details.cached_tokens


# -------------------------------------------------------------------------------- reasoning
def test_stripped_reasoning_leaves_the_cache_what_both_turns_share(server, tokenize):
    """DeepSeek-R1's template opens ``<think>`` in the generation prompt and drops the reasoning
    from the history: turn 2 shares turn 1's prompt up to that tag, and the cache covers exactly
    that much, none of the reasoning."""
    import ollama

    client = ollama.Client(host=server.url)
    ask = [{"role": "user", "content": "Name three stars."}]
    first = client.chat(model="smolr1", messages=ask, think=True, options={"temperature": 0, "num_predict": 12})
    prompt1, size1, _ = served(server)
    assert first.message.thinking and not first.message.content and size1 == len(tokenize(prompt1))
    client.chat(model="smolr1", messages=ask + [first.message, {"role": "user", "content": "And three moons?"}],
                think=True, options={"temperature": 0, "num_predict": 2})
    prompt2, _, cached = served(server)
    assert prompt1.endswith("<｜Assistant｜><think>\n") and first.message.thinking not in prompt2
    assert prompt2.startswith(prompt1.removesuffix("<think>\n") + "<｜end▁of▁sentence｜><｜User｜>And three moons?")
    assert cached == shared(tokenize(prompt1), tokenize(prompt2)) < size1


def test_kept_reasoning_is_all_cached_and_every_api_sends_it_back_the_same(server):
    """Qwen3-Thinking's template keeps the reasoning of the turns after the last question: the
    reasoning SmolLM2 wrote (cut off by max_tokens), sent back with a call, is rendered exactly as
    it was written, so the cache covers turn 1's prompt and all of it. The same turn 2 through
    each API renders the same prompt."""
    import anthropic

    client = anthropic.Anthropic(base_url=server.url, api_key="unused")
    tools = [{"name": "configure", "description": "Configure the device", "input_schema": PARAMS}]
    ask = [{"role": "user", "content": "What should I set zeta to?"}]
    first = client.messages.create(model="smolthink", max_tokens=12, tools=tools, messages=ask,
                                   thinking={"type": "enabled", "budget_tokens": 1024}, extra_body={"temperature": 0})
    prompt1, size1, _ = served(server)
    assert first.content[0].type == "thinking" and first.stop_reason == "max_tokens"
    assert not "".join(b.text for b in first.content if b.type == "text")
    thought = first.content[0].thinking
    use = {"type": "tool_use", "id": "call_1", "name": "configure", "input": ARGS}
    client.messages.create(model="smolthink", max_tokens=1, tools=tools, extra_body={"temperature": 0}, messages=ask + [
        {"role": "assistant", "content": [*first.content, use]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "done"}]}])
    prompt2, size2, cached = served(server)
    assert prompt2.startswith(prompt1 + thought + "\n</think>\n\n<tool_call>\n" + '{"name": "configure", "arguments": '
                              + JINJA_ARGS + "}\n</tool_call><|im_end|>\n" + RESULT)
    assert cached >= size1 + first.usage.output_tokens - 1
    bodies = {
        "/api/chat": {"messages": ask + [
            {"role": "assistant", "content": "", "thinking": thought,
             "tool_calls": [{"function": {"name": "configure", "arguments": ARGS}}]},
            {"role": "tool", "content": "done", "tool_name": "configure"}], "options": {"num_predict": 1}},
        "/v1/chat/completions": {"max_tokens": 1, "messages": ask + [
            {"role": "assistant", "content": None, "reasoning_content": thought, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "configure", "arguments": GO_ARGS}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"}]},
        "/v1/responses": {"max_output_tokens": 1, "input": ask + [
            {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": thought}]},
            {"type": "function_call", "call_id": "call_1", "name": "configure", "arguments": JINJA_ARGS},
            {"type": "function_call_output", "call_id": "call_1", "output": "done"}]},
    }
    for path, body in bodies.items():
        wire_tools = ([{"type": "function", **TOOL["function"]}] if path == "/v1/responses" else [TOOL])
        r = httpx.post(server.url + path, timeout=120, json={"model": "smolthink", "tools": wire_tools, "stream": False,
                                                             "temperature": 0, **body})
        assert r.status_code == 200, r.text
        assert served(server)[0] == prompt2, path
