"""The API an upstream speaks, as one protocol: OpenAI's (:mod:`.openai_wire`) or Ollama's
(:mod:`.ollama_wire`). A dialect turns a prepared :class:`~runner.api.Request` into the upstream's
chat request and its streamed answer back into :class:`~runner.api.Chunk` values, and does the
same for embeddings and the model list. What every dialect shares is here: the conversation an
upstream is sent (:func:`conversation`), which options a request set (:func:`set_options`), and
the option rules (:data:`LOCAL_ONLY`)."""

from __future__ import annotations

from typing import Any, Protocol

from ..api import Chunk, Embedding, InvalidRequest, Message, Request, TokenLogprob

# Options that shape a local load or the local batch loop: a remote model's upstream has its own
# (its context size, batch, threads and devices are set where it runs); they are not forwarded.
LOCAL_ONLY = frozenset({"num_ctx", "num_batch", "num_thread", "num_gpu", "main_gpu", "use_mmap", "num_keep",
                        "draft_num_predict"})


class Reader(Protocol):
    """The parser of one streamed answer."""

    def read(self, line: bytes) -> list[Chunk]:
        """The chunks one line of the stream adds (none for a keep-alive or a comment; the done
        chunk when the answer ends). Raises UpstreamError for an error event or a line that is
        not the API's."""

    def end(self) -> list[Chunk]:
        """The stream closed: the done chunk when it has not come yet and the answer was
        complete; raises UpstreamError when the answer was cut off."""


class Dialect(Protocol):
    """One upstream API."""

    name: str  # "OpenAI" or "Ollama", for messages
    models_path: str  # GET: the models the upstream serves
    chat_path: str  # POST: a streamed chat
    embed_path: str  # POST: embeddings

    def model_names(self, body: Any) -> list[str]:
        """The model names in the answer to ``GET models_path``."""

    def chat_body(self, request: Request, model: str) -> dict[str, Any]:
        """The streamed chat request for ``request`` (prepared: options merged, the model's
        SYSTEM and MESSAGEs in). Raises InvalidRequest for what this API cannot carry."""

    def reader(self) -> Reader:
        """A parser for one streamed answer to :meth:`chat_body`."""

    def embed_body(self, texts: list[str | list[int]], truncate: bool, model: str) -> dict[str, Any]:
        """The embeddings request. Raises InvalidRequest for inputs this API cannot take."""

    def embedding(self, body: Any, count: int) -> Embedding:
        """The vectors of an embeddings answer for ``count`` inputs. Raises UpstreamError when
        it is not one."""


def conversation(request: Request) -> list[Message]:
    """The messages an upstream is sent: a chat's (the model's MESSAGEs already in), or a
    completion's prompt as one user turn with its images; the request's SYSTEM (the model's when
    it has none) first unless the conversation starts with a system message (Ollama's rule for
    its remote models). Refuses what only a local template can do."""
    if request.raw:
        raise InvalidRequest("raw prompts cannot be sent to a remote model: its upstream applies its own "
                             "template (send the prompt without raw)")
    if request.template:
        raise InvalidRequest("a remote model's upstream applies its own template: a request's template "
                             "cannot be sent to it")
    if request.context:
        raise InvalidRequest("context (generate's token list) cannot be sent to a remote model: send the "
                             "conversation as messages to /api/chat")
    if request.messages is not None:
        messages = list(request.messages)
    else:
        messages = [Message("user", request.prompt, images=list(request.images))]
    if request.system and not (messages and messages[0].role == "system"):
        messages.insert(0, Message("system", request.system))
    return messages


def set_options(request: Request) -> dict[str, Any]:
    """The options the request (or the model's PARAMETERs) set, by name, with their values:
    what is forwarded. Ollama's defaults for the others are not sent: the upstream has its own."""
    return {name: getattr(request.options, name) for name in sorted(request.options_set)}


def refuse_options(names: list[str], upstream: str, api: str) -> None:
    """Refuse ``names``, options an upstream cannot take (InvalidRequest, one line)."""
    if names:
        which = ", ".join(names)
        raise InvalidRequest(f"option{'s' if len(names) > 1 else ''} {which} cannot be sent to this remote model: "
                             f"its upstream speaks the {api} API, which has no such option{'s' if len(names) > 1 else ''}"
                             f"{' (' + upstream + ')' if upstream else ''}")


def image_mime(data: bytes) -> str:
    """The media type of an encoded image (PNG, JPEG or WEBP: what runner.images accepts)."""
    if data.startswith(b"\x89PNG"):
        return "image/png"
    if data.startswith(b"\xff\xd8"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "application/octet-stream"


def logprobs_from_wire(items: Any) -> list[TokenLogprob] | None:
    """``[{token, logprob, bytes, top_logprobs: [...]}]`` (OpenAI's ``logprobs.content`` and
    Ollama's ``logprobs`` share the shape) as TokenLogprob values; None when absent."""
    if not isinstance(items, list) or not items:
        return None
    out = []
    for item in items:
        if not isinstance(item, dict):
            continue
        top = [TokenLogprob(str(t.get("token", "")), float(t.get("logprob") or 0.0), _bytes(t.get("bytes")))
               for t in item.get("top_logprobs") or [] if isinstance(t, dict)]
        out.append(TokenLogprob(str(item.get("token", "")), float(item.get("logprob") or 0.0),
                                _bytes(item.get("bytes")), top))
    return out or None


def _bytes(value: Any) -> list[int]:
    return [b for b in value if isinstance(b, int)] if isinstance(value, list) else []
