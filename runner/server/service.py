"""What both HTTP APIs do with a request: options, keep-alive, scheduling, running, metrics.

The API modules translate wire formats; this module owns the path from "a request for model X
with these options" to a stream of runner chunks with Ollama's metrics filled in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Mapping

import runner as _runner
from runner import config as _config
from runner import store
from runner.template import prompt, features as templatefeatures
from runner.api import (
    Cancelled,
    Chunk,
    DoneReason,
    InvalidRequest,
    Metrics,
    Options,
    PollamaError,
    Request,
    TokenLogprob,
    ToolCall,
)
from runner.reply.thinking import think_on

from .disconnect import client_gone
from .bridge import in_thread
from .scheduler import LoadedModel, ResolvedModel, Scheduler, ShuttingDown, resolve

log = logging.getLogger(__name__)

_MAX_TOP_LOGPROBS = 20


def now_ns() -> int:
    return time.perf_counter_ns()


def parse_keep_alive(value: str | float | int | None) -> float | None:
    """A request's keep_alive in seconds (None: the server default). Raises InvalidRequest."""
    if value is None:
        return None
    try:
        seconds = _config.parse_duration(value)
    except (ValueError, TypeError):
        raise InvalidRequest(f"invalid keep_alive {value!r}: use a duration like \"5m\" or seconds") from None
    if not math.isfinite(seconds):
        raise InvalidRequest(f"invalid keep_alive {value!r}")
    return seconds


def check_top_logprobs(value: int) -> None:
    if value < 0 or value > _MAX_TOP_LOGPROBS:
        raise InvalidRequest(f"top_logprobs must be between 0 and {_MAX_TOP_LOGPROBS}")


def build_options(model: ResolvedModel, values: Mapping[str, Any] | None) -> Options:
    """Ollama's merge order: defaults → the model's PARAMETERs → the request's ``options``."""
    base = Options()
    defaults = model.defaults
    if defaults.params:
        try:
            base = base.merged(defaults.params)
        except PollamaError as err:
            log.warning("ignoring the params of %s: %s", model.stored.name, err)
    if values is not None and not isinstance(values, Mapping):
        raise InvalidRequest("options must be an object")
    options = base.merged(values)
    _check_ranges(options)
    return options


def _check_ranges(options: Options) -> None:
    """The ranges rule, shared with ``pollama run``: ``runner.checked_options``."""
    _runner.checked_options(options)


def fit_to_runner(request: Request, model: LoadedModel) -> None:
    """Checks and clamps that need the loaded runner (its vocabulary, its context)."""
    opts = request.options
    if opts.repeat_last_n > model.runner.num_ctx:
        opts.repeat_last_n = model.runner.num_ctx
    n_vocab = model.runner.n_vocab
    if request.context:
        if any(not isinstance(t, int) or t < 0 or t >= n_vocab for t in request.context):
            raise InvalidRequest(f"invalid context: token ids must be in [0, {n_vocab})")


def check_features(name: str, request: Request, budget: prompt.RenderBudget | None = None) -> None:
    """Refuse what the model's template cannot do, with Ollama's messages: tools it does not
    render, reasoning it does not have (``think`` asked for; unset is fine), and a template whose
    feature probes alone ran out of the render budget. Probing a template not seen before
    renders it: call this off the event loop, with the request's render ``budget``, which the
    probes draw on (and the request's ``cancel`` stops)."""
    assert request.chat_template is not None
    try:
        with prompt.sharing(budget) if budget is not None else contextlib.nullcontext():
            found = templatefeatures.features(request.chat_template)
    except Cancelled:
        log.info("template rendering cancelled: the request was cancelled")
        raise
    if found.over_budget:
        raise prompt.BudgetExceeded(found.over_budget)
    if request.tools and request.tool_choice.mode != "none" and found.tools is None:
        raise InvalidRequest(f'"{name}" does not support tools')
    if found.thinking is None and think_on(request.think, False):
        raise InvalidRequest(f'"{name}" does not support thinking')


# ----------------------------------------------------------------------------------- running
@dataclass
class Outcome:
    """Filled in while a generation streams: what the API layer needs for its final object."""

    model: LoadedModel | None = None
    load_duration: int = 0


class Service:
    """The scheduler plus the request lifecycle around it."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    @property
    def cfg(self) -> _config.Config:
        return self.scheduler.cfg

    def resolve(self, name: str) -> store.StoredModel:
        """The store entry ``name`` points to (for listings and ``show``)."""
        if not name:
            raise InvalidRequest("model is required")
        return resolve(name, self.cfg)

    def model(self, name: str) -> ResolvedModel:
        """A request's model, resolved once (its file, header and Modelfile defaults)."""
        if not name:
            raise InvalidRequest("model is required")
        return self.scheduler.resolve(name)

    async def preload(self, name: str, options: Mapping[str, Any] | None,
                      keep_alive: float | None) -> None:
        """An empty prompt: load the model (or keep it loaded) and return."""
        resolved = self.model(name)
        model = await self.scheduler.acquire(resolved, build_options(resolved, options), keep_alive)
        self.scheduler.release(model)

    async def unload(self, name: str) -> None:
        """An empty prompt with keep_alive 0: unload now (or when its requests finish)."""
        model = self.scheduler.find(self.resolve(name))  # unknown names are 404 even when nothing is loaded
        if model is not None:
            await self.scheduler.expire(model)

    async def stream(self, name: str, request: Request, raw_options: Mapping[str, Any] | None,
                     keep_alive: float | None, chat: bool, t0: int, outcome: Outcome) -> AsyncIterator[Chunk]:
        """Schedule and run one generate/chat; the final chunk's metrics carry load and total
        durations measured from ``t0`` (the handler's start). Errors raise from the iterator."""
        resolved = self.model(name)
        request.options = build_options(resolved, raw_options)
        defaults = resolved.defaults
        if request.system is None:
            request.system = defaults.system
        if chat and defaults.messages:  # the model's MESSAGEs start every conversation
            request.messages = store.starting_messages(defaults, list(request.messages or []))
        # chosen for the model named: models with one GGUF share a runner, not their TEMPLATE
        budget = prompt.RenderBudget(cancel=request.cancel)  # one for the probes and the prompt

        def choose() -> None:  # parsing and probing a template: never on the event loop
            request.chat_template = prompt.select(request.template, resolved.info)
            check_features(name, request, budget)

        await in_thread(choose)
        check_top_logprobs(request.top_logprobs)
        model = await self.scheduler.acquire(resolved, request.options, keep_alive)
        outcome.model = model
        outcome.load_duration = now_ns() - t0
        job = None
        try:
            fit_to_runner(request, model)
            runner = model.runner

            def begin(deliver: Callable[[Any], None]) -> None:
                try:
                    with prompt.sharing(budget):  # the prompt's renders get what the probes left
                        runner.submit(request, chat, deliver)
                except Cancelled:  # the client left (or the server stops) while its prompt rendered
                    log.info("template rendering cancelled: the request was cancelled")
                    raise
                except PollamaError:
                    raise
                except Exception as err:
                    if request.template:  # a user's template failing at render time is their error
                        raise InvalidRequest(f"template error: {err}") from None
                    raise

            job = self.scheduler.start(begin, request.cancel)
            async for chunk in job.chunks():
                if chunk.done:
                    metrics = chunk.metrics or Metrics()
                    metrics.load_duration = outcome.load_duration
                    metrics.total_duration = now_ns() - t0
                    chunk.metrics = metrics
                    if chunk.done_reason is DoneReason.CONNECTION_CLOSED:
                        # only a shutdown cancels a stream whose client is still there
                        raise PollamaError("server is shutting down")
                yield chunk
                if chunk.done:
                    return
        finally:
            if job is not None:
                job.cancel()
                self.scheduler.finish(job)
            self.scheduler.release(model)

    async def embed(self, name: str, texts: list[str], truncate: bool, raw_options: Mapping[str, Any] | None,
                    keep_alive: float | None, t0: int) -> tuple[list[list[float]], int, int]:
        """(vectors, prompt tokens, load duration ns). An empty ``texts`` only loads the model.

        The work stops at the runner's next batch when the client disconnects (the inputs not
        yet evaluated never are) or the server shuts down; the model stays in use until the
        runner has let go of it, so keep-alive and eviction see the truth."""
        resolved = self.model(name)
        model = await self.scheduler.acquire(resolved, build_options(resolved, raw_options), keep_alive)
        load_ns = now_ns() - t0
        if not texts:
            self.scheduler.release(model)
            return [], 0, load_ns
        with self.scheduler.cancellable(threading.Event()) as cancel:
            work = in_thread(model.runner.embed, texts, truncate, cancel)
            work.add_done_callback(lambda done: self._embedded(model, done))
            gone = asyncio.ensure_future(client_gone())
            try:
                await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                gone.cancel()
                if not work.done():  # the client left, or this request was cancelled
                    cancel.set()
            if not work.done():
                log.info("embedding cancelled: the client disconnected")
                raise Cancelled("the client disconnected")
        try:
            result = work.result()
        except Cancelled:
            if self.scheduler.closing:
                raise ShuttingDown("server is shutting down") from None
            raise
        return result.vectors, result.prompt_eval_count, load_ns

    def _embedded(self, model: LoadedModel, work: asyncio.Future) -> None:
        """The runner let go of an embedding: the model is free (its error, if nobody awaited
        it any more, is retrieved here)."""
        if not work.cancelled():
            work.exception()
        self.scheduler.release(model)


@dataclass
class Reply:
    """A whole answer (``stream: false``): its parts, logprobs and final chunk."""

    text: str = ""
    thinking: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    final: Chunk | None = None


async def collect(chunks: AsyncIterator[Chunk]) -> Reply:
    """Gather a stream into one :class:`Reply`."""
    texts: list[str] = []
    thoughts: list[str] = []
    reply = Reply()
    try:
        async for chunk in chunks:
            texts.append(chunk.text)
            thoughts.append(chunk.thinking)
            reply.tool_calls.extend(chunk.tool_calls or [])
            reply.logprobs.extend(chunk.logprobs or [])
            if chunk.done:
                reply.final = chunk
    finally:
        await chunks.aclose()
    reply.text, reply.thinking = "".join(texts), "".join(thoughts)
    return reply
