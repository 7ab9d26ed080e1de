"""A reply as the model streams it, split into its parts: reasoning, answer text, tool calls.

The reasoning comes first (:class:`runner.reply.thinking.ThinkingParser`); the text after it goes
through the tool-call parser (:class:`runner.reply.toolcalls.ToolCallParser`), so a call the model
only mulls over while thinking is not made, and an answer that is nothing but a bare or fenced
JSON call of an offered tool is judged as a whole after the reasoning. Testable without a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..api import Request, ToolCall
from ..reply.thinking import ThinkingParser, think_on
from ..reply.toolcalls import ToolCallParser
from ..template.features import TemplateFeatures


@dataclass
class Parts:
    content: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.thinking or self.tool_calls)


class ReplyParser:
    def __init__(self, thinking: ThinkingParser | None, tools: ToolCallParser | None) -> None:
        self.thinking = thinking
        self.tools = tools

    def feed(self, text: str, final: bool = False) -> Parts:
        """The parts of the reply that ``text`` completes; ``final``: the reply ended."""
        reasoning, content = self.thinking.feed(text, final) if self.thinking else ("", text)
        calls: list = []
        if self.tools is not None:
            content, calls = self.tools.feed(content, final)
        return Parts(content, reasoning, calls)

    def finish(self) -> Parts:
        return self.feed("", final=True)


def for_request(request: Request, found: TemplateFeatures, prompt_text: str) -> ReplyParser | None:
    """The parser a request's reply needs (None: the text is all answer). Reasoning is parsed
    when the request thinks (:func:`runner.reply.thinking.think_on`); the reply starts inside it when
    the prompt ends with the opening tag. Tool calls are parsed when the request offers tools (none with ``tool_choice: none``:
    :func:`runner.prepare.prepare` drops them)."""
    thinking = tools = None
    tags = found.thinking
    if tags is not None and think_on(request.think, True):
        thinking = ThinkingParser(tags, opened=prompt_text.rstrip().endswith(tags.open))
    if request.tools and found.tools is not None:
        tools = ToolCallParser(found.tools, frozenset(t.name for t in request.tools))
    if thinking is None and tools is None:
        return None
    return ReplyParser(thinking, tools)
