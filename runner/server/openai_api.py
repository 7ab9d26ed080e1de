"""OpenAI-compatible API: /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models.

Requests map onto the native options as Ollama's middleware does (reference §5.1):
``max_tokens``→``num_predict``, ``temperature`` and ``top_p`` default to 1.0, ``seed``, ``stop``
(a string or a list), the penalties, and ``response_format`` (``json_object``→"json",
``json_schema``→its schema). Streams are SSE ``data: {chunk}`` lines ending ``data: [DONE]``.
Errors have OpenAI's shape (``http.openai_error``), in the body or, once a stream has begun, as
its last ``data:`` event. ``max_tokens``/``max_completion_tokens`` must be at least 1, and ``n``
1 (one choice per request).
"""

from __future__ import annotations

import asyncio
import base64
import secrets
import struct
import time
from typing import Any, AsyncIterator, Literal, Union

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from runner.api import Chunk, DoneReason, Image, InvalidRequest, Message, Request, TokenLogprob
from runner.images import image_from_data_url

from . import models as _models
from . import toolwire
from .http import JSON, SSE, RunnerResponse, dumps, json_response, openai_error, status_of
from .ollama_api import normalize_dims, service
from runner.prepare import think_level
from .service import Service, collect, now_ns, parse_keep_alive

router = APIRouter(prefix="/v1")

FINGERPRINT = "fp_ollama"


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class ContentPart(_Body):
    type: str
    text: str | None = None
    image_url: Any = None


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning: str | None = None
    reasoning_content: str | None = None


class StreamOptions(_Body):
    include_usage: bool = False


class JsonSchemaFormat(_Body):
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Body):
    type: str
    json_schema: JsonSchemaFormat | None = None


class _Sampling(_Body):
    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = None
    n: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    keep_alive: Union[str, float, None] = None


class ChatCompletionBody(_Sampling):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: str | None = None
    reasoning: dict[str, Any] | None = None


class CompletionBody(_Sampling):
    prompt: Union[str, list[str]]
    suffix: str | None = None
    logprobs: int | None = None
    echo: bool | None = None


class EmbeddingBody(_Body):
    model: str
    input: Any  # a string, a list of strings, token ids, or a list of token-id lists (embedding_inputs)
    encoding_format: str | None = None
    dimensions: int | None = None


# ---------------------------------------------------------------------------------- mapping
def check_counts(body: _Sampling, **token_limits: int | None) -> None:
    """OpenAI's lower bound on the token limits, and one choice per request (``n`` absent or 1)."""
    for name, value in token_limits.items():
        if value is not None and value < 1:
            raise InvalidRequest(f"invalid {name} {value}: it must be at least 1")
    if body.n is not None and body.n != 1:
        raise InvalidRequest(f"invalid n {body.n}: pollama returns one choice per request, so n must be 1")


def sampling_options(body: _Sampling, max_tokens: int | None) -> dict[str, Any]:
    options: dict[str, Any] = {}
    if max_tokens is not None:
        options["num_predict"] = max_tokens
    options["temperature"] = 1.0 if body.temperature is None else body.temperature
    options["top_p"] = 1.0 if body.top_p is None else body.top_p
    if body.seed is not None:
        options["seed"] = body.seed
    if body.stop is not None:
        options["stop"] = [body.stop] if isinstance(body.stop, str) else list(body.stop)
    if body.frequency_penalty is not None:
        options["frequency_penalty"] = body.frequency_penalty
    if body.presence_penalty is not None:
        options["presence_penalty"] = body.presence_penalty
    return options


def response_format(fmt: ResponseFormat | None) -> str | dict | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return "json"
    if fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise InvalidRequest("response_format json_schema needs a json_schema.schema")
        return fmt.json_schema.schema_
    raise InvalidRequest(f"invalid response_format type {fmt.type!r}: use text, json_object or json_schema")


def message_text(message: ChatMessage) -> str:
    """The text of a message that may not carry images."""
    text, images = message_parts(message, "content")
    if images:
        raise InvalidRequest("image content parts are only taken in chat messages")
    return text


def message_parts(message: ChatMessage, where: str) -> tuple[str, list[Image]]:
    """A message's text parts joined, and its ``image_url`` parts as images: base64 data URLs
    only (``{"url": "data:image/png;base64,..."}`` or the URL string itself)."""
    content = message.content
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    parts: list[str] = []
    images: list[Image] = []
    for k, part in enumerate(content):
        if part.type == "text":
            parts.append(part.text or "")
        elif part.type == "image_url":
            url = part.image_url.get("url") if isinstance(part.image_url, dict) else part.image_url
            images.append(image_from_data_url(url, f"image {where}[{k}]"))
        else:
            raise InvalidRequest(f"invalid content part type {part.type!r}")
    return "".join(parts), images


def finish_reason(chunk: Chunk, called: bool = False) -> str:
    if called:
        return "tool_calls"
    return "length" if chunk.done_reason is DoneReason.LENGTH else "stop"


def reasoning_think(body: ChatCompletionBody) -> bool | str | None:
    """``reasoning_effort`` (or ``reasoning.effort``) as ``think``: high, medium, low (max is
    high), none (or minimal) turns it off, unset leaves the model's default."""
    effort = body.reasoning_effort
    if effort is None and body.reasoning is not None:
        effort = body.reasoning.get("effort")
    return think_level(effort, "reasoning_effort")


def chat_messages(raw: list[ChatMessage]) -> list[Message]:
    """OpenAI messages as the runner's: ``developer`` is ``system``; an assistant's calls keep
    their ids; a tool message gets the name of the call it answers (its ``tool_call_id``)."""
    names: dict[str, str] = {}
    out = []
    for i, m in enumerate(raw):
        calls = toolwire.calls_from_wire(m.tool_calls, f"messages[{i}]")
        names.update({c.id: c.name for c in calls if c.id})
        tool_name = ""
        if m.role == "tool":
            tool_name = m.name or names.get(m.tool_call_id or "", "")
        text, images = message_parts(m, f"messages[{i}].content")
        out.append(Message("system" if m.role == "developer" else m.role, text,
                           thinking=m.reasoning_content or m.reasoning or "", tool_calls=calls,
                           tool_name=tool_name, tool_call_id=m.tool_call_id or "", images=images))
    return out


def usage(chunk: Chunk) -> dict[str, Any]:
    m = chunk.metrics
    assert m is not None
    prompt = m.prompt_eval_count + m.prompt_cached_count
    return {
        "prompt_tokens": prompt,
        "completion_tokens": m.eval_count,
        "total_tokens": prompt + m.eval_count,
        "prompt_tokens_details": {"cached_tokens": m.prompt_cached_count},
    }


def timings(chunk: Chunk) -> dict[str, Any]:
    """llama-server's ``timings`` object (its speed-bench and similar tools read it): tokens from
    the cache (slot or prompt store), tokens evaluated and generated, and their milliseconds;
    with speculative decoding, as llama-server only when something was drafted, the drafted
    tokens and how many the model accepted."""
    m = chunk.metrics
    assert m is not None
    prompt_ms, predicted_ms = m.prompt_eval_duration / 1e6, m.eval_duration / 1e6
    drafts = {"draft_n": m.draft_n, "draft_n_accepted": m.draft_n_accepted} if m.draft_n else {}
    return {
        "cache_n": m.prompt_cached_count,
        "prompt_n": m.prompt_eval_count,
        "prompt_ms": prompt_ms,
        "prompt_per_token_ms": prompt_ms / m.prompt_eval_count if m.prompt_eval_count else 0.0,
        "prompt_per_second": m.prompt_eval_count / prompt_ms * 1e3 if prompt_ms > 0 else 0.0,
        "predicted_n": m.eval_count,
        "predicted_ms": predicted_ms,
        "predicted_per_token_ms": predicted_ms / m.eval_count if m.eval_count else 0.0,
        "predicted_per_second": m.eval_count / predicted_ms * 1e3 if predicted_ms > 0 else 0.0,
        **drafts,
    }


def chat_logprobs(items: list[TokenLogprob]) -> dict[str, Any]:
    return {"content": [
        {"token": lp.token, "logprob": lp.logprob, "bytes": lp.bytes,
         "top_logprobs": [{"token": t.token, "logprob": t.logprob, "bytes": t.bytes} for t in lp.top_logprobs]}
        for lp in items
    ]}


def sse(obj: Any) -> bytes:
    return b"data: " + dumps(obj) + b"\n\n"


def _openai_response(svc: Service, *, model: str, request: Request, options: dict[str, Any],
                     keep_alive: float | None, stream: bool, include_usage: bool, t0: int) -> RunnerResponse:
    chat = request.messages is not None
    ident = f"{'chatcmpl' if chat else 'cmpl'}-{secrets.randbelow(10**9)}"
    created = int(time.time())
    obj_kind = ("chat.completion.chunk" if stream else "chat.completion") if chat else "text_completion"

    def envelope(choices: list[dict[str, Any]]) -> dict[str, Any]:
        body = {"id": ident, "object": obj_kind, "created": created, "model": model,
                "system_fingerprint": FINGERPRINT, "choices": choices}
        if stream and include_usage:
            body["usage"] = None  # OpenAI's: null on every chunk but the usage chunk
        return body

    def choice(text: str, reason: str | None, lps: list[TokenLogprob] | None, thinking: str = "",
               calls=None) -> dict[str, Any]:
        """A whole answer's choice (``stream: false``)."""
        if not chat:
            return {"text": text, "index": 0, "logprobs": None, "finish_reason": reason}
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thinking:
            message["reasoning"] = message["reasoning_content"] = thinking
        if calls:
            message["tool_calls"] = toolwire.openai_calls(calls, False)
        out: dict[str, Any] = {"index": 0, "message": message}
        if request.logprobs:
            out["logprobs"] = chat_logprobs(lps or [])
        out["finish_reason"] = reason
        return out

    def delta(fields: dict[str, Any], reason: str | None = None,
              lps: list[TokenLogprob] | None = None) -> dict[str, Any]:
        """A streamed chunk's choice: ``delta`` holds only what this chunk adds."""
        if not chat:
            return {"text": fields.get("content", ""), "index": 0, "logprobs": None, "finish_reason": reason}
        return {"index": 0, "delta": fields, "logprobs": chat_logprobs(lps) if lps else None,
                "finish_reason": reason}

    def added(chunk: Chunk) -> dict[str, Any] | None:
        """What a runner chunk adds to the answer, as delta fields (None: nothing)."""
        fields: dict[str, Any] = {}
        if chunk.thinking and chat:
            fields["reasoning"] = fields["reasoning_content"] = chunk.thinking
        if chunk.tool_calls and chat:
            fields["tool_calls"] = toolwire.openai_calls(chunk.tool_calls, True)
        if chunk.text or (chunk.logprobs and not fields):
            fields["content"] = chunk.text
        return fields or None

    async def events() -> AsyncIterator[bytes]:
        """OpenAI's order: a first chunk with the role (chat) and nothing else, then each
        chunk's additions (no role), then the finish_reason with an empty delta, then (with
        ``stream_options.include_usage``) the usage with no choices, then ``[DONE]``."""
        chunks = svc.stream(model, request, options, keep_alive, t0)
        started = called = False
        try:
            async for chunk in chunks:
                if not started and chat:
                    yield sse(envelope([delta({"role": "assistant", "content": ""})]))
                started = True
                if chunk.done:
                    reason = finish_reason(chunk, called)
                    last = envelope([delta({}, reason)])
                    last["timings"] = timings(chunk)  # llama-server's place: the chunk that finishes
                    yield sse(last)
                    if include_usage:
                        body = envelope([])
                        body["usage"] = usage(chunk)
                        yield sse(body)
                    yield b"data: [DONE]\n\n"
                    continue
                called = called or bool(chunk.tool_calls)
                fields = added(chunk)
                if fields is not None:
                    yield sse(envelope([delta(fields, None, chunk.logprobs)]))
        except Exception as err:
            if not started:
                raise
            yield sse(openai_error(status_of(err), str(err)))
        finally:
            await chunks.aclose()

    async def single() -> AsyncIterator[bytes]:
        reply = await collect(svc.stream(model, request, options, keep_alive, t0))
        if reply.final is not None:
            body = envelope([choice(reply.text, finish_reason(reply.final, bool(reply.tool_calls)), reply.logprobs,
                                    reply.thinking, reply.tool_calls)])
            body["usage"] = usage(reply.final)
            body["timings"] = timings(reply.final)
            yield dumps(body)

    return RunnerResponse(events if stream else single, SSE if stream else JSON, on_close=request.cancel.set)


# ----------------------------------------------------------------------------------- routes
@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionBody, svc: Service = Depends(service)) -> Response:
    t0 = now_ns()
    if not body.model:
        raise InvalidRequest("model is required")
    if not body.messages:
        raise InvalidRequest("no messages provided")
    tools = toolwire.parse_tools(body.tools)
    tool_choice = toolwire.parse_tool_choice(body.tool_choice, tools)
    keep_alive = parse_keep_alive(body.keep_alive)
    max_tokens = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
    check_counts(body, max_tokens=body.max_tokens, max_completion_tokens=body.max_completion_tokens)
    top = body.top_logprobs or 0
    messages = await asyncio.to_thread(chat_messages, body.messages)  # images are decoded to check them
    request = Request(
        messages=messages, format=response_format(body.response_format),
        tools=tools, tool_choice=tool_choice, parallel_tool_calls=body.parallel_tool_calls,
        think=reasoning_think(body),
        logprobs=bool(body.logprobs) or top > 0, top_logprobs=top,
    )
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return _openai_response(svc, model=body.model, request=request, options=sampling_options(body, max_tokens),
                            keep_alive=keep_alive, stream=body.stream, include_usage=include_usage, t0=t0)


@router.post("/completions")
async def completions(body: CompletionBody, svc: Service = Depends(service)) -> Response:
    t0 = now_ns()
    if not body.model:
        raise InvalidRequest("model is required")
    prompt = body.prompt
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise InvalidRequest("prompt must be a string (or a list of one string)")
        prompt = prompt[0]
    if not prompt:
        raise InvalidRequest("prompt is required")
    if body.suffix:
        raise InvalidRequest(f'"{body.model}" does not support insert')
    keep_alive = parse_keep_alive(body.keep_alive)
    check_counts(body, max_tokens=body.max_tokens)
    request = Request(prompt=prompt)
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return _openai_response(svc, model=body.model, request=request, options=sampling_options(body, body.max_tokens),
                            keep_alive=keep_alive, stream=body.stream, include_usage=include_usage, t0=t0)


def _token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(type(t) is int for t in value)


def embedding_inputs(raw: Any) -> list[str | list[int]]:
    """``/v1/embeddings`` ``input`` as OpenAI takes it: a string, a list of strings, one array of
    token ids, or a list of them (ids are embedded as given; the runner checks them against the
    vocabulary). Nothing empty: no empty string, no empty array."""
    if isinstance(raw, str):
        inputs: list[str | list[int]] = [raw]
    elif isinstance(raw, list) and raw and all(isinstance(t, str) for t in raw):
        inputs = list(raw)
    elif isinstance(raw, list) and raw and _token_ids(raw):
        inputs = [list(raw)]
    elif isinstance(raw, list) and raw and all(_token_ids(t) for t in raw):
        inputs = [list(t) for t in raw]
    elif raw is None or raw == []:
        inputs = []
    else:
        raise InvalidRequest("invalid input type: use a string, a list of strings, an array of token ids "
                             "(integers) or a list of them")
    if not inputs or any(len(t) == 0 for t in inputs):
        raise InvalidRequest("invalid input: it must be a non-empty string or token array, or a non-empty list of them")
    return inputs


@router.post("/embeddings")
async def embeddings(body: EmbeddingBody, svc: Service = Depends(service)) -> Response:
    t0 = now_ns()
    if not body.model:
        raise InvalidRequest("model is required")
    texts = embedding_inputs(body.input)
    if body.encoding_format not in (None, "float", "base64"):
        raise InvalidRequest(f"invalid encoding_format {body.encoding_format!r}: use float or base64")
    if body.dimensions is not None and body.dimensions < 0:
        raise InvalidRequest("dimensions must be a positive number")
    vectors, count, _ = await svc.embed(body.model, texts, True, None, None, t0)

    def build() -> dict[str, Any]:
        data = []
        for index, vector in enumerate(vectors):
            vector = normalize_dims(vector, body.dimensions)
            value: Any = vector
            if body.encoding_format == "base64":
                value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
            data.append({"object": "embedding", "embedding": value, "index": index})
        return {"object": "list", "data": data, "model": body.model,
                "usage": {"prompt_tokens": count, "total_tokens": count}}

    return await json_response(build)


def _model_entry(stored: Any) -> dict[str, Any]:
    return {"id": stored.name, "object": "model", "created": int(stored.modified.timestamp()),
            "owned_by": "library"}


@router.get("/models")
async def list_models(svc: Service = Depends(service)) -> dict[str, Any]:
    found = await asyncio.to_thread(_models.all_models, svc.cfg)
    return {"object": "list", "data": [_model_entry(m) for m in found]}


@router.get("/models/{model:path}")
async def get_model(model: str, svc: Service = Depends(service)) -> dict[str, Any]:
    return _model_entry(svc.entry(model))
