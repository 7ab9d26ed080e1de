"""The scheduler: which models are loaded, who is using them, and when they unload (reference §5.4).

Everything here runs on the server's event loop; only the blocking work (loading a model, closing
one, a runner's stream) happens in threads. One load or unload happens at a time (Ollama's
``processPending``); a request whose model is already loaded with the same load-time options takes
it at once (``refs += 1``) and the runner's own FIFO queue gives it a slot.

Queue accounting: a request *waits* when it needs a load or finds every slot of its model taken.
When ``OLLAMA_MAX_QUEUE`` requests already wait, a new one that would wait is refused with 503.

Keep-alive: each request sets its model's keep-alive (its ``keep_alive`` or ``OLLAMA_KEEP_ALIVE``);
when the last user of a model leaves, a duration of 0 unloads it now, a positive one arms a timer,
a negative one keeps it forever. ``OLLAMA_MAX_LOADED_MODELS`` bounds the loaded models: loading one
more unloads the least recently used idle one (waiting for one to go idle when none is).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator

import runner as _runner
from runner import LoadOptions, ResolvedModel, store
from runner import config as _config
from runner.api import ModelInfo, Options, PollamaError, Runner, ServerBusy

from .bridge import Inbox, Job, in_thread

log = logging.getLogger(__name__)

BUSY_MESSAGE = "server busy, please try again.  maximum pending requests exceeded"
FOREVER = timedelta(days=365 * 290)  # Go's time.Now().Add(math.MaxInt64) lands ~292 years out


FOREVER_SECONDS = 1e9  # a keep-alive this long (~31 years) is forever: no timer, no overflow


class ShuttingDown(PollamaError):
    status = 503


def _load(model: ResolvedModel, plan: LoadOptions, cfg: _config.Config) -> Runner:
    return _runner.load(model, cfg=cfg, plan=plan)


# ---------------------------------------------------------------------------------- scheduler
@dataclass(eq=False)
class LoadedModel:
    key: str  # the resolved GGUF path: every name of one file shares one runner
    name: str
    stored: store.StoredModel
    runner: Runner
    load_key: LoadOptions
    keep_alive: float  # seconds; < 0 forever, 0 unload when idle
    refs: int = 0
    last_used: float = field(default_factory=time.monotonic)
    expires_at: datetime | None = None
    timer: asyncio.TimerHandle | None = None
    unloading: bool = False

    @property
    def info(self) -> ModelInfo:
        return self.runner.info


class Scheduler:
    def __init__(self, cfg: _config.Config,
                 load: Callable[[ResolvedModel, LoadOptions, _config.Config], Runner] | None = None) -> None:
        """``load(model, load_options, cfg)`` starts a runner (``runner.load``)."""
        self.cfg = cfg
        self._load_fn = load or _load
        self.loaded: dict[str, LoadedModel] = {}
        self._lock = asyncio.Lock()  # one load/unload decision at a time
        self._changed = asyncio.Event()  # replaced after each set: "refs or loaded models changed"
        self._loading_waiters = 0
        self._jobs: set[Job] = set()
        self._cancels: set[threading.Event] = set()  # blocking runner calls that shutdown must stop
        self._inbox: Inbox | None = None  # made on first use, on the serving event loop
        self._closing_tasks: set[asyncio.Future] = set()
        self.closing = False

    # ------------------------------------------------------------------------------ lookups
    def load_key(self, resolved: ResolvedModel, options: Options) -> LoadOptions:
        """What a loaded runner must match: the load-time options after defaults and clamps (a
        remote model loads nothing: every request shares its one runner)."""
        if resolved.remote is not None:
            return _runner.load_options(resolved.info, Options(), self.cfg)
        return _runner.load_options(resolved.info, options, self.cfg)

    def find(self, stored: store.StoredModel) -> LoadedModel | None:
        """The loaded runner of ``stored``'s file, if any."""
        return self.loaded.get(str(stored.path))

    def waiting(self) -> int:
        """Requests that wait: for a load, or for a slot of a loaded model."""
        queued = sum(max(0, m.refs - m.runner.num_parallel) for m in self.loaded.values())
        return self._loading_waiters + queued

    # ------------------------------------------------------------------------------ acquire
    async def acquire(self, resolved: ResolvedModel, options: Options, keep_alive: float | None) -> LoadedModel:
        """A runner for one request for ``resolved`` (``runner.resolve``); pair with :meth:`release`.

        Raises ServerBusy (queue full), LoadError.
        """
        if self.closing:
            raise ShuttingDown("server is shutting down")
        key = resolved.key
        want = self.load_key(resolved, options)
        keep = self.cfg.keep_alive if keep_alive is None else keep_alive
        model = self.loaded.get(key)
        if model is not None and model.load_key.serves(want) and not model.unloading:
            if model.refs >= model.runner.num_parallel and self.waiting() >= self.cfg.max_queue:
                raise ServerBusy(BUSY_MESSAGE)
            self._take(model, keep)
            return model
        if self.waiting() >= self.cfg.max_queue:
            raise ServerBusy(BUSY_MESSAGE)
        self._loading_waiters += 1
        try:
            async with self._lock:
                return await self._acquire_locked(resolved, want, keep)
        finally:
            self._loading_waiters -= 1

    async def _acquire_locked(self, resolved: ResolvedModel, want: LoadOptions, keep: float) -> LoadedModel:
        key = resolved.key
        while True:
            if self.closing:
                raise ShuttingDown("server is shutting down")
            model = self.loaded.get(key)
            if model is not None and model.load_key.serves(want) and not model.unloading:
                self._take(model, keep)
                return model
            if model is not None:  # loaded with other load-time options: reload once it is idle
                if model.refs > 0:
                    await self._wait_change()
                    continue
                await self._unload(model)
                continue
            local = [m for m in self.loaded.values() if m.stored.remote is None]  # remote ones hold no memory
            if resolved.remote is None and len(local) >= max(1, self.cfg.max_loaded_models):
                idle = [m for m in local if m.refs == 0]
                if not idle:
                    await self._wait_change()
                    continue
                await self._unload(min(idle, key=lambda m: m.last_used))
                continue
            break
        # Load in a task of its own: a client that leaves mid-load must not leak the runner.
        task = asyncio.ensure_future(self._load(resolved, want, keep))
        try:
            model = await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._orphaned)
            raise
        self._take(model, keep)
        return model

    def _orphaned(self, task: asyncio.Future) -> None:
        """The request that loaded a model left before taking it: let keep-alive decide."""
        if task.cancelled() or task.exception() is not None:
            return
        model: LoadedModel = task.result()
        if model.refs == 0:
            self._arm(model)

    async def _load(self, resolved: ResolvedModel, want: LoadOptions, keep: float) -> LoadedModel:
        stored = resolved.stored
        log.info("loading model %s (num_ctx=%d, num_batch=%d, num_thread=%d, parallel=%d)",
                 stored.name, want.num_ctx, want.num_batch, want.num_thread, want.num_parallel)
        loaded_runner = await in_thread(self._load_fn, resolved, want, self.cfg)
        model = LoadedModel(key=resolved.key, name=stored.name, stored=stored, runner=loaded_runner,
                            load_key=want, keep_alive=keep)
        self.loaded[resolved.key] = model
        log.info("loaded %s in %.2fs (%s engine)", stored.name, loaded_runner.load_duration / 1e9,
                 loaded_runner.engine)
        self._notify()
        return model

    def _take(self, model: LoadedModel, keep: float) -> None:
        model.refs += 1
        model.keep_alive = keep
        model.last_used = time.monotonic()
        if model.timer is not None:
            model.timer.cancel()
            model.timer = None
        model.expires_at = self._expiry(keep)

    def release(self, model: LoadedModel) -> None:
        """The request is done with ``model``: unload or arm the keep-alive timer when idle."""
        model.refs = max(0, model.refs - 1)
        model.last_used = time.monotonic()
        model.expires_at = self._expiry(model.keep_alive)
        if model.refs == 0 and not model.unloading:
            self._arm(model)
        self._notify()

    def _expiry(self, keep: float) -> datetime:
        now = datetime.now(timezone.utc)
        if keep < 0 or keep >= FOREVER_SECONDS:
            return now + FOREVER
        return now + timedelta(seconds=keep)

    def _arm(self, model: LoadedModel) -> None:
        if model.timer is not None:
            model.timer.cancel()
            model.timer = None
        if model.refs > 0 or model.unloading:
            return
        if model.keep_alive == 0:
            self._spawn_unload(model)
        elif 0 < model.keep_alive < FOREVER_SECONDS:
            loop = asyncio.get_running_loop()
            model.timer = loop.call_later(model.keep_alive, self._expire, model)

    def _expire(self, model: LoadedModel) -> None:
        model.timer = None
        if model.refs == 0 and not model.unloading and self.loaded.get(model.key) is model:
            log.info("keep-alive expired for %s", model.name)
            self._spawn_unload(model)

    def _spawn_unload(self, model: LoadedModel) -> None:
        if not self._detach(model):
            return
        task = asyncio.ensure_future(self._close(model))
        self._closing_tasks.add(task)
        task.add_done_callback(self._closing_tasks.discard)

    async def expire(self, model: LoadedModel) -> None:
        """``keep_alive: 0`` with no prompt (``pollama stop``): unload now, or once idle."""
        model.keep_alive = 0
        model.expires_at = datetime.now(timezone.utc)
        if model.refs == 0:
            await self._unload(model)

    def _detach(self, model: LoadedModel) -> bool:
        """Take ``model`` out of service at once (no request can take it after this); False when
        it already was. Closing happens after, in a thread."""
        if model.unloading:
            return False
        model.unloading = True
        if model.timer is not None:
            model.timer.cancel()
            model.timer = None
        if self.loaded.get(model.key) is model:
            del self.loaded[model.key]
        return True

    async def _unload(self, model: LoadedModel) -> None:
        if self._detach(model):
            await self._close(model)

    async def _close(self, model: LoadedModel) -> None:
        log.info("unloading %s", model.name)
        try:
            await asyncio.shield(in_thread(model.runner.close))
        except Exception:  # closing must not take the server down
            log.exception("error while unloading %s", model.name)
        self._notify()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    async def _wait_change(self) -> None:
        await self._changed.wait()

    # --------------------------------------------------------------------------------- jobs
    def start(self, begin: Callable[[Callable[[Any], None]], None], cancel: threading.Event) -> Job:
        """Start a runner stream (``begin(deliver)`` submits it); it is cancelled on server shutdown."""
        if self._inbox is None:
            self._inbox = Inbox(asyncio.get_running_loop())
        job = Job(begin, cancel, self._inbox)
        if self.closing:
            job.cancel()
        self._jobs.add(job)
        return job

    def finish(self, job: Job) -> None:
        """The request is done with ``job`` (its thread may still be winding down)."""
        if job.finished.is_set():
            self._jobs.discard(job)
        self._jobs = {j for j in self._jobs if not j.finished.is_set()}

    @contextlib.contextmanager
    def cancellable(self, cancel: threading.Event) -> Iterator[threading.Event]:
        """While inside, a shutdown sets ``cancel`` (a blocking runner call such as ``embed``
        watches it); set at once when the server is already shutting down."""
        self._cancels.add(cancel)
        if self.closing:
            cancel.set()
        try:
            yield cancel
        finally:
            self._cancels.discard(cancel)

    def cancel_all(self) -> None:
        """Shutdown, step 1 (from the signal handler, via the loop): refuse new requests and end
        every running stream and blocking runner call."""
        self.closing = True
        for job in list(self._jobs):
            job.cancel()
        for cancel in list(self._cancels):
            cancel.set()
        self._notify()

    async def close(self, grace: float = 10.0) -> None:
        """Shutdown, step 2: let the cancelled requests leave (up to ``grace`` seconds), then
        unload every model."""
        self.cancel_all()
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and (
            any(m.refs for m in self.loaded.values()) or any(not j.finished.is_set() for j in self._jobs)
        ):
            await asyncio.sleep(0.05)
        for model in list(self.loaded.values()):
            await self._unload(model)
        if self._closing_tasks:
            await asyncio.gather(*self._closing_tasks, return_exceptions=True)
