"""Reasoning ("thinking") in a model's output: the tags, inferred from the chat template, and a
streaming parser that separates the reasoning from the answer.

:func:`derive` renders a probe conversation whose assistant turn carries a known reasoning text
(``reasoning_content``, what HF templates read) and takes the tags around it (``<think>`` and
``</think>`` for Qwen3). Templates that never render past reasoning but strip it from the history
(DeepSeek-R1 splits assistant content at ``</think>``) name their tags in their text; the small
table :data:`KNOWN_TAGS` covers those. A template with neither does not think.

:class:`ThinkingParser` mirrors Ollama's ``thinking.Parser``: leading whitespace is skipped, an
opening tag starts the reasoning (or the prompt itself ended with it, as DeepSeek-R1's does),
whitespace after each tag is eaten, and the closing tag ends the reasoning; everything after it
is the answer. A partial tag at the end of the text is held back until it is known.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence

from ..api import Message

PROBE_THOUGHT = "pollama probe reasoning"
PROBE_ANSWER = "pollama probe answer"

# Tags that templates strip from history without rendering reasoning back (checked in order).
KNOWN_TAGS = (("<think>", "</think>"), ("<seed:think>", "</seed:think>"))

_OPEN_BEFORE = re.compile(r"(<[\w:-]+>|\[[A-Z_]+\])\s*$")
_CLOSE_AFTER = re.compile(r"^\s*(</[\w:-]+>|\[/?[A-Z_]+\])")

# render(messages, think, add_generation_prompt) -> prompt text
Render = Callable[[Sequence[Message], bool, bool], str]


@dataclass(frozen=True)
class ThinkTags:
    open: str
    close: str


def derive(render: Render, source: str) -> ThinkTags | None:
    """The reasoning tags of the template behind ``render`` (``source`` is its text), or None
    when it has none (the model does not think)."""
    rendered = render([Message("user", "pollama probe question"),
                       Message("assistant", PROBE_ANSWER, thinking=PROBE_THOUGHT)], True, False)
    at = rendered.find(PROBE_THOUGHT)
    if at >= 0:
        before = _OPEN_BEFORE.search(rendered[:at])
        after = _CLOSE_AFTER.search(rendered[at + len(PROBE_THOUGHT):])
        if before and after:
            return ThinkTags(before.group(1), after.group(1))
    for open_tag, close_tag in KNOWN_TAGS:
        if open_tag in source and close_tag in source:
            return ThinkTags(open_tag, close_tag)
    return None


def think_on(think: bool | str | None, supported: bool) -> bool:
    """Whether a request's ``think`` asks for reasoning: a level or True does, False does not,
    and unset means the model's default (on for models that think, as Ollama does)."""
    if think is None:
        return supported
    if isinstance(think, str):
        return think.lower() not in ("", "false", "none")
    return bool(think)


def _partial_tail(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ThinkingParser:
    """Splits streamed output into (thinking, content) (see the module's doc)."""

    def __init__(self, tags: ThinkTags, opened: bool = False) -> None:
        """``opened``: the prompt ended with the opening tag, so the output starts inside it."""
        self.tags = tags
        self._state = "eat_open" if opened else "start"
        self._buf = ""

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """Reasoning and answer text that can be shown now. With ``final`` nothing is held."""
        self._buf += text
        thinking: list[str] = []
        content: list[str] = []
        while True:
            buf = self._buf
            if self._state == "start":  # before anything: is it an opening tag?
                stripped = buf.lstrip()
                opening = self.tags.open
                if stripped.startswith(opening):
                    self._buf, self._state = stripped[len(opening):], "eat_open"
                    continue
                if not final and opening.startswith(stripped):
                    break  # whitespace or a partial tag: wait
                self._state = "content"
                continue
            if self._state in ("eat_open", "eat_close"):  # whitespace after a tag
                stripped = buf.lstrip()
                self._buf = stripped
                if not stripped:
                    break
                self._state = "thinking" if self._state == "eat_open" else "content"
                continue
            if self._state == "thinking":
                k = buf.find(self.tags.close)
                if k >= 0:
                    thinking.append(buf[:k].rstrip())
                    self._buf, self._state = buf[k + len(self.tags.close):], "eat_close"
                    continue
                hold = 0 if final else _partial_tail(buf, self.tags.close)
                shown = buf[: len(buf) - hold]
                # trailing whitespace may precede the closing tag, which is trimmed: hold it
                keep = 0 if final else len(shown) - len(shown.rstrip())
                thinking.append(shown[: len(shown) - keep])
                self._buf = buf[len(shown) - keep:]
                break
            content.append(buf)
            self._buf = ""
            break
        return "".join(thinking), "".join(content)

    def finish(self) -> tuple[str, str]:
        return self.feed("", final=True)
