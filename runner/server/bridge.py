"""The bridge between runner threads and the server's event loop.

Runner calls block (a load, ``embed`` waiting for its slot) and runner streams are pushed from
the runner's loop thread; the server's handlers are coroutines. :func:`in_thread` runs a
blocking call in a thread of its own and resolves a future on the loop; :class:`Job` runs one
runner stream (``Runner.submit``), and :class:`Inbox` carries its chunks onto the loop with one
wake-up per burst.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, AsyncIterator, Callable, TypeVar

from runner.api import Chunk

T = TypeVar("T")


def in_thread(fn: Callable[..., T], *args: Any) -> "asyncio.Future[T]":
    """Run ``fn(*args)`` in a fresh daemon thread; the future resolves on the calling loop.

    A thread per call (not the shared pool): runner calls block while they wait for a slot, and
    hundreds of queued requests must not starve a bounded pool.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def work() -> None:
        try:
            result = fn(*args)
        except BaseException as err:  # delivered to the awaiting task
            _call_soon(loop, settle, False, err)
        else:
            _call_soon(loop, settle, True, result)

    threading.Thread(target=work, name="pollama-call", daemon=True).start()
    return future


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the loop is closed: the server is gone, nobody is listening
        pass


class Inbox:
    """Items from runner threads to asyncio queues, with one event-loop wake-up per burst.

    A runner's loop thread finishes a batch and hands each of its streams a chunk within a few
    microseconds: the first item of a burst schedules one drain on the event loop, the rest ride
    along. That keeps the threads that wake per token to one (the event loop), which matters on
    a machine whose cores are all busy decoding.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[asyncio.Queue, Any]] = []

    def post(self, queue: "asyncio.Queue[Any]", item: Any) -> None:
        """Any thread: put ``item`` on ``queue`` (which belongs to the event loop) soon."""
        with self._lock:
            self._items.append((queue, item))
            first = len(self._items) == 1
        if first:
            _call_soon(self._loop, self._drain)

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for queue, item in items:
            queue.put_nowait(item)


class Job:
    """A runner stream (``generate``/``chat``) whose chunks the runner pushes onto the event loop.

    ``start(deliver)`` runs in a short-lived thread, so the runner's eager validation (template
    rendering, tokenization) never blocks the loop; it hands the request to the runner
    (:meth:`Runner.submit`), whose loop thread then calls ``deliver`` per chunk. Its errors arrive
    as the stream's first item. :meth:`cancel` sets the request's cancel event: the runner ends the
    sequence at its next batch, frees the slot and delivers the last chunk, which marks the job
    finished.
    """

    def __init__(self, start: Callable[[Callable[[Any], None]], None], cancel: threading.Event,
                 inbox: Inbox) -> None:
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._inbox = inbox
        self._cancel = cancel
        self.finished = threading.Event()
        threading.Thread(target=self._start, args=(start,), name="pollama-job", daemon=True).start()

    def _start(self, start: Callable[[Callable[[Any], None]], None]) -> None:
        try:
            start(self._deliver)
        except BaseException as err:
            self._deliver(err)

    def _deliver(self, item: Any) -> None:
        if isinstance(item, BaseException) or (isinstance(item, Chunk) and item.done):
            self.finished.set()
        self._inbox.post(self._queue, item)

    def cancel(self) -> None:
        self._cancel.set()

    async def chunks(self) -> AsyncIterator[Chunk]:
        """The runner's chunks up to the done one; its errors are raised here."""
        while True:
            item = await self._queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if item.done:
                return
