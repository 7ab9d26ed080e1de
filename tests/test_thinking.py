"""Reasoning: tags inferred from real Qwen3 / DeepSeek-R1 templates, and the streaming parser."""

from __future__ import annotations

import pytest

from runner.template import prompt
from runner.api import Message
from runner.template.features import features
from runner.reply.thinking import ThinkingParser, ThinkTags, think_on

from test_toolcalls import template

THINK = ThinkTags("<think>", "</think>")


@pytest.mark.parametrize("name, expected", [
    ("qwen3", THINK),  # renders reasoning_content back between its tags
    ("deepseek-r1-distill-qwen", THINK),  # strips it at </think>: named in its text
    ("qwen2.5", None),
    ("llama-3.3", None),
])
def test_tags_are_inferred(name, expected):
    assert features(template(name)).thinking == expected


def test_think_renders_enable_thinking_and_history_reasoning():
    msgs = [Message("user", "2+2?")]
    assert prompt.render(template("qwen3"), msgs, think=False).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert prompt.render(template("qwen3"), msgs, think=True).endswith("<|im_start|>assistant\n")
    assert prompt.render(template("qwen3"), msgs).endswith("<|im_start|>assistant\n")  # unset: the template's default
    # the last answer's reasoning goes back in (Qwen3 reads reasoning_content)
    history = msgs + [Message("assistant", "4", thinking="two and two")]
    assert "<think>\ntwo and two\n</think>\n\n4<|im_end|>" in prompt.render(template("qwen3"), history)
    # DeepSeek-R1's prompt opens the reasoning itself
    assert prompt.render(template("deepseek-r1-distill-qwen"), msgs).endswith("<｜Assistant｜><think>\n")


def run(parser: ThinkingParser, text: str, step: int = 1) -> tuple[str, str]:
    thinking, content = [], []
    for i in range(0, len(text), step):
        t, c = parser.feed(text[i:i + step])
        thinking.append(t), content.append(c)
    t, c = parser.finish()
    thinking.append(t), content.append(c)
    return "".join(thinking), "".join(content)


@pytest.mark.parametrize("step", [1, 4, 1000])
def test_reasoning_then_answer(step):
    assert run(ThinkingParser(THINK), "\n<think>\nLet me add.  2+2 is 4.\n</think>\n\nIt is 4.", step) == \
        ("Let me add.  2+2 is 4.", "It is 4.")
    # the prompt opened the tag (DeepSeek-R1): the output starts inside it
    assert run(ThinkingParser(THINK, opened=True), "Hmm, 4.\n</think>\n\n4", step) == ("Hmm, 4.", "4")


def test_no_tags_is_all_answer_and_a_partial_close_is_held():
    assert run(ThinkingParser(THINK), "Just 4. <think> is a tag") == ("", "Just 4. <think> is a tag")
    parser = ThinkingParser(THINK)
    assert parser.feed("<think>a</thi") == ("a", "")
    assert parser.feed("s is not it</think>b") == ("</this is not it", "b")
    assert parser.finish() == ("", "")
    # cut off while thinking: what was thought is still reasoning
    assert run(ThinkingParser(THINK), "<think>still going</th") == ("still going</th", "")


@pytest.mark.parametrize("think, supported, on", [
    (None, True, True), (None, False, False), (True, False, True), (False, True, False),
    ("high", True, True), ("low", False, True),
])
def test_think_on(think, supported, on):
    assert think_on(think, supported) is on
