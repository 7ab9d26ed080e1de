"""Ollama's rules for rendering a Go ``TEMPLATE`` (its ``template.Template.Execute``).

- Consecutive messages of one role are merged with a blank line between them, and ``.System``
  is every system message's content joined the same way.
- A template that mentions ``.Messages`` renders once with ``.System``, ``.Messages`` (each with
  ``.Role``, ``.Content``, ``.Thinking``, ``.Images``, ``.ToolCalls``, ``.ToolName``,
  ``.ToolCallID``), ``.Tools``, ``.Response`` (empty), ``.Think``, ``.ThinkLevel`` and
  ``.IsThinkSet``. ``.Prompt`` is not set: it prints ``<no value>``.
- An older template (``.System``/``.Prompt``/``.Response`` only) renders once per exchange: a
  system message and a prompt start one, the assistant's answer fills ``.Response``; the last
  exchange renders only up to where ``.Response`` goes, so its answer is what the model writes
  next. A template with neither ``.Messages`` nor ``.Response`` gets ``{{ .Response }}``
  appended, as Ollama's parser appends it.

Both forms extend turn N's prompt with the answer for turn N+1 when the template does, so the
slot cache hits.
"""

from __future__ import annotations

import functools
from typing import Any, Sequence

from . import gotemplate
from .api import Message
from .gotemplate import Action, Command, Field, Pipe, Struct, Template
from .sandbox import RenderBudget, run_bounded

__all__ = ["parse", "render"]


def parse(source: str) -> Template:
    """Parse a Go TEMPLATE as Ollama does (``{{ .Response }}`` appended when it has neither
    ``.Messages`` nor ``.Response``). Raises InvalidRequest."""
    return _parse(source)[0]


@functools.lru_cache(maxsize=32)
def _parse(source: str) -> tuple[Template, bool]:
    """The template and whether it renders ``.Messages`` (cached: both are per source)."""
    template = gotemplate.parse(source)
    names = template.identifiers()
    if "messages" not in names and "response" not in names:
        response = Action(Pipe(0, cmds=[Command([Field(("Response",))])]))
        template = template.with_nodes([*template.nodes, response])
    return template, "messages" in names


def _collate(messages: Sequence[Message]) -> tuple[str, list[Message]]:
    system = [m.content for m in messages if m.role == "system"]
    merged: list[Message] = []
    for m in messages:
        if merged and merged[-1].role == m.role and m.role != "tool":
            merged[-1] = Message(m.role, merged[-1].content + "\n\n" + m.content)
        else:
            merged.append(Message(m.role, m.content))
    return "\n\n".join(system), merged


def _message(m: Message) -> Struct:
    return Struct("*template.templateMessage", {
        "Role": m.role, "Content": m.content, "Thinking": "", "Images": None, "ToolCalls": None,
        "ToolName": "", "ToolCallID": "",
    })


_THINK = {"Think": False, "ThinkLevel": "", "IsThinkSet": False}


def render(source: str, messages: Sequence[Message], budget: RenderBudget) -> str:
    """The prompt for ``messages`` by Ollama's rules, within ``budget``. Raises InvalidRequest
    for a template that does not parse, fails or overruns; Cancelled on the budget's event."""
    template, uses_messages = _parse(source)
    input_chars = len(source) + sum(len(m.content) for m in messages)
    system, merged = _collate(messages)
    if uses_messages:
        data = {"System": system, "Messages": [_message(m) for m in merged], "Tools": None, "Response": "",
                **_THINK}
        return gotemplate.render(template, data, budget, input_chars)
    return run_bounded(budget, input_chars, lambda: _render_exchanges(template, merged, budget))


def _render_exchanges(template: Template, messages: list[Message], budget: RenderBudget) -> str:
    out: list[str] = []
    turn: dict[str, Any] = {"System": "", "Prompt": "", "Response": ""}

    def flush() -> None:
        out.append(gotemplate.execute(template, {**turn, **_THINK}, budget))
        turn.update(System="", Prompt="", Response="")

    for m in messages:
        if m.role == "system":
            if turn["Prompt"] or turn["Response"]:
                flush()
            turn["System"] = m.content
        elif m.role == "user":
            if turn["Response"]:
                flush()
            turn["Prompt"] = m.content
        elif m.role == "assistant":
            turn["Response"] = m.content
    last = template.cut_after_field("Response")
    out.append(gotemplate.execute(last, {**turn, **_THINK}, budget))
    text = "".join(out)
    budget.check_chars(len(text), "the template produces")
    return text
