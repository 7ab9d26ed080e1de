"""Go's ``text/template``, the subset Ollama's Modelfile ``TEMPLATE``\\ s use, parsed and rendered
within a :class:`~runner.template.sandbox.RenderBudget`.

The language, as Go defines it: text with actions in ``{{ }}``; ``{{-`` and ``-}}`` trim the
whitespace beside them; ``{{/* comments */}}``; ``if``/``else if``/``else``/``end``, ``range``
(over lists, maps in key order, and integers, with ``$i, $x :=``), ``with``/``else with``,
``break``/``continue``; variables (``$x := …``, ``$x = …``, ``$`` is the data); fields
``.A.B``, ``$x.A``, ``(pipeline).A``; pipelines ``a | f b``; Go's functions ``and or not len
index slice eq ne lt le gt ge print printf println html urlquery js`` and Ollama's ``json
currentDate yesterdayDate toTypeScriptType``. ``define``/``template``/``block`` are refused.

Data is plain Python: ``dict`` is a Go map (a missing key is *no value*, printed ``<no value>``,
as Ollama's ``missingkey=zero`` over ``map[string]any`` does), :class:`Struct` a Go struct (an
unknown field is an error), ``list``, ``str``, ``int``, ``float``, ``bool``, ``None`` (nil).

Untrusted: a template is data from a Modelfile, a registry or a request. Parsing is linear (a
variable is found without scanning the others) and nesting is bounded; rendering ticks the
budget for every action, loop step and call, checks the size of every string it builds before
building it (and counts them all together), and stops with one
:class:`~runner.api.InvalidRequest` line (or :class:`~runner.api.Cancelled`).
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import re
import urllib.parse
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Mapping, Sequence

from ..api import InvalidRequest
from .sandbox import RenderBudget, check_source, run_bounded

__all__ = ["NO_VALUE", "JSONList", "JSONMap", "Struct", "Template", "TemplateError", "parse", "render"]

MAX_DEPTH = 100  # nesting of blocks and parentheses a template may have (Python's stack is the limit)


class TemplateError(InvalidRequest):
    """A template that does not parse, or fails as it runs (one line, Go's wording where it has one)."""


class _NoValue:
    """Go's invalid value: a map's missing key. Prints ``<no value>``, is false, is nil to ``eq``."""

    _instance: "_NoValue | None" = None

    def __new__(cls) -> "_NoValue":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "<no value>"


NO_VALUE = _NoValue()


_FIELDS = object()  # Struct.json's default: encoding/json writes the fields by name


@dataclass(frozen=True)
class Struct:
    """A Go struct value: named fields in order. ``.Name`` of a field it lacks is an error.

    ``json`` is what ``encoding/json`` writes for it when its fields have json tags (another
    Struct whose field names are the tags, dicts for maps); by default its fields by name.
    ``stringer``: the type has a ``String()`` method that returns that JSON, so printing it
    (``{{ . }}``) writes the JSON, not Go's ``{a b}`` (Ollama's tool types)."""

    type_name: str
    fields: Mapping[str, Any]
    json: Any = _FIELDS
    stringer: bool = False


class JSONMap(dict):
    """An ordered map whose type has a ``String()`` method returning its JSON (Ollama's
    ``ToolCallFunctionArguments`` and ``ToolPropertiesMap``): printed as JSON, otherwise a map.
    Unlike a Go map, its keys keep the order they came in, when ranged over and in its JSON
    (nested objects too): a call's arguments are written back as the model or the client wrote
    them, so a conversation sent again renders to the same prompt."""


class JSONList(list):
    """A Go slice whose type has a ``String()`` method returning its JSON (Ollama's
    ``templateTools``): printed as JSON, otherwise a slice."""


# ------------------------------------------------------------------------------------ the tree
@dataclass
class Field:  # .A.B
    idents: tuple[str, ...]


@dataclass
class Variable:  # $x.A.B ($ alone: the data)
    name: str
    idents: tuple[str, ...] = ()


@dataclass
class Dot:
    pass


@dataclass
class Literal:  # a string, number, bool or nil
    value: Any


@dataclass
class Function:  # an identifier naming a function
    name: str


@dataclass
class Chain:  # (pipeline).A.B
    node: Any
    idents: tuple[str, ...]


@dataclass
class Command:
    args: list[Any]


@dataclass
class Pipe:
    line: int
    decl: list[str] = field(default_factory=list)  # variables declared (:=) or assigned (=)
    assign: bool = False
    cmds: list[Command] = field(default_factory=list)


@dataclass
class Text:
    text: str


@dataclass
class Action:
    pipe: Pipe


@dataclass
class Branch:  # if / range / with
    kind: str
    pipe: Pipe
    body: list[Any]
    else_body: list[Any] | None = None


@dataclass
class Break:
    line: int


@dataclass
class Continue:
    line: int


# ---------------------------------------------------------------------------------- the lexer
_SPACE = " \t\r\n"
_KEYWORDS = {"block", "break", "continue", "define", "else", "end", "if", "range", "nil", "template", "with",
             "true", "false"}
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NUMBER = re.compile(
    r"[+-]?(?:0[xX][0-9a-fA-F_]+|0[bB][01_]+|0[oO][0-7_]+|(?:\d[\d_]*\.?[\d_]*|\.\d[\d_]*)(?:[eE][+-]?\d+)?)")
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\",
            "'": "'", '"': '"'}


@dataclass
class _Tok:
    kind: str  # text, left, right, space, field, var, ident, keyword, string, number, char, op, eof
    value: Any
    line: int


def _unquote(body: str, line: int, quote: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        i += 1
        if i >= len(body):
            break
        e = body[i]
        if e in _ESCAPES and (e != "'" or quote == "'") and (e != '"' or quote == '"'):
            out.append(_ESCAPES[e])
            i += 1
        elif e in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i + 1:i + 1 + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise TemplateError(f"template: line {line}: invalid escape \\{e}{digits}")
            code = int(digits, 16)
            if e == "x":
                out.append(bytes([code]).decode("latin-1"))
            elif code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                raise TemplateError(f"template: line {line}: invalid Unicode escape")
            else:
                out.append(chr(code))
            i += 1 + n
        elif e in "01234567":
            digits = body[i:i + 3]
            if len(digits) != 3 or not all(d in "01234567" for d in digits):
                raise TemplateError(f"template: line {line}: invalid octal escape")
            out.append(chr(int(digits, 8) & 0xFF))
            i += 3
        else:
            raise TemplateError(f"template: line {line}: unknown escape sequence \\{e}")
    return "".join(out)


def _lex(src: str) -> list[_Tok]:
    """Tokens of ``src``: text and the insides of actions (trim markers applied to the text)."""
    toks: list[_Tok] = []
    pos, line, n = 0, 1, len(src)
    trim_next = False
    while pos < n:
        start = src.find("{{", pos)
        text = src[pos:] if start < 0 else src[pos:start]
        if trim_next:
            text = text.lstrip(_SPACE)
        left_trim = start >= 0 and src.startswith("-", start + 2) and start + 3 < n and src[start + 3] in _SPACE
        if left_trim:
            text = text.rstrip(_SPACE)
        if text:
            toks.append(_Tok("text", text, line))
        line += src.count("\n", pos, start if start >= 0 else n)
        if start < 0:
            break
        pos = start + (4 if left_trim else 2)
        # a comment fills the whole action
        if src.startswith("/*", pos):
            end = src.find("*/", pos + 2)
            if end < 0:
                raise TemplateError(f"template: line {line}: unclosed comment")
            line += src.count("\n", pos, end)
            after = end + 2
            if src.startswith("}}", after):
                trim_next, pos = False, after + 2
            elif src.startswith(" -}}", after) or (after < n and src[after] in _SPACE and src.startswith("-}}", after + 1)):
                trim_next, pos = True, after + 4
            else:
                raise TemplateError(f"template: line {line}: comment ends before closing delimiter")
            continue
        toks.append(_Tok("left", None, line))
        pos, line, trim_next = _lex_action(src, pos, line, toks)
    toks.append(_Tok("eof", None, line))
    return toks


def _lex_action(src: str, pos: int, line: int, toks: list[_Tok]) -> tuple[int, int, bool]:
    """Lex one action from ``pos`` (just inside ``{{``) to its ``}}``; the position after it,
    the line, and whether it ends with a trim marker."""
    n, depth = len(src), 0
    while True:
        if pos >= n:
            raise TemplateError(f"template: line {line}: unclosed action")
        c = src[pos]
        if src.startswith("}}", pos):
            if depth:
                raise TemplateError(f"template: line {line}: unclosed left paren")
            toks.append(_Tok("right", None, line))
            return pos + 2, line, False
        if c in _SPACE:
            if src.startswith("-}}", pos + 1):
                if depth:
                    raise TemplateError(f"template: line {line}: unclosed left paren")
                toks.append(_Tok("right", None, line))
                return pos + 4, line, True
            end = pos
            while end < n and src[end] in _SPACE:
                end += 1
            if src.startswith("-}}", end):  # "  -}}": the last space belongs to the trim marker
                end -= 1
            line += src.count("\n", pos, end)
            toks.append(_Tok("space", None, line))
            pos = end
            continue
        if c == "(":
            depth += 1
            if depth > MAX_DEPTH:
                raise TemplateError(f"template: line {line}: parentheses nest too deeply")
            toks.append(_Tok("op", "(", line))
            pos += 1
        elif c == ")":
            depth -= 1
            if depth < 0:
                raise TemplateError(f"template: line {line}: unexpected right paren")
            toks.append(_Tok("op", ")", line))
            pos += 1
        elif src.startswith(":=", pos):
            toks.append(_Tok("op", ":=", line))
            pos += 2
        elif c in "=|,":
            toks.append(_Tok("op", c, line))
            pos += 1
        elif c == '"':
            end = pos + 1
            while end < n and src[end] != '"':
                if src[end] == "\n":
                    raise TemplateError(f"template: line {line}: unterminated quoted string")
                end += 2 if src[end] == "\\" else 1
            if end >= n:
                raise TemplateError(f"template: line {line}: unterminated quoted string")
            toks.append(_Tok("string", _unquote(src[pos + 1:end], line, '"'), line))
            pos = end + 1
        elif c == "`":
            end = src.find("`", pos + 1)
            if end < 0:
                raise TemplateError(f"template: line {line}: unterminated raw quoted string")
            toks.append(_Tok("string", src[pos + 1:end].replace("\r", ""), line))
            line += src.count("\n", pos, end)
            pos = end + 1
        elif c == "'":
            end = pos + 1
            while end < n and src[end] != "'":
                if src[end] == "\n":
                    break
                end += 2 if src[end] == "\\" else 1
            if end >= n or src[end] != "'":
                raise TemplateError(f"template: line {line}: unterminated character constant")
            chars = _unquote(src[pos + 1:end], line, "'")
            if len(chars) != 1:
                raise TemplateError(f"template: line {line}: malformed character constant: {src[pos:end + 1]}")
            toks.append(_Tok("char", ord(chars), line))
            pos = end + 1
        elif c == "$":
            m = _IDENT.match(src, pos + 1)
            name = "$" + (m.group() if m else "")
            toks.append(_Tok("var", name, line))
            pos += len(name)
        elif c == "." and not (pos + 1 < n and src[pos + 1].isdigit()):
            m = _IDENT.match(src, pos + 1)
            if m:
                toks.append(_Tok("field", m.group(), line))
                pos = m.end()
            else:
                toks.append(_Tok("dot", None, line))
                pos += 1
        elif c.isdigit() or c in "+-." :
            m = _NUMBER.match(src, pos)
            if not m or not m.group().lstrip("+-"):
                raise TemplateError(f"template: line {line}: unexpected {c!r} in command")
            toks.append(_Tok("number", _number(m.group(), line), line))
            pos = m.end()
        elif c.isalpha() or c == "_":
            m = _IDENT.match(src, pos)
            assert m is not None
            word = m.group()
            toks.append(_Tok("keyword" if word in _KEYWORDS else "ident", word, line))
            pos = m.end()
        else:
            raise TemplateError(f"template: line {line}: unexpected {c!r} in command")


def _number(text: str, line: int) -> int | float:
    clean = text.replace("_", "")
    try:
        if re.fullmatch(r"[+-]?0[xXbBoO].*", clean):
            return int(clean, 0)
        if re.fullmatch(r"[+-]?\d+", clean):
            return int(clean, 10) if not re.fullmatch(r"[+-]?0\d+", clean) else int(clean, 8)
        return float(clean)
    except ValueError:
        raise TemplateError(f"template: line {line}: bad number syntax: {text!r}") from None


# --------------------------------------------------------------------------------- the parser
_FUNCS_ALLOWED: set[str] = set()  # filled below, once the functions are defined


class _Names:
    """The variable names in scope while parsing: a stack, counted by name (a template that
    declares thousands of variables does not make each use scan them all)."""

    def __init__(self) -> None:
        self.stack: list[str] = ["$"]
        self.count: dict[str, int] = {"$": 1}

    def __len__(self) -> int:
        return len(self.stack)

    def __contains__(self, name: object) -> bool:
        return self.count.get(name, 0) > 0  # type: ignore[call-overload]

    def extend(self, names: Sequence[str]) -> None:
        for name in names:
            self.stack.append(name)
            self.count[name] = self.count.get(name, 0) + 1

    def __delitem__(self, cut: slice) -> None:  # del names[mark:]
        for name in self.stack[cut]:
            self.count[name] -= 1
        del self.stack[cut]


class _Parser:
    def __init__(self, src: str) -> None:
        self.toks = _lex(src)
        self.i = 0
        self.vars = _Names()
        self.depth = 0
        self.loops = 0

    # tokens
    def peek(self, skip_space: bool = True) -> _Tok:
        i = self.i
        while skip_space and self.toks[i].kind == "space":
            i += 1
        return self.toks[i]

    def next(self, skip_space: bool = True) -> _Tok:
        while skip_space and self.toks[self.i].kind == "space":
            self.i += 1
        tok = self.toks[self.i]
        if tok.kind != "eof":
            self.i += 1
        return tok

    def error(self, tok: _Tok, message: str) -> TemplateError:
        return TemplateError(f"template: line {tok.line}: {message}")

    def expect_right(self, context: str) -> None:
        tok = self.next()
        if tok.kind != "right":
            raise self.error(tok, f"unexpected {_describe(tok)} in {context}")

    # lists
    def parse(self) -> list[Any]:
        nodes, end = self.list_until(top=True)
        return nodes

    def list_until(self, top: bool = False) -> tuple[list[Any], tuple[str, _Tok]]:
        """Nodes up to ``{{end}}`` or ``{{else …}}`` (the keyword and its token), or EOF at the top."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise self.error(self.peek(), "blocks nest too deeply")
        nodes: list[Any] = []
        while True:
            tok = self.next(skip_space=False)
            if tok.kind == "eof":
                if not top:
                    raise self.error(tok, "unexpected EOF")
                self.depth -= 1
                return nodes, ("eof", tok)
            if tok.kind == "text":
                nodes.append(Text(tok.value))
                continue
            # tok is "left"
            word = self.peek()
            if word.kind == "keyword" and word.value in ("end", "else"):
                if top:
                    raise self.error(word, f"unexpected {{{{{word.value}}}}}")
                self.next()
                self.depth -= 1
                return nodes, (word.value, word)
            nodes.append(self.action())

    def action(self) -> Any:
        tok = self.peek()
        if tok.kind == "keyword":
            if tok.value in ("if", "range", "with"):
                self.next()
                return self.control(tok.value, tok)
            if tok.value in ("break", "continue"):
                self.next()
                if not self.loops:
                    raise self.error(tok, f"{{{{{tok.value}}}}} outside {{{{range}}}}")
                self.expect_right(tok.value)
                return Break(tok.line) if tok.value == "break" else Continue(tok.line)
            if tok.value in ("define", "template", "block"):
                raise self.error(tok, f"{{{{{tok.value}}}}} is not supported in chat templates")
        return Action(self.pipeline("command", decl_ok=True))

    def control(self, kind: str, tok: _Tok) -> Branch:
        mark = len(self.vars)
        pipe = self.pipeline(kind, decl_ok=True, range_decl=(kind == "range"))
        if kind == "range":
            self.loops += 1
        body, (end, end_tok) = self.list_until()
        if kind == "range":
            self.loops -= 1
        else_body = None
        if end == "else":
            nxt = self.peek()
            if kind in ("if", "with") and nxt.kind == "keyword" and nxt.value == kind:
                # {{else if …}} / {{else with …}}: a nested branch that shares this {{end}}
                self.next()
                else_body = [self.control(kind, nxt)]
            else:
                self.expect_right("else")
                else_body, (end, end_tok) = self.list_until()
                if end != "end":
                    raise self.error(end_tok, "expected end; found {{else}}")
                self.expect_right("end")
        else:
            self.expect_right("end")
        del self.vars[mark:]
        return Branch(kind, pipe, body, else_body)

    def pipeline(self, context: str, decl_ok: bool = False, range_decl: bool = False) -> Pipe:
        first = self.peek()
        pipe = Pipe(first.line)
        if decl_ok and first.kind == "var":
            # look ahead for "$x :=", "$x =", "$i, $x :="
            save = self.i
            names = [self.next().value]
            tok = self.next()
            if tok.kind == "op" and tok.value == "," and range_decl:
                second = self.next()
                if second.kind != "var":
                    raise self.error(second, "range can only initialize variables")
                names.append(second.value)
                tok = self.next()
                if not (tok.kind == "op" and tok.value == ":="):
                    raise self.error(tok, "range can only initialize variables")
            if tok.kind == "op" and tok.value in (":=", "="):
                if tok.value == "=":
                    if names[0] not in self.vars:
                        raise self.error(tok, f'undefined variable "{names[0]}"')
                    pipe.assign = True
                pipe.decl = names
            else:
                self.i = save
        while True:
            pipe.cmds.append(self.command(context))
            tok = self.peek()
            if not (tok.kind == "op" and tok.value == "|"):
                break
            self.next()
        if pipe.decl and not pipe.assign:
            self.vars.extend(pipe.decl)
        for stage, cmd in enumerate(pipe.cmds[1:], start=2):
            if isinstance(cmd.args[0], (Literal, Dot)):
                raise self.error(first, f"non executable command in pipeline stage {stage}")
        if context != "paren":
            self.expect_right(context)
        return pipe

    def command(self, context: str) -> Command:
        args: list[Any] = []
        while True:
            tok = self.peek(skip_space=False)
            if tok.kind == "space":
                self.next(skip_space=False)
                continue
            if tok.kind == "right" or tok.kind == "eof" or (tok.kind == "op" and tok.value in ("|", ")")):
                break
            args.append(self.operand())
            nxt = self.peek(skip_space=False)
            if nxt.kind not in ("space", "right", "eof") and not (nxt.kind == "op" and nxt.value in ("|", ")")):
                raise self.error(nxt, f"unexpected {_describe(nxt)} in operand")
        if not args:
            tok = self.peek()
            raise self.error(tok, "missing command" if tok.kind == "op" and tok.value == "|" else f"missing value for {context}")
        return Command(args)

    def operand(self) -> Any:
        node = self.term()
        idents: list[str] = []
        while self.peek(skip_space=False).kind == "field":
            idents.append(self.next(skip_space=False).value)
        if not idents:
            return node
        if isinstance(node, Field):
            return Field(node.idents + tuple(idents))
        if isinstance(node, Variable):
            return Variable(node.name, node.idents + tuple(idents))
        if isinstance(node, (Literal, Dot)):
            raise self.error(self.peek(), "unexpected . after term")
        return Chain(node, tuple(idents))

    def term(self) -> Any:
        tok = self.next(skip_space=False)
        if tok.kind == "field":
            return Field((tok.value,))
        if tok.kind == "var":
            if tok.value not in self.vars:
                raise self.error(tok, f'undefined variable "{tok.value}"')
            return Variable(tok.value)
        if tok.kind == "dot":
            return Dot()
        if tok.kind in ("string", "number"):
            return Literal(tok.value)
        if tok.kind == "char":
            return Literal(tok.value)
        if tok.kind == "keyword" and tok.value in ("true", "false"):
            return Literal(tok.value == "true")
        if tok.kind == "keyword" and tok.value == "nil":
            return Literal(None)
        if tok.kind == "ident":
            if tok.value not in _FUNCS_ALLOWED:
                raise self.error(tok, f'function "{tok.value}" not defined')
            return Function(tok.value)
        if tok.kind == "op" and tok.value == "(":
            self.depth += 1
            if self.depth > MAX_DEPTH:
                raise self.error(tok, "parentheses nest too deeply")
            pipe = self.pipeline("paren")
            close = self.next()
            if not (close.kind == "op" and close.value == ")"):
                raise self.error(close, "unclosed left paren")
            self.depth -= 1
            return Chain(pipe, ())
        raise self.error(tok, f"unexpected {_describe(tok)} in operand")


def _describe(tok: _Tok) -> str:
    if tok.kind == "right":
        return '"}}"'
    if tok.kind == "eof":
        return "EOF"
    if tok.kind in ("op", "keyword", "ident", "field", "var"):
        return f"<{'.' if tok.kind == 'field' else ''}{tok.value}>"
    return tok.kind


# ------------------------------------------------------------------------------- a template
@dataclass(frozen=True)
class Template:
    """A parsed template: its nodes and the identifiers it uses."""

    nodes: tuple[Any, ...]

    def identifiers(self) -> set[str]:
        """Every field and variable name it mentions, lowercased (Ollama's ``Vars``)."""
        out: set[str] = set()
        _walk_identifiers(list(self.nodes), out)
        return out

    def with_nodes(self, nodes: list[Any]) -> "Template":
        return replace(self, nodes=tuple(nodes))

    def cut_after_field(self, name: str) -> "Template":
        """A copy without everything that follows the first field ``.name`` in document order
        (the conditions of the blocks around it stay): Ollama renders the turn being answered
        this way, the template's part up to where the response goes. A pipeline with a command
        emptied by the cut goes whole, as in Ollama's ``deleteNode``."""
        state = {"cut": False}

        def gone(node: Any) -> bool:
            if isinstance(node, Field) and name in node.idents:
                state["cut"] = True
                return False
            return state["cut"]

        def walk_list(nodes: list[Any]) -> list[Any]:
            out = []
            for node in nodes:
                kept = walk(node)
                if kept is not None:
                    out.append(kept)
            return out

        def walk_pipe(pipe: Pipe) -> Pipe | None:
            cmds = []
            for cmd in pipe.cmds:
                args = [a for a in (walk_arg(arg) for arg in cmd.args) if a is not None]
                if not args:
                    return None
                cmds.append(Command(args))
            return replace(pipe, cmds=cmds) if cmds else None

        def walk_arg(arg: Any) -> Any:
            if gone(arg):
                return None
            if isinstance(arg, Chain) and isinstance(arg.node, Pipe):
                pipe = walk_pipe(arg.node)
                return None if pipe is None else Chain(pipe, arg.idents)
            return arg

        def walk(node: Any) -> Any:
            if gone(node):
                return None
            if isinstance(node, Action):
                pipe = walk_pipe(node.pipe)
                return None if pipe is None else Action(pipe)
            if isinstance(node, Branch):
                body = walk_list(node.body)
                else_body = None
                if node.else_body is not None:
                    else_body = [] if state["cut"] else walk_list(node.else_body)
                return Branch(node.kind, node.pipe, body, else_body)
            return node

        return self.with_nodes(walk_list(list(self.nodes)))


def _walk_identifiers(nodes: list[Any], out: set[str]) -> None:
    for node in nodes:
        if isinstance(node, Action):
            _pipe_identifiers(node.pipe, out)
        elif isinstance(node, Branch):
            _pipe_identifiers(node.pipe, out)
            _walk_identifiers(node.body, out)
            _walk_identifiers(node.else_body or [], out)


def _pipe_identifiers(pipe: Pipe, out: set[str]) -> None:
    for cmd in pipe.cmds:
        for arg in cmd.args:
            if isinstance(arg, Field):
                out.update(i.lower() for i in arg.idents)
            elif isinstance(arg, Variable):
                out.add(arg.name.lower())
                out.update(i.lower() for i in arg.idents)
            elif isinstance(arg, Chain) and isinstance(arg.node, Pipe):
                _pipe_identifiers(arg.node, out)


@functools.lru_cache(maxsize=32)
def parse(source: str) -> Template:
    """Parse ``source`` (cached). Raises TemplateError with the line it failed on, or
    InvalidRequest for a text over the sandbox's size bound."""
    check_source(source)
    try:
        return Template(tuple(_Parser(source).parse()))
    except RecursionError:
        raise TemplateError("template: nests too deeply") from None


# ---------------------------------------------------------------------------- printing values
def _go_float(value: float) -> str:
    """Go's ``%v`` of a float64: the shortest digits, exponent form below 1e-4 and from 1e21."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if str(value).startswith("-") else "0"
    digits, exp = _shortest(value)
    sign = "-" if value < 0 else ""
    point = exp + 1  # digits d1.d2… × 10^exp
    if exp < -4 or exp >= 21:
        mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return f"{sign}{mantissa}e{'+' if exp >= 0 else '-'}{abs(exp):02d}"
    if point <= 0:
        return f"{sign}0.{'0' * -point}{digits}"
    if point >= len(digits):
        return f"{sign}{digits}{'0' * (point - len(digits))}"
    return f"{sign}{digits[:point]}.{digits[point:]}"


def _shortest(value: float) -> tuple[str, int]:
    text = repr(abs(value))
    mantissa, _, exponent = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    exp = int(exponent or 0) + len(whole) - 1
    if whole.strip("0") == "":  # 0.000123
        lead = len(frac) - len(frac.lstrip("0"))
        exp = int(exponent or 0) - lead - 1
    digits = digits.rstrip("0") or "0"
    return digits, exp


def to_text(value: Any, top: bool = True) -> str:
    """How Go prints ``value`` in an action (fmt's ``%v``)."""
    if isinstance(value, str):
        return value
    if value is NO_VALUE:
        return "<no value>"
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, (JSONMap, JSONList)) or (isinstance(value, Struct) and value.stringer):
        return _go_json(value)
    if isinstance(value, (list, tuple)):
        return "[" + " ".join(to_text(v, False) for v in value) + "]"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{to_text(k, False)}:{to_text(value[k], False)}" for k in _sorted_keys(value)) + "]"
    if isinstance(value, Struct):
        return "{" + " ".join(to_text(v, False) for v in value.fields.values()) + "}"
    return str(value)


def _sorted_keys(mapping: Mapping[Any, Any]) -> list[Any]:
    try:
        return sorted(mapping)
    except TypeError:
        return list(mapping)


def _map_keys(mapping: Mapping[Any, Any]) -> list[Any]:
    """The order ``range`` visits a map in: a Go map's sorted keys, a :class:`JSONMap`'s own."""
    return list(mapping) if isinstance(mapping, JSONMap) else _sorted_keys(mapping)


def _truth(value: Any) -> bool:
    if value is NO_VALUE or value is None:
        return False
    if isinstance(value, Struct):
        return True
    if isinstance(value, (bool, int, float, str, list, tuple, dict)):
        return bool(value)
    return True


def _type_name(value: Any) -> str:
    if value is None or value is NO_VALUE:
        return "interface {}"
    if isinstance(value, Struct):
        return value.type_name
    return {bool: "bool", int: "int", float: "float64", str: "string", list: "[]interface {}",
            tuple: "[]interface {}", dict: "map[string]interface {}",
            JSONMap: "map[string]interface {}", JSONList: "[]interface {}"}.get(type(value), type(value).__name__)


# ------------------------------------------------------------------------------- the functions
def _eq(state: "_State", a: Any, *rest: Any) -> bool:
    if not rest:
        raise TemplateError("error calling eq: missing argument for comparison")
    for b in rest:
        if _equal(a, b):
            return True
    return False


def _kind(value: Any) -> str:
    if value is None or value is NO_VALUE:
        return "nil"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    return "other"


def _equal(a: Any, b: Any) -> bool:
    ka, kb = _kind(a), _kind(b)
    if ka != kb:
        if ka == "nil" or kb == "nil":
            return False
        raise TemplateError("error calling eq: incompatible types for comparison")
    if ka == "nil":
        return True
    if ka == "other":
        if isinstance(a, (list, dict)) or isinstance(b, (list, dict)):
            raise TemplateError(f"error calling eq: non-comparable type {_type_name(a)}")
        return a is b or a == b
    return a == b


def _ne(state: "_State", a: Any, b: Any) -> bool:
    return not _equal(a, b)


def _ordered(name: str) -> Callable[..., bool]:
    def compare(state: "_State", a: Any, b: Any) -> bool:
        ka, kb = _kind(a), _kind(b)
        if ka not in ("int", "float", "string") or kb not in ("int", "float", "string"):
            raise TemplateError(f"error calling {name}: invalid type for comparison")
        if ka != kb:
            raise TemplateError(f"error calling {name}: incompatible types for comparison")
        if ka == "string":
            a, b = a.encode("utf-8", "surrogatepass"), b.encode("utf-8", "surrogatepass")
        return {"lt": a < b, "le": a <= b, "gt": a > b, "ge": a >= b}[name]

    return compare


def _not(state: "_State", value: Any) -> bool:
    return not _truth(value)


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def _len(state: "_State", value: Any) -> int:
    if isinstance(value, str):
        return len(_utf8(value))
    if isinstance(value, (list, tuple, dict)):
        return len(value)
    if value is None or value is NO_VALUE:
        raise TemplateError("error calling len: len of nil pointer")
    raise TemplateError(f"error calling len: len of type {_type_name(value)}")


def _as_index(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TemplateError(f"error calling {name}: cannot index slice/array with type {_type_name(value)}")
    return value


def _index(state: "_State", item: Any, *indexes: Any) -> Any:
    for idx in indexes:
        if isinstance(item, dict):
            item = item.get(idx, NO_VALUE) if isinstance(idx, str) else NO_VALUE
        elif isinstance(item, (list, tuple, str)):
            i = _as_index(idx, "index")
            seq = _utf8(item) if isinstance(item, str) else item
            if not 0 <= i < len(seq):
                raise TemplateError(f"error calling index: index out of range: {i}")
            item = seq[i]
        elif item is None or item is NO_VALUE:
            raise TemplateError("error calling index: index of untyped nil")
        else:
            raise TemplateError(f"error calling index: can't index item of type {_type_name(item)}")
    return item


def _slice(state: "_State", item: Any, *indexes: Any) -> Any:
    if item is None or item is NO_VALUE:
        raise TemplateError("error calling slice: slice of untyped nil")
    if not isinstance(item, (list, tuple, str)):
        raise TemplateError(f"error calling slice: can't slice item of type {_type_name(item)}")
    if len(indexes) > 3:
        raise TemplateError(f"error calling slice: too many slice indexes: {len(indexes)}")
    if len(indexes) == 3 and isinstance(item, str):
        raise TemplateError("error calling slice: cannot 3-index slice a string")
    seq = _utf8(item) if isinstance(item, str) else item
    bounds = [_as_index(i, "slice") for i in indexes]
    cap = len(seq)
    for b in bounds:
        if not 0 <= b <= cap:
            raise TemplateError(f"error calling slice: index out of range: {b}")
    lo = bounds[0] if bounds else 0
    hi = bounds[1] if len(bounds) > 1 else len(seq)
    if hi < lo:
        raise TemplateError(f"error calling slice: invalid slice index: {lo} > {hi}")
    if len(bounds) == 3 and bounds[2] < hi:
        raise TemplateError(f"error calling slice: invalid slice index: {hi} > {bounds[2]}")
    part = seq[lo:hi]
    if isinstance(item, str):
        return part.decode("utf-8", "surrogateescape")
    return part if isinstance(part, list) else list(part)


def _sprint(values: Sequence[Any], state: "_State | None" = None, factor: int = 1) -> str:
    """Go's Sprint; with ``state``, the result (``factor`` times, for what escapes it) is sized
    before it is built."""
    if state is not None:
        state.check_size(factor * sum(state.budget.size(v) + 1 for v in values))
    out: list[str] = []
    for i, v in enumerate(values):
        if i and not isinstance(v, str) and not isinstance(values[i - 1], str):
            out.append(" ")
        out.append(to_text(v))
    return "".join(out)


def _print(state: "_State", *values: Any) -> str:
    state.check_size(sum(state.budget.size(v) + 1 for v in values))
    return _sprint(values)


def _println(state: "_State", *values: Any) -> str:
    state.check_size(sum(state.budget.size(v) + 1 for v in values) + 1)
    return " ".join(to_text(v) for v in values) + "\n"


_VERB = re.compile(r"%([-+# 0]*)(\*|\d+)?(?:\.(\*|\d*))?(.)?", re.S)


def _printf(state: "_State", fmt: Any = NO_VALUE, *args: Any) -> str:
    if not isinstance(fmt, str):
        raise TemplateError(f"error calling printf: format must be a string, not {_type_name(fmt)}")
    budget = state.budget
    out: list[str] = []
    total = 0
    i, argi = 0, 0
    args = list(args)
    while i < len(fmt):
        j = fmt.find("%", i)
        if j < 0:
            out.append(fmt[i:])
            break
        out.append(fmt[i:j])
        m = _VERB.match(fmt, j)
        assert m is not None
        flags, width, prec, verb = m.group(1), m.group(2), m.group(3), m.group(4)
        i = m.end()
        if verb is None:
            out.append("%!(NOVERB)")
            continue
        if verb == "%":
            out.append("%")
            continue
        if width == "*":
            width = args[argi] if argi < len(args) and isinstance(args[argi], int) else 0
            argi += 1
        if prec == "*":
            prec = args[argi] if argi < len(args) and isinstance(args[argi], int) else 0
            argi += 1
        w = int(width) if width not in (None, "") else 0
        p = int(prec) if prec not in (None, "") else None
        state.check_size(abs(w) + (p or 0))
        if argi >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        value = args[argi]
        argi += 1
        state.check_size(budget.size(value) * 2 + 8)
        text = _format_one(verb, flags, p, value)
        if w and len(text) < w:
            pad = "0" if "0" in flags and "-" not in flags and verb not in "sqvc" else " "
            if "-" in flags:
                text = text.ljust(w)
            elif pad == "0" and text[:1] in "+-":
                text = text[0] + text[1:].rjust(w - 1, "0")
            else:
                text = text.rjust(w, pad)
        out.append(text)
        total += len(text)
        state.check_size(total)
    if argi < len(args):
        state.check_size(total + len(fmt) + sum(budget.size(a) + 32 for a in args[argi:]))
        extra = ", ".join(f"{_type_name(a)}={to_text(a)}" for a in args[argi:])
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)


def _format_one(verb: str, flags: str, prec: int | None, value: Any) -> str:
    """One of printf's verbs applied to ``value`` (Go's ``%!verb(type=value)`` when they do not fit)."""
    bad = f"%!{verb}({_type_name(value)}={to_text(value)})"
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if verb in "vs":
        if verb == "s" and (is_int or isinstance(value, (bool, float))):
            return bad
        text = to_text(value)
        return text[:prec] if prec is not None and isinstance(value, str) else text
    if verb == "q":
        if isinstance(value, str):
            return json.dumps(value, ensure_ascii=False)
        return "'" + chr(value) + "'" if is_int and 0 <= value <= 0x10FFFF else bad
    if verb == "t":
        return to_text(value) if isinstance(value, bool) else bad
    if verb in "xX" and isinstance(value, str):
        text = _utf8(value).hex()
        return text.upper() if verb == "X" else text
    if verb in "dboxXc":
        if not is_int:
            return bad
        if verb == "c":
            return chr(value) if 0 <= value <= 0x10FFFF else "\ufffd"
        text = format(value, verb)
        if value >= 0 and ("+" in flags or " " in flags):
            text = ("+" if "+" in flags else " ") + text
        return text
    if verb in "feEgG":
        if not isinstance(value, float):
            return bad
        if verb in "gG" and prec is None:
            return _go_float(value)
        text = format(value, f".{6 if prec is None else prec}{verb}")
        return "+" + text if "+" in flags and value >= 0 else text
    return bad


def _go_json(value: Any) -> str:
    """``encoding/json``'s Marshal as Ollama's ``json`` function calls it (HTML characters escaped)."""
    text = json.dumps(_jsonable(value), ensure_ascii=False, separators=(",", ":"))
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def _jsonable(value: Any, ordered: bool = False) -> Any:
    """``value`` as the JSON encoding/json writes for it: a Go map's keys sorted, but a
    :class:`JSONMap`'s, and those of the objects inside it (``ordered``), in their own order."""
    if value is NO_VALUE:
        return None
    if isinstance(value, Struct):
        if value.json is not _FIELDS:
            return _jsonable(value.json)
        return {k: _jsonable(v) for k, v in value.fields.items()}
    if isinstance(value, dict):
        ordered = ordered or isinstance(value, JSONMap)
        keys = list(value) if ordered else _sorted_keys(value)
        return {str(k): _jsonable(value[k], ordered) for k in keys}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, ordered) for v in value]
    if isinstance(value, float) and value == int(value) and abs(value) < 1e21:
        return int(value)
    return value


def _json(state: "_State", value: Any = None) -> str:
    state.check_size(state.budget.size(value) * 6 + 16)
    return _go_json(value)


def _html_escape(state: "_State", *values: Any) -> str:
    text = _sprint(values, state, 6)
    state.check_size(len(text) * 6)
    return (text.replace("&", "&amp;").replace("'", "&#39;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&#34;").replace("\0", "\ufffd"))


def _urlquery(state: "_State", *values: Any) -> str:
    text = _sprint(values, state, 3)
    state.check_size(len(text) * 3)
    return urllib.parse.quote_plus(text, safe="")


def _js(state: "_State", *values: Any) -> str:
    text = _sprint(values, state, 6)
    state.check_size(len(text) * 6)
    out = []
    for ch in text:
        if ch in "\\'\"":
            out.append("\\" + ch)
        elif ch in "<>&=" or ord(ch) < 0x20:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return "".join(out)


def _current_date(state: "_State", *args: Any) -> str:
    return _dt.date.today().isoformat()


def _yesterday_date(state: "_State", *args: Any) -> str:
    return (_dt.date.today() - _dt.timedelta(days=1)).isoformat()


def _to_typescript_type(state: "_State", *args: Any) -> str:
    return "any"


_FUNCS: dict[str, Callable[..., Any]] = {
    "eq": _eq, "ne": _ne, "lt": _ordered("lt"), "le": _ordered("le"), "gt": _ordered("gt"),
    "ge": _ordered("ge"), "not": _not, "len": _len, "index": _index, "slice": _slice,
    "print": _print, "printf": _printf, "println": _println, "html": _html_escape,
    "urlquery": _urlquery, "js": _js,
    # Ollama's (template/template.go)
    "json": _json, "currentDate": _current_date, "yesterdayDate": _yesterday_date,
    "toTypeScriptType": _to_typescript_type,
}
_FIXED_ARITY = {"ne": 2, "lt": 2, "le": 2, "gt": 2, "ge": 2, "not": 1, "len": 1, "json": 1}
_FUNCS_ALLOWED.update(_FUNCS, {"and", "or"})


# ---------------------------------------------------------------------------------- executing
class _Break(Exception):
    pass


class _Continue(Exception):
    pass


class _Vars:
    """The variables in scope as a template runs: Go's stack of (name, value), with each name's
    values at hand, so that a use or an assignment does not scan the stack."""

    def __init__(self, data: Any) -> None:
        self.names: list[str] = ["$"]
        self.values: dict[str, list[Any]] = {"$": [data]}

    def __len__(self) -> int:
        return len(self.names)

    def append(self, item: tuple[str, Any]) -> None:
        name, value = item
        self.names.append(name)
        self.values.setdefault(name, []).append(value)

    def get(self, name: str) -> Any:
        values = self.values.get(name)
        if not values:
            raise TemplateError(f'undefined variable "{name}"')
        return values[-1]

    def set(self, name: str, value: Any) -> None:
        values = self.values.get(name)
        if not values:
            raise TemplateError(f'undefined variable "{name}"')
        values[-1] = value

    def __setitem__(self, pos: int, item: tuple[str, Any]) -> None:
        """Set the variable at stack position ``pos`` (near the top: range's, per element)."""
        name, value = item
        depth = self.names[pos + 1:].count(name)
        self.values[name][-1 - depth] = value

    def __delitem__(self, cut: slice) -> None:  # del vars[mark:]
        for name in reversed(self.names[cut]):
            self.values[name].pop()
        del self.names[cut]


class _State:
    def __init__(self, budget: RenderBudget, data: Any) -> None:
        self.budget = budget
        self.vars = _Vars(data)
        self.out: list[str] = []

    def check_size(self, n: int) -> None:
        self.budget.check_chars(n, "the template builds a value of")

    # variables
    def var(self, name: str) -> Any:
        return self.vars.get(name)

    def set_var(self, name: str, value: Any) -> None:
        self.vars.set(name, value)

    # walking
    def walk(self, dot: Any, nodes: list[Any]) -> None:
        for node in nodes:
            self.budget.tick()
            if isinstance(node, Text):
                self.out.append(self.budget.emit(node.text))
            elif isinstance(node, Action):
                value = self.pipeline(dot, node.pipe)
                if not node.pipe.decl:
                    if not isinstance(value, str):  # sized before it is printed
                        self.budget.check_chars(self.budget.size(value), "the template produces")
                    self.out.append(self.budget.emit(to_text(value)))
            elif isinstance(node, Branch):
                self.branch(dot, node)
            elif isinstance(node, Break):
                raise _Break()
            elif isinstance(node, Continue):
                raise _Continue()

    def branch(self, dot: Any, node: Branch) -> None:
        mark = len(self.vars)
        try:
            value = self.pipeline(dot, node.pipe)
            if node.kind == "range":
                self.range(dot, node, value)
                return
            if _truth(value):
                self.walk(value if node.kind == "with" else dot, node.body)
            elif node.else_body is not None:
                self.walk(dot, node.else_body)
        finally:
            del self.vars[mark:]

    def range(self, dot: Any, node: Branch, value: Any) -> None:
        if value is None or value is NO_VALUE:
            items: Iterator[tuple[Any, Any]] = iter(())
        elif isinstance(value, (list, tuple)):
            items = iter(enumerate(value))
        elif isinstance(value, dict):
            items = ((k, value[k]) for k in _map_keys(value))
        elif isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                value = 0
            items = ((i, i) for i in range(value))
        else:
            raise TemplateError(f"line {node.pipe.line}: range can't iterate over {json.dumps(to_text(value)[:40])}")
        ran = False
        mark = len(self.vars)
        for key, elem in items:
            ran = True
            self.budget.tick()
            if len(node.pipe.decl) == 1:
                self.vars[mark - 1] = (node.pipe.decl[0], elem)
            elif len(node.pipe.decl) == 2:
                self.vars[mark - 2] = (node.pipe.decl[0], key)
                self.vars[mark - 1] = (node.pipe.decl[1], elem)
            try:
                self.walk(elem, node.body)
            except _Continue:
                pass
            except _Break:
                break
            finally:
                del self.vars[mark:]
        if not ran and node.else_body is not None:
            self.walk(dot, node.else_body)

    def pipeline(self, dot: Any, pipe: Pipe) -> Any:
        value: Any = _MISSING
        for cmd in pipe.cmds:
            value = self.command(dot, cmd, value, pipe.line)
        if pipe.assign:
            self.set_var(pipe.decl[0], value)
        elif pipe.decl:
            # range declares its variables itself, per element (placeholders until then)
            for name in pipe.decl:
                self.vars.append((name, value))
        return value

    def command(self, dot: Any, cmd: Command, final: Any, line: int) -> Any:
        first = cmd.args[0]
        if isinstance(first, Function):
            return self.call(dot, first.name, cmd.args[1:], final, line)
        if len(cmd.args) > 1 or final is not _MISSING:
            what = first.idents[-1] if isinstance(first, (Field, Variable)) and getattr(first, "idents", ()) else None
            if what:
                raise TemplateError(f"line {line}: {what} is not a method but has arguments")
            raise TemplateError(f"line {line}: can't give argument to non-function {_node_text(first)}")
        return self.arg(dot, first, line)

    def arg(self, dot: Any, node: Any, line: int) -> Any:
        if isinstance(node, Literal):
            return node.value
        if isinstance(node, Dot):
            return dot
        if isinstance(node, Field):
            return self.fields(dot, node.idents, line)
        if isinstance(node, Variable):
            return self.fields(self.var(node.name), node.idents, line)
        if isinstance(node, Chain):
            base = self.pipeline(dot, node.node) if isinstance(node.node, Pipe) else self.arg(dot, node.node, line)
            return self.fields(base, node.idents, line) if node.idents else base
        if isinstance(node, Function):
            return self.call(dot, node.name, [], _MISSING, line)
        raise TemplateError(f"line {line}: can't evaluate {node!r}")

    def fields(self, receiver: Any, idents: tuple[str, ...], line: int) -> Any:
        for name in idents:
            self.budget.tick()
            if isinstance(receiver, Struct):
                if name not in receiver.fields:
                    raise TemplateError(f"line {line}: can't evaluate field {name} in type {receiver.type_name}")
                receiver = receiver.fields[name]
            elif isinstance(receiver, dict):
                receiver = receiver.get(name, NO_VALUE)
            elif receiver is None or receiver is NO_VALUE:
                raise TemplateError(f"line {line}: nil pointer evaluating interface {{}}.{name}")
            else:
                raise TemplateError(f"line {line}: can't evaluate field {name} in type {_type_name(receiver)}")
        return receiver

    def call(self, dot: Any, name: str, arg_nodes: list[Any], final: Any, line: int) -> Any:
        self.budget.tick()
        if name in ("and", "or"):
            nodes = list(arg_nodes)
            if not nodes and final is _MISSING:
                raise TemplateError(f"line {line}: wrong number of args for {name}: want at least 1 got 0")
            value: Any = None
            count = len(nodes) + (final is not _MISSING)
            for k in range(count):
                value = self.arg(dot, nodes[k], line) if k < len(nodes) else final
                if _truth(value) != (name == "and"):
                    return value
            return value
        args = [self.arg(dot, a, line) for a in arg_nodes]
        if final is not _MISSING:
            args.append(final)
        want = _FIXED_ARITY.get(name)
        if want is not None and len(args) != want:
            raise TemplateError(f"line {line}: wrong number of args for {name}: want {want} got {len(args)}")
        if name in ("index", "slice", "eq") and not args:
            raise TemplateError(f"line {line}: wrong number of args for {name}: want at least 1 got 0")
        try:
            result = _FUNCS[name](self, *args)
        except TemplateError as err:
            raise TemplateError(f"line {line}: {err}") from None
        if isinstance(result, str):
            self.budget.check_built(len(result))
        elif isinstance(result, list):  # slice's: in Go a view of its operand (no larger), here a
            self.budget.built(len(result))  # list of its items: as many references
        return result


_MISSING = object()  # no value passed down a pipeline


def _node_text(node: Any) -> str:
    if isinstance(node, Literal):
        return json.dumps(node.value) if isinstance(node.value, str) else to_text(node.value)
    if isinstance(node, Dot):
        return "."
    return type(node).__name__.lower()


def execute(template: Template, data: Any, budget: RenderBudget) -> str:
    """Render a parsed template with ``data`` as ``.``, within ``budget`` (already started and
    charging: call it inside :func:`~runner.template.sandbox.run_bounded`)."""
    state = _State(budget, data)
    try:
        state.walk(data, list(template.nodes))
    except (_Break, _Continue):  # the parser allows these only inside range
        pass
    except RecursionError:
        raise TemplateError("template: nests too deeply") from None
    return "".join(state.out)


def render(source: str | Template, data: Any, budget: RenderBudget, input_chars: int) -> str:
    """Parse (if needed: charged to the budget) and render within ``budget``, whose size limits
    follow ``input_chars``.
    Raises InvalidRequest (a TemplateError) for a template that fails or overruns, Cancelled when
    the budget's cancel event is set."""
    return run_bounded(budget, input_chars,
                       lambda: execute(parse(source) if isinstance(source, str) else source, data, budget))
