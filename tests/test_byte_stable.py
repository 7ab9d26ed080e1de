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

"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from conftest import SMOLLM2
from runner.api import ChatTemplate, Message, ToolCall
from runner.model.ggufmeta import read_gguf_header
from runner.reply.thinking import ThinkingParser, ThinkTags
from runner.reply.toolcalls import ToolCallParser
from runner.server import anthropic_api, ollama_api, openai_api, responses_api, toolwire
from runner.template import prompt
from runner.template.features import features

TEMPLATES = Path(__file__).parent / "data" / "templates"

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
