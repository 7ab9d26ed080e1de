"""OpenAI's chat API as an upstream speaks it (vLLM, SGLang, llama-server, LM Studio, pollama's /v1).

Requests: ``POST /chat/completions`` with ``stream: true`` and ``stream_options.include_usage``;
options mapped by name (``num_predict`` is ``max_tokens``; ``top_k`` and ``min_p`` are the
extensions vLLM, SGLang and llama-server all take); ``format`` as ``response_format``; ``think`` as
``reasoning_effort``; images as ``image_url`` parts with data URLs; tool calls with their ids.
Answers: server-sent events, each ``data: {chat.completion.chunk}``, ending ``data: [DONE]``;
reasoning arrives as ``reasoning_content`` (llama-server, DeepSeek) or ``reasoning`` (vLLM);
a tool call's arguments arrive in pieces and are passed on whole when the choice finishes.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import Any

from ..api import Chunk, DoneReason, Embedding, Message, Metrics, Request, ToolCall, UpstreamError
from .dialect import LOCAL_ONLY, Reader, conversation, image_mime, logprobs_from_wire, refuse_options, set_options

# Ollama's option -> the request field that carries it
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "stop": "stop",
           "num_predict": "max_tokens", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty", "top_k": "top_k", "min_p": "min_p"}


class OpenAIDialect:
    name = "OpenAI"
    models_path = "/models"
    chat_path = "/chat/completions"
    embed_path = "/embeddings"

    def __init__(self, upstream: str = "") -> None:
        self.upstream = upstream  # for messages

    def model_names(self, body: Any) -> list[str]:
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list):
            raise UpstreamError(f"upstream {self.upstream} sent a model list without data")
        return [str(m["id"]) for m in data if isinstance(m, dict) and isinstance(m.get("id"), str)]

    def chat_body(self, request: Request, model: str) -> dict[str, Any]:
        body: dict[str, Any] = {"model": model, "messages": _messages(conversation(request)), "stream": True,
                                "stream_options": {"include_usage": True}}
        refused = []
        for name, value in set_options(request).items():
            if name in LOCAL_ONLY:
                continue
            if name not in OPTIONS:
                refused.append(name)
            elif name == "num_predict":
                if value > 0:
                    body["max_tokens"] = value
            elif name == "stop":
                if value:
                    body["stop"] = list(value)
            elif name == "seed":
                if value >= 0:
                    body["seed"] = value
            else:
                body[OPTIONS[name]] = value
        refuse_options(refused, self.upstream, self.name)
        if request.format == "json":
            body["response_format"] = {"type": "json_object"}
        elif isinstance(request.format, dict):
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "schema", "schema": request.format}}
        if request.tools:
            body["tools"] = [t.wire() for t in request.tools]
            choice = request.tool_choice
            if choice.mode == "function":
                body["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
            elif choice.mode == "required":
                body["tool_choice"] = "required"
            if request.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = request.parallel_tool_calls
        if request.think is not None:
            body["reasoning_effort"] = ("medium" if request.think is True else "none" if request.think is False
                                        else request.think)
        if request.logprobs:
            body["logprobs"] = True
            if request.top_logprobs:
                body["top_logprobs"] = request.top_logprobs
        return body

    def reader(self) -> Reader:
        return _Reader(self.upstream)

    def embed_body(self, texts: list[str | list[int]], truncate: bool, model: str) -> dict[str, Any]:
        return {"model": model, "input": texts, "encoding_format": "float"}

    def embedding(self, body: Any, count: int) -> Embedding:
        data = body.get("data") if isinstance(body, dict) else None
        if not isinstance(data, list) or len(data) != count:
            raise UpstreamError(f"upstream {self.upstream} sent {len(data) if isinstance(data, list) else 'no'} "
                                f"embeddings for {count} inputs")
        ordered = sorted(data, key=lambda d: d.get("index", 0) if isinstance(d, dict) else 0)
        vectors = [d.get("embedding") if isinstance(d, dict) else None for d in ordered]
        if not all(isinstance(v, list) and all(isinstance(x, (int, float)) for x in v) for v in vectors):
            raise UpstreamError(f"upstream {self.upstream} sent an embedding that is not a list of numbers")
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        return Embedding([[float(x) for x in v] for v in vectors], _int(usage.get("prompt_tokens")))  # type: ignore[union-attr]


def _messages(messages: list[Message]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # ids of the last assistant's calls that no tool message answered yet
    for n, m in enumerate(messages):
        item: dict[str, Any] = {"role": m.role}
        if m.images:
            parts: list[dict[str, Any]] = [{"type": "text", "text": m.content}] if m.content else []
            for image in m.images:
                url = f"data:{image_mime(image.data)};base64,{base64.b64encode(image.data).decode()}"
                parts.append({"type": "image_url", "image_url": {"url": url}})
            item["content"] = parts
        else:
            item["content"] = m.content
        if m.role == "assistant" and m.thinking:
            item["reasoning_content"] = m.thinking
        if m.tool_calls:
            ids = [c.id or f"call_{n}_{i}" for i, c in enumerate(m.tool_calls)]
            item["tool_calls"] = [{"id": i, "type": "function",
                                   "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                                  for i, c in zip(ids, m.tool_calls)]
            pending = list(ids)
        if m.role == "tool":
            call_id = m.tool_call_id or (pending[0] if pending else "")
            if call_id in pending:
                pending.remove(call_id)
            if call_id:
                item["tool_call_id"] = call_id
            if m.tool_name:
                item["name"] = m.tool_name
        out.append(item)
    return out


@dataclass
class _Call:
    id: str = ""
    name: str = ""
    arguments: str = ""


@dataclass
class _Reader:
    upstream: str
    calls: dict[int, _Call] = field(default_factory=dict)
    finish: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    done: bool = False

    def read(self, line: bytes) -> list[Chunk]:
        if self.done or line.startswith(b":") or not line.startswith(b"data:"):
            return []  # a comment (keep-alive), an "event:"/"id:" field, or anything after [DONE]
        data = line[5:].strip()
        if data == b"[DONE]":
            return self._final()
        try:
            event = json.loads(data)
        except ValueError:
            raise UpstreamError(f"upstream {self.upstream} sent an event that is not JSON: "
                                f"{data[:120].decode('utf-8', 'replace')!r}") from None
        if not isinstance(event, dict):
            raise UpstreamError(f"upstream {self.upstream} sent an event that is not an object")
        if "error" in event:
            err = event["error"]
            message = err.get("message", err) if isinstance(err, dict) else err
            raise UpstreamError(f"upstream {self.upstream} failed: {str(message)[:500]}")
        if isinstance(event.get("usage"), dict):
            self.usage = event["usage"]
        if isinstance(event.get("timings"), dict):
            self.timings = event["timings"]
        out: list[Chunk] = []
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") if isinstance(choice.get("delta"), dict) else {}
            text = delta.get("content") or ""
            thinking = delta.get("reasoning_content") or delta.get("reasoning") or ""
            for piece in delta.get("tool_calls") or []:
                self._call_piece(piece)
            lps = logprobs_from_wire((choice.get("logprobs") or {}).get("content")) \
                if isinstance(choice.get("logprobs"), dict) else None
            if isinstance(text, str) and isinstance(thinking, str) and (text or thinking or lps):
                out.append(Chunk(text=text, thinking=thinking, logprobs=lps))
            if choice.get("finish_reason"):
                self.finish = str(choice["finish_reason"])
                calls = self._calls()
                if calls:
                    out.append(Chunk(tool_calls=calls))
        return out

    def end(self) -> list[Chunk]:
        if self.done:
            return []
        if self.finish is None:
            raise UpstreamError(f"upstream {self.upstream} ended its stream before the answer was complete")
        return self._final()

    def _call_piece(self, piece: Any) -> None:
        if not isinstance(piece, dict):
            return
        index = piece.get("index", len(self.calls))
        call = self.calls.setdefault(index if isinstance(index, int) else len(self.calls), _Call())
        if isinstance(piece.get("id"), str) and piece["id"]:
            call.id = piece["id"]
        fn = piece.get("function") if isinstance(piece.get("function"), dict) else {}
        if isinstance(fn.get("name"), str):
            call.name += fn["name"]
        if isinstance(fn.get("arguments"), str):
            call.arguments += fn["arguments"]
        elif isinstance(fn.get("arguments"), dict):
            call.arguments += json.dumps(fn["arguments"])

    def _calls(self) -> list[ToolCall]:
        out = []
        for i, (index, call) in enumerate(sorted(self.calls.items())):
            try:
                args = json.loads(call.arguments) if call.arguments.strip() else {}
            except ValueError:
                raise UpstreamError(f"upstream {self.upstream} sent a tool call whose arguments are not JSON") from None
            if not isinstance(args, dict):
                raise UpstreamError(f"upstream {self.upstream} sent a tool call whose arguments are not an object")
            out.append(ToolCall(call.name, args, index=i, id=call.id))
        self.calls.clear()
        return out

    def _final(self) -> list[Chunk]:
        self.done = True
        out = []
        calls = self._calls()
        if calls:
            out.append(Chunk(tool_calls=calls))
        reason = DoneReason.LENGTH if self.finish == "length" else DoneReason.STOP
        out.append(Chunk(done=True, done_reason=reason, metrics=self._metrics()))
        return out

    def _metrics(self) -> Metrics:
        usage = self.usage or {}
        details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
        prompt, cached = _int(usage.get("prompt_tokens")), _int(details.get("cached_tokens"))  # type: ignore[union-attr]
        timings = self.timings or {}
        if not usage and timings:  # llama-server without include_usage still sends its timings
            cached = _int(timings.get("cache_n"))
            prompt = _int(timings.get("prompt_n")) + cached
        return Metrics(prompt_eval_count=max(0, prompt - cached), prompt_cached_count=min(cached, prompt),
                       eval_count=_int(usage.get("completion_tokens") or timings.get("predicted_n")),
                       prompt_eval_duration=int(_float(timings.get("prompt_ms")) * 1e6),
                       eval_duration=int(_float(timings.get("predicted_ms")) * 1e6))


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _float(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else 0.0
