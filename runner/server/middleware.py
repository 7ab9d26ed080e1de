"""Browser and network safety for ``pollama serve``: Ollama's Origin (CORS) and Host rules.

Any web page the user opens can make the browser send requests to ``http://127.0.0.1:11434``.
Two rules keep such pages out. They run on every request before anything reads its body:

1. **Origin (CORS).** A request without an ``Origin`` header, or whose ``Origin`` is
   ``http://`` or ``https://`` + its own ``Host``, is not cross-origin: it passes. Any other
   origin must be allowed, else the answer is 403 and nothing runs. This also stops the "simple"
   cross-origin requests (a ``text/plain`` POST) that browsers send without a preflight.
   Allowed by default: ``http://`` and ``https://`` ``localhost``, ``127.0.0.1`` and ``0.0.0.0``,
   on any port, and the ``app://``, ``file://``, ``tauri://``, ``vscode-webview://`` and
   ``vscode-file://`` schemes. ``OLLAMA_ORIGINS`` adds entries: exact origins, or with one ``*``
   that matches any text (``chrome-extension://*``, ``http://example.com:*``); ``*`` alone allows
   every origin. An allowed preflight (``OPTIONS``) answers 204 with the allowed methods and
   headers (the OpenAI SDK's ``x-stainless-*`` among them) and a 12 h max age; any other allowed
   request is answered with ``Access-Control-Allow-Origin`` (the origin, or ``*`` when ``*`` is
   allowed) and ``Vary: Origin``. This is gin-contrib/cors as Ollama configures it.
2. **Host (DNS rebinding).** When the server listens on a loopback address, the ``Host`` header
   must name this machine or a local network, as Ollama's rule says (:mod:`.hostrule`): a
   loopback, private, unspecified or own-interface IP, ``localhost``, the machine's hostname, or
   a name ending in ``.localhost``, ``.local`` or ``.internal``; else 403. A page on
   ``evil.example`` whose name is made to resolve to 127.0.0.1 still sends ``Host: evil.example``.
   A request without ``Host`` passes (HTTP/1.0; browsers always send one). Listening on any
   other address (``0.0.0.0``, a LAN IP) means the user chose to be reachable by other
   machines: no Host check, as in Ollama.

An ``OPTIONS`` request that passes the Host rule by its name (not by an IP literal) is answered
204 with no body, as Ollama's middleware does; any other goes on to the routes (405 or 404 there).
Refusals carry the API's error body (see :func:`runner.server.http.error_body`) naming what was
refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .hostrule import Hosts, Verdict
from .http import error_body, send_json

DEFAULT_ORIGIN_HOSTS = ("localhost", "127.0.0.1", "0.0.0.0")
DEFAULT_ORIGIN_SCHEMES = ("app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")
ALLOWED_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS")
ALLOWED_HEADERS = (
    "Authorization", "Content-Type", "User-Agent", "Accept", "X-Requested-With",
    # the OpenAI SDKs'
    "Openai-Beta", "X-Stainless-Arch", "X-Stainless-Async", "X-Stainless-Custom-Poll-Interval",
    "X-Stainless-Helper-Method", "X-Stainless-Lang", "X-Stainless-Os", "X-Stainless-Package-Version",
    "X-Stainless-Poll-Helper", "X-Stainless-Retry-Count", "X-Stainless-Runtime",
    "X-Stainless-Runtime-Version", "X-Stainless-Timeout",
)
MAX_AGE = 12 * 3600


def default_origins() -> tuple[str, ...]:
    """Ollama's built-in allowed origins (envconfig.AllowedOrigins without OLLAMA_ORIGINS)."""
    web = tuple(f"{scheme}://{host}{port}" for host in DEFAULT_ORIGIN_HOSTS
                for port in ("", ":*") for scheme in ("http", "https"))
    return web + DEFAULT_ORIGIN_SCHEMES


@dataclass(frozen=True)
class Origins:
    """The allowed origins: exact strings, and (prefix, suffix) pairs for entries with a ``*``."""

    allow_all: bool
    exact: frozenset[str]
    wildcards: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, entries: Iterable[str]) -> Origins:
        """From trimmed, lowercased entries (config.parse_origins) plus :func:`default_origins`."""
        every = (*entries, *default_origins())
        wildcards = tuple((e.partition("*")[0], e.partition("*")[2]) for e in every if e.count("*") == 1)
        return cls("*" in every, frozenset(e for e in every if "*" not in e), wildcards)

    def allows(self, origin: str) -> bool:
        if self.allow_all or origin in self.exact:
            return True
        return any(origin.startswith(prefix) and origin.endswith(suffix) for prefix, suffix in self.wildcards)

    def response_headers(self, origin: str, preflight: bool) -> list[tuple[bytes, bytes]]:
        """The CORS headers for an allowed ``origin``."""
        out = [(b"access-control-allow-origin", b"*" if self.allow_all else origin.encode("latin-1"))]
        if preflight:
            out += [(b"access-control-allow-methods", ",".join(ALLOWED_METHODS).encode()),
                    (b"access-control-allow-headers", ",".join(ALLOWED_HEADERS).encode()),
                    (b"access-control-max-age", str(MAX_AGE).encode())]
        if not self.allow_all:
            out.append((b"vary", b"Origin"))
            if preflight:
                out += [(b"vary", b"Access-Control-Request-Method"), (b"vary", b"Access-Control-Request-Headers")]
        return out


class GuardMiddleware:
    """The two rules of this module, outside every handler."""

    def __init__(self, app: ASGIApp, origins: Origins, hosts: Hosts) -> None:
        self.app = app
        self.origins = origins
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope.get("path", "")
        host = headers.get("host", "")
        origin = headers.get("origin")
        preflight = scope.get("method") == "OPTIONS"
        cors: list[tuple[bytes, bytes]] = []
        if origin and origin not in (f"http://{host}", f"https://{host}"):
            if not self.origins.allows(origin):
                message = f"origin {origin} is not allowed: set OLLAMA_ORIGINS to allow it"
                await send_json(send, 403, error_body(message, status=403, path=path))
                return
            cors = self.origins.response_headers(origin, preflight)
            if preflight:
                await _no_content(send, cors)
                return
        verdict = self.hosts.verdict(host)
        if verdict is Verdict.REFUSED:
            message = (f"host {host} is not allowed: a server on a loopback address answers only localhost, "
                       "this machine's hostname and IPs, *.localhost, *.local, *.internal and loopback or "
                       "private IPs (a proxy in front should send Host: localhost)")
            await send_json(send, 403, error_body(message, status=403, path=path))
            return
        if preflight and verdict is Verdict.NAME:
            await _no_content(send, [])
            return
        if not cors:
            await self.app(scope, receive, send)
            return

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message, headers=[*message.get("headers", []), *cors])
            await send(message)

        await self.app(scope, receive, send_with_cors)


async def _no_content(send: Send, headers: list[tuple[bytes, bytes]]) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": headers})
    await send({"type": "http.response.body", "body": b""})
