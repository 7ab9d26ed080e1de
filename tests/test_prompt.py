"""Chat prompts: templates, the plain fallback, history truncation, and the prefix property."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from runner.template import prompt
from runner.api import InvalidRequest, Message, Request
from tests.conftest import load

CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_render_template_and_globals():
    text = prompt.render(CHATML, [Message("user", "hi")])
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    src = "{{ bos_token }}{% for m in messages %}[{{ m.content }}]{% endfor %}{{ eos_token }}"
    # BOS is left to the tokenizer when it adds one; EOS stays
    assert prompt.render(src, [Message("user", "a")], bos_token="<s>", eos_token="</s>",
                         tokenizer_adds_bos=True) == "[a]</s>"
    # a tokenizer that adds no BOS gets the template's text whole
    assert prompt.render(src, [Message("user", "a")], bos_token="<s>", eos_token="</s>") == "<s>[a]</s>"
    with pytest.raises(InvalidRequest, match="boom"):
        prompt.render("{{ raise_exception('boom') }}", [Message("user", "a")])
    with pytest.raises(InvalidRequest):
        prompt.render("{% for %}", [Message("user", "a")])
    with pytest.raises(InvalidRequest):
        prompt.render(CHATML, [Message("wizard", "a")])


def test_plain_fallback_is_prefix_stable():
    turn1 = [Message("user", "Once upon a time")]
    p1 = prompt.render(None, turn1)
    turn2 = turn1 + [Message("assistant", " there was a cat."), Message("user", "The end")]
    assert prompt.render(None, turn2).startswith(p1 + " there was a cat.")


def test_history_truncation_keeps_system_and_last():
    msgs = [Message("system", "SYS")] + [Message("user" if i % 2 == 0 else "assistant", f"m{i} " + "x" * 50) for i in range(10)]
    render = lambda ms: prompt.render(CHATML, ms)
    tokenized: list[str] = []

    def tokenize(text: str) -> list[int]:  # a fake tokenizer: four characters a token
        tokenized.append(text)
        return list(range(len(text) // 4))

    text, tokens = prompt.chat_prompt(msgs, render, tokenize, num_ctx=60)
    assert "SYS" in text and "m9 " in text and "m0 " not in text
    assert tokens == tokenize(text) and len(tokens) <= 60
    # the fewest messages dropped: the longest history that fits
    fits = [render([msgs[0]] + msgs[k:]) for k in range(1, len(msgs)) if len(render([msgs[0]] + msgs[k:])) // 4 <= 60]
    assert text == fits[0]
    # no truncation wanted: everything stays, tokenized once
    tokenized.clear()
    text, tokens = prompt.chat_prompt(msgs, render, tokenize, num_ctx=60, truncate=False)
    assert "m0 " in text and tokenized == [text]
    # even the last message alone is too long: system + last are returned, and no search is made
    tokenized.clear()
    text, tokens = prompt.chat_prompt(msgs, render, tokenize, num_ctx=5)
    assert "SYS" in text and "m9 " in text and "m8 " not in text
    assert len(tokenized) == 2 and tokens == list(range(len(text) // 4))
    # one huge message: tokenized once, whatever its size
    tokenized.clear()
    text, tokens = prompt.chat_prompt([Message("user", "x" * 10_000)], render, tokenize, num_ctx=5)
    assert tokenized == [text]


def test_chatml_turn_prefix_on_smollm2():
    """Turn N+1's tokens start with exactly turn N's prompt + answer tokens (the cache hit)."""
    r = load(None, num_predict=40)
    try:
        from runner.api import Request, Options
        from tests.conftest import collect

        msgs = [Message("user", "Name three colors.")]
        p1 = r.tokenize(r.render_chat(msgs))
        answer, final = collect(r.stream(Request(messages=msgs, options=Options(temperature=0, num_predict=40))))
        generated = final.context[len(p1):]
        msgs2 = msgs + [Message("assistant", answer), Message("user", "And three animals?")]
        p2 = r.tokenize(r.render_chat(msgs2))
        assert p2[: len(p1) + len(generated)] == p1 + generated
    finally:
        r.close()


def test_template_runtime_errors_are_bad_input():
    with pytest.raises(InvalidRequest, match="chat template error"):
        prompt.render("{{ messages[0]['content'] + 1 }}", [Message("user", "a")])


@pytest.mark.parametrize("engine", ["old", "new"])
def test_first_prompt_token_is_kept(engine):
    """SmolLM2's BOS is <|im_start|> and its tokenizer adds none: the template's opening
    <|im_start|> must reach the model. stories260K adds BOS itself: exactly one, at the start."""
    from runner.api import Options, Request
    from tests.conftest import STORIES, collect

    r = load(None, engine)
    try:
        assert not r.model_engine.add_bos
        im_start = r.tokenize("<|im_start|>", add_special=False)
        assert len(im_start) == 1
        for request in (Request(prompt="hi", options=Options(num_predict=1, temperature=0)),
                        Request(messages=[Message("user", "hi")], options=Options(num_predict=1, temperature=0))):
            _, final = collect(r.stream(request))
            assert final.context[:2] == im_start + r.tokenize("system", add_special=False)
    finally:
        r.close()
    r = load(STORIES, engine)
    try:
        assert r.model_engine.add_bos
        bos = r.tokenize("", add_special=True)
        assert len(bos) == 1
        _, final = collect(r.stream(Request(prompt="Once upon", options=Options(num_predict=1, temperature=0))))
        assert final.context[0] == bos[0] and final.context[1] != bos[0]
    finally:
        r.close()


# Templates are untrusted (a request's `template`, a GGUF's chat template): each of these would
# run for minutes or allocate gigabytes unbounded. Rendering stops with one clear error instead.
LOOP = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HOSTILE = {
    "nested loops": (LOOP, "time"),
    "nested loops with output": (LOOP.replace("{% endfor %}{% endfor %}", "x{% endfor %}{% endfor %}"),
                                 "time|characters"),
    "exponential macro": ("{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
                          "time"),
    "endless recursion": ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recursion"),
    "string repeat": ("{{ 'x' * 10**9 }}", "characters"),
    "list repeat": ("{{ (range(100000)|list) * 100000 }}", "characters"),
    "center filter": ("{{ 'x'|center(10**9) }}", "characters"),
    "center method": ("{{ 'x'.center(10**9) }}", "characters"),
    "zfill method": ("{{ '1'.zfill(10**9) }}", "characters"),
    "to_bytes": ("{{ (1).to_bytes(10**9, 'big') }}", "characters"),
    "indent filter": ("{{ ('a\n' * 1000)|indent(10**6) }}", "characters"),
    "power": ("{{ 10 ** (10 ** 10) }}", "number"),
    "squaring": ("{% set ns = namespace(n=7) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}{% endfor %}"
                 "{{ ns.n }}", "number"),
    "concat doubling": ("{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
                        "{% endfor %}{{ ns.s|length }}", "characters"),
    "plus doubling": ("{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
                      "{% endfor %}{{ ns.s|length }}", "characters"),
    "list of references": ("{% set ns = namespace(l=[]) %}{% for i in range(100000) %}"
                           "{% set ns.l = ns.l + ['x' * 100000] %}{% endfor %}{{ ns.l }}", "characters"),
    "printf width": ("{{ '%0999999999d' % 1 }}", "characters"),
    "format width": ("{{ '{:>999999999}'.format(1) }}", "characters"),
    "markup format width": ("{{ ('{:>999999999}'|safe).format(1) }}", "characters"),
    "format filter width": ("{{ '%999999999s'|format('x') }}", "characters"),
    "replace": ("{{ ('x' * 100000).replace('', 'yyyyyyyyyy') }}", "characters"),
    "expandtabs": ("{{ ('\t' * 100000).expandtabs(100000) }}", "characters"),
    "join of a long list": ("{{ (['x' * 100000] * 9)|join * 9 }}", "characters"),
    "join of a generator": ("{{ range(100000)|map('center', 1000000)|join }}", "characters"),
    "method join of a generator": ("{{ ''.join(range(100000)|map('center', 1000000)) }}", "characters"),
    "quadratic sum": ("{{ (range(100000)|batch(1)|sum(start=[]))|length }}", "time|characters"),
    "lipsum": ("{{ lipsum(10**6) }}", "lipsum"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_template_is_stopped_with_one_clear_error(name):
    source, what = HOSTILE[name]
    limits = prompt.RenderLimits(cpu_seconds=0.5)
    with pytest.raises(InvalidRequest) as err:
        prompt.render(source, [Message("user", "hi")], limits=limits)
    message = str(err.value)
    assert "\n" not in message and any(w in message for w in what.split("|")), message


def test_a_template_render_stops_when_its_request_is_cancelled():
    import threading
    import time

    from runner.api import Cancelled

    cancel = threading.Event()
    threading.Timer(0.2, cancel.set).start()
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        prompt.render(LOOP, [Message("user", "hi")], cancel=cancel, limits=prompt.RenderLimits(cpu_seconds=60))
    assert time.monotonic() - t0 < 5


def test_the_budget_leaves_real_templates_alone():
    """Large honest inputs render whole: the limits grow with what the template is given."""
    big = "word " * 400_000  # 2 MB of content
    text = prompt.render(CHATML, [Message("user", big)] * 3)
    assert text.count(big) == 3
    loops = ("{% for m in messages %}{% for i in range(m.content|length) %}{% endfor %}"
             "{{ m.content|upper|center(40) }}{{ '%05d'|format(loop.index) }}{{ '{:>6}'.format(loop.index) }}"
             "{% endfor %}{{ messages|tojson(indent=2)|length }}")
    out = prompt.render(loops, [Message("user", "hello")] * 50)
    assert out.startswith("                 HELLO                  00001     1")


# ------------------------------------------------------------------------ template selection
GO_CHATML = ('{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n'
             '{{ end }}<|im_start|>assistant\n')


def _info(architecture="llama", chat_template=None, store_template=None):
    """A model's facts, with its store TEMPLATE beside them (as runner.resolve finds both)."""
    from runner.api import ModelInfo

    info = ModelInfo(name="m", path="/m.gguf", architecture=architecture, size=0, context_length=0,
                     embedding_length=0, parameter_count=0, quantization="Q8_0", chat_template=chat_template,
                     metadata={})
    return info, store_template


def _select(request_template, model):
    """The template runner.prepare.prepare chooses for a request to ``model`` (an ``_info``)."""
    from runner.loading.resolve import ResolvedModel
    from runner.prepare import prepare
    from runner.store import ModelDefaults, StoredModel

    info, store_template = model
    stored = StoredModel("m", Path(info.path), 0, datetime.now(timezone.utc), "")
    resolved = ResolvedModel("m", stored, info, ModelDefaults(template=store_template),
                             prompt.model_template(info, store_template))
    return prepare(resolved, Request(prompt="x", template=request_template)).chat_template


def test_which_template_wins():
    """request > the store's TEMPLATE (Go) > the GGUF's Jinja > llama.cpp's built-in > plain."""
    every = _info("gemma3", chat_template=CHATML, store_template=GO_CHATML)
    assert _select("{{ .Prompt }}", every) == prompt.ChatTemplate("go", "{{ .Prompt }}", "the request's template")
    assert _select(None, every).kind == "go" and _select(None, every).source == GO_CHATML
    assert _select("", every).source == GO_CHATML  # an empty request template is none
    assert _select(None, _info("gemma3", chat_template=CHATML)).kind == "jinja"
    builtin = _select(None, _info("gemma3"))
    assert (builtin.kind, builtin.source) == ("builtin", "gemma") and "gemma3" in builtin.describe()
    assert _select(None, _info("llama")).kind == "plain"
    # a TEMPLATE a user wrote in Jinja (Jinja's tags) renders as Jinja
    assert _select(None, _info(store_template=CHATML)).kind == "jinja"
    # the same messages, each way
    msgs = [Message("user", "hi")]
    for chosen in (_select(None, every), _select(None, _info(chat_template=CHATML))):
        assert prompt.render(chosen, msgs) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    assert prompt.render(builtin, msgs) == "<start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    assert prompt.render(_select(None, _info()), msgs) == "hi"
    # what /show template prints
    assert _select(None, every).show() == GO_CHATML
    assert "gemma" in builtin.show() and "\n" not in builtin.show()
    assert "No prompt template" in _select(None, _info()).show()


def test_a_request_template_is_go_or_jinja():
    assert prompt.request_template("{{ .Prompt }}").kind == "go"
    assert prompt.request_template("plain text").kind == "go"  # renders the same either way
    assert prompt.request_template(CHATML).kind == "jinja"
    assert prompt.request_template("{{ bos_token }}{{ messages[0]['content'] }}").kind == "jinja"
    # looks like Go, parses as neither: Go's error, one line
    with pytest.raises(InvalidRequest, match=r"invalid template: template: line 1: unexpected EOF"):
        prompt.request_template("{{ if .System }}")
    # Go's rules reach the prompt: an old-style template renders per exchange
    msgs = [Message("system", "S"), Message("user", "a"), Message("assistant", "B"), Message("user", "c")]
    legacy = "{{ if .System }}[{{ .System }}]{{ end }}<{{ .Prompt }}>{{ .Response }}|"
    assert prompt.render(legacy, msgs) == "[S]<a>B|<c>"
