"""Chat prompts: templates, the plain fallback, history truncation, and the prefix property."""

from __future__ import annotations

import pytest

from runner import prompt
from runner.api import InvalidRequest, Message
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
    count = lambda s: len(s) // 4
    text = prompt.chat_prompt(msgs, render, count, num_ctx=60)
    assert "SYS" in text and "m9 " in text and "m0 " not in text
    assert count(text) <= 60
    # no truncation wanted: everything stays
    assert "m0 " in prompt.chat_prompt(msgs, render, count, num_ctx=60, truncate=False)
    # even the last message alone is too long: system + last are still returned
    text = prompt.chat_prompt(msgs, render, count, num_ctx=5)
    assert "SYS" in text and "m9 " in text and "m8 " not in text


def test_chatml_turn_prefix_on_smollm2():
    """Turn N+1's tokens start with exactly turn N's prompt + answer tokens (the cache hit)."""
    r = load(None, num_predict=40)
    try:
        from runner.api import Request, Options
        from tests.conftest import collect

        msgs = [Message("user", "Name three colors.")]
        p1 = r.tokenize(r.render_chat(msgs))
        answer, final = collect(r.chat(Request(messages=msgs, options=Options(temperature=0, num_predict=40))))
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
        assert not r.add_bos
        im_start = r.tokenize("<|im_start|>", add_special=False)
        assert len(im_start) == 1
        for request, chat in ((Request(prompt="hi", options=Options(num_predict=1, temperature=0)), False),
                              (Request(messages=[Message("user", "hi")], options=Options(num_predict=1, temperature=0)), True)):
            _, final = collect(r.chat(request) if chat else r.generate(request))
            assert final.context[:2] == im_start + r.tokenize("system", add_special=False)
    finally:
        r.close()
    r = load(STORIES, engine)
    try:
        assert r.add_bos
        bos = r.tokenize("", add_special=True)
        assert len(bos) == 1
        _, final = collect(r.generate(Request(prompt="Once upon", options=Options(num_predict=1, temperature=0))))
        assert final.context[0] == bos[0] and final.context[1] != bos[0]
    finally:
        r.close()
