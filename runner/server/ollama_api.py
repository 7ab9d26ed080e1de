"""Ollama's native API: /api/generate, /api/chat, /api/embed(dings), tags, show, ps, copy, delete.

Streams are NDJSON (one object per line); ``stream: false`` answers one object. An empty prompt
(or no messages) loads the model and answers ``done_reason: "load"``; with ``keep_alive: 0`` it
unloads it (``"unload"``). Durations are nanoseconds.
"""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Literal, Union

from fastapi import APIRouter, Depends, Request as HTTPRequest
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict

from runner import prompt_tiers, store
from runner.version import OLLAMA_API_VERSION, pollama_version
from runner.api import Chunk, Image, InvalidRequest, Message, Request, TokenLogprob
from runner.images import image_from_base64

from . import models as _models
from . import toolwire
from .http import NDJSON, JSON, RunnerResponse, dumps, json_response, now_iso
from runner.prepare import think_level
from .service import Service, collect, now_ns, parse_keep_alive

router = APIRouter()

KeepAlive = Union[str, float, None]
Format = Union[str, dict[str, Any], None]


def version() -> str:
    """pollama's own version (the OpenAPI schema and the log say it)."""
    return pollama_version()


def service(request: HTTPRequest) -> Service:
    return request.app.state.service


# ------------------------------------------------------------------------------------ bodies
class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class GenerateBody(_Body):
    model: str
    prompt: str = ""
    suffix: str = ""
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    stream: bool | None = None
    raw: bool = False
    format: Format = None
    images: list[str] | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None
    think: bool | str | None = None
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool = False
    top_logprobs: int = 0


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    images: list[str] | None = None
    thinking: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_name: str | None = None


class ChatBody(_Body):
    model: str
    messages: list[ChatMessage] = []
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None  # beyond Ollama: OpenAI's, to force a call
    parallel_tool_calls: bool | None = None
    format: Format = None
    options: dict[str, Any] | None = None
    stream: bool | None = None
    keep_alive: KeepAlive = None
    think: bool | str | None = None
    truncate: bool | None = None
    shift: bool | None = None
    logprobs: bool = False
    top_logprobs: int = 0


class EmbedBody(_Body):
    model: str
    input: str | list[str]
    truncate: bool | None = None
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class EmbeddingsBody(_Body):
    model: str
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class ShowBody(_Body):
    model: str = ""
    name: str = ""  # deprecated spelling of model
    verbose: bool = False


class DeleteBody(_Body):
    model: str = ""
    name: str = ""


class CopyBody(_Body):
    source: str
    destination: str


# ---------------------------------------------------------------------------------- helpers
def check_format(fmt: Format) -> str | dict | None:
    if fmt is None or fmt == "" or fmt == "null":
        return None
    if fmt == "json" or isinstance(fmt, dict):
        return fmt
    raise InvalidRequest(f'invalid format "{fmt}": use "json" or a JSON schema')


def wire_images(images: list[str] | None, where: str) -> list[Image]:
    """Ollama's ``images``: base64 strings, each checked to be a PNG, JPEG or WEBP image."""
    return [image_from_base64(data, f"image {where}[{k}]") for k, data in enumerate(images or [])]


def chat_messages(raw: list[ChatMessage]) -> list[Message]:
    out = []
    for i, m in enumerate(raw):
        out.append(Message(m.role, m.content or "", thinking=m.thinking or "",
                           tool_calls=toolwire.calls_from_wire(m.tool_calls, f"messages[{i}]"),
                           tool_name=m.tool_name or "",
                           images=wire_images(m.images, f"messages[{i}].images")))
    return out


def logprobs_wire(items: list[TokenLogprob] | None) -> list[dict[str, Any]]:
    return [
        {"token": lp.token, "logprob": lp.logprob, "bytes": lp.bytes,
         "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in lp.top_logprobs]}
        for lp in items or []
    ]


def final_fields(chunk: Chunk) -> dict[str, Any]:
    m = chunk.metrics
    assert m is not None
    return {
        "total_duration": m.total_duration,
        "load_duration": m.load_duration,
        "prompt_eval_count": m.prompt_tokens,  # the whole prompt, as Ollama reports it
        "prompt_eval_duration": m.prompt_eval_duration,
        "eval_count": m.eval_count,
        "eval_duration": m.eval_duration,
    }


def _special(model: str, reason: str, chat: bool) -> Response:
    body: dict[str, Any] = {"model": model, "created_at": now_iso()}
    if chat:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    body.update({"done": True, "done_reason": reason})
    return Response(dumps(body), media_type=JSON)


async def _load_or_unload(svc: Service, model: str, options: dict[str, Any] | None,
                          keep_alive: float | None, chat: bool) -> Response:
    if keep_alive == 0:
        await svc.unload(model)
        return _special(model, "unload", chat)
    await svc.preload(model, options, keep_alive)
    return _special(model, "load", chat)


def _generation_response(svc: Service, *, model: str, request: Request, options: dict[str, Any] | None,
                         keep_alive: float | None, stream: bool, logprobs: bool,
                         with_context: bool, t0: int) -> RunnerResponse:
    chat = request.messages is not None

    def head() -> dict[str, Any]:
        return {"model": model, "created_at": now_iso()}

    def piece(text: str, lps: list[TokenLogprob] | None, thinking: str = "", calls=None) -> dict[str, Any]:
        body = head()
        if chat:
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = toolwire.ollama_calls(calls)
            body["message"] = message
        else:
            body["response"] = text
            if thinking:
                body["thinking"] = thinking
        body["done"] = False
        if logprobs and lps:
            body["logprobs"] = logprobs_wire(lps)
        return body

    def final(chunk: Chunk, text: str, lps: list[TokenLogprob], thinking: str = "", calls=None) -> dict[str, Any]:
        body = piece(text, lps, thinking, calls)
        body["done"] = True
        body["done_reason"] = chunk.done_reason.value if chunk.done_reason else "stop"
        if with_context and chunk.context is not None:
            body["context"] = chunk.context
        body.update(final_fields(chunk))
        return body

    async def ndjson() -> AsyncIterator[bytes]:
        chunks = svc.stream(model, request, options, keep_alive, t0)
        started = False
        try:
            async for chunk in chunks:
                if chunk.done:
                    yield dumps(final(chunk, "", [])) + b"\n"
                else:
                    yield dumps(piece(chunk.text, chunk.logprobs, chunk.thinking, chunk.tool_calls)) + b"\n"
                started = True
        except Exception as err:
            if not started:
                raise
            yield dumps({"error": str(err)}) + b"\n"
        finally:
            await chunks.aclose()

    async def single() -> AsyncIterator[bytes]:
        reply = await collect(svc.stream(model, request, options, keep_alive, t0))
        if reply.final is not None:
            yield dumps(final(reply.final, reply.text, reply.logprobs, reply.thinking, reply.tool_calls))

    return RunnerResponse(ndjson if stream else single, NDJSON if stream else JSON,
                          on_close=request.cancel.set)


# ----------------------------------------------------------------------------------- routes
@router.get("/", response_class=PlainTextResponse)
@router.head("/", response_class=PlainTextResponse, include_in_schema=False)
async def root() -> PlainTextResponse:
    return PlainTextResponse("Ollama is running")


@router.get("/api/version")
@router.head("/api/version", include_in_schema=False)
async def api_version() -> dict[str, str]:
    return {"version": OLLAMA_API_VERSION}  # the Ollama API pollama speaks (runner/version.py)


@router.post("/api/generate")
async def generate(body: GenerateBody, svc: Service = Depends(service)) -> Response:
    t0 = now_ns()
    if not body.model:
        raise InvalidRequest("model is required")
    keep_alive = parse_keep_alive(body.keep_alive)
    fmt = check_format(body.format)
    think = think_level(body.think)
    images = await asyncio.to_thread(wire_images, body.images, "images")
    if body.suffix:
        raise InvalidRequest(f'"{body.model}" does not support insert')
    if body.prompt == "":
        return await _load_or_unload(svc, body.model, body.options, keep_alive, chat=False)
    request = Request(
        prompt=body.prompt, images=images, system=body.system, template=body.template or None, raw=body.raw,
        context=body.context or None, format=fmt, think=think,
        truncate=True if body.truncate is None else body.truncate,
        shift=True if body.shift is None else body.shift,
        logprobs=body.logprobs, top_logprobs=body.top_logprobs,
    )
    return _generation_response(
        svc, model=body.model, request=request, options=body.options, keep_alive=keep_alive,
        stream=body.stream is not False, logprobs=body.logprobs, with_context=not body.raw, t0=t0,
    )


@router.post("/api/chat")
async def chat(body: ChatBody, svc: Service = Depends(service)) -> Response:
    t0 = now_ns()
    if not body.model:
        raise InvalidRequest("model is required")
    keep_alive = parse_keep_alive(body.keep_alive)
    fmt = check_format(body.format)
    think = think_level(body.think)
    tools = toolwire.parse_tools(body.tools)
    if not body.messages:
        return await _load_or_unload(svc, body.model, body.options, keep_alive, chat=True)
    messages = await asyncio.to_thread(chat_messages, body.messages)  # images are decoded to check them
    request = Request(
        messages=messages, format=fmt, tools=tools, think=think,
        tool_choice=toolwire.parse_tool_choice(body.tool_choice, tools), parallel_tool_calls=body.parallel_tool_calls,
        truncate=True if body.truncate is None else body.truncate,
        shift=True if body.shift is None else body.shift,
        logprobs=body.logprobs, top_logprobs=body.top_logprobs,
    )
    return _generation_response(
        svc, model=body.model, request=request, options=body.options, keep_alive=keep_alive,
        stream=body.stream is not False, logprobs=body.logprobs, with_context=False, t0=t0,
    )


def normalize_dims(vector: list[float], dimensions: int | None) -> list[float]:
    if dimensions is None or dimensions <= 0 or dimensions >= len(vector):
        return vector
    cut = vector[:dimensions]
    norm = sum(v * v for v in cut) ** 0.5
    return [v / norm for v in cut] if norm > 0 else cut


@router.post("/api/embed")
async def embed(body: EmbedBody, svc: Service = Depends(service)) -> Response:
    t0 = now_ns()
    if not body.model:
        raise InvalidRequest("model is required")
    keep_alive = parse_keep_alive(body.keep_alive)
    if body.dimensions is not None and body.dimensions < 0:
        raise InvalidRequest("dimensions must be a positive number")
    if isinstance(body.input, str):
        texts = [body.input] if body.input else []
    else:
        texts = list(body.input or [])
    truncate = True if body.truncate is None else body.truncate
    vectors, count, load_ns = await svc.embed(body.model, texts, truncate, body.options, keep_alive, t0)
    return await json_response(lambda: {
        "model": body.model,
        "embeddings": [normalize_dims(v, body.dimensions) for v in vectors],
        "total_duration": now_ns() - t0,
        "load_duration": load_ns,
        "prompt_eval_count": count,
    })


@router.post("/api/embeddings")
async def embeddings(body: EmbeddingsBody, svc: Service = Depends(service)) -> dict[str, Any]:
    t0 = now_ns()
    if not body.model:
        raise InvalidRequest("model is required")
    keep_alive = parse_keep_alive(body.keep_alive)
    texts = [body.prompt] if body.prompt else []
    vectors, _, _ = await svc.embed(body.model, texts, True, body.options, keep_alive, t0)
    return {"embedding": vectors[0] if vectors else []}


@router.get("/api/tags")
@router.head("/api/tags", include_in_schema=False)
async def tags(svc: Service = Depends(service)) -> dict[str, Any]:
    def listing() -> list[dict[str, Any]]:
        entries = (_models.tag_entry(m) for m in _models.all_models(svc.cfg))
        return [e for e in entries if e is not None]

    return {"models": await asyncio.to_thread(listing)}


@router.post("/api/show")
async def show(body: ShowBody, svc: Service = Depends(service)) -> dict[str, Any]:
    name = body.model or body.name
    return await asyncio.to_thread(lambda: _models.show(svc.cfg, svc.model(name), body.verbose))


@router.get("/api/ps")
async def ps(svc: Service = Depends(service)) -> dict[str, Any]:
    loaded = sorted(svc.scheduler.loaded.values(), key=lambda m: m.name)
    # off the event loop: a model loaded by path is hashed (once) for its digest
    def listing() -> dict[str, Any]:
        # beyond Ollama: the prompt store's use of its bounds (issue 25), bytes per tier
        return {"models": [_models.ps_entry(m) for m in loaded], "prompt_cache": prompt_tiers(svc.cfg).usage()}

    return await asyncio.to_thread(listing)


@router.delete("/api/delete")
async def delete(body: DeleteBody, svc: Service = Depends(service)) -> Response:
    name = body.model or body.name
    await asyncio.to_thread(store.delete, svc.cfg, name)
    return Response(status_code=200)


@router.post("/api/copy")
async def copy(body: CopyBody, svc: Service = Depends(service)) -> Response:
    await asyncio.to_thread(store.copy, svc.cfg, body.source, body.destination)
    return Response(status_code=200)

