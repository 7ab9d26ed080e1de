"""Where the batch loop's decodes run: on the loop thread, or on a compute thread of their own.

The loop (:mod:`runner.loop.runner`) holds one :class:`Decoder`. After starting a batch it asks
:meth:`Decoder.running`: while the batch still computes, the loop builds and prepares the next
one — its inputs known except the tokens the running batch will sample, which are placeholders
filled in afterwards (reference §2.8, the seed's "build graph for next batch in parallel"). Only
one batch decodes at a time.

- :class:`InlineDecoder` decodes on the loop thread: a batch is done when ``start`` returns, so
  the loop builds the next batch after sampling, from real tokens (no overlap, no thread hand-off).
- :class:`ThreadDecoder` decodes on a compute thread: ctypes releases the GIL inside GGML and
  llama.cpp, so the loop thread prepares batch N+1 while N computes. It costs two thread
  hand-offs a batch and one more runnable thread beside the backend's workers: on a CPU with
  few cores that thread competes with the kernels (see bench/README.md, "Pipelining"), so it is
  chosen by a setting (``POLLAMA_PIPELINE``), off by default.
"""

from __future__ import annotations

import threading
from typing import Protocol

from .engine import Engine


class Decoder(Protocol):
    def start(self, engine: Engine) -> None:
        """Begin :meth:`Engine.decode` of ``engine``'s prepared batch; returns once the batch's
        inputs are handed over, so the next batch may be prepared."""

    def running(self) -> bool:
        """Whether the started batch is still decoding."""

    def wait(self) -> None:
        """Until the started batch is done; raises what its decode raised."""

    def close(self) -> None:
        """Stop (no batch may be running)."""


class InlineDecoder:
    """Decodes on the calling thread: :meth:`start` returns when the batch is done."""

    def start(self, engine: Engine) -> None:
        engine.decode(None)

    def running(self) -> bool:
        return False

    def wait(self) -> None:
        pass

    def close(self) -> None:
        pass


class ThreadDecoder:
    """Decodes on a compute thread of its own, one batch at a time."""

    def __init__(self, name: str = "pollama-compute") -> None:
        self._lock = threading.Condition()
        self._engine: Engine | None = None  # the batch to start
        self._started = threading.Event()
        self._done = threading.Event()
        self._done.set()
        self._error: BaseException | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def start(self, engine: Engine) -> None:
        self._started.clear()
        self._done.clear()
        self._error = None
        with self._lock:
            self._engine = engine
            self._lock.notify()
        self._started.wait()

    def running(self) -> bool:
        return not self._done.is_set()

    def wait(self) -> None:
        self._done.wait()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()
        if threading.current_thread() is not self._thread:
            self._thread.join()

    def _work(self) -> None:
        while True:
            with self._lock:
                while self._engine is None and not self._closed:
                    self._lock.wait()
                if self._closed:
                    return
                engine, self._engine = self._engine, None
            try:
                engine.decode(self._started)
            except BaseException as err:  # handed to the loop thread by wait()
                self._error = err
            finally:
                self._started.set()  # a decode that failed before its inputs were handed over
                self._done.set()
