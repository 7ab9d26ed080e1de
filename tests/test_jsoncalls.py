"""Bare and fenced JSON tool calls (runner/reply/jsoncalls.py) through the per-request reply
parser, with the syntaxes real templates give (no model)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.api import ChatTemplate, Message, Request, Tool
from runner.loop.replies import ReplyParser, for_request
from runner.reply.jsoncalls import JsonPrefix, WholeAnswer
from runner.template import prompt
from runner.template.features import features

TEMPLATES = Path(__file__).parent / "data" / "templates"


def template(name: str) -> ChatTemplate:
    kind = "go" if name.startswith("ollama-") else "jinja"
    return ChatTemplate(kind, (TEMPLATES / f"{name}.{'gotmpl' if kind == 'go' else 'jinja'}").read_text(), "test")


WEATHER = Tool("get_weather", "Weather in a city",
               {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
TIME = Tool("get_time", "Time in a city", {"type": "object", "properties": {"city": {"type": "string"}}})
ASK = [Message("user", "What is the weather in Paris?")]

# what Qwen2.5-Coder-0.5B answers, given tools and tool_choice auto
FENCED = '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n```'
BARE = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
PARIS = [("get_weather", {"city": "Paris"}, 0)]
STEPS = [1, 2, 3, 7, 10_000]


def parser(name: str, tools=(WEATHER,), **request) -> ReplyParser:
    chat = template(name)
    req = Request(messages=list(ASK), tools=list(tools), **request)
    reply = for_request(req, features(chat), prompt.render(chat, req.messages, tools=req.tools))
    assert reply is not None
    return reply


def stream(reply: ReplyParser, text: str, step: int):
    """Feed ``text`` ``step`` characters at a time: (content pieces, thinking, calls)."""
    pieces, thinking, calls = [], [], []
    for i in range(0, len(text), step):
        parts = reply.feed(text[i:i + step])
        pieces.append(parts.content), thinking.append(parts.thinking), calls.extend(parts.tool_calls)
    parts = reply.finish()
    pieces.append(parts.content), thinking.append(parts.thinking), calls.extend(parts.tool_calls)
    return pieces, "".join(thinking), calls


def names(calls):
    return [(c.name, c.arguments, c.index) for c in calls]


@pytest.mark.parametrize("name", ["qwen2.5", "ollama-qwen2.5", "llama-3.3", "mistral-small-3.1"])
@pytest.mark.parametrize("out", [FENCED, BARE, "\n" + FENCED + "\n", "  " + BARE + "\n\n",
                                 FENCED.replace("```json", "```"), FENCED.replace("\n```", "```")])
@pytest.mark.parametrize("step", STEPS)
def test_a_whole_answer_that_is_a_call(name, out, step):
    pieces, _, calls = stream(parser(name), out, step)
    assert names(calls) == PARIS and "".join(pieces) == ""
    assert all(c.id.startswith("call_") for c in calls)


@pytest.mark.parametrize("step", STEPS)
def test_lists_and_parameters(step):
    two = '[{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "parameters": {}}]'
    pieces, _, calls = stream(parser("qwen2.5", (WEATHER, TIME)), "```json\n" + two + "\n```", step)
    assert names(calls) == [("get_weather", {"city": "Paris"}, 0), ("get_time", {}, 1)] and "".join(pieces) == ""
    pieces, _, calls = stream(parser("qwen2.5"), '{"name": "get_weather", "parameters": {"city": "Paris"}}', step)
    assert names(calls) == PARIS and "".join(pieces) == ""


NOT_CALLS = [
    '{"name": "get_stock", "arguments": {"symbol": "ACME"}}',  # a tool the request did not offer
    '```json\n{"name": "get_stock", "arguments": {}}\n```',
    BARE + " Let me know if you need more.",  # text after the JSON
    BARE + "\n\nDone.",
    FENCED + "\nThat is the call.",  # text after the fence
    FENCED[:-3],  # the fence never closes
    BARE[:-5],  # cut off
    '{"name": "get_weather", "arguments": {city: "Paris"}}',  # not JSON
    '{"name": "get_weather", "arguments": "Paris"}',  # arguments not an object
    '{"name": "get_weather"}',
    '{"name": ["get_weather"], "arguments": {}}',
    '{"city": "Paris"}',  # JSON, but no call
    '{"name": "get_weather", "arguments": {"city": "Paris"}} {"name": "get_weather", "arguments": {}}',
    "[]", "[1, 2]", '[{"name": "get_weather", "arguments": {}}, "x"]',
    '```python\nprint(get_weather("Paris"))\n```',  # a fenced code block that is not a call
    '```\n{"city": "Paris"}\n```',
    '```jsonc\n' + BARE + '\n```',
    '````json\n' + BARE + '\n````',
    "Sure! " + BARE,  # text before the JSON
    "The weather in Paris is sunny.",
    "   ", "",
]


@pytest.mark.parametrize("name", ["qwen2.5", "ollama-qwen2.5"])
@pytest.mark.parametrize("out", NOT_CALLS)
@pytest.mark.parametrize("step", [1, 3, 10_000])
def test_anything_else_stays_content_byte_for_byte(name, out, step):
    pieces, _, calls = stream(parser(name, (WEATHER, TIME)), out, step)
    assert calls == [] and "".join(pieces) == out


@pytest.mark.parametrize("released", [
    BARE + " L",  # text after the closing brace
    '{"name": "get_stock"',  # a name that is not an offered tool, once it is whole
    '{"name": 3',
    '{"name": "get_weather", "arguments": {"city": P',  # not JSON
    "```p", "[1", '{"a": 1,}', FENCED + "\nx", "```json\n" + BARE + "\n``x",
])
def test_held_text_is_released_the_moment_it_cannot_be_a_call(released):
    reply = parser("qwen2.5")
    shown = [reply.feed(ch).content for ch in released + "more"]
    assert shown[:len(released)] == [""] * (len(released) - 1) + [released]
    assert shown[len(released):] == list("more") and reply.finish().content == ""


def test_what_may_still_be_a_call_is_held():
    for text in (" ", "\n`", "``", "```", "```js", "```json\n", "```json\n{", BARE, FENCED[:-1], FENCED + "\n"):
        reply = parser("qwen2.5")
        assert [reply.feed(ch).content for ch in text] == [""] * len(text), text


@pytest.mark.parametrize("step", STEPS)
def test_the_templates_own_syntax_is_unchanged(step):
    qwen = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
    pieces, _, calls = stream(parser("qwen2.5"), qwen, step)
    assert names(calls) == PARIS and "".join(pieces) == ""
    # JSON first, then a tagged call: the JSON is content again and the tag still parses
    pieces, _, calls = stream(parser("qwen2.5"), '{"note": 1} ' + qwen, step)
    assert names(calls) == PARIS and "".join(pieces) == '{"note": 1}'
    # Mistral's tag starts with a bracket, as a list of calls does
    mistral = '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    pieces, _, calls = stream(parser("mistral-small-3.1"), mistral, step)
    assert names(calls) == PARIS and "".join(pieces) == ""
    pieces, _, calls = stream(parser("mistral-small-3.1"), mistral[len("[TOOL_CALLS] "):], step)
    assert names(calls) == PARIS and "".join(pieces) == ""
    # Llama's own bare JSON: its call (and text after it) as before
    llama = '{"name": "get_weather", "parameters": {"city": "Paris"}} and more'
    pieces, _, calls = stream(parser("llama-3.3"), llama, step)
    assert names(calls) == PARIS and "".join(pieces) == "and more"


@pytest.mark.parametrize("step", STEPS)
def test_thinking_models_call_after_their_reasoning(step):
    out = "<think>\nThe user wants the weather: call get_weather.\n</think>\n\n" + FENCED
    pieces, thinking, calls = stream(parser("qwen3", think=True), out, step)
    assert thinking == "The user wants the weather: call get_weather."
    assert names(calls) == PARIS and "".join(pieces) == ""
    # a call only thought about, then a text answer: no call
    out = "<think>\n" + BARE + "\n</think>\n\nIt is sunny in Paris."
    pieces, thinking, calls = stream(parser("qwen3", think=True), out, step)
    assert thinking == BARE and calls == [] and "".join(pieces) == "It is sunny in Paris."
    # a JSON reasoning, then a JSON answer that is no call
    out = "<think>\nhmm\n</think>\n\n" + '{"city": "Paris"}'
    pieces, thinking, calls = stream(parser("qwen3", think=True), out, step)
    assert calls == [] and "".join(pieces) == '{"city": "Paris"}'


def test_format_json_without_tools_is_an_answer():
    chat = template("qwen2.5")
    req = Request(messages=list(ASK), format="json")
    assert for_request(req, features(chat), prompt.render(chat, req.messages)) is None  # all content
    chat = template("qwen3")
    req = Request(messages=list(ASK), format="json", think=True)
    reply = for_request(req, features(chat), prompt.render(chat, req.messages))
    pieces, _, calls = stream(reply, BARE, 1)
    assert calls == [] and "".join(pieces) == BARE


# ------------------------------------------------------------------------------ the pieces
JSON_DOCS = [
    '{}', '[]', '{"a": [1, -2.5e+3, 0, 0.0, 1E9, true, false, null, "x\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9é"]}',
    '[{"a": {"b": [[]]}}, {}]', ' { "a" : 1 , "b" : [ ] } ',
    '{"a": 01}', '{"a": 1.}', '{"a": -}', '{"a": 1e}', '{"a": .5}', '{"a": +1}', '{"a": tru}', '{"a": nul}',
    '{"a": NaN}', '[1,]', '{,}', '{"a" 1}', '{"a": 1,}', '{a: 1}', "{'a': 1}", '["\\x"]', '["\\u12g4"]',
    '["a\nb"]', '[1 2]', '{"a": 1}}', '[1]]', '{"a": [}', '[', '{"a"', '"str"', 'true',
]


@pytest.mark.parametrize("doc", JSON_DOCS)
def test_json_prefix_agrees_with_json_loads(doc):
    prefix = JsonPrefix()
    fed = 0
    for ch in doc:
        if prefix.done and ch in " \t\n\r":
            fed += 1
            continue
        if not prefix.feed(ch):
            break
        fed += 1
    try:
        json.loads(doc)
        valid = "NaN" not in doc  # Python's extension, not JSON
    except ValueError:
        valid = False
    assert (fed == len(doc) and prefix.done) is valid


def test_whole_answer_reads_only_what_is_new():
    whole = WholeAnswer(frozenset({"f"}))
    text = '{"name": "f", "arguments": {"x": "' + "y" * 20_000 + '"}}'
    for i in range(0, len(text), 4):
        assert whole.read(text[:i + 4]) is None
    assert whole.read(text, final=True) == [("f", {"x": "y" * 20_000})]
