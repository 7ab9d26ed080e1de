"""Ollama's store-changing API: /api/pull, /api/push, /api/create, /api/blobs/:digest.

Pull and create are generators of :class:`~runner.store.progress.Progress` run in a thread; each
event is one NDJSON line (``stream: false`` answers the last one). The first line is held back
until the second is ready, so a failure at once (an unknown model, a bad name, a missing blob)
answers with its status and ``{"error"}`` body rather than a 200 stream; a failure later is an
``{"error": "..."}`` line, as Ollama streams it. A client that goes away cancels the work (a
pull keeps its partial file for the next try).

``/api/push`` is refused with a 400, as pollama refuses every feature it lacks (tools, images,
quantize): it does not publish models.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from typing import Any, AsyncIterator, Callable, Iterator

from fastapi import APIRouter, Depends, Request as HTTPRequest
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict
from starlette.requests import ClientDisconnect

from runner import store
from runner.api import InvalidRequest, PollamaError
from runner.store import blobs as _blobs
from runner.store.create import CreateSpec, create as create_model, remote_spec
from runner.store.progress import Progress
from runner.store.pull import parse_pull_name, pull as pull_model

from .http import JSON, NDJSON, RunnerResponse, dumps
from .service import Service

log = logging.getLogger(__name__)

router = APIRouter()


def service(request: HTTPRequest) -> Service:
    return request.app.state.service


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class PullBody(_Body):
    model: str = ""
    name: str = ""  # the older spelling
    insecure: bool = False
    stream: bool | None = None


class CreateBody(_Body):
    model: str = ""
    name: str = ""
    from_: str | None = None
    files: dict[str, str] | None = None
    draft_files: dict[str, str] | None = None
    adapters: dict[str, str] | None = None
    template: str | None = None
    system: str | None = None
    parameters: dict[str, Any] | None = None
    messages: list[dict[str, Any]] | None = None
    license: str | list[str] | None = None
    quantize: str | None = None
    quantization: str | None = None
    remote_host: str | None = None  # Ollama's: a remote model on this Ollama-API host ("from" names it there)
    remote_hosts: list[str] | None = None  # pollama's: a remote model's replicas (README "Remote models")
    stream: bool | None = None

    model_config = ConfigDict(extra="ignore", populate_by_name=True,
                              alias_generator=lambda f: "from" if f == "from_" else f)


class _Done:
    pass


def progress_response(produce: Callable[[threading.Event], Iterator[Progress]], stream: bool) -> RunnerResponse:
    """Run ``produce(cancel)`` in a thread; its events become NDJSON lines (or one JSON object)."""
    cancel = threading.Event()

    async def events() -> AsyncIterator[Progress]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Any] = asyncio.Queue()

        def put(item: Any) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the server is gone
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> None:
            try:
                for event in produce(cancel):
                    put(event)
            except BaseException as err:  # delivered to the request's task
                put(err)
            else:
                put(_Done())

        threading.Thread(target=work, name="store-change", daemon=True).start()
        try:
            while True:
                item = await queue.get()
                if isinstance(item, _Done):
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancel.set()  # the client left or the stream ended: the thread stops at its next step

    async def lines() -> AsyncIterator[bytes]:
        held: Progress | None = None
        started = False
        try:
            async for event in events():
                if held is None and not started:
                    held = event
                    continue
                if held is not None:
                    yield dumps(held.wire()) + b"\n"
                    held, started = None, True
                yield dumps(event.wire()) + b"\n"
            if held is not None:
                yield dumps(held.wire()) + b"\n"
        except PollamaError as err:
            if not started:  # nothing sent yet: the error is the answer, with its status
                raise
            yield dumps({"error": str(err)}) + b"\n"

    async def single() -> AsyncIterator[bytes]:
        last: Progress | None = None
        async for event in events():
            last = event
        yield dumps(last.wire() if last is not None else {"status": "success"})

    return RunnerResponse(lines if stream else single, NDJSON if stream else JSON, on_close=cancel.set)


# ----------------------------------------------------------------------------------- routes
@router.post("/api/pull")
async def pull(body: PullBody, svc: Service = Depends(service)) -> Response:
    name = body.model or body.name
    parse_pull_name(name)  # a bad name is 400 before anything streams
    cfg = svc.cfg
    return progress_response(lambda cancel: pull_model(cfg, name, insecure=body.insecure, cancel=cancel),
                             stream=body.stream is not False)


@router.post("/api/push")
async def push(body: PullBody) -> Response:
    raise InvalidRequest(f'pushing "{body.model or body.name}" is not supported: pollama does not '
                      "publish models (use ollama push)")


@router.post("/api/create")
async def create(body: CreateBody, svc: Service = Depends(service)) -> Response:
    parameters = dict(body.parameters or {})
    remote = remote_spec(body.from_ or "", body.remote_host, body.remote_hosts, parameters)
    spec = CreateSpec(
        model=body.model or body.name, from_="" if remote else body.from_ or "", files=dict(body.files or {}),
        draft_files=dict(body.draft_files or {}),
        adapters=dict(body.adapters or {}), template=body.template, system=body.system,
        parameters=parameters, messages=list(body.messages or []),
        license=body.license, quantize=body.quantize or body.quantization or "", remote=remote,
    )
    spec.check()  # a bad request is 400 before anything streams
    cfg = svc.cfg
    return progress_response(lambda cancel: create_model(cfg, spec, cancel=cancel),
                             stream=body.stream is not False)


@router.head("/api/blobs/{digest}")
async def head_blob(digest: str, svc: Service = Depends(service)) -> Response:
    if await asyncio.to_thread(_blobs.has_blob, store.Layout(svc.cfg.models), digest):
        return Response(status_code=200)
    return Response(dumps({"error": f'blob "{digest}" not found'}), status_code=404, media_type=JSON)


@router.post("/api/blobs/{digest}")
async def upload_blob(digest: str, request: HTTPRequest, svc: Service = Depends(service)) -> Response:
    """The body is stored as the blob ``digest`` when its sha256 is that digest (201; 200 when
    the blob was already there); streamed to disk, never held in memory. Concurrent uploads of
    one blob each succeed. A body that ends early (the client closed, paused past the body
    timeout, or sent malformed chunks) is a 400 — on a connection that is usually gone — and
    leaves nothing in the store."""
    layout = store.Layout(svc.cfg.models)
    upload = _blobs.Upload(layout, digest)  # a bad digest is 400 here
    if await asyncio.to_thread(_blobs.has_blob, layout, digest):
        return Response(status_code=200)
    try:
        await asyncio.to_thread(upload.open)
        async for chunk in request.stream():
            if chunk:
                await asyncio.to_thread(upload.write, chunk)
        await asyncio.to_thread(upload.finish)
    except ClientDisconnect:
        log.info("upload of %s ended before its body was complete", digest)
        raise InvalidRequest("the request body ended before it was complete") from None
    finally:
        await asyncio.to_thread(upload.close)
    return Response(status_code=201)
