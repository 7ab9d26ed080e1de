"""Rendering untrusted Jinja templates within a budget: jinja2's immutable sandbox, with every
loop step, call, operator and piece of output counted against a :class:`RenderBudget`.

A request's ``template`` and a GGUF's chat template are both untrusted. The sandbox stops a
template from reaching Python's internals, not from running forever or building gigabytes:
nested ``range`` loops, recursion through macros, ``'x' * 10**9``, ``center(10**9)``, a string
doubled in a loop. Here the parsed template is rewritten so that each ``{% for %}`` step, each
``{{ … }}`` and each ``~`` goes through the budget, the sandbox's hooks (calls, ``*`` ``**``
``+`` ``%``, ``str.format``) and every filter check sizes before they build anything, and the
CPU time and the caller's cancel event are looked at every millisecond (of wall time, whatever
the steps cost), and all the values one render builds are counted together. An overrun stops the
render with one :class:`InvalidRequest` line (or :class:`Cancelled`).
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
import threading
import time
import types
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Callable, Iterator, Mapping, Sequence

import jinja2
import jinja2.filters
import jinja2.runtime
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedFormatter
from jinja2.utils import Namespace
from jinja2.visitor import NodeTransformer
from markupsafe import EscapeFormatter, Markup

from ..api import Cancelled, InvalidRequest

__all__ = ["DEFAULT_LIMITS", "BudgetExceeded", "RenderBudget", "RenderLimits", "compile_template", "render",
           "run_bounded", "sharing"]


# ------------------------------------------------------------------------------ render budget
@dataclass(frozen=True)
class RenderLimits:
    """What rendering one prompt may cost. A request's ``template`` and a GGUF's chat template
    are both untrusted: a template may loop, recurse or build strings without end.

    ``cpu_seconds`` of the rendering thread's CPU time (every render of one prompt together:
    history truncation renders several); ``base_chars + per_input_char × input`` characters for
    the output and for any one value the template builds, where input counts the message
    contents and the template itself, and ``built_factor`` times that for all the values one
    render builds together (what it keeps in variables, lists or macro frames and what it
    drops: the memory a render may take); numbers up to ``max_bits`` bits."""

    cpu_seconds: float = 2.0
    base_chars: int = 1 << 20
    per_input_char: int = 4
    built_factor: int = 16
    max_bits: int = 1 << 16


DEFAULT_LIMITS = RenderLimits()

#: characters of a template's text. Compiling a Jinja template is Python's ``compile()``, which
#: holds the GIL (every other request) throughout and cannot be interrupted: ~0.5 s for 64 KiB
#: of nested calls, ~2.6 s for 256 KiB. Real chat templates are a few KiB to a few tens of KiB.
MAX_SOURCE_CHARS = 64 * 1024


def check_source(source: str) -> None:
    """Raise InvalidRequest when ``source`` is longer than :data:`MAX_SOURCE_CHARS` (Jinja's and
    Go's parsers both ask this first)."""
    if len(source) > MAX_SOURCE_CHARS:
        raise InvalidRequest(f"the template is {len(source)} characters, over the limit of {MAX_SOURCE_CHARS}")


class _Overrun(BaseException):
    """Stops a render from inside (a BaseException: nothing in jinja2 catches it)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class BudgetExceeded(InvalidRequest):
    """A render ran out of its CPU time (the one InvalidRequest that says the budget, not the
    template's text, stopped it: the same template may fit a fresh budget)."""


class _Allowance:
    """CPU seconds that the renders drawing on one budget have spent, from whichever threads
    they ran on (a request's feature probes in one thread, its prompt in another)."""

    __slots__ = ("limit", "spent")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.spent = 0.0


class RenderBudget:
    """One prompt's allowance, checked by the bounded environment as a template runs: a tick for
    every loop step, call, operator and piece of output, and a size check before anything that
    builds a string or a list.

    Time: a tick looks at the wall clock (cheap); every :attr:`POLL_SECONDS` of it, the render
    hands the GIL to any thread that waits for it, looks at the cancel event and charges the
    rendering thread's CPU time since the last look to the allowance. So an overrun stops about
    a millisecond of CPU past the limit, however much or little one tick costs (a count of ticks
    is not a measure of time: one tick may cost a microsecond or a millisecond), and the event
    loop and the batch loop get the GIL within about that long. Only time spent inside renders
    (parsing and compiling included) is charged, on whichever thread runs them (one at a time):
    history truncation's renders, and the feature probes of a request (see :func:`sharing`),
    draw on one allowance."""

    POLL_SECONDS = 0.001

    def __init__(self, limits: RenderLimits = DEFAULT_LIMITS, cancel: threading.Event | None = None) -> None:
        shared = _shared.get()
        self.limits = limits
        self.cancel = cancel
        if shared is not None:  # a budget made inside sharing(): the request's allowance
            self._allowance = shared._allowance
            outer = shared._cancels
        else:
            self._allowance = _Allowance(limits.cpu_seconds)
            outer = ()
        self._cancels = tuple(dict.fromkeys(e for e in (cancel, *outer) if e is not None))
        self._mark: float | None = None  # the rendering thread's CPU clock when last charged
        self._next_poll = 0.0
        self.max_chars = limits.base_chars
        self._emitted = 0
        self._built = 0
        self._sizes: dict[int, tuple[Any, int]] = {}

    def start(self, input_chars: int) -> None:
        """A new render of a prompt whose inputs hold ``input_chars`` characters."""
        self.max_chars = self.limits.base_chars + self.limits.per_input_char * input_chars
        self._emitted = 0
        self._built = 0
        self._sizes.clear()

    @property
    def cpu_limit(self) -> float:
        """The CPU seconds the allowance grants (a shared one: the budget it shares)."""
        return self._allowance.limit

    @property
    def cpu_spent(self) -> float:
        """CPU seconds charged so far (the renders that ended, and the one running up to its
        last poll)."""
        return self._allowance.spent

    @contextlib.contextmanager
    def drawing(self) -> Iterator[None]:
        """Charge the CPU time this thread spends inside to the allowance (a nested use is
        part of the outer one); for :func:`render` and :func:`run_bounded`, which turn the
        overrun it raises at once when the allowance is spent into BudgetExceeded."""
        if self._mark is not None:
            yield
            return
        self._mark = time.thread_time()
        self._next_poll = 0.0
        try:
            self.check()
            yield
        finally:
            self._charge()
            self._mark = None

    def _charge(self) -> None:
        if self._mark is not None:
            now = time.thread_time()
            self._allowance.spent += now - self._mark
            self._mark = now

    # --- time ---------------------------------------------------------------------------------
    def tick(self) -> None:
        if _wall() >= self._next_poll:
            self.poll()

    def poll(self) -> None:
        """Let the process's other threads run, then stop the render if it is cancelled or out
        of CPU time."""
        # A thread that renders for seconds would otherwise keep the GIL for 5 ms (Python's
        # switch interval) at a time against every thread that wakes up: the event loop, the
        # batch loop, whose every ctypes call gives the GIL up and must take it back. sleep(0)
        # hands it over for sure (~0.08 ms; os.sched_yield is shorter but lets a GIL-hungry
        # thread starve the render, which then holds its memory for many times its budget).
        time.sleep(0)
        self._next_poll = _wall() + self.POLL_SECONDS
        self.check()

    def check(self) -> None:
        """Stop the render (from inside it) if it is cancelled or out of CPU time."""
        for event in self._cancels:
            if event.is_set():
                raise _Overrun(Cancelled("template rendering was cancelled"))
        self._charge()
        if self._allowance.spent > self._allowance.limit:
            raise _Overrun(BudgetExceeded(
                f"chat template error: rendering took more than its time budget "
                f"({self._allowance.limit:g} s of CPU): a loop or a recursion too long"))

    # --- sizes --------------------------------------------------------------------------------
    def too_big(self, what: str) -> _Overrun:
        return _Overrun(InvalidRequest(
            f"chat template error: {what} more than {self.max_chars} characters"))

    def check_chars(self, n: int, what: str = "the template builds a value of") -> None:
        if n > self.max_chars:
            raise self.too_big(what)

    def built(self, n: int) -> None:
        """Count a value of ``n`` characters that the template built (checked before it was
        built, or right after for what is never larger than its inputs by much): all of one
        render's values together stay within ``built_factor`` times the size limit, so a
        template cannot hold gigabytes in many values that are each small enough."""
        self._built += n
        if self._built > self.limits.built_factor * self.max_chars:
            raise _Overrun(InvalidRequest(
                f"chat template error: the template builds values of more than "
                f"{self.limits.built_factor * self.max_chars} characters in all"))

    def check_built(self, n: int, what: str = "the template builds a value of") -> None:
        """:meth:`check_chars` then :meth:`built`: a value about to be built."""
        self.check_chars(n, what)
        self.built(n)

    def check_bits(self, bits: int) -> None:
        if bits > self.limits.max_bits:
            raise _Overrun(InvalidRequest(
                f"chat template error: the template computes a number larger than "
                f"{self.limits.max_bits} bits"))

    def size(self, value: Any) -> int:
        """About how many characters ``str(value)`` has, counted without building it (stops
        counting past the limit). Containers count their items, recursively."""
        if isinstance(value, str):
            return len(value)
        if isinstance(value, (bool, float, type(None))):
            return 8
        if isinstance(value, int):
            return value.bit_length() // 3 + 2
        if isinstance(value, range):
            return len(value) * (len(str(max(abs(value.start), abs(value.stop)))) + 2)
        cached = self._sizes.get(id(value))
        if cached is not None and cached[0] is value:
            return cached[1]
        total, stack, mutable = 0, [value], False
        while stack and total <= self.max_chars:
            item = stack.pop()
            if isinstance(item, str):
                total += len(item) + 4
            elif isinstance(item, (bytes, bytearray)):
                total += 4 * len(item) + 4
            elif isinstance(item, dict):
                total += 2 + 2 * len(item)
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, Namespace):  # the one container a template changes: never cached
                mutable = True
                try:
                    attrs = object.__getattribute__(item, "_Namespace__attrs")
                except AttributeError:  # another jinja2: count its repr
                    attrs = {"": repr(item)}
                total += 16
                stack.extend(attrs.keys())
                stack.extend(attrs.values())
            elif isinstance(item, (list, tuple, set, frozenset)):
                total += 2 + 2 * len(item)
                stack.extend(item)
            elif isinstance(item, int) and not isinstance(item, bool):
                total += item.bit_length() // 3 + 2
            else:
                total += 32  # numbers, None, functions, jinja's loop objects: short reprs
        if not mutable:  # lists and dicts cannot change in the immutable sandbox
            self._sizes[id(value)] = (value, total)
        return total

    def check_values(self, values: Sequence[Any], what: str = "the template passes a value of") -> None:
        for value in values:
            self.check_chars(self.size(value), what)

    def collect(self, value: Any) -> Any:
        """A lazy iterable (``map``, ``select``… return one) as a list, counted item by item:
        a filter or function that consumes it in C would otherwise build an unbounded result
        before anything could check it."""
        if not isinstance(value, Iterator):
            return value
        items, total = [], 0
        for item in value:
            self.tick()
            total += self.size(item) + 2
            self.check_chars(total, "the template builds a sequence of")
            items.append(item)
        return items

    def emit(self, value: Any) -> str:
        """Account one piece of output (it is joined with the rest: the total is bounded)."""
        self.check_chars(self.size(value), "the template produces")
        text = value if isinstance(value, str) else str(value)
        self._emitted += len(text)
        if self._emitted > self.max_chars:
            raise self.too_big("the template produces")
        self.tick()
        return text


_budget: ContextVar[RenderBudget | None] = ContextVar("pollama_render_budget", default=None)
_shared: ContextVar[RenderBudget | None] = ContextVar("pollama_shared_budget", default=None)
_wall = time.perf_counter


@contextlib.contextmanager
def sharing(budget: RenderBudget) -> Iterator[RenderBudget]:
    """Inside (this thread, this context), every new :class:`RenderBudget` draws on ``budget``'s
    CPU allowance and also stops on its cancel event: the renders one request makes in several
    places (its template's feature probes, its prompt, history truncation) share one budget."""
    token = _shared.set(budget)
    try:
        yield budget
    finally:
        _shared.reset(token)


class _NoBudget(Exception):
    """Raised when template code runs outside a render (jinja2's constant folding at compile
    time): jinja2 then leaves the expression to be evaluated when the template renders."""


def _current(get: Callable[[], RenderBudget | None] = _budget.get) -> RenderBudget:
    budget = get()
    if budget is None:
        raise _NoBudget("outside a render")
    return budget


# ------------------------------------------------------------------------ checks per operation
_WIDTH_METHODS = {"center", "ljust", "rjust", "zfill", "to_bytes"}
_PRINTF_SPEC = re.compile(r"%(?:\(([^)]*)\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?")
_DIGITS = re.compile(r"\d+")


def _check_printf(budget: RenderBudget, fmt: str, args: Any) -> None:
    """``fmt % args``: its field widths and precisions, and what it formats (a mapping's value
    once for each field that names it)."""
    widths = by_key = 0
    for key, width, precision in _PRINTF_SPEC.findall(fmt):
        widths += sum(int(n) for n in (width, precision) if n and n != "*")
        if key and isinstance(args, Mapping):
            by_key += budget.size(args.get(key))
            budget.check_chars(by_key)
    values = args if isinstance(args, tuple) else (args,)
    stars = sum(v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0)
    budget.check_built(len(fmt) + widths + stars + by_key + sum(budget.size(v) for v in values))


def _check_binop(budget: RenderBudget, operator: str, left: Any, right: Any) -> None:
    ints = isinstance(left, int) and isinstance(right, int)
    if operator == "**":
        if ints and right > 0:
            budget.check_bits(right * max(abs(left).bit_length(), 1))
    elif operator == "*":
        if ints:
            budget.check_bits(abs(left).bit_length() + abs(right).bit_length())
        elif isinstance(left, int) or isinstance(right, int):
            seq, n = (right, left) if isinstance(left, int) else (left, right)
            if isinstance(seq, (str, list, tuple, bytes)) and n > 0:
                budget.check_built(budget.size(seq) * n)
    elif operator == "+":
        if not ints:
            budget.check_built(budget.size(left) + budget.size(right))
    elif operator == "%":
        if isinstance(left, str):
            _check_printf(budget, left, right)


def _check_method(budget: RenderBudget, method: Any, args: tuple, kwargs: dict) -> None:
    """Calls whose result can be much larger than their arguments."""
    if not isinstance(method, types.BuiltinMethodType):
        return
    owner, name = method.__self__, method.__name__
    if not isinstance(owner, (str, bytes, int)) or isinstance(owner, bool):
        return
    numbers = [v for v in (*args, *kwargs.values()) if isinstance(v, int) and not isinstance(v, bool)]
    if name in _WIDTH_METHODS:
        budget.check_chars(max(numbers, default=0))
    elif name == "expandtabs" and isinstance(owner, (str, bytes)):
        tab = b"\t" if isinstance(owner, bytes) else "\t"
        budget.check_chars(len(owner) + owner.count(tab) * max(numbers, default=8))
    elif name == "replace" and isinstance(owner, (str, bytes)) and len(args) >= 2:
        _check_replace(budget, owner, args[0], args[1])
    elif name == "join" and isinstance(owner, (str, bytes)) and args:
        items = args[0]
        if isinstance(items, (list, tuple, set, frozenset, dict)):
            budget.check_chars(budget.size(items) + len(owner) * len(items))


def _check_replace(budget: RenderBudget, text: Any, old: Any, new: Any) -> None:
    """``text.replace(old, new)``: each occurrence of ``old`` may grow it by ``new``."""
    if isinstance(text, (str, bytes)) and isinstance(old, type(text)) and isinstance(new, type(text)):
        count = (len(text) + 1) if not old else text.count(old)
        budget.check_chars(len(text) + count * max(len(new) - len(old), 0))


class _BoundedFormatter(SandboxedFormatter):
    """``str.format`` in templates: the sandbox's formatter, with field widths bounded and the
    fields of one call counted together (``'{0}{0}{0}…'.format(big)``)."""

    _total = 0

    def format_field(self, value: Any, format_spec: str) -> Any:
        budget = _current()
        self._total += sum(int(n) for n in _DIGITS.findall(format_spec)) + budget.size(value)
        budget.check_chars(self._total)
        return super().format_field(value, format_spec)


class _BoundedEscapeFormatter(_BoundedFormatter, EscapeFormatter):
    """The same for ``Markup.format`` (escaping what it inserts)."""


_PASSED = (jinja2.Environment, jinja2.runtime.Context, nodes.EvalContext)  # what jinja2 hands some filters first


def _bounded_filter(name: str, fn: Callable) -> Callable:
    """Wrap a jinja2 filter: its arguments are size-checked, its integer parameters (widths,
    counts) bounded, and what it returns size-checked."""

    @functools.wraps(fn)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        budget = _current()
        budget.tick()
        first = next((k for k, a in enumerate(args) if not isinstance(a, _PASSED)), None)
        if first is not None:  # the value filtered: a lazy one is counted as it is consumed
            args = (*args[:first], budget.collect(args[first]), *args[first + 1:])
        values = [a for a in (*args, *kwargs.values()) if not isinstance(a, _PASSED)]
        budget.check_values(values)
        params = values[1:]  # the first is the value filtered
        budget.check_chars(max((v for v in params if isinstance(v, int) and not isinstance(v, bool)), default=0))
        if name == "format" and values and isinstance(values[0], str):
            _check_printf(budget, values[0], tuple(params))
        elif name == "indent" and values and isinstance(values[0], str):
            width = params[0] if params else kwargs.get("width", 4)
            width = len(width) if isinstance(width, str) else width
            budget.check_chars(len(values[0]) + (values[0].count("\n") + 1) * (width if isinstance(width, int) else 0))
        elif name == "join" and values:
            joiner = params[0] if params and isinstance(params[0], str) else ""
            budget.check_chars(budget.size(values[0]) * (1 + len(joiner)))
        elif name == "replace" and len(values) >= 3:
            _check_replace(budget, values[0], values[1], values[2])
        result = fn(*args, **kwargs)
        budget.check_built(budget.size(result), "a filter returns")
        return result

    return bounded


def _checked_sum(iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    """The ``sum`` filter, one checked ``+`` at a time (Python's sum over lists is quadratic,
    in C, out of the budget's reach)."""
    budget = _current()
    total = start
    if attribute is not None:
        iterable = map(jinja2.filters.make_attrgetter(_ENV, attribute), iterable)
    for item in iterable:
        budget.tick()
        _check_binop(budget, "+", total, item)
        total = total + item
    return total


def _tojson(value, indent=None, ensure_ascii=False, sort_keys=False):
    if isinstance(indent, int) and indent > 64:
        raise InvalidRequest("chat template error: tojson indent must be at most 64")
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


class _BoundedEnvironment(ImmutableSandboxedEnvironment):
    """The sandbox, with every operation of a template counted against the current
    :class:`RenderBudget`."""

    intercepted_binops = frozenset({"*", "**", "+", "%"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        budget = _current()
        if operator == "+" and type(left) is str and type(right) is str:  # most of a chat template
            budget.check_built(len(left) + len(right))
            return left + right
        budget.tick()
        _check_binop(budget, operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        budget = _current()
        budget.tick()
        args = tuple(budget.collect(a) for a in args)
        budget.check_values(args)
        budget.check_values(list(kwargs.values()))
        _check_method(budget, __obj, args, kwargs)
        result = super().call(__context, __obj, *args, **kwargs)
        if isinstance(result, (str, bytes, list, tuple, dict)):
            budget.check_built(budget.size(result), "a call returns")
        return result

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """``str.format`` / ``format_map`` of a template string, through the bounded formatter."""
        if not isinstance(value, (types.MethodType, types.BuiltinMethodType)) \
                or value.__name__ not in ("format", "format_map") or not isinstance(value.__self__, str):
            return None
        fmt = value.__self__
        formatter: SandboxedFormatter = (_BoundedEscapeFormatter(self, escape=fmt.escape)
                                         if isinstance(fmt, Markup) else _BoundedFormatter(self))
        kind = type(fmt)
        if value.__name__ == "format_map":
            return lambda mapping: kind(formatter.vformat(fmt, (), mapping))
        return lambda *args, **kwargs: kind(formatter.vformat(fmt, args, kwargs))


_EMIT, _CONCAT, _LOOP = "__pollama_emit", "__pollama_concat", "__pollama_loop"


def _emit(value: Any) -> str:
    return _current().emit(value)


def _concat(*values: Any) -> str:
    """``a ~ b ~ …``, checked before it is built."""
    budget = _current()
    budget.check_built(sum(budget.size(v) for v in values))
    return "".join(v if isinstance(v, str) else str(v) for v in values)


def _loop(iterable: Any) -> Any:
    """Every ``{% for %}`` iterates through this: one tick a step."""
    budget = _current()
    for item in iterable:
        budget.tick()
        yield item


class _Instrument(NodeTransformer):
    """Rewrite a parsed template so its loops, outputs and ``~`` go through the budget (as
    filters: jinja2 calls a filter directly, where a call goes through the sandbox's checks)."""

    @staticmethod
    def _filter(name: str, value: nodes.Expr, args: list, lineno: int) -> nodes.Filter:
        return nodes.Filter(value, name, args, [], None, None, lineno=lineno)

    def visit_For(self, node: nodes.For) -> nodes.Node:
        self.generic_visit(node)
        node.iter = self._filter(_LOOP, node.iter, [], node.lineno)
        return node

    def visit_Output(self, node: nodes.Output) -> nodes.Node:
        self.generic_visit(node)
        node.nodes = [self._filter(_EMIT, nodes.Const(child.data, lineno=child.lineno)
                                   if isinstance(child, nodes.TemplateData) else child, [], node.lineno)
                      for child in node.nodes]
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        return self._filter(_CONCAT, node.nodes[0], list(node.nodes[1:]), node.lineno)


def _raise_exception(message: str) -> None:
    raise InvalidRequest(f"chat template error: {message}")


def _environment() -> _BoundedEnvironment:
    env = _BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.filters["sum"] = _checked_sum
    env.filters = {name: _bounded_filter(name, fn) for name, fn in env.filters.items()}
    env.filters.update({_EMIT: _emit, _CONCAT: _concat, _LOOP: _loop})
    env.globals.pop("lipsum", None)  # its loop runs in jinja2's code, out of the budget's reach
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


_ENV = _environment()


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Parse, instrument and compile ``source`` (cached). Raises InvalidRequest."""
    check_source(source)
    try:
        tree = _Instrument().visit(_ENV.parse(source))
        return _ENV.from_string(tree)
    except jinja2.TemplateError as err:
        raise InvalidRequest(f"invalid chat template: {err}") from None
    except (RecursionError, MemoryError, SyntaxError, ValueError) as err:
        raise InvalidRequest(f"invalid chat template: {err}") from None


def render(source: str, budget: RenderBudget, input_chars: int, context: Mapping[str, Any]) -> str:
    """Render ``source`` with ``context`` within ``budget``, whose size limits follow
    ``input_chars`` (what the template is given, itself included); compiling it (when it is not
    cached) is charged to the budget too. Raises InvalidRequest for a template that fails or
    overruns (BudgetExceeded for the time), Cancelled when the budget's cancel event is set."""
    token = _budget.set(budget)
    try:
        with budget.drawing():
            template = compile_template(source)
            budget.start(input_chars)
            budget.check()  # compiling counts
            return template.render(**context)
    except _Overrun as stop:
        raise stop.error from None
    except (InvalidRequest, Cancelled):
        raise
    except Exception as err:  # a template is user data: any failure in it is bad input
        raise InvalidRequest(f"chat template error: {_one_line(err)}") from None
    finally:
        _budget.reset(token)


def _one_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def run_bounded(budget: RenderBudget, input_chars: int, fn: Callable[[], str]) -> str:
    """Run a renderer of another template language (:mod:`runner.template.go`) within ``budget``:
    the size limits follow ``input_chars``; the CPU time ``fn`` takes (parsing included) is
    charged; an overrun, a failure in the template, or the cancel event end it with one
    InvalidRequest line (BudgetExceeded for the time; Cancelled for the event)."""
    try:
        with budget.drawing():
            budget.start(input_chars)
            return fn()
    except _Overrun as stop:
        raise stop.error from None
    except (InvalidRequest, Cancelled):
        raise
    except (RecursionError, MemoryError, ArithmeticError, TypeError, ValueError) as err:
        raise InvalidRequest(f"template error: {_one_line(err)}") from None
