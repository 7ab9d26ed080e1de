"""Tool calls: the syntax derived from real templates, and the streaming parser (no model)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.template import prompt
from runner.api import ChatTemplate, Message, Tool, ToolCall, ToolChoice
from runner.loop.replies import ReplyParser
from runner.template.features import capabilities, features
from runner.reply.thinking import ThinkingParser, ThinkTags
from runner.reply.toolcalls import ToolCallParser, ToolSyntax

TEMPLATES = Path(__file__).parent / "data" / "templates"


def template(name: str) -> ChatTemplate:
    return ChatTemplate("jinja", (TEMPLATES / f"{name}.jinja").read_text(), "test")


QWEN = ToolSyntax("<tool_call>\n", "\n</tool_call>")
LLAMA = ToolSyntax("", "", name_key="name", args_key="parameters")
MISTRAL = ToolSyntax("[TOOL_CALLS] ", "", as_list=True)


@pytest.mark.parametrize("name, expected", [
    ("qwen2.5", QWEN),
    ("qwen3", QWEN),  # its empty <think></think> block before the call is not part of it
    ("llama-3.3", LLAMA),
    ("mistral-small-3.1", MISTRAL),
    ("deepseek-r1-distill-qwen", None),  # writes calls but never shows the model the tools
])
def test_syntax_is_derived_from_the_template(name, expected):
    assert features(template(name)).tools == expected


def go_template(name: str) -> ChatTemplate:
    """A Go TEMPLATE from Ollama's library (the text ``ollama show --template`` prints)."""
    return ChatTemplate("go", (TEMPLATES / f"{name}.gotmpl").read_text(), "test")


@pytest.mark.parametrize("name, expected", [
    ("ollama-qwen2.5", QWEN),
    ("ollama-llama3.1", LLAMA),  # its last user turn lists the tools: only a text answer shares the turn's start
])
def test_syntax_is_derived_from_ollamas_go_templates(name, expected):
    assert features(go_template(name)).tools == expected


WEATHER = Tool("get_weather", "Weather in a city", {
    "type": "object", "properties": {"city": {"type": "string", "description": "The city"},
                                     "unit": {"type": ["string", "null"], "enum": ["C", "F"]}},
    "required": ["city"]})
CALLED = [Message("user", "Weather in Paris?"),
          Message("assistant", "", tool_calls=[ToolCall("get_weather", {"city": "Paris", "unit": "C"}, id="call_1")]),
          Message("tool", "18 degrees", tool_name="get_weather", tool_call_id="call_1")]
# Ollama's JSON for WEATHER: its template types' fields in order, the properties map by key
WEATHER_JSON = ('{"name":"get_weather","description":"Weather in a city","parameters":{"type":"object",'
                '"required":["city"],"properties":{"city":{"type":"string","description":"The city"},'
                '"unit":{"type":["string","null"],"enum":["C","F"]}}}}')


def test_ollamas_go_templates_render_tools_and_calls():
    qwen = prompt.render(go_template("ollama-qwen2.5"), CALLED, tools=[WEATHER])
    assert '<tools>\n{"type": "function", "function": ' + WEATHER_JSON + "}\n</tools>" in qwen
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city":"Paris","unit":"C"}}'
            '\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n18 degrees\n</tool_response><|im_end|>\n'
            '<|im_start|>assistant\n') in qwen
    # without tools, the system turn is not written at all
    assert not prompt.render(go_template("ollama-qwen2.5"), CALLED[:1]).startswith("<|im_start|>system")
    llama = prompt.render(go_template("ollama-llama3.1"), [Message("user", "Weather in Paris?")], tools=[WEATHER])
    # {{ range $.Tools }}{{- . }}: a tool prints as its JSON
    assert '{"type":"function","function":' + WEATHER_JSON + "}\n\nQuestion: Weather in Paris?<|eot_id|>" in llama
    llama = prompt.render(go_template("ollama-llama3.1"), CALLED, tools=[WEATHER])
    assert ('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": '
            '{"city":"Paris","unit":"C"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n18 degrees') in llama
    # phi4-mini's writes the whole list: {{ .Tools }} prints as a JSON array
    phi = prompt.render(go_template("ollama-phi4-mini"), CALLED[:1], tools=[WEATHER, WEATHER])
    assert "<|tool|>[" + ",".join(['{"type":"function","function":' + WEATHER_JSON + "}"] * 2) + "]<|/tool|>" in phi


def test_go_template_fields_of_tools_and_calls():
    source = ("{{- range .Messages }}{{ range .ToolCalls }}{{ .ID }} {{ .Function.Index }} {{ .Function.Name }}"
              "{{ range $k, $v := .Function.Arguments }} {{ $k }}={{ $v }}{{ end }};{{ end }}{{ end }}"
              "{{- range .Tools }}|{{ .Type }} {{ .Function.Name }}: {{ .Function.Description }}"
              " {{ .Function.Parameters.Type }} {{ .Function.Parameters.Required }}"
              "{{ range $name, $p := .Function.Parameters.Properties }} {{ $name }}:{{ $p.Type }}{{ end }}"
              " {{ json .Function.Parameters.Properties.city }}{{ end }}")
    out = prompt.render(ChatTemplate("go", source, "test"), CALLED, tools=[WEATHER])
    assert out == ('call_1 0 get_weather city=Paris unit=C;|function get_weather: Weather in a city object [city]'
                   ' city:string unit:[string null] {"type":"string","description":"The city"}')
    # no tools: .Tools is nil, and so is a message's .ToolCalls
    source = "{{ if .Tools }}tools{{ end }}{{ range .Messages }}{{ if .ToolCalls }}calls{{ end }}{{ .Role }}{{ end }}"
    assert prompt.render(ChatTemplate("go", source, "test"), CALLED[:1]) == "user"


def test_smollm2_template_has_no_tools():
    from runner.store import default_model_path
    from runner.model.ggufmeta import read_gguf_header

    source = read_gguf_header(default_model_path()).metadata["tokenizer.chat_template"]
    assert features(ChatTemplate("jinja", source, "gguf")).tools is None


def test_tools_and_calls_render_as_hf_templates_expect():
    weather = Tool("get_weather", "Weather in a city", {"type": "object", "properties": {"city": {"type": "string"}}})
    msgs = [Message("user", "Weather in Paris?"),
            Message("assistant", "", tool_calls=[ToolCall("get_weather", {"city": "Paris"}, id="call_abcdefghi")]),
            Message("tool", "18 degrees", tool_name="get_weather", tool_call_id="call_abcdefghi")]
    qwen = prompt.render(template("qwen2.5"), msgs, tools=[weather])
    assert '{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city"' in qwen
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in qwen
    assert "<tool_response>\n18 degrees\n</tool_response>" in qwen
    assert qwen.endswith("<|im_start|>assistant\n")
    llama = prompt.render(template("llama-3.3"), msgs, tools=[weather])
    assert '{"name": "get_weather", "parameters": {"city": "Paris"}}<|eot_id|>' in llama
    # strings are iterable in Jinja, so this template (in HF too) writes the result as JSON
    assert '<|start_header_id|>ipython<|end_header_id|>\n\n"18 degrees"<|eot_id|>' in llama
    # a message without calls has no tool_calls key (Llama's template tests 'tool_calls' in message)
    plain = prompt.render(template("llama-3.3"), [Message("user", "hi")])
    assert "Environment: ipython" not in plain and plain.endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
    mistral = prompt.render(template("mistral-small-3.1"), msgs, tools=[weather], bos_token="<s>", eos_token="</s>")
    assert '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "defghi"' not in mistral
    assert '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]</s>' in mistral


def test_capabilities_follow_the_template():
    from runner.api import ModelInfo

    def info(tpl: str | None) -> ModelInfo:
        return ModelInfo("m", "/m.gguf", "llama", 0, 0, 0, 0, "Q4_0", tpl, {})

    def of(tpl: str | None) -> list[str]:
        return capabilities(info(tpl), prompt.model_template(info(tpl)))

    assert of(template("qwen2.5").source) == ["completion", "tools"]
    assert of(template("qwen3").source) == ["completion", "tools", "thinking"]
    assert of(template("deepseek-r1-distill-qwen").source) == ["completion", "thinking"]
    assert of(None) == ["completion"]
    assert capabilities(info(None), ChatTemplate("go", "{{ .Prompt }}<fim>{{ .Suffix }}", "x")) == ["completion", "insert"]


def stream(parser, text: str, step: int = 1):
    """Feed ``text`` ``step`` characters at a time: (content pieces, calls)."""
    pieces, calls = [], []
    for i in range(0, len(text), step):
        content, done = parser.feed(text[i:i + step])
        pieces.append(content)
        calls.extend(done)
    content, done = parser.finish()
    pieces.append(content)
    calls.extend(done)
    return pieces, calls


def names(calls: list[ToolCall]):
    return [(c.name, c.arguments, c.index) for c in calls]


@pytest.mark.parametrize("step", [1, 3, 1000])
def test_text_then_calls(step):
    out = 'Let me check. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n' \
          '<tool_call>\n{"name": "add", "arguments": "{\\"a\\": 1}"}\n</tool_call>'
    pieces, calls = stream(ToolCallParser(QWEN, frozenset({"get_weather", "add"})), out, step)
    assert "".join(pieces) == "Let me check."  # the space before the tag is the call's, not the text's
    assert names(calls) == [("get_weather", {"city": "Paris"}, 0), ("add", {"a": 1}, 1)]
    assert all(c.id.startswith("call_") and len(c.id) == 13 for c in calls)


def test_partial_tag_is_held_back_then_released():
    parser = ToolCallParser(QWEN)
    assert parser.feed("a <tool") == ("a", [])  # might be a tag (and the space before it the call's): held
    assert parser.feed("box> b") == (" <toolbox> b", [])  # it was not
    assert parser.feed("<tool_") == ("", [])
    assert parser.finish() == ("<tool_", [])  # the end came: it is text


@pytest.mark.parametrize("out", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"</tool_call>',  # cut off
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": Paris}}\n</tool_call>',  # not JSON
    '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',  # not one of the tools
    '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>',  # arguments not an object
    '<tool_call> sure, here it is',
])
def test_what_does_not_parse_stays_content(out):
    pieces, calls = stream(ToolCallParser(QWEN, frozenset({"get_weather"})), out)
    assert calls == [] and "".join(pieces) == out


def test_bare_json_calls_only_open_the_answer():
    pieces, calls = stream(ToolCallParser(LLAMA), ' {"name": "f", "parameters": {"x": [1, "]"]}}')
    assert names(calls) == [("f", {"x": [1, "]"]}, 0)] and "".join(pieces) == ""
    pieces, calls = stream(ToolCallParser(LLAMA), 'JSON looks like {"name": "f", "parameters": {}}')
    assert calls == [] and "".join(pieces) == 'JSON looks like {"name": "f", "parameters": {}}'


def test_a_list_of_calls():
    out = '[TOOL_CALLS] [{"name": "a", "arguments": {}, "id": "123456789"}, {"name": "b", "arguments": {"k": "v"}}]'
    pieces, calls = stream(ToolCallParser(MISTRAL), out, 2)
    assert names(calls) == [("a", {}, 0), ("b", {"k": "v"}, 1)] and "".join(pieces) == ""


def test_calls_made_while_thinking_are_not_calls():
    parser = ReplyParser(ThinkingParser(ThinkTags("<think>", "</think>")), ToolCallParser(QWEN))
    out = '<think>\nmaybe <tool_call>{"name": "x", "arguments": {}}</tool_call>?\n</think>\n\n' \
          '<tool_call>\n{"name": "y", "arguments": {}}\n</tool_call>'
    content, thinking, calls = [], [], []
    for ch in out:
        parts = parser.feed(ch)
        content.append(parts.content), thinking.append(parts.thinking), calls.extend(parts.tool_calls)
    parts = parser.finish()
    content.append(parts.content), thinking.append(parts.thinking), calls.extend(parts.tool_calls)
    assert "".join(thinking) == 'maybe <tool_call>{"name": "x", "arguments": {}}</tool_call>?'
    assert [c.name for c in calls] == ["y"] and "".join(content) == ""


def test_forced_grammar_compiles_for_each_syntax(grammars):
    """The grammar llama.cpp gets for each template's syntax compiles (a vocab-only SmolLM2)."""
    from runner.sample.grammar import VocabOnly, init_sampler
    from runner.sample.toolgrammar import tool_call_grammar
    from runner.store import default_model_path
    import llama_cpp as L

    tools = [Tool("get_weather", "w", {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}),
             Tool("noargs")]
    vocab = VocabOnly(str(default_model_path()))
    try:
        for syntax in (QWEN, LLAMA, MISTRAL):
            for choice in (ToolChoice("required"), ToolChoice("function", "noargs"), ToolChoice()):
                for parallel in (None, True):
                    grammar = tool_call_grammar(syntax, tools, choice, parallel, grammars)
                    assert (grammar.trigger is None and grammar.tag is None) == choice.forced
                    sampler = init_sampler(vocab.vocab, grammar)
                    assert sampler, grammar.gbnf
                    L.llama_sampler_free(sampler)
    finally:
        vocab.close()


def test_probes_share_one_render_budget():
    """A template that burns CPU costs its probes one budget in all, and supports nothing."""
    import time

    from runner.template.sandbox import DEFAULT_LIMITS

    slow = ChatTemplate("jinja", "{% for i in range(10**9) %}{% endfor %}{{ messages[0].content }}", "test")
    t0 = time.thread_time()
    assert features(slow).tools is None and features(slow).thinking is None
    assert time.thread_time() - t0 < DEFAULT_LIMITS.cpu_seconds * 1.5 + 0.5
