"""HTTP plumbing shared by the APIs: error bodies, the cancellable streaming response, the request
boundary (JSON bodies, access log, last-resort 500).

Error bodies take the shape of the API a path belongs to (:func:`error_body`): OpenAI's
``{"error": {"message", "type", "param", "code"}}`` under ``/v1/``, Ollama's ``{"error": "..."}``
elsewhere. A response produced by a :class:`RunnerResponse` decides its status from its first
piece: an error raised before any output becomes that error's status and body; an error after the
headers went out is the producer's to report in-band.
"""

from __future__ import annotations

import json
import logging
import re
import time
from datetime import datetime, timezone
from typing import Any, AsyncIterator, Awaitable, Callable

import anyio
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from runner.api import PollamaError

log = logging.getLogger("runner.server")

NDJSON = "application/x-ndjson"
SSE = "text/event-stream"
JSON = "application/json; charset=utf-8"
BINARY_PATHS = ("/api/blobs/",)  # bodies that are not JSON: streamed to their handler as they come


def now_iso() -> str:
    """RFC 3339 UTC timestamp like Go's (microseconds)."""
    return iso(datetime.now(timezone.utc))


def iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")


def dumps(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")


async def json_response(build: Callable[[], Any]) -> Response:
    """The JSON response ``build()`` returns, built and serialised in a worker thread, a list of
    objects or arrays one element at a time: 5,000 embeddings are 37 MB of JSON, and FastAPI's
    encoding of them held the event loop (every other client) for 3 s; one ``json.dumps`` call
    in a thread still holds the GIL throughout (~1 s)."""
    body = await anyio.to_thread.run_sync(lambda: _dumps_piecewise(build()))
    return Response(body, media_type=JSON)


def _dumps_piecewise(obj: Any) -> bytes:
    if isinstance(obj, dict):
        return b"{" + b",".join(dumps(str(k)) + b":" + _dumps_piecewise(v) for k, v in obj.items()) + b"}"
    if isinstance(obj, list) and obj and isinstance(obj[0], (list, dict)):
        return b"[" + b",".join(_dumps_piecewise(item) for item in obj) + b"]"
    return dumps(obj)


def openai_error(status: int, message: str) -> dict[str, Any]:
    """OpenAI's error object; ``type`` as Ollama's openai.NewError chooses it from the status."""
    kind = {400: "invalid_request_error", 404: "not_found_error"}.get(status, "api_error")
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """Anthropic's error object, its ``type`` from the status."""
    kind = {400: "invalid_request_error", 404: "not_found_error", 503: "overloaded_error"}.get(status, "api_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def error_body(message: str, *, status: int = 500, path: str = "/api/") -> bytes:
    """The error body for a request to ``path``: Anthropic's shape on ``/v1/messages``, OpenAI's
    on the rest of ``/v1/*``, else Ollama's."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return dumps(anthropic_error(status, message))
    if path == "/v1" or path.startswith("/v1/"):
        return dumps(openai_error(status, message))
    return dumps({"error": message})


def status_of(err: BaseException) -> int:
    return int(getattr(err, "status", 500)) if isinstance(err, PollamaError) else 500


async def send_json(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", JSON.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


class RunnerResponse(Response):
    """An ASGI response whose body pieces come from an async generator that may wait on a model.

    While the body is produced, the client's connection is watched: when it goes away, ``on_close``
    runs (it cancels the runner's sequence, which frees the slot) and the producer is cancelled, so
    its ``finally`` blocks release what it holds. A :class:`PollamaError` raised before the first
    piece becomes an HTTP error with the path's :func:`error_body`.
    """

    def __init__(self, body: Callable[[], AsyncIterator[bytes]], media_type: str,
                 on_close: Callable[[], None] | None = None) -> None:
        # Not Response.__init__: there is no body to render up front. FastAPI passes a Response
        # through untouched and may attach background tasks, run once the body is sent.
        self.produce = body
        self.media_type = media_type
        self.on_close = on_close
        self.disconnected = False
        self.status_code = 200
        self.background = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async with anyio.create_task_group() as group:
            async def watch() -> None:
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        self.disconnected = True
                        if self.on_close is not None:
                            self.on_close()
                        group.cancel_scope.cancel()
                        return

            group.start_soon(watch)
            try:
                await self._produce(send, scope.get("path", ""))
            finally:
                group.cancel_scope.cancel()
        if self.background is not None and not self.disconnected:
            await self.background()

    async def _produce(self, send: Send, path: str) -> None:
        started = False
        pieces = self.produce()
        try:
            async for piece in pieces:
                if not started:
                    started = True
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [(b"content-type", self.media_type.encode()),
                                            (b"cache-control", b"no-cache"),
                                            (b"x-accel-buffering", b"no")]})
                await send({"type": "http.response.body", "body": piece, "more_body": True})
        except PollamaError as err:
            if started:
                log.warning("stream ended with an error: %s", err)
            else:
                status = status_of(err)
                await send_json(send, status, error_body(str(err), status=status, path=path))
                return
        except (anyio.get_cancelled_exc_class(), OSError):
            raise
        except Exception as err:  # a bug: log it, answer 500, keep serving
            log.exception("request failed")
            if not started:
                await send_json(send, 500, error_body(f"internal error: {err}", path=path))
                return
        finally:
            await _aclose(pieces)
        if started:
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await send_json(send, 500, error_body("no response produced", path=path))


async def _aclose(gen: AsyncIterator[bytes]) -> None:
    close: Callable[[], Awaitable[None]] | None = getattr(gen, "aclose", None)
    if close is not None:
        with anyio.CancelScope(shield=True):
            await close()


class ServerMiddleware:
    """Outermost layer: one log line per request, and a 500 in the path's error shape for anything
    that escaped the handlers."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        t0 = time.perf_counter()
        status = 0

        async def send_wrapper(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_wrapper)
        except Exception as err:
            log.exception("unhandled error on %s %s", scope.get("method"), path)
            if not status:
                status = 500
                try:
                    await send_json(send, 500, error_body(f"internal error: {err}", path=path))
                except Exception:
                    pass
        finally:
            elapsed = time.perf_counter() - t0
            client = scope.get("client") or ("-", 0)
            log.info('| %3d | %12s | %15s | %-7s "%s"', status, _elapsed(elapsed), client[0],
                     scope.get("method", "?"), path)


# An escaped UTF-16 surrogate (\ud800-\udfff) or its raw UTF-8 form (which Python's json
# decodes with "surrogatepass"): only bodies with one of these need the full check.
_SURROGATE_HINT = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")


def lone_surrogate(body: bytes) -> bool:
    """Whether a JSON body holds a string (value or key) with a lone UTF-16 surrogate: valid JSON,
    but not Unicode, so no text encoder downstream can take it."""
    if not _SURROGATE_HINT.search(body):
        return False
    try:
        value = json.loads(body)
    except ValueError:
        return False  # not JSON: the handler reports that
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class JsonBodyMiddleware:
    """The request boundary for the API's JSON bodies (POST, PUT, PATCH, DELETE under ``/api/`` and
    ``/v1/``; not the blob uploads of :data:`BINARY_PATHS`): the body is read whole before any
    handler runs, and

    - it is JSON whatever the content type says: ``curl -d '{...}'`` sends
      ``application/x-www-form-urlencoded`` and Ollama reads the body as JSON anyway;
    - a string with a lone UTF-16 surrogate (``"\\ud800"``) is refused with 400 here, once, instead
      of failing wherever the text is first encoded;
    - a client that goes away before its body is complete gets no handler run at all.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if (scope["type"] != "http" or scope.get("method") not in ("POST", "PUT", "PATCH", "DELETE")
                or not path.startswith(("/api/", "/v1/")) or path.startswith(BINARY_PATHS)):
            await self.app(scope, receive, send)
            return
        body = await _read_body(receive)
        if body is None:
            return
        if lone_surrogate(body):
            message = "invalid request: a string in the body holds a lone UTF-16 surrogate (\\ud800-\\udfff)"
            await send_json(send, 400, error_body(message, status=400, path=path))
            return
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-type"]
        headers.append((b"content-type", b"application/json"))
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(dict(scope, headers=headers), replay, send)


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body, or None when the client disconnected first."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


def _elapsed(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.3f}s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.3f}ms"
    return f"{seconds * 1e6:.1f}µs"
