"""Anthropic's Messages API: ``POST /v1/messages`` (what Claude-Code-style agents speak) and
``POST /v1/messages/count_tokens``.

``system`` (a string or text blocks), ``messages`` whose content is a string or blocks (``text``,
``tool_use``, ``tool_result``, ``thinking``), ``max_tokens`` (required), ``tools`` (``name``,
``description``, ``input_schema``), ``tool_choice`` (``auto``, ``any``, ``tool``, ``none``),
``thinking`` (``{"type": "enabled"}`` turns reasoning on; dropped, as Ollama does, for a model
that cannot think), ``stop_sequences``, ``temperature``, ``top_p``, ``top_k``. The answer is a
message whose content holds ``thinking``, ``text`` and ``tool_use`` blocks, its ``stop_reason``
``end_turn``, ``max_tokens``, ``tool_use`` or ``stop_sequence`` (with the ``stop_sequence`` that
matched); streamed, Anthropic's events (``message_start``, ``content_block_start``,
``content_block_delta`` with ``text_delta`` / ``thinking_delta`` / ``input_json_delta``,
``content_block_stop``, ``message_delta``, ``message_stop``). ``usage`` counts as Anthropic does:
``input_tokens`` evaluated, ``cache_read_input_tokens`` reused from the slot's cache (together the
whole prompt); streamed, ``message_start`` has them (the runner's first chunk does) and
``message_delta`` the final counts. ``count_tokens`` answers the size of the prompt the same
request would render (``{"input_tokens": N}``, the whole prompt). Errors have Anthropic's shape.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from typing import Any, AsyncIterator, Literal, Union

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from runner.api import Chunk, DoneReason, Image, InvalidRequest, Message, Metrics, Request, ToolCall, ToolChoice
from runner.images import image_from_base64

from . import toolwire
from .http import JSON, RunnerResponse, anthropic_error, dumps, status_of
from .ollama_api import service
from .service import Service, collect, now_ns

router = APIRouter(prefix="/v1")


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class AnthropicMessage(_Body):
    role: Literal["user", "assistant"]
    content: Union[str, list[dict[str, Any]]]


class CountBody(_Body):
    """What makes the prompt: the body of ``count_tokens``, and the start of a message request's."""

    model: str
    messages: list[AnthropicMessage]
    system: Union[str, list[dict[str, Any]], None] = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: dict[str, Any] | None = None


class MessagesBody(CountBody):
    max_tokens: int
    stop_sequences: list[str] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    stream: bool = False


def _text(blocks: Union[str, list[dict[str, Any]], None], where: str) -> str:
    if blocks is None:
        return ""
    if isinstance(blocks, str):
        return blocks
    parts = []
    for block in blocks:
        if block.get("type") != "text":
            raise InvalidRequest(f"invalid {where}: only text blocks are supported there")
        parts.append(str(block.get("text") or ""))
    return "\n".join(parts)


def to_messages(body: MessagesBody) -> list[Message]:
    """Anthropic's conversation as the runner's: an assistant's ``tool_use`` blocks are its calls;
    each ``tool_result`` block is a ``tool`` message named after the call it answers."""
    out: list[Message] = []
    system = _text(body.system, "system")
    if system:
        out.append(Message("system", system))
    names: dict[str, str] = {}
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            out.append(Message(m.role, m.content))
            continue
        texts: list[str] = []
        thinking: list[str] = []
        calls: list[ToolCall] = []
        images: list[Image] = []
        for j, block in enumerate(m.content):
            kind = block.get("type")
            if kind == "text":
                texts.append(str(block.get("text") or ""))
            elif kind == "thinking":
                thinking.append(str(block.get("thinking") or ""))
            elif kind == "redacted_thinking":
                continue
            elif kind == "image" and m.role == "user":
                images.append(_image(block.get("source"), f"messages[{i}].content[{j}]"))
            elif kind == "tool_use" and m.role == "assistant":
                args = block.get("input") or {}
                if not isinstance(block.get("name"), str) or not isinstance(args, dict):
                    raise InvalidRequest(f"invalid messages[{i}].content[{j}]: tool_use has a name and an input object")
                call = ToolCall(block["name"], args, index=len(calls), id=str(block.get("id") or ""))
                names[call.id] = call.name
                calls.append(call)
            elif kind == "tool_result" and m.role == "user":
                call_id = str(block.get("tool_use_id") or "")
                content = block.get("content")
                text = content if isinstance(content, str) else _text(content, f"messages[{i}].content[{j}].content")
                out.append(Message("tool", text, tool_name=names.get(call_id, ""), tool_call_id=call_id))
            else:
                raise InvalidRequest(f"invalid messages[{i}].content[{j}]: unsupported block type {kind!r}")
        if texts or calls or thinking or images or not m.content:
            out.append(Message(m.role, "".join(texts), thinking="".join(thinking), tool_calls=calls, images=images))
    return out


def _image(source: Any, where: str) -> Image:
    """An image block's ``source``: base64 data only (pollama fetches nothing from the network)."""
    if not isinstance(source, dict) or source.get("type") != "base64":
        kind = source.get("type") if isinstance(source, dict) else None
        if kind == "url":
            raise InvalidRequest(f"invalid {where}: image URLs are not supported; send the image as base64")
        raise InvalidRequest(f"invalid {where}: an image block needs a source of type base64")
    return image_from_base64(source.get("data"), f"image {where}")


def to_tools(raw: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Anthropic's tools in the OpenAI/Ollama shape toolwire reads."""
    out = []
    for i, tool in enumerate(raw or []):
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
            raise InvalidRequest(f"invalid tools[{i}]: a tool has a name and an input_schema")
        out.append({"type": "function", "function": {"name": tool["name"], "description": tool.get("description") or "",
                                                     "parameters": tool.get("input_schema")}})
    return out


def to_choice(raw: dict[str, Any] | None, names: set[str]) -> ToolChoice:
    if raw is None or raw.get("type") == "auto":
        return ToolChoice()
    kind = raw.get("type")
    if kind == "none":
        return ToolChoice("none")
    if kind == "any":
        return ToolChoice("required")
    if kind == "tool" and raw.get("name") in names:
        return ToolChoice("function", raw["name"])
    raise InvalidRequest(f"invalid tool_choice {raw!r}")


def stop_reason(chunk: Chunk, called: bool, stops: list[str] | None) -> tuple[str, str | None]:
    """(``stop_reason``, ``stop_sequence``) of an answer whose last chunk is ``chunk``: a stop
    sequence is one of the request's ``stop_sequences`` (a model's own stop PARAMETER, like its
    end-of-turn token, ends the turn)."""
    if called:
        return "tool_use", None
    if chunk.stop is not None and chunk.stop in (stops or []):
        return "stop_sequence", chunk.stop
    return ("max_tokens" if chunk.done_reason is DoneReason.LENGTH else "end_turn"), None


def usage(m: Metrics | None) -> dict[str, int]:
    """Anthropic's usage: ``input_tokens`` are the prompt tokens evaluated, ``cache_read_input_tokens``
    those reused from the slot's cache (together, the whole prompt, as Anthropic counts them)."""
    return {"input_tokens": m.prompt_eval_count if m else 0, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": m.prompt_cached_count if m else 0,
            "output_tokens": m.eval_count if m else 0}


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + dumps(data) + b"\n\n"


async def to_request(body: CountBody) -> Request:
    """The runner's request for the prompt ``body`` describes (InvalidRequest when it is bad)."""
    if not body.model:
        raise InvalidRequest("model is required")
    if not body.messages:
        raise InvalidRequest("messages: at least one message is required")
    tools = toolwire.parse_tools(to_tools(body.tools))
    think = None
    if body.thinking is not None:
        think = body.thinking.get("type") == "enabled"
    conversation = await asyncio.to_thread(to_messages, body)  # images are decoded to check them
    return Request(messages=conversation, tools=tools,
                   tool_choice=to_choice(body.tool_choice, {t.name for t in tools}), think=think,
                   relax_think=True)  # as Ollama: clients ask every model to think


@router.post("/messages/count_tokens")
async def count_tokens(body: CountBody, svc: Service = Depends(service)) -> Response:
    """``{"input_tokens": N}``: the whole prompt the same ``/v1/messages`` request would run
    (system, tools, messages, images, as rendered and tokenized for the model; loads it)."""
    request = await to_request(body)

    async def single() -> AsyncIterator[bytes]:
        yield dumps({"input_tokens": await svc.count(body.model, request, None, None)})

    return RunnerResponse(single, JSON, on_close=request.cancel.set)


@router.post("/messages")
async def messages(body: MessagesBody, svc: Service = Depends(service)) -> Response:
    t0 = now_ns()
    if body.max_tokens < 1:
        raise InvalidRequest("max_tokens: must be at least 1")
    request = await to_request(body)
    options: dict[str, Any] = {"num_predict": body.max_tokens}
    for name, value in (("temperature", body.temperature), ("top_p", body.top_p), ("top_k", body.top_k),
                        ("stop", body.stop_sequences)):
        if value is not None:
            options[name] = value
    ident = "msg_" + secrets.token_hex(12)

    def envelope(content: list[dict[str, Any]], reason: tuple[str | None, str | None], used: dict[str, int]):
        return {"id": ident, "type": "message", "role": "assistant", "model": body.model, "content": content,
                "stop_reason": reason[0], "stop_sequence": reason[1], "usage": used}

    def tool_block(call: ToolCall) -> dict[str, Any]:
        return {"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments}

    async def single() -> AsyncIterator[bytes]:
        reply = await collect(svc.stream(body.model, request, options, None, t0))
        if reply.final is None:
            return
        content: list[dict[str, Any]] = []
        if reply.thinking:
            content.append({"type": "thinking", "thinking": reply.thinking, "signature": ""})
        if reply.text or not reply.tool_calls:
            content.append({"type": "text", "text": reply.text})
        content.extend(tool_block(c) for c in reply.tool_calls)
        yield dumps(envelope(content, stop_reason(reply.final, bool(reply.tool_calls), body.stop_sequences),
                             usage(reply.final.metrics)))

    async def events() -> AsyncIterator[bytes]:
        chunks = svc.stream(body.model, request, options, None, t0)
        index = -1
        open_kind: str | None = None
        called = False

        def close() -> list[bytes]:
            nonlocal open_kind
            if open_kind is None:
                return []
            open_kind = None
            return [_event("content_block_stop", {"type": "content_block_stop", "index": index})]

        def start(kind: str, block: dict[str, Any]) -> list[bytes]:
            nonlocal index, open_kind
            out = close()
            index += 1
            open_kind = kind
            return out + [_event("content_block_start", {"type": "content_block_start", "index": index,
                                                         "content_block": block})]

        try:
            first = True
            async for chunk in chunks:
                if first:  # it carries the prompt's counts (runner.api.Chunk)
                    first = False
                    started = usage(chunk.metrics)
                    started["output_tokens"] = 0
                    yield _event("message_start", {"type": "message_start",
                                                   "message": envelope([], (None, None), started)})
                if chunk.thinking:
                    if open_kind != "thinking":
                        for e in start("thinking", {"type": "thinking", "thinking": ""}):
                            yield e
                    yield _event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                         "delta": {"type": "thinking_delta", "thinking": chunk.thinking}})
                if chunk.text:
                    if open_kind != "text":
                        for e in start("text", {"type": "text", "text": ""}):
                            yield e
                    yield _event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                         "delta": {"type": "text_delta", "text": chunk.text}})
                for call in chunk.tool_calls or []:
                    called = True
                    for e in start("tool_use", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}):
                        yield e
                    yield _event("content_block_delta", {"type": "content_block_delta", "index": index,
                                                         "delta": {"type": "input_json_delta",
                                                                   "partial_json": json.dumps(call.arguments)}})
                if chunk.done:
                    for e in close():
                        yield e
                    reason, sequence = stop_reason(chunk, called, body.stop_sequences)
                    yield _event("message_delta", {"type": "message_delta",  # the final counts
                                                   "delta": {"stop_reason": reason, "stop_sequence": sequence},
                                                   "usage": usage(chunk.metrics)})
                    yield _event("message_stop", {"type": "message_stop"})
        except Exception as err:
            if first:
                raise
            yield _event("error", anthropic_error(status_of(err), str(err)))
        finally:
            await chunks.aclose()

    return RunnerResponse(events if body.stream else single, "text/event-stream" if body.stream else JSON,
                          on_close=request.cancel.set)
