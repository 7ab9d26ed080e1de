"""A request, prepared the one way the CLI and every API prepare it.

The path of every generation is the same: ``runner.resolve(name)`` (the model) → :func:`prepare`
(this module) → a loaded runner (``runner.load`` in the CLI, the scheduler's acquire in the
server) → ``Runner.stream`` / ``Runner.submit``. What is decided here is decided nowhere else:

- the options: Ollama's merge order (defaults → the model's PARAMETERs → the caller's), then the
  ranges rule (:func:`checked`);
- the model's Modelfile defaults: its SYSTEM when the request has none, its MESSAGEs first in
  every conversation;
- the template: the request's own (``Request.template``) or the model's;
- what the model can do: tools its template renders (none with ``tool_choice: none``), reasoning
  it has, images it can see;
- the request's ``think`` level (:func:`think_level`, one parser for every spelling).
"""

from __future__ import annotations

import contextlib
import logging
import math
from typing import Any, Mapping

from . import store
from .api import InvalidRequest, NoVision, Options, PollamaError, Request
from .images import has_images
from .loading.plan import MAX_CTX
from .loading.resolve import ResolvedModel
from .reply.thinking import think_on
from .template import features as templatefeatures
from .template import prompt as _prompt

log = logging.getLogger(__name__)

INT32 = 2**31 - 1
MAX_TOP_LOGPROBS = 20
THINK_LEVELS = ("high", "medium", "low")


def think_level(value: Any, field: str = "think") -> bool | str | None:
    """A ``think`` value as the runner takes it: None (the model's default), True/False, or a
    level "high"|"medium"|"low". Accepted spellings: a bool, "true"/"false", a level, "max"
    (Ollama's word for "high"), "none"/"minimal" (OpenAI's efforts for off), in any case.
    ``field`` names the value in the error (``think``, ``--think``, ``reasoning_effort``)."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        level = value.strip().lower()
        if level in THINK_LEVELS:
            return level
        if level == "max":
            return "high"
        if level in ("true", "false"):
            return level == "true"
        if level in ("none", "minimal"):
            return False
    words = "high, medium, low or none" if "effort" in field else "true, false, high, medium or low"
    raise InvalidRequest(f"invalid value for {field}: {value!r} (use {words})")


def checked(options: Options) -> Options:
    """``options`` with the ranges rule applied (in place, and returned): a float that is not a
    finite number is refused (InvalidRequest); ``num_ctx`` and ``num_batch`` are clamped to 2^20,
    ``top_k``, ``num_gpu`` and ``main_gpu`` to int32. Lengths the runner bounds itself
    (num_predict, num_keep, repeat_last_n) and ``num_thread`` (the load plan clamps it) pass."""
    for name in Options.names():
        value = getattr(options, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise InvalidRequest(f"invalid value for option {name!r}: {value!r}")
    options.num_ctx = min(options.num_ctx, MAX_CTX)
    options.num_batch = min(options.num_batch, MAX_CTX)
    options.top_k = min(options.top_k, INT32)
    options.num_gpu = max(min(options.num_gpu, INT32), -INT32)
    options.main_gpu = max(min(options.main_gpu, INT32), -INT32)
    return options


def options(model: ResolvedModel, values: Mapping[str, Any] | None) -> Options:
    """The options a request runs with: defaults → the model's PARAMETERs (ignored with a
    warning when they do not parse) → ``values`` (a request's ``options``, ``-o`` pairs, the
    REPL's parameters), range-checked. Raises InvalidRequest."""
    base = Options()
    if model.defaults.params:
        try:
            base = base.merged(model.defaults.params)
        except PollamaError as err:
            log.warning("ignoring the params of %s: %s", model.stored.name, err)
    if values is not None and not isinstance(values, Mapping):
        raise InvalidRequest("options must be an object")
    return checked(base.merged(values))


def options_set(model: ResolvedModel, values: Mapping[str, Any] | None) -> frozenset[str]:
    """The names of the options the model's PARAMETERs or ``values`` set (not null): the rest
    are defaults (what :func:`options` merged, by name)."""
    known = set(Options.names())
    given = {str(k) for k, v in (values or {}).items() if v is not None} if isinstance(values, Mapping) else set()
    return frozenset((set(model.defaults.params) | given) & known)


def prepare(model: ResolvedModel, request: Request, values: Mapping[str, Any] | None = None,
            budget: _prompt.RenderBudget | None = None) -> Request:
    """``request`` made ready for a runner of ``model`` (in place, and returned): its options
    from ``values`` (:func:`options`), the model's SYSTEM and MESSAGEs, its template, its think
    level; refused (InvalidRequest, one line) when it asks for what the model cannot do (but a
    ``think`` the model cannot do is dropped when the request has ``relax_think``).

    Probing a template not seen before renders it: call this off an event loop; the probes draw
    on ``budget`` (the request's render budget, shared with its prompt) when given."""
    request.options = options(model, values)
    request.options_set = options_set(model, values)
    request.think = think_level(request.think)
    if not 0 <= request.top_logprobs <= MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}")
    defaults = model.defaults
    if request.system is None:
        request.system = defaults.system
    if request.messages is not None and defaults.messages:  # the model's MESSAGEs start every conversation
        request.messages = store.starting_messages(defaults, list(request.messages))
    if request.tool_choice.mode == "none":  # OpenAI's "none": the tools are not offered at all
        request.tools = []
    if model.remote is not None:  # its upstream templates the request, and refuses what its model cannot do
        request.chat_template = model.template
        return request
    request.chat_template = _prompt.request_template(request.template) if request.template else model.template
    if has_images(request.messages, request.images) and not model.info.vision:
        raise NoVision()
    _check_features(model.name, request, budget)
    return request


def _check_features(name: str, request: Request, budget: _prompt.RenderBudget | None) -> None:
    """Refuse what the template cannot do, with Ollama's messages: tools it does not render,
    reasoning it does not have (``think`` asked for; unset is fine; with ``relax_think`` it is
    dropped instead), and a template whose feature probes alone ran out of the render budget."""
    assert request.chat_template is not None
    with _prompt.sharing(budget) if budget is not None else contextlib.nullcontext():
        found = templatefeatures.features(request.chat_template)  # Cancelled when its client leaves
    if found.over_budget:
        raise _prompt.BudgetExceeded(found.over_budget)
    if request.tools and found.tools is None:
        raise InvalidRequest(f'"{name}" does not support tools')
    if found.thinking is None and think_on(request.think, False):
        if not request.relax_think:
            raise InvalidRequest(f'"{name}" does not support thinking')
        log.warning('"%s" does not support thinking: answering without it', name)
        request.think = None
