"""Go templates (Modelfile TEMPLATE): the text/template subset, Ollama's rules for rendering a
conversation with one, and the render budget.

The golden prompts in tests/data/ollama_templates.json are what Go's text/template renders for
Ollama's own templates (Ollama's template tests): our renderer must give the same bytes."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from runner.template import go as gotemplate, ollama as ollamatemplate
from runner.api import Cancelled, InvalidRequest, Message
from runner.template.go import NO_VALUE, Struct, TemplateError
from runner.template.sandbox import RenderBudget, RenderLimits

GOLDEN = json.loads((Path(__file__).parent / "data" / "ollama_templates.json").read_text())["templates"]
HELLO, GREAT, SHOW = ("Hello, how are you?", "I'm doing great. How can I help you today?",
                      "I'd like to show off how chat templating works!")
CONVERSATIONS = {
    "user": [Message("user", HELLO)],
    "user-assistant-user": [Message("user", HELLO), Message("assistant", GREAT), Message("user", SHOW)],
    "system-user-assistant-user": [Message("system", "You are a helpful assistant."), Message("user", HELLO),
                                   Message("assistant", GREAT), Message("user", SHOW)],
}
# Ollama's test trims one trailing space these templates leave (the expected files lack it)
TRAILING_SPACE = {"chatqa", "llama2-chat", "mistral-instruct", "openchat", "vicuna"}


def go(source: str, data: object = None, limits: RenderLimits = RenderLimits()) -> str:
    return gotemplate.render(source, data if data is not None else {}, RenderBudget(limits), 100)


@pytest.mark.parametrize("name", sorted(GOLDEN))
def test_ollamas_templates_render_as_go_renders_them(name):
    entry = GOLDEN[name]
    assert set(entry["expected"]) == set(CONVERSATIONS)
    for case, messages in CONVERSATIONS.items():
        got = ollamatemplate.render(entry["template"], messages, RenderBudget())
        if name in TRAILING_SPACE and got.endswith(" "):
            got = got[:-1]
        assert got == entry["expected"][case], (name, case)


# Ollama's templates whose generation prompt ends exactly where the answer goes (the others put
# a space or a newline between them, which the next turn's prompt writes differently; the
# slot cache then reuses the common prefix). command-r and codellama-70b close the turn.
STRICT = {"alfred", "alpaca", "chatml", "falcon-instruct", "gemma-instruct", "granite-instruct", "llama3-instruct",
          "magicoder", "phi-3", "solar-instruct", "starcoder2-instruct", "zephyr"}
LOOSE = {"chatqa", "gemma3-instruct", "llama2-chat", "mistral-instruct", "openchat", "vicuna"}


@pytest.mark.parametrize("name", sorted(STRICT | LOOSE))
def test_a_turn_extends_the_last_turns_prompt_and_answer(name):
    """Prefix stability: the next turn's prompt starts with this turn's prompt plus the answer."""
    template = GOLDEN[name]["template"]
    turn1 = [Message("system", "Be brief."), Message("user", "Hi")]
    p1 = ollamatemplate.render(template, turn1, RenderBudget())
    turn2 = turn1 + [Message("assistant", "Hello!"), Message("user", "Bye")]
    p2 = ollamatemplate.render(template, turn2, RenderBudget())
    if name in STRICT:
        assert p2.startswith(p1 + "Hello!"), (p1, p2)
    else:
        assert p2.startswith(p1.rstrip(" \n")) and "Hello!" in p2[len(p1.rstrip(" \n")):], (p1, p2)


# Ollama's TestExecuteWithMessages: old .Prompt/.Response templates render per exchange and give
# the same prompt as the .Messages form.
MISTRAL_MESSAGES = ('[INST] {{ if .System }}{{ .System }}\n\n{{ end }}\n{{- range .Messages }}\n'
                    '{{- if eq .Role "user" }}{{ .Content }}[/INST] {{ else if eq .Role "assistant" }}'
                    '{{ .Content }}[INST] {{ end }}\n{{- end }}')
LEGACY = [
    ([Message("user", "Hello friend!"), Message("assistant", "Hello human!"), Message("user", "What is your name?")],
     ["[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] ",
      "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] {{ .Response }}", MISTRAL_MESSAGES],
     "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] "),
    ([Message("system", "You are a helpful assistant!"), Message("user", "Hello friend!"),
      Message("assistant", "Hello human!"), Message("user", "What is your name?")],
     ["[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] ",
      "[INST] {{ if .System }}{{ .System }}\n\n{{ end }}{{ .Prompt }}[/INST] {{ .Response }}", MISTRAL_MESSAGES],
     "[INST] You are a helpful assistant!\n\nHello friend![/INST] Hello human![INST] What is your name?[/INST] "),
    ([Message("user", "Hello friend!"), Message("assistant", "Hello human!"), Message("user", "What is your name?"),
      Message("assistant", "My name is Ollama and I")],
     ["[INST] {{ .Prompt }}[/INST] ", "[INST] {{ .Prompt }}[/INST] {{ .Response }}",
      '\n{{- range $i, $m := .Messages }}\n{{- if eq .Role "user" }}[INST] {{ .Content }}[/INST] '
      '{{ else if eq .Role "assistant" }}{{ .Content }}{{ end }}\n{{- end }}'],
     "[INST] Hello friend![/INST] Hello human![INST] What is your name?[/INST] My name is Ollama and I"),
    ([Message("system", "You are a helpful assistant!"), Message("user", "Hello friend!"),
      Message("assistant", "Hello human!"), Message("user", "What is your name?")],
     ["{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}{{ if .Prompt }}<|im_start|>user\n"
      "{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n{{ .Response }}<|im_end|>\n",
      "\n{{- range $index, $_ := .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n{{ end }}"
      "<|im_start|>assistant\n"],
     "<|im_start|>system\nYou are a helpful assistant!<|im_end|>\n<|im_start|>user\nHello friend!<|im_end|>\n"
     "<|im_start|>assistant\nHello human!<|im_end|>\n<|im_start|>user\nWhat is your name?<|im_end|>\n"
     "<|im_start|>assistant\n"),
]


@pytest.mark.parametrize("messages,templates,expected", LEGACY)
def test_old_prompt_response_templates_render_per_exchange(messages, templates, expected):
    for template in templates:
        assert ollamatemplate.render(template, messages, RenderBudget()) == expected, template


def test_a_template_without_response_gets_it_appended():
    """Ollama's default template is {{ .Prompt }}: each exchange is prompt + answer."""
    msgs = [Message("user", "a"), Message("assistant", "B"), Message("user", "c")]
    assert ollamatemplate.render("{{ .Prompt }}", msgs, RenderBudget()) == "aBc"
    # consecutive messages of one role merge with a blank line; .System joins them too
    msgs = [Message("system", "s1"), Message("system", "s2"), Message("user", "u1"), Message("user", "u2")]
    out = ollamatemplate.render("{{ .System }}|{{ range .Messages }}[{{ .Role }}:{{ .Content }}]{{ end }}",
                                msgs, RenderBudget())
    assert out == "s1\n\ns2|[system:s1\n\ns2][user:u1\n\nu2]"
    # .Prompt is not set when the template ranges over .Messages: Go prints <no value>
    assert ollamatemplate.render("{{ .Prompt }}{{ len .Messages }}", msgs, RenderBudget()) == "<no value>2"


def test_the_language():
    data = {"L": [1, 2.5, "x"], "M": {"b": "<&>", "a": 1}, "S": Struct("T", {"Name": "n", "Empty": ""}),
            "N": None, "T": True}
    cases = {
        "a {{- /* comment */ -}}  b": "ab",
        "a  {{- 1 -}}  \n b": "a1b",
        "{{ $x := 3 }}{{ $x }}{{ $x = 4 }}{{ $x }}": "34",
        "{{ if eq 1 2 }}a{{ else if eq 2 2 }}b{{ else }}c{{ end }}": "b",
        "{{ with .S }}{{ .Name }}{{ end }}{{ with .S.Empty }}x{{ else with .S.Name }}{{ . }}{{ end }}": "nn",
        "{{ range $i, $v := .L }}{{ $i }}={{ $v }},{{ end }}": "0=1,1=2.5,2=x,",
        "{{ range .N }}x{{ else }}empty{{ end }}": "empty",
        "{{ range $k, $v := .M }}{{ $k }}{{ $v }}{{ end }}": "a1b<&>",
        "{{ range 5 }}{{ if eq . 3 }}{{ break }}{{ end }}{{ if eq . 1 }}{{ continue }}{{ end }}{{ . }}{{ end }}": "02",
        "{{ range $x := .L }}{{ $x }}{{ end }}": "12.5x",
        "{{ len .L | printf \"%03d\" }}|{{ printf \"%s-%d-%v-%q-%5s|%-3s|\" \"a\" 7 .T \"q\" \"r\" \"l\" }}":
            '003|a-7-true-"q"-    r|l  |',
        "{{ printf \"%d\" \"x\" }}|{{ printf \"%s\" }}|{{ printf \"a\" 1 }}": "%!d(string=x)|%!s(MISSING)|a%!(EXTRA int=1)",
        "{{ slice \"héllo\" 1 3 }}|{{ slice .L 1 }}|{{ index .L 2 }}|{{ index .M \"b\" }}|{{ index .M \"z\" }}":
            "é|[2.5 x]|x|<&>|<no value>",
        "{{ len \"hé\" }}{{ len .M }}": "32",
        "{{ .Missing }}|{{ .N }}|{{ .L }}|{{ .M }}|{{ 1.5 }}|{{ 1e21 }}|{{ 100000.0 }}":
            "<no value>|<nil>|[1 2.5 x]|map[a:1 b:<&>]|1.5|1e+21|100000",
        "{{ json .L }}|{{ json .M }}|{{ json .S }}|{{ json \"<a>\" }}":
            '[1,2.5,"x"]|{"a":1,"b":"\\u003c\\u0026\\u003e"}|{"Name":"n","Empty":""}|"\\u003ca\\u003e"',
        "{{ and 1 0 }}{{ and 1 2 }}{{ or 0 \"\" }}{{ or 0 \"z\" }}{{ not 0 }}{{ ne 1 2 }}{{ lt 1 2 }}{{ ge \"b\" \"a\" }}":
            "02ztruetruetruetrue",
        "{{ and .N .N.X }}|{{ or .T .N.X }}": "<nil>|true",  # and/or stop at their answer
        "{{ print 1 2 \"a\" 3 }}|{{ println 1 \"a\" }}": "1 2a3|1 a\n",
        "{{ (index .L 0) }}{{ (.S).Name }}{{ $.S.Name }}": "1nn",
        "{{ eq .S.Name \"x\" \"n\" }}{{ eq .N nil }}{{ eq .Missing \"a\" }}": "truetruefalse",
        "{{ \"\\u00e9\\n\\x41\" }}{{ `raw\\n` }}{{ 'a' }}{{ 0x10 }}{{ -3 }}": "é\nAraw\\n9716-3",
        "{{ html \"<a href='x'>\" }}|{{ urlquery \"a b&c\" }}": "&lt;a href=&#39;x&#39;&gt;|a+b%26c",
    }
    for source, expected in cases.items():
        assert go(source, data) == expected, source


@pytest.mark.parametrize("source,message", [
    ("{{ .X", "unclosed action"),
    ("{{ if .X }}", "unexpected EOF"),
    ("{{ end }}", "unexpected {{end}}"),
    ("{{ else }}", "unexpected {{else}}"),
    ("{{ foo }}", 'function "foo" not defined'),
    ("{{ $x }}", 'undefined variable "$x"'),
    ("{{ $x = 1 }}", 'undefined variable "$x"'),
    ("{{ .X | }}", "missing"),
    ("{{ }}", "missing value for command"),
    ("{{ range .X }}{{ else if .Y }}{{ end }}", "in else"),
    ("{{ break }}", "outside {{range}}"),
    ('{{ "a".B }}', "unexpected . after term"),
    ("{{ (1 }}", "unclosed left paren"),
    ("{{ 1) }}", "unexpected right paren"),
    ("{{/* x }}", "unclosed comment"),
    ('{{ "abc }}', "unterminated quoted string"),
    ("{{ 'ab' }}", "character constant"),
    ('{{ "\\q" }}', "unknown escape"),
    ("{{ .X 1 | 2 }}", "non executable command"),
    ('{{ define "x" }}{{ end }}', "not supported"),
    ('{{ template "x" }}', "not supported"),
    ("{{ if 1 }}" * 500, "nest too deeply"),
    ("{{ " + "(" * 500 + "1" + ")" * 500 + " }}", "nest too deeply"),
    ("a\nb\n{{ foo }}", "line 3"),
])
def test_a_malformed_template_is_one_clear_line(source, message):
    with pytest.raises(TemplateError) as err:
        go(source)
    text = str(err.value)
    assert message in text and "\n" not in text, text
    assert isinstance(err.value, InvalidRequest)


@pytest.mark.parametrize("source,data,message", [
    ("{{ len 1 }}", {}, "len of type int"),
    ("{{ index .L 9 }}", {"L": [1]}, "index out of range: 9"),
    ("{{ slice .L 2 1 }}", {"L": [1, 2]}, "invalid slice index"),
    ("{{ .A.B }}", {}, "nil pointer evaluating"),
    ("{{ .S.Nope }}", {"S": Struct("T", {})}, "can't evaluate field Nope in type T"),
    ("{{ .S.X }}", {"S": "str"}, "can't evaluate field X in type string"),
    ('{{ eq 1 "a" }}', {}, "incompatible types"),
    ('{{ lt true false }}', {}, "invalid type for comparison"),
    ("{{ range .S }}{{ end }}", {"S": "a\nbc"}, "range can't iterate"),
    ("{{ .X 1 }}", {"X": 1}, "not a method but has arguments"),
    ("{{ not 1 2 }}", {}, "wrong number of args for not"),
])
def test_a_template_that_fails_as_it_runs_is_one_clear_line(source, data, message):
    with pytest.raises(InvalidRequest) as err:
        go(source, data)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


# Templates are untrusted: each of these would run for minutes or build gigabytes unbounded.
HOSTILE = {
    "nested ranges": ("{{ range 1000000000 }}{{ range 1000000000 }}{{ end }}{{ end }}", "time"),
    "output in a long range": ("{{ range 1000000000 }}xxxxxxxxxxxxxxxx{{ end }}", "time|characters"),
    "doubling a string": ('{{ $s := "xx" }}{{ range 64 }}{{ $s = printf "%s%s" $s $s }}{{ end }}{{ len $s }}',
                          "characters"),
    "doubling with print": ('{{ $s := "xx" }}{{ range 64 }}{{ $s = print $s $s }}{{ end }}', "characters"),
    "printf width": ('{{ printf "%999999999d" 1 }}', "characters"),
    "printf star width": ('{{ printf "%*d" 999999999 1 }}', "characters"),
    "json of a doubled string": ('{{ $s := "<<" }}{{ range 64 }}{{ $s = json $s }}{{ end }}', "characters"),
    "ranging over the messages in the messages": (
        "{{ range .L }}{{ range $.L }}{{ range $.L }}{{ range $.L }}{{ . }}{{ end }}{{ end }}{{ end }}{{ end }}",
        "time|characters"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_go_template_is_stopped_with_one_clear_error(name):
    source, what = HOSTILE[name]
    data = {"L": ["x" * 1000] * 300}
    t0 = time.monotonic()
    with pytest.raises(InvalidRequest) as err:
        go(source, data, RenderLimits(cpu_seconds=0.5))
    assert time.monotonic() - t0 < 20
    message = str(err.value)
    assert "\n" not in message and any(w in message for w in what.split("|")), message


def test_a_go_render_stops_when_its_request_is_cancelled():
    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        gotemplate.render("{{ range 1000000000 }}{{ range 1000000000 }}{{ end }}{{ end }}", {},
                          RenderBudget(RenderLimits(cpu_seconds=60), cancel), 10)
    assert time.monotonic() - t0 < 5


def test_legacy_exchanges_share_one_budget():
    """An old-style template renders once per exchange; the output limit covers them all."""
    many = [Message("user" if i % 2 == 0 else "assistant", "x") for i in range(2001)]
    template = "{{ .Prompt }}{{ range 2000 }}yyyyyyyyyy{{ end }}{{ .Response }}"
    with pytest.raises(InvalidRequest, match="characters"):
        ollamatemplate.render(template, many, RenderBudget(RenderLimits(base_chars=1 << 20, cpu_seconds=30)))


def test_no_value_is_false_and_prints_as_go_prints_it():
    assert go("{{ if .X }}y{{ else }}n{{ end }}{{ .X }}") == "n<no value>"
    assert repr(NO_VALUE) == "<no value>"


def test_random_templates_fail_only_as_bad_input():
    """Fragments of Go templates shuffled together: each parses and renders, or is one
    InvalidRequest line; nothing else escapes (a seeded fuzz, so it is the same every run)."""
    import random

    pieces = ["{{", "}}", "{{-", "-}}", " ", ".", ".Messages", ".Role", ".Content", "$", "$x", ":=", "=", "|",
              "(", ")", "range", "if", "else", "end", "with", "break", "continue", "eq", "len", "slice", "index",
              "printf", "json", "and", "or", "not", '"s"', "'c'", "1", "-2", "0x1F", "1.5e3", "nil", "true", ",",
              "/*", "*/", "text\n", "$i", "$.System", "print", "`raw`", '"\\n"', "le", "urlquery"]
    rng = random.Random(1234)
    data = {"Messages": [Struct("m", {"Role": "user", "Content": "hi"})], "System": "s", "Prompt": "p"}
    outcomes = {"ok": 0, "error": 0}
    for _ in range(3000):
        source = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 24)))
        try:
            out = gotemplate.render(source, data, RenderBudget(RenderLimits(cpu_seconds=0.5)), 100)
            assert isinstance(out, str)
            outcomes["ok"] += 1
        except InvalidRequest as err:
            assert "\n" not in str(err), (source, str(err))
            outcomes["error"] += 1
    assert outcomes["ok"] > 100 and outcomes["error"] > 100, outcomes


# A Llama 3.1-style template as Ollama's registry carries it: tools, tool calls, $last, slice.
LLAMA31 = """{{- if or .System .Tools }}<|start_header_id|>system<|end_header_id|>
{{- if .System }}

{{ .System }}
{{- end }}
{{- if .Tools }}

You are a helpful assistant with tool calling capabilities.
{{- end }}<|eot_id|>
{{- end }}
{{- range $i, $_ := .Messages }}
{{- $last := eq (len (slice $.Messages $i)) 1 }}
{{- if eq .Role "user" }}<|start_header_id|>user<|end_header_id|>
{{- if and $.Tools $last }}

{{ range $.Tools }}
{{- json . }}
{{ end }}
Question: {{ .Content }}<|eot_id|>
{{- else }}

{{ .Content }}<|eot_id|>
{{- end }}{{ if $last }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- else if eq .Role "assistant" }}<|start_header_id|>assistant<|end_header_id|>
{{- if .ToolCalls }}
{{ range .ToolCalls }}
{"name": "{{ .Function.Name }}", "parameters": {{ .Function.Arguments }}}{{ end }}
{{- else }}

{{ .Content }}
{{- end }}{{ if not $last }}<|eot_id|>{{ end }}
{{- else if eq .Role "tool" }}<|start_header_id|>ipython<|end_header_id|>

{{ .Content }}<|eot_id|>{{ if $last }}<|start_header_id|>assistant<|end_header_id|>

{{ end }}
{{- end }}
{{- end }}"""


def test_a_llama31_template_gives_llama_cpps_llama3_prompt():
    from runner.template import builtins as chattemplates

    for msgs in ([Message("user", "Hi")],
                 [Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello!"),
                  Message("user", "Name a color.")]):
        assert ollamatemplate.render(LLAMA31, msgs, RenderBudget()) == chattemplates.apply("llama3", msgs)
    # an assistant message last (a prefill) is left open for the model to continue
    msgs = [Message("user", "Hi"), Message("assistant", "Hel")]
    assert ollamatemplate.render(LLAMA31, msgs, RenderBudget()).endswith("<|end_header_id|>\n\nHel")
