"""A deliberately broken OpenAI-compatible upstream on 127.0.0.1, for the remote-model fault tests.

A real HTTP server (``http.server`` in a thread). ``GET /v1/models`` lists one model; ``POST
/v1/chat/completions`` and ``/v1/embeddings`` answer as :attr:`BrokenUpstream.mode` says:

- ``ok``: a short, well-formed stream ("Hello", " world", usage, ``[DONE]``);
- ``hang``: reads the request, then sends nothing until the server stops;
- ``die``: headers and one chunk, then the connection is cut mid-stream;
- ``hang_after_first``: one chunk, then silence;
- ``garbage``: a 200 stream whose events are not JSON;
- ``redirect``: a 307 to the same path on another host (``localhost`` vs ``127.0.0.1``);
- ``oversized``: a stream line longer than the client's bound, and no newline;
- ``not_found``: OpenAI's 404 error body; ``server_error``: a 500;
- ``truncated``: content chunks, then the stream closes without a finish or ``[DONE]``.

Each request's path and JSON body is kept in :attr:`requests`, its ``Authorization`` header (""
when none) in :attr:`auth`. With :attr:`key` set, a request without ``Bearer KEY`` gets OpenAI's
401, whose message (as a careless server's would) repeats the token it was sent.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "broken-model"


class BrokenUpstream:
    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.requests: list[tuple[str, Any]] = []
        self.auth: list[str] = []
        self.key: str | None = None
        self.stopping = threading.Event()
        self._server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "BrokenUpstream":
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def refused(self) -> bool:
                """Whether the request lacks the key (then it has its 401)."""
                sent = self.headers.get("authorization") or ""
                upstream.auth.append(sent)
                if upstream.key is None or sent == f"Bearer {upstream.key}":
                    return False
                self._json(401, {"error": {"message": f"Incorrect API key provided: {sent.removeprefix('Bearer ')}",
                                           "type": "invalid_request_error", "code": "invalid_api_key"}})
                return True

            def do_GET(self) -> None:
                upstream.requests.append((self.path, None))
                if self.refused():
                    return
                if self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": MODEL, "object": "model",
                                                                 "max_model_len": 2048}]})
                else:
                    self._json(404, {"error": {"message": "no such path", "type": "not_found_error"}})

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(length) or b"null")
                upstream.requests.append((self.path, body))
                if self.refused():
                    return
                mode = upstream.mode
                if mode == "hang":
                    upstream.stopping.wait(60)
                    return
                if mode == "redirect":
                    self.send_response(307)
                    self.send_header("Location", f"http://localhost:{upstream.port}{self.path}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if mode == "not_found":
                    self._json(404, {"error": {"message": f"The model '{body.get('model')}' does not exist",
                                               "type": "not_found_error"}})
                    return
                if mode == "server_error":
                    self._json(500, {"error": {"message": "CUDA out of memory", "type": "server_error"}})
                    return
                if self.path == "/v1/embeddings":
                    inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
                    self._json(200, {"object": "list", "usage": {"prompt_tokens": 3 * len(inputs)},
                                     "data": [{"index": i, "embedding": [0.6, 0.8]} for i in range(len(inputs))]})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                if mode == "garbage":
                    self._raw(b"data: this is not json\n\n")
                elif mode == "oversized":
                    for _ in range(10):
                        self._raw(b"x" * (1 << 20))
                elif mode in ("die", "hang_after_first", "truncated"):
                    self._event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hel"}}]})
                    if mode == "hang_after_first":
                        upstream.stopping.wait(60)
                    elif mode == "die":
                        self.connection.shutdown(socket.SHUT_RDWR)
                    else:
                        self._event({"choices": [{"index": 0, "delta": {"content": "lo"}}]})
                else:  # ok
                    for piece in ("Hello", " world"):
                        self._event({"choices": [{"index": 0, "delta": {"content": piece}}]})
                        time.sleep(0.01)
                    self._event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                    self._event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}})
                    self._raw(b"data: [DONE]\n\n")
                self.close_connection = True

            def _event(self, event: dict[str, Any]) -> None:
                self._raw(b"data: " + json.dumps(event).encode() + b"\n\n")

            def _raw(self, data: bytes) -> None:
                self.wfile.write(data)
                self.wfile.flush()

            def _json(self, status: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that left mid-answer is what these tests do

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> "BrokenUpstream":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
