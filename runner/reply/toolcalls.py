"""Tool calls in a model's output: the syntax, derived from the chat template, and a streaming
parser that turns the model's text into content plus :class:`~runner.api.ToolCall` values.

The syntax is not looked up by model name. :func:`derive` renders a probe conversation (a user
turn, then an assistant turn whose only content is one known call) through the template, finds
the JSON that holds the probe call, and keeps what surrounds it: the text before the JSON
(``<tool_call>``, ``[TOOL_CALLS]``, or nothing for bare JSON), the text after it (``</tool_call>``),
whether the JSON is one call or a list of calls, and the keys the template uses for the name and
the arguments (``arguments``, or Llama's ``parameters``). This is what Ollama's ``tools/template.go``
does for its Go templates and llama.cpp's chat parser does for Jinja ones.

:class:`ToolCallParser` follows the output as it streams:

- text before a call streams as content; the end of the text that could be the start of the
  tag is held back, like a partial stop sequence, and so is trailing whitespace: before a call
  it is the template's separator (Qwen's ``"\n"``), which the template writes back itself;
- after the tag, the JSON is collected until its brackets balance; then each call in it is
  emitted once, with its arguments parsed (a dict);
- JSON that does not parse, a call of a tool the request did not offer, or a call cut off by the
  end of the output is given back as content, exactly as the model wrote it.

Besides the template's syntax, when the request names its tools, an answer that is nothing but
a JSON call (bare, or in one ```json fence) of one of them is a call too, as llama.cpp reads it
(:mod:`.jsoncalls`): such an answer is held back while it may still be one, and handed to the
template's syntax unchanged the moment it cannot.
"""

from __future__ import annotations

import json
import re
import secrets
import string
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..api import Message, Tool, ToolCall
from .jsoncalls import WholeAnswer

PROBE_NAME = "pollama_probe_function"
PROBE_ARGS = {"pollama_probe_argument": "pollama probe value"}
PROBE_ID = "call_pollama0probe"  # Mistral's templates want ids of 9+ characters
PROBE_TEXT = "pollama probe answer"
PROBE_TOOL = Tool(PROBE_NAME, "A probe.", {"type": "object", "properties": {"pollama_probe_argument": {"type": "string"}}})

# Keys accepted besides the derived ones: what models write when they stray from their template.
_NAME_KEYS = ("name", "function")
_ARGS_KEYS = ("arguments", "parameters")

_EMPTY_ELEMENT = re.compile(r"^\s*<([\w-]+)>\s*</\1>\s*")

# render(messages, tools, add_generation_prompt) -> prompt text
Render = Callable[[Sequence[Message], Sequence[Tool], bool], str]


@dataclass(frozen=True)
class ToolSyntax:
    """How a template writes an assistant's tool calls: ``prefix`` JSON ``suffix``."""

    prefix: str  # exactly as rendered (e.g. "<tool_call>\n"); "" for bare JSON
    suffix: str  # exactly as rendered (e.g. "\n</tool_call>"); may be ""
    as_list: bool = False  # the JSON is a list of calls
    name_key: str = "name"
    args_key: str = "arguments"

    @property
    def tag(self) -> str:
        """The prefix without surrounding whitespace: what starts a call in the output."""
        return self.prefix.strip()

    @property
    def end_tag(self) -> str:
        return self.suffix.strip()


def _probe_call() -> ToolCall:
    return ToolCall(PROBE_NAME, dict(PROBE_ARGS), id=PROBE_ID)


def derive(render: Render) -> ToolSyntax | None:
    """The tool-call syntax of the template behind ``render``, or None when the template does
    not render tools (the model does not support them) or writes calls in a way that is not
    JSON around a prefix and a suffix. ``render`` raising (a template error) propagates."""
    user = Message("user", "pollama probe question")
    base = render([user], [PROBE_TOOL], True)
    if PROBE_NAME not in base:
        return None  # the tools are not shown to the model
    with_call = render([user, Message("assistant", "", tool_calls=[_probe_call()])], [PROBE_TOOL], False)
    plain = render([user, Message("assistant", PROBE_TEXT)], [PROBE_TOOL], False)
    # the call starts where it differs from both the generation prompt and a text answer (a Go
    # template such as Llama 3.1's writes the last user turn differently, so only the text
    # answer shares all the turn's opening with the call)
    start = max(_common_prefix(base, with_call), _common_prefix(plain, with_call))
    at = with_call.find(PROBE_NAME, start)
    if at < 0:
        return None
    found = _enclosing_json(with_call, start, at)
    if found is None:
        return None
    j, end, value = found
    item = value[0] if isinstance(value, list) and value else value
    if not isinstance(item, dict):
        return None
    name_key = next((k for k, v in item.items() if v == PROBE_NAME), None)
    args_key = next((k for k, v in item.items() if _is_probe_args(v)), None)
    if name_key is None:
        return None
    tail = ""
    if PROBE_TEXT in plain:
        tail = plain[plain.index(PROBE_TEXT) + len(PROBE_TEXT):]
    suffix = with_call[end:]
    if tail and suffix.endswith(tail):
        suffix = suffix[: len(suffix) - len(tail)]
    elif tail.strip() and tail.strip() in suffix:
        suffix = suffix[: suffix.index(tail.strip())]
    # an empty reasoning block the template writes before every answer (Qwen3) is not the call's
    prefix = _EMPTY_ELEMENT.sub("", with_call[start:j], count=1)
    return ToolSyntax(prefix=prefix, suffix=suffix, as_list=isinstance(value, list),
                      name_key=name_key, args_key=args_key or "arguments")


def _is_probe_args(value: Any) -> bool:
    if value == PROBE_ARGS:
        return True
    if isinstance(value, str):
        try:
            return json.loads(value) == PROBE_ARGS
        except ValueError:
            return False
    return False


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _enclosing_json(text: str, start: int, at: int) -> tuple[int, int, Any] | None:
    """The outermost JSON value that begins in ``text[start:at]`` and spans ``at``:
    (its start, its end, the value)."""
    decoder = json.JSONDecoder()
    for j in range(start, at):
        if text[j] not in "{[":
            continue
        try:
            value, end = decoder.raw_decode(text, j)
        except ValueError:
            continue
        if end > at:
            return j, end, value
    return None


# ------------------------------------------------------------------------------------ parsing
def new_call_id() -> str:
    """An id for a call the model made (``call_`` and 8 random characters, as Ollama makes them)."""
    return "call_" + "".join(secrets.choice(string.ascii_lowercase + string.digits) for _ in range(8))


class _JsonSpan:
    """Finds where a JSON object or array that is streaming in ends, incrementally."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.pos = 0

    def end(self, text: str) -> int | None:
        """The index just past the value starting at ``text[0]`` once its brackets balance,
        None while it is incomplete. ``text`` only grows between calls."""
        for i in range(self.pos, len(text)):
            ch = text[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
            elif ch == '"':
                self.in_string = True
            elif ch in "{[":
                self.depth += 1
            elif ch in "}]":
                self.depth -= 1
                if self.depth == 0:
                    self.pos = i + 1
                    return i + 1
        self.pos = len(text)
        return None


def _partial_tail(text: str, tag: str) -> int:
    """The length of the longest end of ``text`` that is a proper start of ``tag``."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


@dataclass
class ToolCallParser:
    """Splits streamed output into content and tool calls (see the module's doc)."""

    syntax: ToolSyntax
    tool_names: frozenset[str] = frozenset()  # the request's tools; empty: any name
    _state: str = "text"  # "text", "call" (after the tag), "suffix" (after a call's JSON)
    _buf: str = ""
    _raw: str = ""  # the call's text as written, given back if it does not parse
    _span: _JsonSpan = field(default_factory=_JsonSpan)
    _at_start: bool = True  # nothing but whitespace so far (bare JSON calls only start there)
    _after_call: bool = False
    _index: int = 0
    _whole: WholeAnswer | None = None  # while the whole answer may be a bare or fenced JSON call
    _held: str = ""  # that answer so far

    def __post_init__(self) -> None:
        if self.tool_names:
            own = "" if self.syntax.tag else ("[" if self.syntax.as_list else "{")
            self._whole = WholeAnswer(self.tool_names, own)

    def feed(self, text: str, final: bool = False) -> tuple[str, list[ToolCall]]:
        """Content that can be shown now, and the calls completed by ``text``. With ``final``
        (the output ended) nothing is held back any more."""
        if self._whole is not None:
            self._held += text
            found = self._whole.read(self._held, final)
            if found is None:
                return "", []
            self._whole, text, self._held = None, self._held, ""
            if found:
                calls = [ToolCall(name, args, index=i, id=new_call_id()) for i, (name, args) in enumerate(found)]
                self._index = len(calls)
                return "", calls
        self._buf += text
        content: list[str] = []
        calls: list[ToolCall] = []
        while True:
            if self._state == "text":
                if not self._text_step(content, final):
                    break
            elif self._state == "call":
                if not self._call_step(content, calls, final):
                    break
            else:
                if not self._suffix_step(final):
                    break
        return "".join(content), calls

    def finish(self) -> tuple[str, list[ToolCall]]:
        return self.feed("", final=True)

    # -- states: each returns True when it changed state and the loop should go on
    def _text_step(self, content: list[str], final: bool) -> bool:
        tag = self.syntax.tag
        if not tag:
            return self._bare_step(content, final)
        buf = self._buf
        k = buf.find(tag)
        if k >= 0:
            before = buf[:k]
            if self._after_call:
                before = before.lstrip()
            # the whitespace before the tag is the template's, which it writes back between the
            # text and the call: not content (given back with the call if the call is not one)
            text = before.rstrip()
            content.append(text)
            self._begin_call(before[len(text):] + tag, buf[k + len(tag):])
            return True
        hold = 0 if final else _partial_tail(buf, tag)
        if not final:  # trailing whitespace may precede a tag: hold it until that is known
            hold += len(buf) - hold - len(buf[: len(buf) - hold].rstrip())
        shown = buf[: len(buf) - hold]
        if self._after_call:
            if not shown.strip():  # whitespace between calls: dropped unless text follows
                if final:
                    self._buf = ""
                return False
            shown = shown.lstrip()
            self._after_call = False
        content.append(shown)
        self._buf = buf[len(buf) - hold:]
        return False

    def _bare_step(self, content: list[str], final: bool) -> bool:
        """Bare JSON: a call can only be the whole answer, starting with its bracket."""
        buf = self._buf
        if self._at_start or self._after_call:
            stripped = buf.lstrip()
            if not stripped:
                if final:
                    self._buf = ""
                    if not self._after_call:
                        content.append(buf)
                return False
            if stripped[0] == ("[" if self.syntax.as_list else "{"):
                self._begin_call(buf[: len(buf) - len(stripped)], stripped)
                return True
            if self._after_call:
                buf = stripped
            self._at_start = self._after_call = False
        content.append(buf)
        self._buf = ""
        return False

    def _begin_call(self, raw: str, rest: str) -> None:
        self._state, self._raw, self._buf = "call", raw, rest
        self._span = _JsonSpan()
        self._at_start = False

    def _call_step(self, content: list[str], calls: list[ToolCall], final: bool) -> bool:
        body = self._buf.lstrip()
        if not body:
            if final:
                self._give_back(content)
            return False
        if body[0] not in "{[":
            self._give_back(content)
            return True
        end = self._span.end(body)
        if end is None:
            if final:
                self._give_back(content)
            return False
        parsed = self._calls(body[:end])
        if parsed is None:
            self._give_back(content)
            return True
        calls.extend(parsed)
        self._raw, self._buf = "", body[end:]
        self._state = "suffix" if self.syntax.end_tag else "text"
        self._after_call = True
        return True

    def _suffix_step(self, final: bool) -> bool:
        end_tag = self.syntax.end_tag
        rest = self._buf.lstrip()
        if rest.startswith(end_tag):
            self._buf = rest[len(end_tag):]
        elif end_tag.startswith(rest) and not final:
            return False  # the end tag may still be coming
        elif end_tag.startswith(rest):
            self._buf = ""
        self._state = "text"
        return True

    def _give_back(self, content: list[str]) -> None:
        """The call did not parse: what the model wrote is content after all."""
        content.append(self._raw + self._buf)
        self._raw, self._buf, self._state = "", "", "text"
        self._after_call = False

    def _calls(self, text: str) -> list[ToolCall] | None:
        try:
            value = json.loads(text)
        except ValueError:
            return None
        items = value if isinstance(value, list) else [value]
        out: list[ToolCall] = []
        for item in items:
            call = self._call(item)
            if call is None:
                return None
            out.append(call)
        if not out:
            return None
        return out

    def _call(self, item: Any) -> ToolCall | None:
        if not isinstance(item, dict):
            return None
        if isinstance(item.get("function"), dict) and "name" in item["function"]:
            item = item["function"]  # {"type": "function", "function": {...}}
        name_keys = (self.syntax.name_key, *_NAME_KEYS)
        name = next((item[k] for k in name_keys if isinstance(item.get(k), str)), None)
        if name is None or (self.tool_names and name not in self.tool_names):
            return None
        args_keys = (self.syntax.args_key, *_ARGS_KEYS)
        args: Any = next((item[k] for k in args_keys if k in item), {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                return None
        if args is None:
            args = {}
        if not isinstance(args, dict):
            return None
        call = ToolCall(name, args, index=self._index, id=new_call_id())
        self._index += 1
        return call
