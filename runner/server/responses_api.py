"""OpenAI's Responses API: ``POST /v1/responses``, ``GET``/``DELETE /v1/responses/{id}`` (what
Codex-style agents speak), shaped as the OpenResponses specification's response object.

The request: ``input`` (a string, or a list of items: messages with a ``role`` and ``content`` as
a string or ``input_text`` / ``output_text`` / ``input_image`` parts, ``function_call`` items with
``call_id``, ``name`` and ``arguments``, ``function_call_output`` items with ``call_id`` and
``output``, ``reasoning`` items whose text goes back as the next assistant turn's thinking),
``instructions`` (a system message first; not carried over by ``previous_response_id``, as
OpenAI's are not), ``tools`` (flat: ``{"type": "function", "name", "description",
"parameters"}``), ``tool_choice``, ``parallel_tool_calls``, ``max_output_tokens``,
``temperature`` and ``top_p`` (1.0 unless given, as on ``/v1/chat/completions``), the penalties,
``reasoning.effort`` (as ``think``), ``text.format`` (``json_object`` / ``json_schema``),
``stream``, ``store`` and ``previous_response_id``. An ``input_image`` is a base64 data URL in
``image_url``, as ``/v1/chat/completions`` takes images (a remote URL or a ``file_id`` is a 400).
``conversation`` and ``background`` are refused.

Responses are kept (``store`` true, the default) in a bounded in-memory
:class:`~runner.server.responsestore.ResponseStore`: ``previous_response_id`` continues one (its
input items, then its output items, then the new input: the prompt extends the earlier one, so
the slot's cache holds most of it, as for a resent conversation), ``GET`` answers it and
``DELETE`` forgets it. An id that is not kept (never, ``store: false``, evicted or deleted) is a
404 with OpenAI's ``invalid_request_error``.

The answer is a ``response`` object with every field the OpenResponses schema requires, whose
``output`` lists, in the order the model wrote them, a ``reasoning`` item (its thinking as
``summary_text``, as Ollama sends it), ``message`` items (``output_text``) and ``function_call``
items (``arguments`` a JSON string). A reply cut off by ``max_output_tokens`` has status
``incomplete`` with ``incomplete_details.reason`` ``max_output_tokens`` (and its last message
item is ``incomplete``), as OpenAI's does. Streamed, it is OpenAI's events, each with its
``sequence_number`` and an ``event:`` line that names its type: ``response.created``,
``response.in_progress``, then per item ``response.output_item.added`` …
``response.output_item.done`` (with ``content_part``, ``output_text.delta/done``,
``reasoning_summary_*`` or ``function_call_arguments.delta/done`` inside), then
``response.completed`` (or ``response.incomplete``), then ``data: [DONE]``; an error after the
stream has begun is a ``response.failed`` event. Errors before it have OpenAI's shape (400 for
bad input).
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from typing import Any, AsyncIterator, Union

from fastapi import APIRouter, Depends
from fastapi import Request as HTTPRequest
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict

from runner.api import Chunk, DoneReason, Image, InvalidRequest, Message, Request, ToolCall
from runner.images import image_from_data_url

from . import toolwire
from .http import JSON, SSE, RunnerResponse, dumps, status_of
from .ollama_api import service
from .responsestore import ResponseStore
from runner.prepare import think_level
from .service import Service, collect, now_ns, parse_keep_alive

router = APIRouter(prefix="/v1")


class ResponsesBody(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    input: Union[str, list[Any]]
    instructions: str | None = None
    tools: list[Any] | None = None
    tool_choice: Union[str, dict[str, Any], None] = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    stream: bool = False
    store: bool | None = None  # OpenAI's default: kept
    previous_response_id: str | None = None
    conversation: Any = None
    background: bool | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None
    truncation: str | None = None
    metadata: dict[str, Any] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    keep_alive: Union[str, float, None] = None


def response_store(request: HTTPRequest) -> ResponseStore:
    return request.app.state.responses


# ------------------------------------------------------------------------------------- input
def _content(content: Any, where: str) -> tuple[str, list[Image]]:
    """A message's content: a string, or a list of ``input_text`` / ``output_text`` parts and
    ``input_image`` parts (``image_url`` a base64 data URL, as ``/v1/chat/completions`` takes)."""
    if content is None:
        return "", []
    if isinstance(content, str):
        return content, []
    if not isinstance(content, list):
        raise InvalidRequest(f"invalid {where}: content is a string or a list of parts")
    texts: list[str] = []
    images: list[Image] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "input_image":
            if part.get("image_url") is None and part.get("file_id") is not None:
                raise InvalidRequest(f"invalid {where}[{j}]: file_id images are not supported; send a base64 data URL "
                                     "in image_url")
            images.append(image_from_data_url(part.get("image_url"), f"image {where}[{j}]"))
        elif kind == "input_file":
            raise InvalidRequest(f"invalid {where}[{j}]: {kind} is not supported")
        else:
            raise InvalidRequest(f"invalid {where}[{j}]: unknown content type {kind!r}")
    return "".join(texts), images


def _content_text(content: Any, where: str) -> str:
    """Content that may not carry images (a function call's output)."""
    text, images = _content(content, where)
    if images:
        raise InvalidRequest(f"invalid {where}: images are only taken in messages")
    return text


def _reasoning_text(item: dict[str, Any]) -> str:
    """The thinking a client sends back in a ``reasoning`` item (pollama writes it, as Ollama
    does, both as the summary and as ``encrypted_content``)."""
    if isinstance(item.get("encrypted_content"), str) and item["encrypted_content"]:
        return item["encrypted_content"]
    parts = [p for key in ("content", "summary") if isinstance(item.get(key), list) for p in item[key]]
    return "".join(p.get("text", "") for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def input_items(body: ResponsesBody) -> list[Any]:
    """The request's ``input`` as items (a string is one user message)."""
    if isinstance(body.input, str):
        if not body.input:
            raise InvalidRequest("input must not be empty")
        return [{"type": "message", "role": "user", "content": body.input}]
    if not body.input:
        raise InvalidRequest("input must not be empty")
    return list(body.input)


def to_messages(instructions: str | None, items: list[Any], first: int = 0) -> list[Message]:
    """``instructions`` and input ``items`` as the runner's conversation. Consecutive
    ``function_call`` items join one assistant turn (after its text, if the turn has any); a
    ``function_call_output`` is a ``tool`` message named after the call it answers. ``first``:
    the position of the request's own ``input`` in ``items`` (after a chain's), for errors."""
    out: list[Message] = []
    if instructions:
        out.append(Message("system", instructions))
    names: dict[str, str] = {}
    thinking = ""
    for i, item in enumerate(items):
        where = f"input[{i - first}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"invalid {where}: an input item is an object")
        kind = item.get("type") or ("message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise InvalidRequest(f"invalid {where}.role {role!r}: use user, system, developer or assistant")
            text, images = _content(item.get("content"), f"{where}.content")
            message = Message("system" if role == "developer" else role, text, images=images)
            if role == "assistant" and thinking:
                message.thinking, thinking = thinking, ""
            out.append(message)
        elif kind == "function_call":
            name, call_id = item.get("name"), item.get("call_id")
            if not isinstance(name, str) or not name or not isinstance(call_id, str):
                raise InvalidRequest(f"invalid {where}: a function_call has a name and a call_id")
            args = toolwire.arguments(item.get("arguments"), where)
            last = out[-1] if out else None
            if last is None or last.role != "assistant":
                last = Message("assistant", "")
                out.append(last)
            if thinking:
                last.thinking, thinking = thinking, ""
            last.tool_calls.append(ToolCall(name, args, index=len(last.tool_calls), id=call_id))
            names[call_id] = name
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise InvalidRequest(f"invalid {where}: a function_call_output has a call_id")
            output = item.get("output")
            text = output if isinstance(output, str) else _content_text(output, f"{where}.output")
            out.append(Message("tool", text, tool_name=names.get(call_id, ""), tool_call_id=call_id))
        elif kind == "reasoning":
            thinking = _reasoning_text(item)
        else:
            raise InvalidRequest(f"invalid {where}: unsupported input item type {kind!r}")
    if thinking:
        out.append(Message("assistant", "", thinking=thinking))
    return out


def to_tools(raw: list[Any] | None) -> list[dict[str, Any]]:
    """Responses' flat function tools in the nested shape toolwire reads."""
    out = []
    for i, tool in enumerate(raw or []):
        if not isinstance(tool, dict):
            raise InvalidRequest(f"invalid tools[{i}]: a tool is an object")
        if tool.get("type") != "function":
            raise InvalidRequest(f"invalid tools[{i}].type {tool.get('type')!r}: only \"function\" tools are supported")
        out.append({"type": "function", "function": {"name": tool.get("name"), "description": tool.get("description"),
                                                     "parameters": tool.get("parameters")}})
    return out


def to_tool_choice(raw: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
    """Responses' ``tool_choice`` (``{"type": "function", "name"}`` for a function) in
    chat-completions' shape."""
    if isinstance(raw, dict) and raw.get("type") == "function" and "function" not in raw:
        return {"type": "function", "function": {"name": raw.get("name")}}
    return raw


def text_format(raw: dict[str, Any] | None) -> str | dict | None:
    fmt = (raw or {}).get("format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return "json"
    if kind == "json_schema":
        if not isinstance(fmt.get("schema"), dict):
            raise InvalidRequest("text.format json_schema needs a schema")
        return fmt["schema"]
    raise InvalidRequest(f"invalid text.format type {kind!r}: use text, json_object or json_schema")


# ------------------------------------------------------------------------------------ output
def _ident(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _message_item(ident: str, text: str, status: str) -> dict[str, Any]:
    """A message item: ``in_progress`` (just added: no content yet), ``completed``, or
    ``incomplete`` (cut off by ``max_output_tokens``)."""
    content = [] if status == "in_progress" else [_text_part(text)]
    return {"id": ident, "type": "message", "status": status, "role": "assistant", "content": content}


def _reasoning_item(ident: str, text: str | None) -> dict[str, Any]:
    item: dict[str, Any] = {"id": ident, "type": "reasoning", "summary": []}
    if text is not None:
        item["summary"] = [{"type": "summary_text", "text": text}]
        item["encrypted_content"] = text  # plain text, as Ollama sends it: it comes back as thinking
    return item


def _call_item(ident: str, call: ToolCall, status: str) -> dict[str, Any]:
    return {"id": ident, "type": "function_call", "status": status, "call_id": call.id, "name": call.name,
            "arguments": json.dumps(call.arguments) if status == "completed" else ""}


def _usage(chunk: Chunk | None) -> dict[str, Any]:
    m = chunk.metrics if chunk is not None else None
    prompt = m.prompt_tokens if m else 0
    out = m.eval_count if m else 0
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": m.prompt_cached_count if m else 0},
            "output_tokens": out, "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + out}


class _Envelope:
    """The response object's fields that echo the request (every field the OpenResponses
    schema requires)."""

    def __init__(self, body: ResponsesBody, tools: list[dict[str, Any]]) -> None:
        self.id = _ident("resp")
        self.created_at = int(time.time())
        self.body = body
        self.tools = tools

    def object(self, status: str, output: list[dict[str, Any]], final: Chunk | None = None,
               error: dict[str, Any] | None = None) -> dict[str, Any]:
        b = self.body
        incomplete = None
        if status == "incomplete":
            incomplete = {"reason": "max_output_tokens"}
        text = b.text if isinstance(b.text, dict) and isinstance(b.text.get("format"), dict) else {"format": {"type": "text"}}
        return {
            "id": self.id, "object": "response", "created_at": self.created_at,
            "completed_at": int(time.time()) if status == "completed" else None,
            "status": status, "error": error, "incomplete_details": incomplete, "model": b.model,
            "previous_response_id": b.previous_response_id, "instructions": b.instructions, "output": output,
            "tools": [{"type": "function", "name": t["function"]["name"], "description": t["function"]["description"],
                       "parameters": t["function"]["parameters"], "strict": False} for t in self.tools],
            "tool_choice": b.tool_choice if b.tool_choice is not None else "auto",
            "truncation": b.truncation or "disabled",
            "parallel_tool_calls": b.parallel_tool_calls if b.parallel_tool_calls is not None else True,
            "text": text,
            "top_p": 1.0 if b.top_p is None else b.top_p,
            "presence_penalty": b.presence_penalty or 0.0,
            "frequency_penalty": b.frequency_penalty or 0.0,
            "top_logprobs": b.top_logprobs or 0,
            "temperature": 1.0 if b.temperature is None else b.temperature,
            "reasoning": {"effort": (b.reasoning or {}).get("effort"), "summary": None} if b.reasoning else None,
            "user": b.user,
            "usage": _usage(final) if final is not None else None,
            "max_output_tokens": b.max_output_tokens, "max_tool_calls": b.max_tool_calls,
            "store": b.store is not False, "background": False, "service_tier": "default",
            "metadata": b.metadata or {}, "safety_identifier": b.safety_identifier,
            "prompt_cache_key": b.prompt_cache_key,
        }


def _status(final: Chunk) -> str:
    return "incomplete" if final.done_reason is DoneReason.LENGTH else "completed"


def _event(name: str, seq: int, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: ".encode() + dumps({"type": name, "sequence_number": seq, **data}) + b"\n\n"


class _Events:
    """The streamed events of one response: output items open and close as the reply's parts
    arrive (reasoning, text, calls), each at the next output index."""

    def __init__(self, envelope: _Envelope) -> None:
        self.envelope = envelope
        self.seq = 0
        self.output: list[dict[str, Any]] = []  # the finished items, in order
        self.open: str | None = None  # "reasoning" or "message": the item being streamed
        self.open_id = ""
        self.text = ""
        self.final: dict[str, Any] | None = None  # the response object, once done

    def emit(self, name: str, data: dict[str, Any]) -> bytes:
        out = _event(name, self.seq, data)
        self.seq += 1
        return out

    def start(self) -> list[bytes]:
        obj = self.envelope.object("in_progress", [])
        return [self.emit("response.created", {"response": obj}), self.emit("response.in_progress", {"response": obj})]

    def _begin(self, kind: str, item: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.open, self.open_id, self.text = kind, item["id"], ""
        out.append(self.emit("response.output_item.added", {"output_index": len(self.output), "item": item}))
        return out

    def close(self, status: str = "completed") -> list[bytes]:
        """Finish the item being streamed, if any (a message as ``status``)."""
        if self.open is None:
            return []
        at, ident, text = len(self.output), self.open_id, self.text
        if self.open == "reasoning":
            part = {"type": "summary_text", "text": text}
            item = _reasoning_item(ident, text)
            out = [self.emit("response.reasoning_summary_text.done",
                             {"item_id": ident, "output_index": at, "summary_index": 0, "text": text}),
                   self.emit("response.reasoning_summary_part.done",
                             {"item_id": ident, "output_index": at, "summary_index": 0, "part": part})]
        else:
            item = _message_item(ident, text, status)
            out = [self.emit("response.output_text.done", {"item_id": ident, "output_index": at, "content_index": 0,
                                                           "text": text, "logprobs": []}),
                   self.emit("response.content_part.done", {"item_id": ident, "output_index": at,
                                                            "content_index": 0, "part": _text_part(text)})]
        out.append(self.emit("response.output_item.done", {"output_index": at, "item": item}))
        self.output.append(item)
        self.open = None
        return out

    def thinking(self, delta: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open != "reasoning":
            out = self._begin("reasoning", _reasoning_item(_ident("rs"), None))
            out.append(self.emit("response.reasoning_summary_part.added", {
                "item_id": self.open_id, "output_index": len(self.output), "summary_index": 0,
                "part": {"type": "summary_text", "text": ""}}))
        self.text += delta
        out.append(self.emit("response.reasoning_summary_text.delta", {
            "item_id": self.open_id, "output_index": len(self.output), "summary_index": 0, "delta": delta}))
        return out

    def content(self, delta: str) -> list[bytes]:
        out: list[bytes] = []
        if self.open != "message":
            out = self._begin("message", _message_item(_ident("msg"), "", "in_progress"))
            out.append(self.emit("response.content_part.added", {
                "item_id": self.open_id, "output_index": len(self.output), "content_index": 0,
                "part": _text_part("")}))
        self.text += delta
        out.append(self.emit("response.output_text.delta", {
            "item_id": self.open_id, "output_index": len(self.output), "content_index": 0, "delta": delta,
            "logprobs": []}))
        return out

    def call(self, call: ToolCall) -> list[bytes]:
        out = self.close()
        at, ident = len(self.output), _ident("fc")
        done = _call_item(ident, call, "completed")
        out.append(self.emit("response.output_item.added", {"output_index": at,
                                                             "item": _call_item(ident, call, "in_progress")}))
        out.append(self.emit("response.function_call_arguments.delta",
                             {"item_id": ident, "output_index": at, "delta": done["arguments"]}))
        out.append(self.emit("response.function_call_arguments.done",
                             {"item_id": ident, "output_index": at, "arguments": done["arguments"]}))
        out.append(self.emit("response.output_item.done", {"output_index": at, "item": done}))
        self.output.append(done)
        return out

    def done(self, final: Chunk) -> list[bytes]:
        """Close the last item and end with the whole response (kept in :attr:`final`)."""
        out = []
        if not self.output and self.open is None:  # an empty answer is still a message
            out += self.content("")
        status = _status(final)
        out += self.close(status)
        self.final = self.envelope.object(status, self.output, final)
        name = "response.completed" if status == "completed" else "response.incomplete"
        out.append(self.emit(name, {"response": self.final}))
        return out

    def failed(self, err: BaseException) -> bytes:
        error = {"code": "server_error" if status_of(err) >= 500 else "invalid_request", "message": str(err)}
        return self.emit("response.failed", {"response": self.envelope.object("failed", self.output, error=error)})


# ----------------------------------------------------------------------------------- routes
def not_found(message: str, param: str | None = None, code: str | None = None) -> Response:
    """OpenAI's 404 for a response id it does not have (an ``invalid_request_error``)."""
    body = {"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}
    return Response(dumps(body), status_code=404, media_type=JSON)


def output_items(reply_final: Chunk, thinking: str, text: str, calls: list[ToolCall]) -> list[dict[str, Any]]:
    """A whole reply's output items, in the order the model writes them; the message of a
    reply cut off by ``max_output_tokens`` is ``incomplete`` when it is the last item."""
    output: list[dict[str, Any]] = []
    if thinking:
        output.append(_reasoning_item(_ident("rs"), thinking))
    if text or not calls:
        status = _status(reply_final) if not calls else "completed"
        output.append(_message_item(_ident("msg"), text, status))
    output.extend(_call_item(_ident("fc"), c, "completed") for c in calls)
    return output


@router.post("/responses")
async def responses(body: ResponsesBody, svc: Service = Depends(service),
                    store: ResponseStore = Depends(response_store)) -> Response:
    t0 = now_ns()
    if not body.model:
        raise InvalidRequest("model is required")
    if body.conversation is not None:
        raise InvalidRequest("conversation is not supported: chain responses with previous_response_id, "
                             "or send the whole conversation in input")
    if body.background:
        raise InvalidRequest("background is not supported: pollama answers while the request is open")
    if body.max_output_tokens is not None and body.max_output_tokens < 1:
        raise InvalidRequest(f"invalid max_output_tokens {body.max_output_tokens}: it must be at least 1")
    if body.truncation not in (None, "auto", "disabled"):
        raise InvalidRequest(f"invalid truncation {body.truncation!r}: use auto or disabled")
    chain: list[Any] = []
    if body.previous_response_id is not None:
        previous = store.get(body.previous_response_id)
        if previous is None:
            return not_found(f"Previous response with id '{body.previous_response_id}' not found.",
                             "previous_response_id", "previous_response_not_found")
        chain = previous.conversation()
    items = chain + input_items(body)
    wire_tools = to_tools(body.tools)
    tools = toolwire.parse_tools(wire_tools)
    messages = await asyncio.to_thread(to_messages, body.instructions, items, len(chain))  # decodes images
    request = Request(
        messages=messages, tools=tools,
        tool_choice=toolwire.parse_tool_choice(to_tool_choice(body.tool_choice), tools),
        parallel_tool_calls=body.parallel_tool_calls, format=text_format(body.text),
        think=think_level((body.reasoning or {}).get("effort"), "reasoning_effort"),
    )
    options: dict[str, Any] = {"temperature": 1.0 if body.temperature is None else body.temperature,
                               "top_p": 1.0 if body.top_p is None else body.top_p}
    if body.max_output_tokens is not None:
        options["num_predict"] = body.max_output_tokens
    if body.presence_penalty is not None:
        options["presence_penalty"] = body.presence_penalty
    if body.frequency_penalty is not None:
        options["frequency_penalty"] = body.frequency_penalty
    keep_alive = parse_keep_alive(body.keep_alive)
    envelope = _Envelope(body, wire_tools)

    def keep(response: dict[str, Any]) -> None:
        if body.store is not False:
            store.put(envelope.id, response, items)

    async def single() -> AsyncIterator[bytes]:
        reply = await collect(svc.stream(body.model, request, options, keep_alive, t0))
        if reply.final is None:
            return
        output = output_items(reply.final, reply.thinking, reply.text, reply.tool_calls)
        response = envelope.object(_status(reply.final), output, reply.final)
        keep(response)
        yield dumps(response)

    async def events() -> AsyncIterator[bytes]:
        chunks = svc.stream(body.model, request, options, keep_alive, t0)
        state = _Events(envelope)
        started = False
        try:
            async for chunk in chunks:
                pieces: list[bytes] = []
                if not started:
                    started = True
                    pieces += state.start()
                if chunk.thinking:
                    pieces += state.thinking(chunk.thinking)
                if chunk.text:
                    pieces += state.content(chunk.text)
                for call in chunk.tool_calls or []:
                    pieces += state.call(call)
                if chunk.done:
                    pieces += state.done(chunk)
                    assert state.final is not None
                    keep(state.final)
                    pieces.append(b"data: [DONE]\n\n")
                for piece in pieces:
                    yield piece
        except Exception as err:
            if not started:
                raise
            yield state.failed(err)
            yield b"data: [DONE]\n\n"
        finally:
            await chunks.aclose()

    return RunnerResponse(events if body.stream else single, SSE if body.stream else JSON, on_close=request.cancel.set)


@router.get("/responses/{response_id}")
async def get_response(response_id: str, store: ResponseStore = Depends(response_store)) -> Response:
    """The stored response object (404 when it is not kept)."""
    stored = store.get(response_id)
    if stored is None:
        return not_found(f"Response with id '{response_id}' not found.")
    return Response(stored.response, media_type=JSON)


@router.delete("/responses/{response_id}")
async def delete_response(response_id: str, store: ResponseStore = Depends(response_store)) -> Response:
    """Forget a stored response: OpenAI's deletion object (404 when it is not kept)."""
    if not store.delete(response_id):
        return not_found(f"Response with id '{response_id}' not found.")
    return Response(dumps({"id": response_id, "object": "response", "deleted": True}), media_type=JSON)
