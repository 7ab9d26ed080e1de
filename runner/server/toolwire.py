"""Tools and tool calls on the wire: the ``tools`` list both APIs take, and tool calls in
Ollama's shape (``arguments`` an object) and OpenAI's (``arguments`` a JSON string, with ids)."""

from __future__ import annotations

import json
from typing import Any

from runner.api import InvalidRequest, Tool, ToolCall, ToolChoice


def parse_tools(raw: list[Any] | None) -> list[Tool]:
    """``[{"type": "function", "function": {"name", "description", "parameters"}}]``. Raises
    InvalidRequest for an entry that is not a function with a name."""
    tools: list[Tool] = []
    for i, entry in enumerate(raw or []):
        fn = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
            raise InvalidRequest(f"invalid tools[{i}]: a tool is {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        if entry.get("type", "function") != "function":
            raise InvalidRequest(f"invalid tools[{i}].type {entry.get('type')!r}: only \"function\" is supported")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, dict):
            raise InvalidRequest(f"invalid tools[{i}].function.parameters: it must be a JSON schema object")
        description = fn.get("description") or ""
        tools.append(Tool(fn["name"], description if isinstance(description, str) else str(description), params))
    return tools


def parse_tool_choice(raw: Any, tools: list[Tool]) -> ToolChoice:
    """OpenAI's ``tool_choice``: "auto" | "none" | "required" | {"type": "function",
    "function": {"name"}} (a name that is not among the tools is refused)."""
    if raw is None or raw == "auto":
        return ToolChoice()
    if raw in ("none", "required"):
        if raw == "required" and not tools:
            raise InvalidRequest('tool_choice "required" needs tools')
        return ToolChoice(raw)
    if isinstance(raw, dict):
        fn = raw.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if isinstance(name, str) and name:
            if name not in {t.name for t in tools}:
                raise InvalidRequest(f"tool_choice names {name!r}, which is not one of the tools")
            return ToolChoice("function", name)
    raise InvalidRequest(f"invalid tool_choice {raw!r}: use \"auto\", \"none\", \"required\" or a function")


def arguments(value: Any, where: str) -> dict[str, Any]:
    """A call's arguments: a JSON object, or a string holding one (empty: none)."""
    if value is None or value == "":
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise InvalidRequest(f"invalid {where}: arguments must be a JSON object") from None
    if not isinstance(value, dict):
        raise InvalidRequest(f"invalid {where}: arguments must be a JSON object")
    return value


def calls_from_wire(raw: list[Any] | None, where: str) -> list[ToolCall]:
    """An assistant message's ``tool_calls`` (either API's shape) as :class:`ToolCall` values."""
    calls = []
    for i, entry in enumerate(raw or []):
        fn = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise InvalidRequest(f"invalid {where}.tool_calls[{i}]: a call has function.name")
        index = fn.get("index", i)
        call_id = entry.get("id") or ""
        calls.append(ToolCall(fn["name"], arguments(fn.get("arguments"), f"{where}.tool_calls[{i}]"),
                              index=index if isinstance(index, int) else i,
                              id=call_id if isinstance(call_id, str) else ""))
    return calls


def ollama_calls(calls: list[ToolCall]) -> list[dict[str, Any]]:
    return [{"id": c.id, "function": {"index": c.index, "name": c.name, "arguments": c.arguments}} for c in calls]


def openai_calls(calls: list[ToolCall], streaming: bool) -> list[dict[str, Any]]:
    out = []
    for c in calls:
        item: dict[str, Any] = {"id": c.id, "type": "function",
                                "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
        if streaming:
            item["index"] = c.index
        out.append(item)
    return out
