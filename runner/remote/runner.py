"""The runner of a remote model: the runner contract (:class:`runner.api.Runner`) kept by
forwarding each request to an upstream server instead of decoding it here.

A request arrives prepared (``runner.prepare.prepare``: options merged, the model's SYSTEM and
MESSAGEs in, nothing templated); its upstream's dialect (:mod:`.openai_wire`, :mod:`.ollama_wire`)
turns it into a streamed chat request, and each line of the answer becomes chunks as it arrives:
nothing is buffered. Every API front end and ``pollama run`` work unchanged on top.

Replicas (:mod:`.replicas`): a request goes to the replica its conversation's prefix went to,
within the imbalance and in-flight rules; a replica that refuses the connection, times out or
fails (5xx) before the first chunk was passed on is marked down (not for a 5xx) and the request
tries the next one; a failure after the first chunk ends the stream with an error, which each API
reports in its own shape. A health-check thread probes the replicas marked down and brings back
those that answer.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
import time
from typing import Any, Callable, Iterator

from .. import config as _config
from ..api import (
    Cancelled,
    Chunk,
    DoneReason,
    Embedding,
    InvalidRequest,
    Metrics,
    ModelInfo,
    Offload,
    PollamaError,
    Request,
    UpstreamError,
)
from .client import MAX_ERROR, Connection, Unreachable, lines
from .replicas import Replicas
from .upstream import RemoteModel

log = logging.getLogger(__name__)

HEALTH_INTERVAL = 5.0  # seconds between probes of the replicas marked down
HEALTH_TIMEOUT = 5.0
WAIT_STEP = 0.25  # seconds between looks at a waiting request's cancel event


def prefix_key(request: Request) -> str:
    """A conversation's identity for prefix affinity: a hash of its first blocks (the system
    prompt, the tools, the messages up to and including the first user turn; a completion's
    system prompt and the start of its prompt), which later turns of it share."""
    head: list[Any] = []
    if request.messages is not None:
        for m in request.messages:
            head.append([m.role, m.content, [i.digest for i in m.images]])
            if m.role == "user":
                break
    else:
        head.append(request.prompt[:4096])
    blob = json.dumps({"system": request.system or "", "tools": [t.wire() for t in request.tools], "head": head},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


class RemoteRunner:
    """A remote model, "loaded": connections to its replicas and their routing state."""

    engine = "remote"

    def __init__(self, info: ModelInfo, remote: RemoteModel, cfg: _config.Config) -> None:
        self.info = info
        self.remote = remote
        self.connections = [Connection(u, cfg) for u in remote.upstreams]
        self.dialects = [u.dialect() for u in remote.upstreams]
        self.replicas = Replicas(len(remote.upstreams), limit=cfg.remote_parallel)
        self.num_ctx = remote.context_length
        self.num_parallel = len(remote.upstreams) * cfg.remote_parallel
        self.num_batch = 0
        self.n_vocab = 0
        self.memory_size = 0
        self.load_duration = 0
        self.offload = Offload(devices="remote")  # nothing here: the upstream's devices are its own
        self._routing = threading.Condition()
        self._closed = threading.Event()
        self._health = threading.Thread(target=self._check_health, name=f"remote-health:{info.name}", daemon=True)
        self._health.start()

    # ---------------------------------------------------------------------------- generation
    def stream(self, request: Request) -> Iterator[Chunk]:
        body = self.dialects[0].chat_body(request, self.remote.model)  # what cannot be sent raises here
        return self._stream(request, body)

    def submit(self, request: Request, deliver: Callable[[Chunk | PollamaError], None]) -> None:
        chunks = self.stream(request)

        def work() -> None:
            try:
                for chunk in chunks:
                    deliver(chunk)
            except PollamaError as err:
                deliver(err)
            except Exception as err:  # a bug of ours: the stream still ends, with its message
                log.exception("remote stream failed")
                deliver(UpstreamError(f"forwarding to the upstream failed: {err}"))

        threading.Thread(target=work, name=f"remote:{self.info.name}", daemon=True).start()

    def count(self, request: Request) -> int:
        """The prompt's size as the upstream counts it: the request sent for one token."""
        options = dataclasses.replace(request.options, num_predict=1)
        probe = dataclasses.replace(request, options=options, options_set=request.options_set | {"num_predict"})
        final = None
        for chunk in self.stream(probe):
            final = chunk if chunk.done else final
        return final.metrics.prompt_tokens if final is not None and final.metrics is not None else 0

    def _stream(self, request: Request, body: dict[str, Any]) -> Iterator[Chunk]:
        key = prefix_key(request)
        t0 = time.perf_counter_ns()
        tried: set[int] = set()
        while True:
            i = self._take(key, tried, request.cancel)
            passed = False
            try:
                conn = self.connections[i]
                with conn.open("POST", self.dialects[i].chat_path, body) as response:
                    self._answered(i)
                    reader = self.dialects[i].reader()
                    first_ns = 0
                    try:
                        for line in lines(response, conn.upstream, request.cancel):
                            for chunk in reader.read(line):
                                if not passed:
                                    first_ns = time.perf_counter_ns()
                                    chunk.metrics = chunk.metrics or Metrics()
                                if chunk.done:
                                    _timed(chunk, t0, first_ns)
                                passed = True
                                yield chunk
                                if chunk.done:
                                    return
                        for chunk in reader.end():  # the stream closed: the answer ends here
                            _timed(chunk, t0, first_ns)
                            yield chunk
                        return
                    except Cancelled:
                        yield Chunk(done=True, done_reason=DoneReason.CONNECTION_CLOSED, metrics=Metrics())
                        return
            except UpstreamError as err:
                if passed or err.status < 500:
                    raise
                tried.add(i)
                if isinstance(err, Unreachable):
                    self._mark_down(i)
                if len(tried) >= len(self.connections):
                    raise
                log.warning("%s; trying another replica", err)
            finally:
                self._release(i)

    # ---------------------------------------------------------------------------- embeddings
    def embed(self, texts: list[str | list[int]], truncate: bool = True,
              cancel: threading.Event | None = None) -> Embedding:
        cancel = cancel or threading.Event()
        body = self.dialects[0].embed_body(texts, truncate, self.remote.model)
        tried: set[int] = set()
        while True:
            i = self._take(None, tried, cancel)
            try:
                result = self.connections[i].json("POST", self.dialects[i].embed_path, body)
                self._answered(i)
                return self.dialects[i].embedding(result, len(texts))
            except UpstreamError as err:
                if err.status < 500:
                    raise
                tried.add(i)
                if isinstance(err, Unreachable):
                    self._mark_down(i)
                if len(tried) >= len(self.connections) or cancel.is_set():
                    raise
                log.warning("%s; trying another replica", err)
            finally:
                self._release(i)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        raise InvalidRequest(f'"{self.info.name}" is a remote model: its tokenizer is on its upstream')

    def detokenize(self, tokens: list[int]) -> str:
        raise InvalidRequest(f'"{self.info.name}" is a remote model: its tokenizer is on its upstream')

    def close(self) -> None:
        self._closed.set()
        with self._routing:
            self._routing.notify_all()
        for conn in self.connections:
            conn.close()

    # ------------------------------------------------------------------------------- routing
    def _take(self, key: str | None, tried: set[int], cancel: threading.Event) -> int:
        """A replica for the request, counted in (wait while all are at their limit)."""
        with self._routing:
            while True:
                if cancel.is_set() or self._closed.is_set():
                    raise Cancelled("the request was cancelled")
                i = self.replicas.pick(key, time.monotonic(), frozenset(tried))
                if i is not None:
                    self.replicas.start(i, key)
                    return i
                self._routing.wait(WAIT_STEP)

    def _release(self, i: int) -> None:
        with self._routing:
            self.replicas.finish(i)
            self._routing.notify()

    def _answered(self, i: int) -> None:
        with self._routing:
            self.replicas.up(i)

    def _mark_down(self, i: int) -> None:
        with self._routing:
            self.replicas.down(i, time.monotonic())

    def _check_health(self) -> None:
        while not self._closed.wait(HEALTH_INTERVAL):
            with self._routing:
                down = self.replicas.downs(time.monotonic())
            for i in down:
                try:
                    self.connections[i].json("GET", self.dialects[i].models_path, limit=MAX_ERROR * 16,
                                             timeout=HEALTH_TIMEOUT)
                except (PollamaError, RuntimeError):  # still down (or closing)
                    continue
                log.info("upstream %s answers again", self.connections[i].upstream)
                self._answered(i)


def _timed(chunk: Chunk, t0: int, first_ns: int) -> None:
    """The done chunk's durations where the upstream sent none: the wait for the first chunk
    (the prompt) and the rest (the answer), measured here."""
    if not chunk.done:
        return
    now = time.perf_counter_ns()
    metrics = chunk.metrics or Metrics()
    first_ns = first_ns or now
    if not metrics.prompt_eval_duration:
        metrics.prompt_eval_duration = first_ns - t0
    if not metrics.eval_duration:
        metrics.eval_duration = now - first_ns
    chunk.metrics = metrics
