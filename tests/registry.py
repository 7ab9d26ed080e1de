"""A small registry of our own on 127.0.0.1, speaking the protocol Ollama pulls with.

It serves ``GET /v2/{namespace}/{model}/manifests/{tag}`` (Docker manifest v2 JSON) and
``GET /v2/{namespace}/{model}/blobs/{digest}`` (with Range requests, and optionally through a
307 redirect to ``/cdn/{digest}`` as registry.ollama.ai and Hugging Face do) from models built
out of the test GGUFs. Knobs for the failure tests: drop a blob's connection after N bytes
(once), serve a blob with corrupted bytes, slow a blob down. For a registry that lies
(tests/test_pull_hostile.py), :attr:`LocalRegistry.routes` answers a path with one of the hostile
answers below: a gzip bomb, a body without end, a trickle, a hang, a redirect. Used by the pull
tests and ``bench/bench_pull.py``; a real HTTP server (``http.server``) in a thread.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import re
import select
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable, Iterable

Route = Callable[[BaseHTTPRequestHandler, "LocalRegistry"], None]

MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
LAYER = "application/vnd.ollama.image."

_ROUTE = re.compile(r"^/v2/([^/]+)/([^/]+)/(manifests|blobs)/([^/]+)$")


def digest_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class LocalRegistry:
    def __init__(self) -> None:
        self.manifests: dict[tuple[str, str, str], bytes] = {}
        self.blobs: dict[str, bytes] = {}
        self.files: dict[str, Path] = {}  # big blobs served from disk (the benchmark)
        self.drop_after: dict[str, int] = {}  # digest -> bytes sent before the connection drops (once)
        self.corrupt: set[str] = set()
        self.delay: dict[str, float] = {}  # digest -> seconds to sleep per 64 KiB
        self.redirect = True
        self.requests: list[tuple[str, str]] = []  # (path, Range header)
        self.routes: dict[str, Route] = {}  # request path -> a hostile answer (functions below)
        self.hangups: list[tuple[str, float]] = []  # (path, time.monotonic()): a client left mid-answer
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------------------- content
    def add_blob(self, data: bytes) -> dict[str, Any]:
        digest = digest_of(data)
        self.blobs[digest] = data
        return {"digest": digest, "size": len(data)}

    def add_file(self, path: Path) -> dict[str, Any]:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
        digest = "sha256:" + h.hexdigest()
        self.files[digest] = path
        return {"digest": digest, "size": path.stat().st_size}

    def add_model(self, namespace: str, model: str, tag: str, gguf: Path,
                  extra: dict[str, bytes] | None = None, from_disk: bool = False) -> dict[str, Any]:
        """A manifest: the GGUF as the model layer, ``extra`` {media suffix: bytes} as more layers."""
        weights = self.add_file(gguf) if from_disk else self.add_blob(gguf.read_bytes())
        layers = [{"mediaType": LAYER + "model", **weights}]
        for suffix, data in (extra or {}).items():
            layers.append({"mediaType": LAYER + suffix, **self.add_blob(data)})
        config = self.add_blob(json.dumps({"model_format": "gguf", "model_family": "llama"}).encode())
        manifest = {"schemaVersion": 2, "mediaType": MANIFEST,
                    "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
                    "layers": layers}
        self.manifests[(namespace, model, tag)] = json.dumps(manifest).encode()
        return manifest

    # ------------------------------------------------------------------------------ server
    @property
    def host(self) -> str:
        assert self._server is not None
        return f"127.0.0.1:{self._server.server_address[1]}"

    def name(self, namespace: str, model: str, tag: str) -> str:
        return f"{self.host}/{namespace}/{model}:{tag}"

    def start(self) -> "LocalRegistry":
        registry = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                registry.requests.append((self.path, self.headers.get("Range", "")))
                route = registry.routes.get(self.path)
                if route is not None:
                    return route(self, registry)
                if self.path.startswith("/cdn/"):
                    return self._blob(self.path[len("/cdn/"):])
                match = _ROUTE.match(self.path)
                if not match:
                    return self._error(404, "not found")
                namespace, model, kind, ref = match.groups()
                if kind == "manifests":
                    data = registry.manifests.get((namespace, model, ref))
                    if data is None:
                        return self._error(404, "manifest unknown")
                    return self._send(200, data, MANIFEST)
                if registry.redirect:
                    self.send_response(307)
                    self.send_header("Location", f"/cdn/{ref}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                return self._blob(ref)

            def _blob(self, digest: str) -> None:
                if digest in registry.files:
                    source: Any = open(registry.files[digest], "rb")
                    size = registry.files[digest].stat().st_size
                elif digest in registry.blobs:
                    data = registry.blobs[digest]
                    if digest in registry.corrupt:
                        data = bytes([data[0] ^ 0xFF]) + data[1:]
                    source, size = io.BytesIO(data), len(data)
                else:
                    return self._error(404, "blob unknown")
                with source:
                    start = 0
                    match = re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))
                    status = 200
                    if match:
                        start = int(match.group(1))
                        if start >= size:
                            return self._error(416, "range not satisfiable")
                        status = 206
                    self.send_response(status)
                    self.send_header("Content-Type", "application/octet-stream")
                    self.send_header("Content-Length", str(size - start))
                    if status == 206:
                        self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
                    self.end_headers()
                    source.seek(start)
                    drop = registry.drop_after.pop(digest, None)
                    if drop is not None:
                        self.wfile.write(source.read(max(drop - start, 0)))
                        self.wfile.flush()
                        self.close_connection = True
                        self.connection.shutdown(2)
                        return
                    delay = registry.delay.get(digest, 0.0)
                    step = 1 << 16 if delay else 1 << 22
                    for block in iter(lambda: source.read(step), b""):
                        self.wfile.write(block)
                        if delay:
                            time.sleep(delay)

            def _send(self, status: int, data: bytes, media: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", media)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _error(self, status: int, message: str) -> None:
                body = json.dumps({"errors": [{"code": "NOT_FOUND" if status == 404 else "ERROR",
                                               "message": message}]}).encode()
                self._send(status, body, "application/json")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hangs up (a cancelled or resumed pull) is not news

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def manifest_path(self, namespace: str, model: str, tag: str) -> str:
        return f"/v2/{namespace}/{model}/manifests/{tag}"

    def blob_path(self, namespace: str, model: str, digest: str) -> str:
        return f"/v2/{namespace}/{model}/blobs/{digest}"

    def __enter__(self) -> "LocalRegistry":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


# ------------------------------------------------------------------------ hostile answers
def _head(handler: BaseHTTPRequestHandler, status: int, headers: dict[str, str]) -> None:
    handler.send_response(status)
    for key, value in headers.items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.flush()


def answer(status: int, body: bytes, headers: dict[str, str] | None = None) -> Route:
    """A whole answer: ``status``, ``headers`` (Content-Length added) and ``body``."""
    def route(handler: BaseHTTPRequestHandler, registry: LocalRegistry) -> None:
        _head(handler, status, {"Content-Length": str(len(body)), **(headers or {})})
        handler.wfile.write(body)
    return route


@functools.lru_cache(maxsize=4)
def gzip_padded(prefix: bytes, padding: int) -> bytes:
    """``prefix`` then ``padding`` spaces, gzip-compressed without ever holding the padding:
    256 MiB of spaces become about 250 KiB (JSON allows the spaces after the value)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [z.compress(prefix)]
    block = b" " * (1 << 20)
    left = padding
    while left:
        n = min(left, len(block))
        out.append(z.compress(block[:n]))
        left -= n
    out.append(z.flush())
    return b"".join(out)


def gzip_bomb(prefix: bytes, padding: int, headers: dict[str, str] | None = None) -> Route:
    """``prefix`` + ``padding`` spaces sent gzip-compressed with ``Content-Encoding: gzip``."""
    return answer(200, gzip_padded(prefix, padding), {"Content-Encoding": "gzip", **(headers or {})})


def stream(chunks: Callable[[], Iterable[bytes]], length: int | None = None,
           headers: dict[str, str] | None = None) -> Route:
    """A 200 whose body is whatever ``chunks()`` yields (an endless generator: a body without
    end). ``length`` is the Content-Length it announces; None announces none and closes the
    connection after the body. Stops when the client leaves (recorded in ``registry.hangups``)."""
    def route(handler: BaseHTTPRequestHandler, registry: LocalRegistry) -> None:
        sizing = {"Content-Length": str(length)} if length is not None else {"Connection": "close"}
        handler.close_connection = True
        _head(handler, 200, {**sizing, **(headers or {})})
        try:
            for chunk in chunks():
                handler.wfile.write(chunk)
        except OSError:
            registry.hangups.append((handler.path, time.monotonic()))
    return route


def filler(prefix: bytes = b"", total: int | None = None, byte: bytes = b"\0",
           step: int = 1 << 16) -> Callable[[], Iterable[bytes]]:
    """``prefix``, then ``byte`` repeated until ``total`` bytes in all (None: without end)."""
    def chunks() -> Iterable[bytes]:
        yield prefix
        sent = len(prefix)
        block = byte * step
        while total is None or sent < total:
            n = step if total is None else min(step, total - sent)
            yield block[:n]
            sent += n
    return chunks


def trickle(body: bytes, every: float, headers: dict[str, str] | None = None) -> Route:
    """A 200 with an honest Content-Length whose body comes one byte every ``every`` seconds."""
    def route(handler: BaseHTTPRequestHandler, registry: LocalRegistry) -> None:
        _head(handler, 200, {"Content-Length": str(len(body)), **(headers or {})})
        try:
            for i in range(len(body)):
                handler.wfile.write(body[i:i + 1])
                handler.wfile.flush()
                time.sleep(every)
        except OSError:
            registry.hangups.append((handler.path, time.monotonic()))
    return route


def hang(head: bytes, total: int, seconds: float = 60.0) -> Route:
    """A 200 announcing ``total`` bytes that sends ``head`` and then nothing, until the client
    closes the connection (recorded in ``registry.hangups``) or ``seconds`` pass."""
    def route(handler: BaseHTTPRequestHandler, registry: LocalRegistry) -> None:
        _head(handler, 200, {"Content-Length": str(total), "Content-Type": "application/octet-stream"})
        handler.wfile.write(head)
        handler.wfile.flush()
        handler.close_connection = True
        sock = handler.connection
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            readable, _, _ = select.select([sock], [], [], 0.05)
            if readable:
                try:
                    data = sock.recv(1 << 16)
                except OSError:
                    data = b""
                if not data:  # the client closed its end
                    registry.hangups.append((handler.path, time.monotonic()))
                    return
    return route


def redirect(location: str, status: int = 307) -> Route:
    def route(handler: BaseHTTPRequestHandler, registry: LocalRegistry) -> None:
        _head(handler, status, {"Location": location, "Content-Length": "0"})
    return route


class OtherService:
    """Another HTTP service on this machine (not a registry): every GET gets ``status`` with a
    body that must never reach a pull's error message. ``requests`` counts what it was asked."""

    def __init__(self, status: int = 500, body: bytes = b"SECRET-OF-ANOTHER-SERVICE token=hunter2") -> None:
        self.status, self.body = status, body
        self.requests: list[str] = []
        service = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                service.requests.append(self.path)
                answer(service.status, service.body, {"Content-Type": "text/plain"})(self, None)  # type: ignore[arg-type]

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a pull that hangs up is not news

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
