"""Ollama's rules for rendering a Go ``TEMPLATE`` (its ``template.Template.Execute``).

- Consecutive messages of one role are merged with a blank line between them, and ``.System``
  is every system message's content joined the same way.
- A template that mentions ``.Messages`` renders once with ``.System``, ``.Messages`` (each with
  ``.Role``, ``.Content``, ``.Thinking``, ``.Images``, ``.ToolCalls``, ``.ToolName``,
  ``.ToolCallID``), ``.Tools``, ``.Response`` (empty), ``.Think``, ``.ThinkLevel`` and
  ``.IsThinkSet``. ``.Prompt`` is not set: it prints ``<no value>``.
- ``.Tools`` (nil without tools) and a message's ``.ToolCalls`` have the shapes of Ollama's
  template types: a tool is ``.Type`` and ``.Function`` (``.Name``, ``.Description``,
  ``.Parameters`` with ``.Type``, ``.Required``, ``.Properties``, a map of name to property:
  ``.Type``, ``.Description``, ``.Enum``…); a call is ``.ID`` and ``.Function`` (``.Index``,
  ``.Name``, ``.Arguments``, a map). As in Ollama, a tool, a tool's function, its parameters,
  its properties, a call's arguments and ``.Tools`` itself print as their JSON (``{{ . }}``,
  ``{{ .Function }}``, ``{{ .Function.Arguments }}``, ``{{ .Tools }}``), which is what templates such as Qwen2.5's and Llama 3.1's
  write into the prompt.
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

import dataclasses
import json

from . import go as gotemplate
from ..api import Message, Tool, ToolCall
from .go import Action, Command, Field, JSONList, JSONMap, Pipe, Struct, Template
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
    """Ollama's collate: consecutive messages of one role (not tool results) become one, whose
    other fields are the first's."""
    system = [m.content for m in messages if m.role == "system"]
    merged: list[Message] = []
    for m in messages:
        if merged and merged[-1].role == m.role and m.role != "tool":
            merged[-1] = dataclasses.replace(merged[-1], content=merged[-1].content + "\n\n" + m.content)
        else:
            merged.append(m)
    return "\n\n".join(system), merged


def _object(fields: dict[str, Any]) -> Struct:
    """A JSON object with its keys in this order (how encoding/json writes a struct's tagged
    fields); empty values are left out (``omitempty``) where ``fields`` maps them to None."""
    return Struct("", {k: v for k, v in fields.items() if v is not None})


def _property(raw: Any) -> Any:
    """One property of a tool's parameters as Ollama's ``api.ToolProperty`` (what it keeps of
    the JSON schema: anyOf, type, items, description, enum, properties, required)."""
    if not isinstance(raw, dict):
        return raw
    kind = raw.get("type")
    props = raw.get("properties")
    any_of = [_property(p) for p in raw["anyOf"]] if isinstance(raw.get("anyOf"), list) else None
    fields = {"AnyOf": any_of, "Type": kind if kind else None, "Items": raw.get("items"),
              "Description": raw.get("description") or "", "Enum": raw.get("enum"),
              "Properties": JSONMap({k: _property(v) for k, v in props.items()}) if isinstance(props, dict) else None,
              "Required": raw.get("required")}
    return Struct("api.ToolProperty", fields, json=_object({
        "anyOf": any_of or None, "type": kind or None, "items": raw.get("items"),
        "description": raw.get("description") or None, "enum": raw.get("enum") or None,
        "properties": fields["Properties"], "required": raw.get("required") or None}))


def _tool(tool: Tool) -> Struct:
    """A tool as Ollama's ``templateTool``."""
    params = tool.parameters if isinstance(tool.parameters, dict) else {}
    raw_props = params.get("properties")
    props = JSONMap({k: _property(v) for k, v in raw_props.items()}) if isinstance(raw_props, dict) else JSONMap()
    kind = params.get("type") if isinstance(params.get("type"), str) else ""
    parameters = Struct("template.templateToolFunctionParameters", {
        "Type": kind, "Defs": params.get("$defs"), "Items": params.get("items"),
        "Required": params.get("required"), "Properties": props,
    }, json=_object({"type": kind, "$defs": params.get("$defs"), "items": params.get("items"),
                     "required": params.get("required") or None, "properties": props}), stringer=True)
    function = Struct("template.templateToolFunction", {
        "Name": tool.name, "Description": tool.description, "Parameters": parameters,
    }, json=_object({"name": tool.name, "description": tool.description, "parameters": parameters}), stringer=True)
    return Struct("template.templateTool", {"Type": "function", "Items": None, "Function": function},
                  json=_object({"type": "function", "function": function}), stringer=True)


def _call(call: ToolCall) -> Struct:
    """A call as Ollama's ``templateToolCall`` (its arguments print as JSON)."""
    return Struct("template.templateToolCall", {"ID": call.id, "Function": Struct(
        "template.templateToolCallFunction",
        {"Index": call.index, "Name": call.name, "Arguments": JSONMap(call.arguments)})})


def _message(m: Message) -> Struct:
    return Struct("*template.templateMessage", {
        "Role": m.role, "Content": m.content, "Thinking": m.thinking, "Images": None,
        "ToolCalls": [_call(c) for c in m.tool_calls] or None, "ToolName": m.tool_name,
        "ToolCallID": m.tool_call_id,
    })


def _think(think: bool | str | None) -> dict[str, Any]:
    """``.Think``, ``.ThinkLevel``, ``.IsThinkSet`` for a request's ``think`` (a level is on)."""
    if think is None:
        return {"Think": False, "ThinkLevel": "", "IsThinkSet": False}
    if isinstance(think, str):
        on = think.lower() not in ("", "false", "none")
        return {"Think": on, "ThinkLevel": think if on and think.lower() != "true" else "", "IsThinkSet": True}
    return {"Think": bool(think), "ThinkLevel": "", "IsThinkSet": True}


def render(source: str, messages: Sequence[Message], budget: RenderBudget, tools: Sequence[Tool] = (),
           think: bool | str | None = None) -> str:
    """The prompt for ``messages`` (offering ``tools``, reasoning as ``think`` asks) by Ollama's
    rules, within ``budget``. Raises InvalidRequest for a template that does not parse, fails or
    overruns; Cancelled on the budget's event."""
    input_chars = len(source) + sum(len(m.content) + len(m.thinking) for m in messages)
    input_chars += sum(len(json.dumps(c.arguments)) for m in messages for c in m.tool_calls)
    input_chars += sum(len(json.dumps(t.parameters)) + len(t.description) + len(t.name) for t in tools)
    return run_bounded(budget, input_chars, lambda: _render(source, messages, budget, tools, think))


def _render(source: str, messages: Sequence[Message], budget: RenderBudget, tools: Sequence[Tool],
            think: bool | str | None) -> str:
    template, uses_messages = _parse(source)  # inside the budget: parsing a new template counts
    system, merged = _collate(messages)
    flags = _think(think)
    if uses_messages:
        data = {"System": system, "Messages": [_message(m) for m in merged],
                "Tools": JSONList(_tool(t) for t in tools) or None, "Response": "", **flags}
        return gotemplate.execute(template, data, budget)
    return _render_exchanges(template, merged, budget, flags)


def _render_exchanges(template: Template, messages: list[Message], budget: RenderBudget,
                      flags: dict[str, Any]) -> str:
    out: list[str] = []
    turn: dict[str, Any] = {"System": "", "Prompt": "", "Response": ""}

    def flush() -> None:
        out.append(gotemplate.execute(template, {**turn, **flags}, budget))
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
    out.append(gotemplate.execute(last, {**turn, **flags}, budget))
    text = "".join(out)
    budget.check_chars(len(text), "the template produces")
    return text
