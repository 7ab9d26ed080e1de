"""The bounds a JSON schema must keep before it becomes a grammar (``format``, ``response_format``,
``text.format``, a forced tool's ``parameters``).

llama-cpp-python's converter writes a repetition as one nested group per repeat
(``maxLength: 5`` is ``(c (c (c (c (c)?)?)?)?)?``) and a repeated literal as the literal written
out, and llama.cpp's parser descends into each group: ``maxItems: 20000`` overflows its stack and
kills the process, ``"pattern": "^a{1000000000}$"`` asks for a 1 GB literal. llama.cpp itself
refuses a grammar whose repetitions multiply past 2,000 rules ("exceeds sane defaults"); every
alternative (an ``enum`` value, an ``anyOf`` branch) is a grammar stack that each candidate token
is checked against, ~0.1 ms per 1,000 alternatives per 1,000 vocabulary entries. So a schema is
refused, naming the keyword, when it is over one of :data:`LIMITS` (OpenAI's structured outputs
refuses schemas past similar bounds: 1,000 enum values, a few levels of nesting).

:func:`check` walks the schema as a schema (the keywords that hold subschemas), not as data: an
``enum`` value that happens to hold ``{"maxItems": 10**9}`` is a value, not a keyword.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..api import InvalidRequest


@dataclass(frozen=True)
class Limits:
    repeat: int = 1000  # a count (minItems ... maxLength, a pattern's {m,n} times its groups')
    alternatives: int = 1000  # enum values, anyOf/oneOf branches and type lists, summed
    properties: int = 256  # properties of one object
    depth: int = 32  # schemas inside schemas
    pattern: int = 1000  # characters of one pattern
    size: int = 512 * 1024  # the schema as JSON, in characters


LIMITS = Limits()

_COUNTS = ("minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties",
           "minContains", "maxContains")
_ONE = ("items", "additionalProperties", "additionalItems", "unevaluatedItems",
        "unevaluatedProperties", "not", "if", "then", "else", "contains", "propertyNames")
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_NAMED = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")


def check(schema: Any, where: str, limits: Limits = LIMITS) -> None:
    """Raise InvalidRequest (``invalid JSON schema in <where>: <keyword> ...``) when ``schema`` is
    over a bound; return when it may go to the converter."""

    def refuse(why: str) -> InvalidRequest:
        return InvalidRequest(f"invalid JSON schema in {where}: {why}")

    try:
        size = len(json.dumps(schema))
    except (TypeError, ValueError, RecursionError):
        raise refuse("not a JSON value (or nested too deeply)") from None
    if size > limits.size:
        raise refuse(f"the schema is {size} characters, over the limit of {limits.size}")
    alternatives = 0
    todo: list[tuple[Any, int]] = [(schema, 1)]
    while todo:
        node, depth = todo.pop()
        if not isinstance(node, dict):
            continue  # true/false schemas; the converter judges anything else
        if depth > limits.depth:
            raise refuse(f"schemas nest deeper than {limits.depth} levels")
        for key in _COUNTS:
            value = node.get(key)
            if _is_number(value) and value > limits.repeat:
                raise refuse(f'"{key}" is {value}, over the limit of {limits.repeat}')
        for key in ("enum", "anyOf", "oneOf", "type"):
            if isinstance(node.get(key), list):
                alternatives += len(node[key])
        if alternatives > limits.alternatives:
            raise refuse(f"enum values and anyOf/oneOf branches add up to {alternatives}, "
                         f"over the limit of {limits.alternatives}")
        if isinstance(node.get("properties"), dict) and len(node["properties"]) > limits.properties:
            raise refuse(f'"properties" has {len(node["properties"])} entries, over the limit of {limits.properties}')
        if isinstance(node.get("pattern"), str):
            why = pattern_problem(node["pattern"], limits)
            if why:
                raise refuse(f'"pattern" {why}')
        for key in _ONE:
            todo.append((node.get(key), depth + 1))
        for key in _MANY:
            if isinstance(node.get(key), list):
                todo.extend((sub, depth + 1) for sub in node[key])
        for key in _NAMED:
            if isinstance(node.get(key), dict):
                todo.extend((sub, depth + 1) for sub in node[key].values())


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def pattern_problem(pattern: str, limits: Limits = LIMITS) -> str | None:
    """Why ``pattern`` is over a bound (its length, or a repetition that, multiplied by the
    repetitions of the groups around it, exceeds ``limits.repeat``), or None."""
    if len(pattern) > limits.pattern:
        return f"is {len(pattern)} characters, over the limit of {limits.pattern}"
    times = repetition(pattern)
    if times > limits.repeat:
        return f"repeats {times} times, over the limit of {limits.repeat}"
    return None


def repetition(pattern: str) -> int:
    """The most times any one part of ``pattern`` is written out by its ``{m}``/``{m,n}``
    quantifiers, nested groups multiplied (``*``, ``+`` and ``?`` loop rather than repeat: 1)."""
    frames = [1]  # per open group: the most any part inside it repeats so far
    i, n = 0, len(pattern)
    while i < n:
        ch = pattern[i]
        if ch == "\\":
            i += 2
            times = 1
        elif ch == "[":
            i = _class_end(pattern, i + 1)
            times = 1
        elif ch == "(":
            frames.append(1)
            i += 1
            continue
        elif ch == ")" and len(frames) > 1:
            times = frames.pop()
            i += 1
        else:
            i += 1
            times = 1
        count, i = _quantifier(pattern, i)
        frames[-1] = max(frames[-1], times * count)
    return max(frames)


def _class_end(pattern: str, i: int) -> int:
    """The index after the ``]`` closing a character class whose body starts at ``i``."""
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    while i < len(pattern) and pattern[i] != "]":
        i += 2 if pattern[i] == "\\" else 1
    return i + 1


def _quantifier(pattern: str, i: int) -> tuple[int, int]:
    """(times, index after) for a ``{m}``, ``{m,}`` or ``{m,n}`` at ``i`` (1 for none or others)."""
    if i >= len(pattern) or pattern[i] != "{":
        return 1, i
    end = pattern.find("}", i)
    body = pattern[i + 1:end] if end > 0 else ""
    parts = body.split(",")
    if end < 0 or len(parts) > 2 or not all(p.strip().isdigit() or (k and not p.strip())
                                              for k, p in enumerate(parts)):
        return 1, i  # a literal "{", as the converter reads it
    low = int(parts[0])
    high = int(parts[1]) if len(parts) == 2 and parts[1].strip() else low
    return max(low, high, 1), end + 1
