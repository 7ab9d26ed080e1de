"""HTTP to one upstream server, with the rules every call to it keeps.

- **Bounded:** a JSON answer is read up to :data:`MAX_BODY`, an error body up to
  :data:`MAX_ERROR`, a stream one line (one event) at a time up to :data:`MAX_LINE` and
  :data:`MAX_STREAM` in all; more is an :class:`~runner.api.UpstreamError`, never memory.
- **Redirects** are followed (at most :data:`MAX_REDIRECTS`) only within the upstream's own
  origin; one to another host (or scheme, or port) is refused: a prompt goes nowhere the user did
  not name.
- **Timeouts:** :data:`CONNECT_TIMEOUT` to connect; ``POLLAMA_REMOTE_TIMEOUT`` for the first byte
  of the answer, and then between bytes.
- **Errors** name the upstream: :class:`Unreachable` (no connection, or no answer before the
  timeout: the replica is down), :class:`Failed` (its 5xx: try another), and an
  :class:`~runner.api.UpstreamError` with the upstream's own 4xx status for a request it refused.
- The API key is sent as a bearer token: the upstream's own from ``POLLAMA_REMOTE_API_KEYS``,
  else ``POLLAMA_REMOTE_API_KEY`` (:meth:`runner.config.Config.remote_key`); nothing is stored,
  and no message names the key, only where it came from.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
from typing import Any, Iterator
from urllib.parse import urljoin, urlsplit

import httpx

from .. import config as _config
from ..api import Cancelled, UpstreamError
from .upstream import Upstream

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
MAX_BODY = 256 << 20  # an embeddings answer: 5,000 vectors of 4,096 floats as JSON is ~400 MB; bounded below that
MAX_ERROR = 64 << 10
MAX_LINE = 8 << 20  # one stream event (a long tool call's arguments fit many times)
MAX_STREAM = 512 << 20
MAX_REDIRECTS = 3
MAX_MESSAGE = 500  # characters of an upstream's error message passed on


class Unreachable(UpstreamError):
    """No answer from the upstream: refused, unresolvable, or silent past the timeout (before
    its first byte). Another replica may take the request; this one is marked down."""


class Failed(UpstreamError):
    """The upstream answered with a 5xx before its first byte: another replica may take it."""


class Connection:
    """Calls to one upstream (a thread-safe pool of HTTP connections)."""

    def __init__(self, upstream: Upstream, cfg: _config.Config) -> None:
        self.upstream = upstream
        headers = {"Accept": "application/json, text/event-stream, application/x-ndjson"}
        _, host, port = upstream.origin
        self.key = cfg.remote_key(host, port)
        if self.key is not None:
            headers["Authorization"] = f"Bearer {self.key.value}"
        self._client = httpx.Client(
            timeout=httpx.Timeout(cfg.remote_timeout, connect=CONNECT_TIMEOUT),
            follow_redirects=False, headers=headers,
            limits=httpx.Limits(max_connections=max(4, cfg.remote_parallel), max_keepalive_connections=8),
        )

    def close(self) -> None:
        self._client.close()

    def url(self, path: str) -> str:
        return self.upstream.url + path

    # ------------------------------------------------------------------------------- calls
    @contextlib.contextmanager
    def open(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Iterator[httpx.Response]:
        """The upstream's answer to ``method path`` (JSON ``body``), its headers read and its
        status a success; the body is the caller's to read (:func:`lines`, :meth:`json`).
        ``timeout``: seconds for each step instead of the configured ones (a health check)."""
        url = self.url(path)
        content = json.dumps(body).encode() if body is not None else None
        for _ in range(MAX_REDIRECTS + 1):
            try:
                request = self._client.build_request(method, url, content=content, headers=(
                    {"Content-Type": "application/json"} if content is not None else None),
                    timeout=httpx.Timeout(timeout) if timeout is not None else httpx.USE_CLIENT_DEFAULT)
                response = self._client.send(request, stream=True)
            except (httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout, httpx.PoolTimeout,
                    httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as err:
                raise Unreachable(f"upstream {self.upstream} did not answer: {_reason(err)}") from None
            except (httpx.HTTPError, httpx.InvalidURL, UnicodeError, ValueError) as err:
                raise Failed(f"upstream {self.upstream} failed: {_reason(err)}") from None
            try:
                if response.is_redirect:
                    url = self._redirect(url, response)
                    continue
                if response.status_code >= 400:
                    raise self._error(response)
                yield response
                return
            finally:
                response.close()
        raise Failed(f"upstream {self.upstream} redirected more than {MAX_REDIRECTS} times")

    def json(self, method: str, path: str, body: Any = None, limit: int = MAX_BODY,
             timeout: float | None = None) -> Any:
        """The upstream's JSON answer (at most ``limit`` bytes)."""
        with self.open(method, path, body, timeout) as response:
            data = read_bounded(response, limit, self.upstream)
        try:
            return json.loads(data)
        except ValueError:
            raise UpstreamError(f"upstream {self.upstream} sent an answer that is not JSON: {_snippet(data)}") from None

    def _redirect(self, url: str, response: httpx.Response) -> str:
        location = response.headers.get("location", "")
        target = urljoin(url, location)
        parts = urlsplit(target)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if (parts.scheme, (parts.hostname or "").lower(), port) != self.upstream.origin:
            raise UpstreamError(f"upstream {self.upstream} redirected to {parts.scheme}://{parts.hostname}"
                                f"{':' + str(parts.port) if parts.port else ''}: redirects to another host are "
                                "not followed")
        if response.status_code not in (307, 308):
            raise UpstreamError(f"upstream {self.upstream} answered {response.status_code} (a redirect that "
                                "drops the request's body): use the URL it redirects to in FROM")
        return target

    def _error(self, response: httpx.Response) -> UpstreamError:
        status = response.status_code
        try:
            data = read_bounded(response, MAX_ERROR, self.upstream, cut=True)
        except UpstreamError:
            data = b""
        message = error_message(data) or response.reason_phrase or "no message"
        if self.key is not None:  # an upstream that echoes the key it refused must not spread it
            message = message.replace(self.key.value, "***")
        text = f"upstream {self.upstream} answered {status}: {message}"
        if status >= 500:
            return Failed(text)
        if status in (401, 403):
            if self.key is None:
                _, host, port = self.upstream.origin
                where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                hint = f" (set POLLAMA_REMOTE_API_KEY, or {where}=KEY in POLLAMA_REMOTE_API_KEYS)"
            else:
                hint = f" (pollama sent the key from {self.key.source})"
            return UpstreamError(text + hint, status)
        return UpstreamError(text, status if 400 <= status < 500 else 502)


def read_bounded(response: httpx.Response, limit: int, upstream: Upstream, cut: bool = False) -> bytes:
    """The response body, at most ``limit`` bytes (``cut``: the first ``limit`` bytes of a longer
    one; else a longer body is an UpstreamError)."""
    out = bytearray()
    try:
        for piece in response.iter_bytes():
            out += piece
            if len(out) > limit:
                if cut:
                    return bytes(out[:limit])
                raise UpstreamError(f"upstream {upstream} sent more than {limit >> 20} MiB: refused")
    except httpx.HTTPError as err:
        raise UpstreamError(f"upstream {upstream} broke off its answer: {_reason(err)}") from None
    return bytes(out)


def lines(response: httpx.Response, upstream: Upstream, cancel: threading.Event | None = None) -> Iterator[bytes]:
    """The lines of a streamed answer as they arrive (without their line ends; blank lines
    skipped), each at most :data:`MAX_LINE` bytes. Raises UpstreamError when the upstream breaks
    off or sends too much; Cancelled when ``cancel`` is set (checked as each piece arrives)."""
    pending = bytearray()
    total = 0
    try:
        for piece in response.iter_raw():
            if cancel is not None and cancel.is_set():
                raise Cancelled("the request was cancelled")
            total += len(piece)
            if total > MAX_STREAM:
                raise UpstreamError(f"upstream {upstream} streamed more than {MAX_STREAM >> 20} MiB: refused")
            pending += piece
            while True:
                end = pending.find(b"\n")
                if end < 0:
                    break
                line = bytes(pending[:end]).rstrip(b"\r")
                del pending[:end + 1]
                if line:
                    yield line
            if len(pending) > MAX_LINE:
                raise UpstreamError(f"upstream {upstream} sent a line longer than {MAX_LINE >> 20} MiB: refused")
    except httpx.HTTPError as err:
        raise UpstreamError(f"upstream {upstream} broke off its answer: {_reason(err)}") from None
    if pending.strip():
        yield bytes(pending).rstrip(b"\r")


def error_message(data: bytes) -> str:
    """The message of an upstream's error body: Ollama's ``{"error": "..."}``, OpenAI's
    ``{"error": {"message": ...}}``, or the text itself; cut to :data:`MAX_MESSAGE`."""
    text = data.decode("utf-8", errors="replace").strip()
    try:
        body = json.loads(text)
    except ValueError:
        return _snippet(data)
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return str(err)[:MAX_MESSAGE]
    return _snippet(data)


def _snippet(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip().replace("\n", " ")
    return text[:MAX_MESSAGE] + ("..." if len(text) > MAX_MESSAGE else "")


def _reason(err: BaseException) -> str:
    text = str(err).strip()
    return text or type(err).__name__
