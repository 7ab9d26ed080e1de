"""Ollama's chat API as an upstream speaks it (Ollama, pollama).

Requests: ``POST /api/chat`` (streamed NDJSON) with the options the request set under their own
names, ``format``, ``tools``, ``think`` and images (base64) as they are; a forced tool choice
has no place in this API and is refused. Answers: one JSON object a line, the last with
``done: true`` and Ollama's counts and durations, passed back as they are.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any

from ..api import Chunk, DoneReason, Embedding, InvalidRequest, Message, Metrics, Request, ToolCall, UpstreamError
from .dialect import LOCAL_ONLY, Reader, conversation, logprobs_from_wire, set_options

# load-time options an Ollama upstream takes per request (it loads the model with them)
FORWARDED_LOAD_OPTIONS = frozenset({"num_ctx", "num_batch", "num_thread", "num_gpu", "main_gpu", "use_mmap",
                                    "num_keep"})


class OllamaDialect:
    name = "Ollama"
    models_path = "/api/tags"
    chat_path = "/api/chat"
    embed_path = "/api/embed"

    def __init__(self, upstream: str = "") -> None:
        self.upstream = upstream

    def model_names(self, body: Any) -> list[str]:
        models = body.get("models") if isinstance(body, dict) else None
        if not isinstance(models, list):
            raise UpstreamError(f"upstream {self.upstream} sent a model list without models")
        return [str(m.get("model") or m.get("name")) for m in models
                if isinstance(m, dict) and isinstance(m.get("model") or m.get("name"), str)]

    def chat_body(self, request: Request, model: str) -> dict[str, Any]:
        if request.tool_choice.forced:
            raise InvalidRequest(f"tool_choice {request.tool_choice.mode!r} cannot be sent to this remote model: "
                                 f"its upstream speaks the Ollama API, which has no tool_choice ({self.upstream})")
        options = {name: value for name, value in set_options(request).items()
                   if name not in LOCAL_ONLY or name in FORWARDED_LOAD_OPTIONS}
        body: dict[str, Any] = {"model": model, "messages": [_message(m) for m in conversation(request)],
                                "stream": True}
        if options:
            body["options"] = options
        if request.format is not None:
            body["format"] = request.format
        if request.tools:
            body["tools"] = [t.wire() for t in request.tools]
        if request.think is not None:
            body["think"] = request.think
        if request.logprobs:
            body["logprobs"] = True
            if request.top_logprobs:
                body["top_logprobs"] = request.top_logprobs
        return body

    def reader(self) -> Reader:
        return _Reader(self.upstream)

    def embed_body(self, texts: list[str | list[int]], truncate: bool, model: str) -> dict[str, Any]:
        if not all(isinstance(t, str) for t in texts):
            raise InvalidRequest("token-id inputs cannot be sent to this remote model: its upstream speaks the "
                                 f"Ollama API, which embeds text only ({self.upstream})")
        return {"model": model, "input": texts, "truncate": truncate}

    def embedding(self, body: Any, count: int) -> Embedding:
        vectors = body.get("embeddings") if isinstance(body, dict) else None
        if not isinstance(vectors, list) or len(vectors) != count:
            raise UpstreamError(f"upstream {self.upstream} sent {len(vectors) if isinstance(vectors, list) else 'no'} "
                                f"embeddings for {count} inputs")
        if not all(isinstance(v, list) and all(isinstance(x, (int, float)) for x in v) for v in vectors):
            raise UpstreamError(f"upstream {self.upstream} sent an embedding that is not a list of numbers")
        return Embedding([[float(x) for x in v] for v in vectors], _int(body.get("prompt_eval_count")))


def _message(m: Message) -> dict[str, Any]:
    item: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.thinking:
        item["thinking"] = m.thinking
    if m.images:
        item["images"] = [base64.b64encode(i.data).decode() for i in m.images]
    if m.tool_calls:
        item["tool_calls"] = [{"function": {"index": c.index, "name": c.name, "arguments": c.arguments},
                               **({"id": c.id} if c.id else {})} for c in m.tool_calls]
    if m.tool_name:
        item["tool_name"] = m.tool_name
    if m.tool_call_id:
        item["tool_call_id"] = m.tool_call_id
    return item


@dataclass
class _Reader:
    upstream: str
    done: bool = False

    def read(self, line: bytes) -> list[Chunk]:
        if self.done:
            return []
        try:
            event = json.loads(line)
        except ValueError:
            raise UpstreamError(f"upstream {self.upstream} sent a line that is not JSON: "
                                f"{line[:120].decode('utf-8', 'replace')!r}") from None
        if not isinstance(event, dict):
            raise UpstreamError(f"upstream {self.upstream} sent a line that is not an object")
        if "error" in event:
            raise UpstreamError(f"upstream {self.upstream} failed: {str(event['error'])[:500]}")
        message = event.get("message") if isinstance(event.get("message"), dict) else {}
        text, thinking = message.get("content") or "", message.get("thinking") or ""
        if not isinstance(text, str) or not isinstance(thinking, str):
            raise UpstreamError(f"upstream {self.upstream} sent a message that is not text")
        calls = _calls(message.get("tool_calls"), self.upstream)
        lps = logprobs_from_wire(event.get("logprobs"))
        out = []
        if text or thinking or calls or lps:
            out.append(Chunk(text=text, thinking=thinking, tool_calls=calls or None, logprobs=lps))
        if event.get("done") is True:
            self.done = True
            reason = DoneReason.LENGTH if event.get("done_reason") == "length" else DoneReason.STOP
            out.append(Chunk(done=True, done_reason=reason, metrics=Metrics(
                prompt_eval_count=_int(event.get("prompt_eval_count")),
                prompt_eval_duration=_int(event.get("prompt_eval_duration")),
                eval_count=_int(event.get("eval_count")), eval_duration=_int(event.get("eval_duration")))))
        return out

    def end(self) -> list[Chunk]:
        if not self.done:
            raise UpstreamError(f"upstream {self.upstream} ended its stream before the answer was complete")
        return []


def _calls(raw: Any, upstream: str) -> list[ToolCall]:
    out = []
    for i, entry in enumerate(raw if isinstance(raw, list) else []):
        fn = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise UpstreamError(f"upstream {upstream} sent a tool call without a name")
        args = fn.get("arguments") or {}
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except ValueError:
                args = None
        if not isinstance(args, dict):
            raise UpstreamError(f"upstream {upstream} sent a tool call whose arguments are not an object")
        index = fn.get("index", i)
        out.append(ToolCall(fn["name"], args, index=index if isinstance(index, int) else i,
                            id=entry.get("id") if isinstance(entry.get("id"), str) else ""))
    return out


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0
