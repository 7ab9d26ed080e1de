"""A small registry of our own on 127.0.0.1, speaking the protocol Ollama pulls with.

It serves ``GET /v2/{namespace}/{model}/manifests/{tag}`` (Docker manifest v2 JSON) and
``GET /v2/{namespace}/{model}/blobs/{digest}`` (with Range requests, and optionally through a
307 redirect to ``/cdn/{digest}`` as registry.ollama.ai and Hugging Face do) from models built
out of the test GGUFs. Knobs for the failure tests: drop a blob's connection after N bytes
(once), serve a blob with corrupted bytes, slow a blob down. Used by the pull tests and
``bench/bench_pull.py``; a real HTTP server (``http.server``) in a thread.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

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
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> "LocalRegistry":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
