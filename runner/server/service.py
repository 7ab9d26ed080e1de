"""What every HTTP API does with a request: resolve, prepare, schedule, run, time.

The API modules translate wire formats; this module owns the path from "a request for model X
with these options" to a stream of runner chunks: ``runner.resolve`` → ``runner.prepare.prepare``
(the same two the CLI calls) → the scheduler's acquire → ``Runner.submit``, with Ollama's
``load_duration`` and ``total_duration`` filled in (the caller's part of the metrics).
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable, Mapping

import runner as _runner
from runner import ResolvedModel
from runner import config as _config
from runner import store
from runner import prepare
from runner.template import prompt
from runner.api import (
    Cancelled,
    Chunk,
    DoneReason,
    InvalidRequest,
    Metrics,
    PollamaError,
    Request,
    TokenLogprob,
    ToolCall,
)

from .disconnect import client_gone
from .bridge import in_thread
from .scheduler import LoadedModel, Scheduler, ShuttingDown

log = logging.getLogger(__name__)

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


# ----------------------------------------------------------------------------------- running
class Service:
    """The scheduler plus the request lifecycle around it."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    @property
    def cfg(self) -> _config.Config:
        return self.scheduler.cfg

    def entry(self, name: str) -> store.StoredModel:
        """The store entry ``name`` points to (for listings and ``show``)."""
        if not name:
            raise InvalidRequest("model is required")
        return store.lookup(name, self.cfg, from_network=True)

    def model(self, name: str) -> ResolvedModel:
        """A request's model, resolved once (its file, header, Modelfile defaults, template)."""
        if not name:
            raise InvalidRequest("model is required")
        return _runner.resolve(name, self.cfg, from_network=True)

    async def preload(self, name: str, options: Mapping[str, Any] | None,
                      keep_alive: float | None) -> None:
        """An empty prompt: load the model (or keep it loaded) and return."""
        resolved = self.model(name)
        model = await self.scheduler.acquire(resolved, prepare.options(resolved, options), keep_alive)
        self.scheduler.release(model)

    async def unload(self, name: str) -> None:
        """An empty prompt with keep_alive 0: unload now (or when its requests finish)."""
        model = self.scheduler.find(self.entry(name))  # unknown names are 404 even when nothing is loaded
        if model is not None:
            await self.scheduler.expire(model)

    async def stream(self, name: str, request: Request, raw_options: Mapping[str, Any] | None,
                     keep_alive: float | None, t0: int) -> AsyncIterator[Chunk]:
        """One generation: resolve ``name`` → prepare ``request`` (with the request's
        ``raw_options``) → acquire a runner → submit. The final chunk's metrics carry the load
        this request waited for and the total from ``t0`` (the handler's start). Errors raise
        from the iterator."""
        resolved = self.model(name)
        budget = prompt.RenderBudget(cancel=request.cancel)  # one for the probes and the prompt
        await _prepared(resolved, request, raw_options, budget)
        model = await self.scheduler.acquire(resolved, request.options, keep_alive)
        load_duration = now_ns() - t0  # Ollama's: from the request's start until it has its runner
        job = None
        try:
            runner = model.runner

            def begin(deliver: Callable[[Any], None]) -> None:
                _rendering(request, budget, lambda: runner.submit(request, deliver))

            job = self.scheduler.start(begin, request.cancel)
            async for chunk in job.chunks():
                if chunk.done:
                    metrics = chunk.metrics or Metrics()
                    metrics.load_duration = load_duration
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

    async def count(self, name: str, request: Request, raw_options: Mapping[str, Any] | None,
                    keep_alive: float | None) -> int:
        """The size in tokens of the prompt :meth:`stream` would run for ``request``
        (``Runner.count``): resolved, prepared and given a runner the same way (loading the
        model if need be), nothing generated. Errors raise as :meth:`stream`'s do."""
        resolved = self.model(name)
        budget = prompt.RenderBudget(cancel=request.cancel)
        await _prepared(resolved, request, raw_options, budget)
        model = await self.scheduler.acquire(resolved, request.options, keep_alive)
        runner = model.runner
        work = in_thread(_rendering, request, budget, lambda: runner.count(request))
        work.add_done_callback(lambda done: self._let_go(model, done))
        return await asyncio.shield(work)  # released when the call ends, also if this task is cancelled

    async def embed(self, name: str, texts: list[str | list[int]], truncate: bool,
                    raw_options: Mapping[str, Any] | None, keep_alive: float | None,
                    t0: int) -> tuple[list[list[float]], int, int]:
        """(vectors, prompt tokens, load duration ns) of ``texts`` (texts or token ids, as
        :meth:`runner.api.Runner.embed` takes them). An empty ``texts`` only loads the model.

        The work stops at the runner's next batch when the client disconnects (the inputs not
        yet evaluated never are) or the server shuts down; the model stays in use until the
        runner has let go of it, so keep-alive and eviction see the truth."""
        resolved = self.model(name)
        model = await self.scheduler.acquire(resolved, prepare.options(resolved, raw_options), keep_alive)
        load_ns = now_ns() - t0
        if not texts:
            self.scheduler.release(model)
            return [], 0, load_ns
        with self.scheduler.cancellable(threading.Event()) as cancel:
            work = in_thread(model.runner.embed, texts, truncate, cancel)
            work.add_done_callback(lambda done: self._let_go(model, done))
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

    def _let_go(self, model: LoadedModel, work: asyncio.Future) -> None:
        """A blocking runner call (an embedding, a count) let go of ``model``: it is free (the
        call's error, if nobody awaited it any more, is retrieved here)."""
        if not work.cancelled():
            work.exception()
        self.scheduler.release(model)


async def _prepared(model: ResolvedModel, request: Request, raw_options: Mapping[str, Any] | None,
                    budget: prompt.RenderBudget) -> None:
    """``runner.prepare.prepare`` off the event loop: choosing and probing a template parses and
    renders it, within ``budget``, which the request's prompt shares afterwards."""

    def run() -> None:  # logs in its thread: the awaiting task is gone when its client left
        try:
            prepare.prepare(model, request, raw_options, budget)
        except Cancelled:
            log.info("template rendering cancelled: the request was cancelled")
            raise

    await in_thread(run)


def _rendering(request: Request, budget: prompt.RenderBudget, call: Callable[[], Any]) -> Any:
    """``call()``, a runner call that renders ``request``'s prompt (submit, count), within
    ``budget`` (what the template probes left of it). A user's template that fails at render time
    is their error (InvalidRequest)."""
    try:
        with prompt.sharing(budget):
            return call()
    except Cancelled:  # the client left (or the server stops) while its prompt rendered
        log.info("template rendering cancelled: the request was cancelled")
        raise
    except PollamaError:
        raise
    except Exception as err:
        if request.template:
            raise InvalidRequest(f"template error: {err}") from None
        raise


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
