"""Answers that are nothing but a JSON tool call, the way small models write them.

Given tools, Qwen2.5-Coder-0.5B answers a weather question with a fenced call::

    ```json
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    ```

or with that JSON bare, never with its template's ``<tool_call>`` tag. llama.cpp's parsers for
such templates take that as a call; so does pollama, as a fallback beside the template's own
syntax (:class:`runner.reply.toolcalls.ToolCallParser`), for requests that offer tools:

- the whole answer, outside whitespace and one code fence (```json or ```),
  is a JSON object, or a non-empty JSON list of objects;
- each object's ``name`` is one of the offered tools and its ``arguments`` (or, without
  ``arguments``, its ``parameters``) is an object.

Anything else is not a call, and its text is the parser's as it came. :class:`WholeAnswer` reads
the answer as it streams and says, after each piece, whether it may still be a call (hold it), can
no longer be one (release it: text after the JSON or the fence, JSON that is not valid, a
``name`` that is not an offered tool, a list of something else) or, at the end, what calls it is.
"""

from __future__ import annotations

import json
import string
from typing import Any, Callable

WHITESPACE = " \t\n\r"
FENCE = "```"
FENCE_INFO = "json"

Hook = Callable[[list[list[Any]], str, "str | None"], bool]

# JSON's number syntax, one character at a time: state -> {character class -> next state}
_NUMBER = {
    "start": {"-": "sign", "0": "zero", "1": "int"},
    "sign": {"0": "zero", "1": "int"},
    "zero": {".": "dot", "e": "e"},
    "int": {"0": "int", "1": "int", ".": "dot", "e": "e"},
    "dot": {"0": "frac", "1": "frac"},
    "frac": {"0": "frac", "1": "frac", "e": "e"},
    "e": {"+": "esign", "-": "esign", "0": "exp", "1": "exp"},
    "esign": {"0": "exp", "1": "exp"},
    "exp": {"0": "exp", "1": "exp"},
}
_NUMBER_ENDS = ("zero", "int", "frac", "exp")
_LITERALS = {"t": "rue", "f": "alse", "n": "ull"}


def _number_class(ch: str) -> str:
    if ch == "0":
        return "0"
    if ch in "123456789":
        return "1"
    return "e" if ch in "eE" else ch


class JsonPrefix:
    """Checks, a character at a time, that a text is the start of one JSON value (RFC 8259).

    ``stack`` holds the open containers, innermost last: ``["{", key]`` (the key being read, or
    None before the first) and ``["[", index]``. ``hook(stack, first, text)`` is asked at the start
    of every value (``first`` its first character, ``text`` None) and at the end of every string
    value (``text`` the decoded string); returning False makes the text invalid there."""

    def __init__(self, hook: Hook | None = None) -> None:
        self.stack: list[list[Any]] = []
        self.hook = hook
        self.done = False  # the value is complete
        self._state = "value"
        self._chars: list[str] = []  # the string being read, as written
        self._is_key = False
        self._hex = 0
        self._literal = ""
        self._number = ""

    def feed(self, ch: str) -> bool:
        """Read one more character; False when the text can no longer be the start of a value
        (a character after the complete value is one of those)."""
        state = self._state
        if state == "string":
            if ch == '"':
                return self._end_string()
            if ch < " ":
                return False
            self._chars.append(ch)
            if ch == "\\":
                self._state = "escape"
            return True
        if state == "escape":
            self._chars.append(ch)
            if ch == "u":
                self._state, self._hex = "hex", 4
                return True
            self._state = "string"
            return ch in '"\\/bfnrt'
        if state == "hex":
            self._chars.append(ch)
            self._hex -= 1
            if not self._hex:
                self._state = "string"
            return ch in string.hexdigits
        if state == "literal":
            if ch != self._literal[0]:
                return False
            self._literal = self._literal[1:]
            if not self._literal:
                self._after_value()
            return True
        if state == "number":
            following = _NUMBER[self._number].get(_number_class(ch))
            if following is not None:
                self._number = following
                return True
            if self._number not in _NUMBER_ENDS:
                return False
            self._after_value()
            return self.feed(ch)  # the number ended: the character is what follows it
        if self.done:
            return False
        if ch in WHITESPACE:
            return True
        if state == "value":
            return self._value(ch)
        if state == "value_or_end":
            return self._close() if ch == "]" else self._value(ch)
        if state in ("key_or_end", "key"):
            if state == "key_or_end" and ch == "}":
                return self._close()
            if ch != '"':
                return False
            self._state, self._chars, self._is_key = "string", [], True
            return True
        if state == "colon":
            self._state = "value"
            return ch == ":"
        # "after": a value ended inside a container
        top = self.stack[-1]
        if ch == ",":
            if top[0] == "[":
                top[1] += 1
            self._state = "key" if top[0] == "{" else "value"
            return True
        return ch == ("}" if top[0] == "{" else "]") and self._close()

    def _value(self, ch: str) -> bool:
        if self.hook is not None and not self.hook(self.stack, ch, None):
            return False
        if ch == "{":
            self.stack.append(["{", None])
            self._state = "key_or_end"
        elif ch == "[":
            self.stack.append(["[", 0])
            self._state = "value_or_end"
        elif ch == '"':
            self._state, self._chars, self._is_key = "string", [], False
        elif ch in "-0123456789":
            self._state, self._number = "number", _NUMBER["start"][_number_class(ch)]
        elif ch in _LITERALS:
            self._state, self._literal = "literal", _LITERALS[ch]
        else:
            return False
        return True

    def _end_string(self) -> bool:
        text = json.loads('"' + "".join(self._chars) + '"')
        if self._is_key:
            self.stack[-1][1] = text
            self._state = "colon"
            return True
        if self.hook is not None and not self.hook(self.stack, '"', text):
            return False
        self._after_value()
        return True

    def _close(self) -> bool:
        self.stack.pop()
        self._after_value()
        return True

    def _after_value(self) -> None:
        if self.stack:
            self._state = "after"
        else:
            self._state, self.done = "done", True


def _call(item: Any, names: frozenset[str]) -> tuple[str, dict] | None:
    if not isinstance(item, dict) or item.get("name") not in names:
        return None
    args = item["arguments"] if "arguments" in item else item.get("parameters")
    return (item["name"], args) if isinstance(args, dict) else None


class WholeAnswer:
    """Follows an answer as it streams: is all of it one JSON call, or a list of them (see the
    module's doc)? ``own_bracket`` is the bracket the template's own bare-JSON syntax starts a
    call with (Llama's ``{``): an answer starting with it unfenced is left to that syntax."""

    def __init__(self, names: frozenset[str], own_bracket: str = "") -> None:
        self.names = names
        self.own_bracket = own_bracket
        self._state = "lead"
        self._pos = 0  # how much of the answer has been read
        self._fenced = False
        self._info = ""  # the fence's info string so far
        self._ticks = 0  # backticks of the fence being read
        self._start = 0  # where the JSON starts
        self._json = JsonPrefix(self._hook)
        self._calls: list[tuple[str, dict]] = []

    def read(self, answer: str, final: bool = False) -> list[tuple[str, dict]] | None:
        """``answer`` is the whole answer so far (it only grows between calls). None: it may still
        be a call, hold it. ``[]``: it is not one. The (name, arguments) of each call: it is, and
        the answer has ended (``final``; until then trailing text could still follow)."""
        for i in range(self._pos, len(answer)):
            if not self._step(answer, i):
                self._pos = len(answer)
                self._state = "no"
                return []
        self._pos = len(answer)
        if self._state == "no":
            return []
        if not final:
            return None
        return self._calls if self._state == "end" or (self._state == "trail" and not self._fenced) else []

    def _step(self, answer: str, i: int) -> bool:
        ch = answer[i]
        state = self._state
        if state in ("lead", "gap", "end") and ch in WHITESPACE:
            return True
        if state == "lead":
            if ch == "`":
                self._state, self._fenced, self._ticks = "open", True, 1
                return True
            return ch in "{[" and ch != self.own_bracket and self._begin(i, ch)
        if state == "open":  # the opening fence's backticks
            if ch != "`":
                return False
            self._ticks += 1
            if self._ticks == len(FENCE):
                self._state = "info"
            return True
        if state == "info":  # ``` then "json" or nothing, then whitespace or the JSON
            if self._info in ("", FENCE_INFO) and ch in WHITESPACE:
                self._state = "gap"
                return True
            if self._info in ("", FENCE_INFO) and ch in "{[":
                return self._begin(i, ch)
            if len(self._info) < len(FENCE_INFO) and ch == FENCE_INFO[len(self._info)]:
                self._info += ch
                return True
            return False
        if state == "gap":
            return ch in "{[" and self._begin(i, ch)
        if state == "json":
            if not self._json.feed(ch):
                return False
            if self._json.done:
                self._calls = self._parse(answer[self._start:i + 1])
                self._state = "trail"
                return bool(self._calls)
            return True
        if state == "trail":  # after the JSON: whitespace, then the closing fence if it opened with one
            if ch in WHITESPACE:
                return True
            if self._fenced and ch == "`":
                self._state, self._ticks = "close", 1
                return True
            return False
        if state == "close":
            if ch != "`":
                return False
            self._ticks += 1
            if self._ticks == len(FENCE):
                self._state = "end"
            return True
        return False  # "end": only whitespace may follow

    def _begin(self, i: int, ch: str) -> bool:
        self._state, self._start = "json", i
        return self._json.feed(ch)

    def _hook(self, stack: list[list[Any]], first: str, text: str | None) -> bool:
        """Rejects, as soon as it is written, what no call can hold: a top-level value other than
        an object or a list, a list item other than an object, a ``name`` that is not a string
        naming an offered tool."""
        if not stack:
            return first in "{["
        if len(stack) == 1 and stack[0][0] == "[":
            return first == "{"
        call_object = len(stack) == 1 or (len(stack) == 2 and stack[0][0] == "[")
        if call_object and stack[-1][0] == "{" and stack[-1][1] == "name":
            return first == '"' if text is None else text in self.names
        return True

    def _parse(self, text: str) -> list[tuple[str, dict]]:
        try:
            value = json.loads(text)
        except ValueError:
            return []
        items = value if isinstance(value, list) else [value]
        calls = [_call(item, self.names) for item in items]
        if not calls or any(c is None for c in calls):
            return []
        return calls  # type: ignore[return-value]
