"""A grammar whose every output is a well-formed call of the request's tools, written in the
model's own tool-call syntax (beyond Ollama, which only parses what the model happens to write).

The call's JSON comes from the tools' JSON schemas (llama.cpp's schema converter, as ``format``
uses): ``{"<name key>": "<one tool's name>", "<args key>": <that tool's parameters>}``, one
alternative per tool, inside the template's prefix and suffix (``<tool_call>\\n`` … ``\\n</tool_call>``)
and, for templates that write a list of calls, brackets. Forced (``tool_choice`` ``required`` or a
named function) the whole answer follows it; with ``auto`` it is lazy: it starts constraining
only once the model writes the call's tag, wherever in the answer (:mod:`runner.sample.lazygrammar`;
for bare JSON, at the top of the answer), so the model may still answer in plain text, or write
some before its call, but a call it starts is well formed.
"""

from __future__ import annotations

import re
import threading
from typing import Sequence

from ..api import Grammar, InvalidRequest, Tool, ToolChoice
from ..reply.toolcalls import ToolSyntax
from . import schemabounds
from .grammarcheck import GrammarCheck


def _literal(text: str) -> str:
    """A GBNF string literal."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r") + '"'


def _regex_literal(text: str) -> str:
    """``text`` as an ECMAScript regular expression (what llama.cpp's std::regex reads)."""
    out = []
    for ch in text:
        if ch in "\\^$.|?*+()[]{}/-":
            out.append("\\" + ch)
        elif ch in "\n\r\t":
            out.append({"\n": "\\n", "\r": "\\r", "\t": "\\t"}[ch])
        else:
            out.append(ch)
    return "".join(out)


def _call_schema(syntax: ToolSyntax, tool: Tool) -> dict:
    params = tool.parameters if isinstance(tool.parameters, dict) and tool.parameters else {"type": "object"}
    return {
        "type": "object",
        "properties": {syntax.name_key: {"const": tool.name}, syntax.args_key: params},
        "required": [syntax.name_key, syntax.args_key],
        "additionalProperties": False,
    }


def tool_call_grammar(syntax: ToolSyntax, tools: Sequence[Tool], choice: ToolChoice,
                      parallel: bool | None, grammars: GrammarCheck,
                      cancel: threading.Event | None = None) -> Grammar:
    """The grammar for a request's tool calls (see the module's doc), its schemas bounded,
    converted and the whole compiled by ``grammars``. Several calls in one answer only when
    ``parallel`` is True. Raises InvalidRequest for a schema over a bound or that does not
    convert, or a named function that is not among ``tools``."""
    chosen = list(tools)
    if choice.mode == "function":
        chosen = [t for t in tools if t.name == choice.name]
        if not chosen:
            raise InvalidRequest(f"tool_choice names {choice.name!r}, which is not one of the tools")
    for tool in chosen:
        schemabounds.check(tool.parameters, f'the parameters of tool "{tool.name}"')
    schemas = [_call_schema(syntax, t) for t in chosen]
    schema = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
    body = grammars.schema_gbnf(schema, "tools", cancel)
    body = re.sub(r"^root ::=", "tool-call ::=", body, count=1, flags=re.M)
    if syntax.as_list:
        calls = '"[" tool-call ("," space tool-call)* "]"' if parallel else '"[" tool-call "]"'
    else:
        calls = "tool-call"
    # around the JSON, the template's tags with up to two spaces or newlines (the template's
    # own "\n" among them): a model that drops one is still on the grammar's path
    parts = [_literal(syntax.tag)] if syntax.tag else []
    parts += ["gap", calls, "gap"] if syntax.tag or syntax.end_tag else [calls]
    parts += [_literal(syntax.end_tag)] if syntax.end_tag else []
    many = 'tool-block ("\\n" tool-block)*' if parallel and not syntax.as_list else "tool-block"
    gbnf = f"root ::= {many}\ntool-block ::= {' '.join(parts)}\ngap ::= [ \\n]? [ \\n]?\n{body}"
    gbnf = grammars.compiled(gbnf, "tools", cancel)
    if choice.forced:
        return Grammar(gbnf)
    # auto, with a tag: lazily, from wherever the model writes the tag (runner.sample.lazygrammar)
    if syntax.tag:
        return Grammar(gbnf, tag=syntax.tag)
    # auto, bare JSON: a call is only a call at the top of the answer (the parser's rule), so the
    # trigger is an opening bracket there. It must match all the output so far (llama.cpp's
    # regex_match after each token): anchored, it fails at the first other character, so its cost
    # does not grow with the answer; ending at the bracket, it fires only when a token ends there,
    # so the grammar never starts in the middle of a token it rejects (llama.cpp aborts on that).
    opening = "[" if syntax.as_list else "{"
    trigger = r"\s*(" + _regex_literal(opening) + r")"
    return Grammar(gbnf, trigger)
