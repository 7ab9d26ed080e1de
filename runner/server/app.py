"""The FastAPI app and the uvicorn server around it (``pollama serve``).

Errors: every error body has the shape of its API (``http.error_body``: OpenAI's under ``/v1/``,
``{"error": "..."}`` elsewhere): runner errors carry their status
(:class:`~runner.api.PollamaError`), FastAPI's validation errors become 400, unknown routes 404,
wrong methods 405, and anything unexpected 500 (logged with its traceback).

Layers, outermost first: the access log (``http.ServerMiddleware``), the Origin and Host rules
(``middleware``), the JSON request boundary (``http.JsonBodyMiddleware``), then the routes. The
connection itself is ``protocol.Protocol`` (deadlines for half-sent requests). No ``/docs``,
``/redoc`` or ``/openapi.json``: ``create_app().openapi()`` builds the schema in-process.

Shutdown (SIGINT/SIGTERM): the listener closes, running streams are cancelled (their sequences
end at the next batch and the client gets an error line), then every model unloads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from typing import Any, AsyncIterator

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from runner import config as _config
from runner.api import PollamaError

from . import anthropic_api, ollama_api, openai_api, responses_api, store_api
from .disconnect import TrackClient
from .http import JSON, JsonBodyMiddleware, ServerMiddleware, error_body, status_of
from .hostrule import Hosts
from .middleware import GuardMiddleware, Origins
from .protocol import Protocol
from .responsestore import ResponseStore
from .scheduler import Scheduler
from .service import Service

log = logging.getLogger("runner.server")


def _error(request: Request, status: int, message: str) -> Response:
    return Response(error_body(message, status=status, path=request.url.path), status_code=status,
                    media_type=JSON)


def _validation_message(err: RequestValidationError) -> str:
    problems = []
    for item in err.errors():
        loc = [str(p) for p in item.get("loc", ()) if p != "body"]
        kind = item.get("type", "")
        if kind == "json_invalid":
            return f"invalid JSON in the request body: {item.get('ctx', {}).get('error', item.get('msg', ''))}"
        if not loc and kind == "missing":
            return "missing request body"
        if not loc and kind in ("model_attributes_type", "dict_type"):
            return "the request body must be a JSON object"
        where = ".".join(loc) or "body"
        if kind == "missing" and len(loc) == 1:
            return f"{where} is required"
        problems.append(f"{where}: {item.get('msg', 'invalid value')}")
    return "invalid request: " + "; ".join(problems[:3])


def create_app(cfg: _config.Config | None = None, scheduler: Scheduler | None = None) -> FastAPI:
    cfg = cfg or _config.load()
    scheduler = scheduler or Scheduler(cfg)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        log.info("shutting down: unloading %d model(s)", len(scheduler.loaded))
        await scheduler.close()

    app = FastAPI(title="pollama", version=ollama_api.version(), lifespan=lifespan,
                  description="Ollama- and OpenAI-compatible API over pollama's in-process runner",
                  docs_url=None, redoc_url=None, openapi_url=None)
    app.state.scheduler = scheduler
    app.state.service = Service(scheduler)
    app.state.responses = ResponseStore()  # the Responses API's stored responses (store: true)

    @app.exception_handler(PollamaError)
    async def pollama_error(request: Request, err: PollamaError) -> Response:
        return _error(request, status_of(err), str(err))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, err: RequestValidationError) -> Response:
        return _error(request, 400, _validation_message(err))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> Response:
        message = {404: "404 page not found", 405: "405 method not allowed"}.get(err.status_code, str(err.detail))
        return _error(request, err.status_code, message)

    app.include_router(ollama_api.router)
    app.include_router(store_api.router)
    app.include_router(openai_api.router)
    app.include_router(anthropic_api.router)
    app.include_router(responses_api.router)
    app.add_middleware(JsonBodyMiddleware)
    app.add_middleware(GuardMiddleware, origins=Origins.of(cfg.origins), hosts=Hosts.of(cfg.host))
    app.add_middleware(TrackClient)  # lets a JSON handler see its client leave (disconnect.py)
    app.add_middleware(ServerMiddleware)  # the last added is the outermost
    return app


class _Server(uvicorn.Server):
    """uvicorn's server, plus: a signal cancels the running streams at once (they would otherwise
    run to their end), and a clean shutdown exits 0 instead of re-raising the signal."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler) -> None:
        super().__init__(config)
        self._scheduler = scheduler
        self._loop: asyncio.AbstractEventLoop | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: Any) -> None:
        if self._loop is not None and not self.should_exit:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._scheduler.cancel_all)
        super().handle_exit(sig, frame)
        captured = getattr(self, "_captured_signals", None)
        if isinstance(captured, list):
            captured.clear()


def bind(cfg: _config.Config) -> socket.socket:
    """The listening socket; raises OSError with Ollama's wording when the address is taken."""
    family = socket.AF_INET6 if ":" in cfg.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((cfg.host, cfg.port))
    except OSError as err:
        sock.close()
        reason = "address already in use" if err.errno in (98, 48) else (err.strerror or str(err)).lower()
        raise OSError(err.errno, f"listen tcp {cfg.host}:{cfg.port}: bind: {reason}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def serve(cfg: _config.Config | None = None) -> None:
    """Run the server until SIGINT/SIGTERM. Raises OSError when the address cannot be bound."""
    cfg = cfg or _config.load()
    sock = bind(cfg)
    scheduler = Scheduler(cfg)
    app = create_app(cfg, scheduler)
    config = uvicorn.Config(app, log_config=None, access_log=False, lifespan="on", http=Protocol,
                            timeout_graceful_shutdown=10, timeout_keep_alive=5)
    server = _Server(config, scheduler)
    log.info("Listening on %s:%d (version %s)", cfg.host, cfg.port, ollama_api.version())
    log.info("server config: num_parallel=%d max_queue=%d max_loaded_models=%d keep_alive=%ss "
             "context_length=%d models=%s", cfg.num_parallel, cfg.max_queue, cfg.max_loaded_models,
             cfg.keep_alive, cfg.context_length, cfg.models)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()


__all__ = ["create_app", "serve", "bind"]
