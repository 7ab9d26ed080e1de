"""The runner contract: what the CLI and the server see of an engine.

:class:`Runner` is what ``runner.load`` returns: the batch loop (``runner.loop.runner``) holding one of
the two engines (``runner.engines.llamacpp`` over llama.cpp, ``runner.engines.ggml`` over our own GGML
model code; their protocol is ``runner.loop.engine.Engine``). Everything here is plain data: requests go in, a stream of
:class:`Chunk` comes out, and errors are :class:`PollamaError` subclasses carrying a one-line
message and the HTTP status the server answers with.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Protocol

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------- errors
class PollamaError(Exception):
    """A failure a user can act on: ``str(err)`` is one line, ``status`` the HTTP status."""

    status = 500


class ModelNotFound(PollamaError):
    status = 404


class InvalidModel(PollamaError):
    """The file exists but cannot be used: not a GGUF, truncated, or an unsupported architecture."""

    status = 400


class InvalidRequest(PollamaError):
    """Bad input: an unknown option, a value of the wrong type, an empty prompt where one is needed."""

    status = 400


class PromptTooLong(InvalidRequest):
    """The prompt does not fit in the context and truncation is off."""


class NoVision(InvalidRequest):
    """An image was sent to a model without a vision projector (Ollama's message)."""

    def __init__(self, message: str = "this model is missing data required for image input") -> None:
        super().__init__(message)


class ServerBusy(PollamaError):
    status = 503


class Cancelled(PollamaError):
    """The caller cancelled the request (its client left, or the server is shutting down)."""

    status = 499


class LoadError(PollamaError):
    """The model could not be loaded (memory, backend failure)."""

    status = 500


class UpstreamError(PollamaError):
    """A remote model's upstream server failed (502) or refused the request (its own 4xx,
    passed on); the message names the upstream."""

    status = 502

    def __init__(self, message: str, status: int = 502) -> None:
        super().__init__(message)
        self.status = status


# -------------------------------------------------------------------------------------- options
class DoneReason(str, enum.Enum):
    STOP = "stop"
    LENGTH = "length"
    CONNECTION_CLOSED = "connection_closed"
    LOAD = "load"
    UNLOAD = "unload"


@dataclass
class Options:
    """Ollama's options with Ollama's defaults (reference §5.3; ``repeat_penalty`` is HEAD's 1.0:
    Ollama dropped PRE's 1.1 in 6a261db7d, as llama.cpp had in 2024, because a penalty no model
    maker recommends also makes the target reject guesses its own text would confirm).

    ``num_ctx`` 0 means "the configured default" (``OLLAMA_CONTEXT_LENGTH``, else 4096), clamped to
    the model's trained context at load.
    """

    # predict options
    num_keep: int = 4
    seed: int = -1
    num_predict: int = -1
    top_k: int = 40
    top_p: float = 0.9
    min_p: float = 0.0
    typical_p: float = 1.0
    repeat_last_n: int = 64
    temperature: float = 0.8
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: list[str] = field(default_factory=list)
    # speculative decoding (runner.spec): the most tokens drafted per step, 0 = off (the runner
    # drafts fewer, or none, where its acceptance and the cost of a step say so; at most 62, the
    # default (runner.spec.controller.MAX_DRAFT): a verbatim copy pays deepest). On by default:
    # bench/bench_spec.py measured 2.5-3.1x on gemma-3-270m and 1.4-1.9x on SmolLM2 rewriting
    # code and quoting, 3.3-4.6x asked again (bench/README.md)
    draft_num_predict: int = 62
    # a draft model (runner.loop.draftmodel): a store name or a .gguf path of a smaller model with
    # the same vocabulary, loaded beside the model ("" : the Modelfile's DRAFT, if any; load-time)
    draft: str = ""
    # runner (load-time) options
    num_ctx: int = 0
    num_batch: int = 512
    num_thread: int = 0
    num_gpu: int = -1
    main_gpu: int = 0
    use_mmap: bool | None = None

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def merged(self, values: Mapping[str, Any] | None) -> "Options":
        """A copy with ``values`` applied, as Ollama applies a request's ``options``: a ``null``
        value leaves the option as it is; a name that is not an option (a typo, or one Ollama
        dropped such as ``mirostat`` or ``tfs_z``) is logged once and ignored. A value of the
        wrong type raises InvalidRequest."""
        out = dataclasses.replace(self, stop=list(self.stop))
        for name, raw in (values or {}).items():
            if raw is None:
                continue
            if name not in _FIELD_TYPES:
                _warn_unknown_option(str(name))
                continue
            setattr(out, name, coerce_option(name, raw))
        return out


_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(Options)}


@functools.lru_cache(maxsize=256)  # bounded: option names come from the network
def _warn_unknown_option(name: str) -> None:
    log.warning("ignoring option %r: not an option pollama knows (it may be one Ollama dropped)", name[:64])


def coerce_option(name: str, raw: Any) -> Any:
    """Convert ``raw`` (JSON value or CLI string) to the type of option ``name``."""
    kind = _FIELD_TYPES.get(name)
    if kind is None:
        raise InvalidRequest(f"invalid option provided: {name!r}")
    try:
        if kind == "list[str]":
            if raw is None:
                return []
            if isinstance(raw, str):
                return [raw]
            if isinstance(raw, (list, tuple)) and all(isinstance(s, str) for s in raw):
                return list(raw)
            raise ValueError
        if kind == "str":
            if isinstance(raw, str):
                return raw
            raise ValueError
        if kind == "bool | None":
            if raw is None or isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.lower() in ("true", "1", "false", "0"):
                return raw.lower() in ("true", "1")
            raise ValueError
        if isinstance(raw, bool) or raw is None or isinstance(raw, (list, dict)):
            raise ValueError
        if kind == "int":
            value = float(raw)
            if value != int(value):
                raise ValueError
            return int(value)
        if kind == "float":
            value = float(raw)
            if value != value:  # NaN
                raise ValueError
            return value
    except (TypeError, ValueError, OverflowError):
        pass
    raise InvalidRequest(f"invalid value for option {name!r}: {raw!r}")


# ------------------------------------------------------------------------------------- requests
@dataclass
class ToolCall:
    """A call of one of the request's tools, as the model wrote it (or as a client sends it back
    in an assistant message). ``index`` is its place among the calls of one answer."""

    name: str
    arguments: dict[str, Any]
    index: int = 0
    id: str = ""  # OpenAI's call id ("call_..."); empty when the client gave none

    def wire(self) -> dict[str, Any]:
        """The HF/OpenAI shape chat templates expect: ``{"id", "type": "function", "function":
        {"name", "arguments"}}`` with ``arguments`` a dict."""
        out: dict[str, Any] = {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        if self.id:
            out["id"] = self.id
        return out


@dataclass
class Tool:
    """A function the model may call: its name, what it does, and a JSON schema of its arguments."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def wire(self) -> dict[str, Any]:
        """The ``{"type": "function", "function": {...}}`` form templates render."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolChoice:
    """Whether the answer must be a tool call (OpenAI's ``tool_choice``).

    ``auto``: the model decides; ``none``: no tools are offered; ``required``: the answer is a
    call of one of the tools; ``function``: a call of the tool named ``name``. The last two are
    enforced with a grammar (:mod:`runner.sample.toolgrammar`)."""

    mode: str = "auto"
    name: str = ""

    @property
    def forced(self) -> bool:
        return self.mode in ("required", "function")


@dataclass(frozen=True)
class Image:
    """An image input: its encoded bytes (PNG, JPEG or WEBP, checked by
    :func:`runner.images.image_from_bytes`) and its identity, the sha256 of those bytes, which is
    what the slot cache compares (the same picture sent again is the same input)."""

    data: bytes = field(repr=False)
    digest: str  # hex sha256 of ``data``
    width: int = 0
    height: int = 0


@dataclass
class Message:
    role: str
    content: str
    thinking: str = ""  # an assistant's reasoning (rendered as ``reasoning_content``)
    tool_calls: list[ToolCall] = field(default_factory=list)  # an assistant's calls
    tool_name: str = ""  # a tool message: the tool whose result this is
    tool_call_id: str = ""  # a tool message: the call it answers (OpenAI's id)
    images: list[Image] = field(default_factory=list)  # attached to this message, in order


@dataclass(frozen=True)
class Grammar:
    """A GBNF grammar the sampled tokens must follow (rule ``root``). With a ``trigger`` (a
    regular expression over the output so far, llama.cpp's lazy grammar) it only starts to
    constrain once the output matches the trigger, from the trigger's first group onwards. With
    a ``tag`` it starts where that text first appears in the output, from the tag on
    (:mod:`runner.sample.lazygrammar`); the grammar must accept the tag followed by up to two
    spaces or newlines."""

    gbnf: str
    trigger: str | None = None
    tag: str | None = None


@dataclass(frozen=True)
class ChatTemplate:
    """The template prompts are rendered with, and where it came from."""

    kind: str  # "go", "jinja", "builtin" (llama.cpp's, by name), "plain" or "remote" (the upstream's own)
    source: str  # the Go or Jinja text, or the built-in's name ("" for plain)
    origin: str  # where it came from, for people

    def describe(self) -> str:
        """One line: what kind, from where."""
        what = {"go": "Go template", "jinja": "Jinja template", "plain": "no template: plain text",
                "builtin": f'llama.cpp built-in template "{self.source}"',
                "remote": "the upstream's own template"}[self.kind]
        return f"{what} ({self.origin})"

    def show(self) -> str:
        """The text ``/show template`` and ``pollama show --template`` print: the template's
        own text, or for a built-in or plain text, what is used instead."""
        if self.kind in ("go", "jinja"):
            return self.source
        if self.kind == "builtin":
            return f"{self.describe()}: the GGUF has no chat template"
        if self.kind == "remote":
            return f"No template here: this is a remote model, and {self.origin} applies its own."
        return "No prompt template was specified for this model (plain text)."


@dataclass
class Request:
    """One generation: a chat when ``messages`` is set, else a completion of ``prompt``.

    ``cancel`` may be set from any thread: the sequence stops at the next batch and frees its slot.
    """

    prompt: str = ""
    messages: list[Message] | None = None
    images: list[Image] = field(default_factory=list)  # generate's images (chat: each message's own)
    system: str | None = None
    template: str | None = None  # the request's own template text (Go, as Ollama takes it, or Jinja)
    raw: bool = False  # prompt is sent as is, no template
    # the template prompts are rendered with, chosen by runner.prepare.prepare from ``template`` and
    # the model the caller named (a server shares one runner among store models with one GGUF and
    # different TEMPLATEs). None: the loaded model's own.
    chat_template: ChatTemplate | None = None
    context: list[int] | None = None  # /api/generate's deprecated token context, prepended
    format: str | dict | None = None  # "json" or a JSON schema
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    parallel_tool_calls: bool | None = None  # a forced call: several calls allowed only when True
    tool_grammar: bool = True  # False: calls are only parsed, as Ollama does (to measure the grammar)
    # the model's reasoning: None (the model's default: on for models that think), True/False,
    # or an effort "high"|"medium"|"low"
    think: bool | str | None = None
    # True: ``think`` is a wish, not a demand: for a model without reasoning it is dropped (the
    # model's default) instead of refused. Anthropic's /v1/messages, as Ollama's: Claude-Code-style
    # clients ask every model to think. False (/api/chat, /api/generate, OpenAI's): a 400.
    relax_think: bool = False
    options: Options = field(default_factory=Options)
    # the option names the caller or the model's PARAMETERs set (runner.prepare.prepare fills it);
    # the others hold Ollama's defaults. A remote model forwards only these (runner.remote).
    options_set: frozenset[str] = frozenset()
    truncate: bool = True
    shift: bool = True
    logprobs: bool = False
    top_logprobs: int = 0
    cache_prompt: bool = True  # False: evaluate the whole prompt, reusing nothing from the slot
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class TokenLogprob:
    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list["TokenLogprob"] = field(default_factory=list)


@dataclass
class Metrics:
    """Counts and durations of one request. Durations are nanoseconds (Ollama's wire format).

    ``prompt_eval_count`` counts the prompt tokens *evaluated* by this request; the tokens reused
    from the slot cache or restored from the prompt store are ``prompt_cached_count`` (their sum is
    the prompt length), and ``prompt_cache_source`` says from where: ``"slot"``, ``"ram"`` or
    ``"disk"`` ("" when none were).

    Each field has one owner: the runner fills the counts and the eval durations; the caller (the
    CLI, the server) fills ``load_duration`` (the load this request waited for, if any) and
    ``total_duration`` (from when the request began, its load included, as Ollama reports it).
    """

    prompt_eval_count: int = 0
    prompt_cached_count: int = 0
    prompt_cache_source: str = ""
    prompt_eval_duration: int = 0
    eval_count: int = 0
    eval_duration: int = 0
    load_duration: int = 0
    total_duration: int = 0
    draft_n: int = 0  # tokens drafted (speculative decoding) and verified
    draft_n_accepted: int = 0  # of which the model agreed with (each saved a decode step)

    @property
    def prompt_tokens(self) -> int:
        """The whole prompt, cached and evaluated: what the APIs report as the prompt's size
        (Ollama's ``prompt_eval_count``, OpenAI's ``prompt_tokens``)."""
        return self.prompt_eval_count + self.prompt_cached_count


@dataclass
class Chunk:
    """A piece of streamed output; the last one has ``done`` set, a ``done_reason`` and metrics.

    ``metrics``: the last chunk's are the request's, complete. The first chunk a sequence delivers
    (it has its slot by then) carries the prompt's counts as well, ``prompt_eval_count`` and
    ``prompt_cached_count`` with everything else 0, so an API can say how big the prompt is before
    the answer ends (Anthropic's ``message_start``); other chunks that are not done have None.
    Whoever reports totals reads the done chunk's.

    ``stop``: on the last chunk, the stop sequence (one of ``Options.stop``, the request's or the
    model's PARAMETERs) whose appearance ended the output (``done_reason`` STOP; the text is cut
    before it); None when anything else ended it (an end-of-generation token, a length, a cancel).
    """

    text: str = ""
    thinking: str = ""  # reasoning, separated from the answer when the request thinks
    tool_calls: list[ToolCall] | None = None  # calls completed in this piece of output
    done: bool = False
    done_reason: DoneReason | None = None
    metrics: Metrics | None = None
    logprobs: list[TokenLogprob] | None = None
    context: list[int] | None = None  # generate only: prompt + response tokens
    stop: str | None = None  # the last chunk: the stop sequence that ended the output, if one did


@dataclass
class Embedding:
    vectors: list[list[float]]
    prompt_eval_count: int


@dataclass
class ModelInfo:
    """What is known about a loaded model without running it."""

    name: str  # how the user named it (e.g. "smollm2:135m" or a path)
    path: str
    architecture: str
    size: int  # bytes on disk
    context_length: int  # trained context
    embedding_length: int
    parameter_count: int
    quantization: str
    chat_template: str | None  # the GGUF's tokenizer.chat_template (Jinja)
    metadata: dict[str, Any]
    projector: str | None = None  # the vision projector GGUF (store ``projector`` layer or --mmproj)
    draft: str | None = None  # the draft model GGUF (the store entry's ``draft`` layer: Modelfile DRAFT)

    @property
    def vision(self) -> bool:
        """Whether the model takes images: it has a projector."""
        return self.projector is not None


@dataclass(frozen=True)
class Offload:
    """Where a loaded model runs, as ``/api/ps``, ``pollama ps`` and ``--verbose`` report it
    (``runner.loading.gpu`` decides it)."""

    devices: str = "CPU"  # "CPU", "CUDA0 (NVIDIA H200) 31/31 layers", "... 20/31 layers, CPU 11/31 layers"
    vram: int = 0  # bytes estimated on the GPUs: offloaded weights, their KV cache, compute buffers
    full: bool = False  # every layer offloaded

    def size_vram(self, size: int) -> int:
        """``/api/ps``'s ``size_vram`` for a model taking ``size`` bytes in all: all of it when
        every layer is offloaded (what the host keeps then is the token embedding's row lookup,
        which llama.cpp leaves there by design: counting it, no model would read "100% GPU"),
        else the estimate, at most ``size``."""
        if self.vram <= 0:
            return 0
        return size if self.full else min(self.vram, size)


class Runner(Protocol):
    """A loaded model and the background thread that decodes its sequences."""

    engine: str  # "old" (llama.cpp) or "new" (our GGML model code)
    info: ModelInfo
    num_ctx: int  # per-sequence context
    num_parallel: int  # slots
    num_batch: int
    n_vocab: int
    memory_size: int  # bytes held besides the weights: KV cache and compute buffers
    offload: Offload  # where its layers run (the CPU, or GPUs)

    def stream(self, request: Request) -> Iterator[Chunk]:
        """Stream the answer to ``request`` (prepared by ``runner.prepare.prepare``): a chat when
        it has ``messages`` (rendered with its chat template), else a completion of its
        ``prompt`` (templated unless ``raw``). Errors in the request raise here."""

    def submit(self, request: Request, deliver: Callable[[Chunk | PollamaError], None]) -> None:
        """Push form of ``stream`` (for an event loop): errors in the request raise here; then
        the runner's thread calls ``deliver`` with each chunk, ending with a done chunk or an
        error. ``deliver`` must return at once."""

    def count(self, request: Request) -> int:
        """How many tokens (images' positions included) the prompt of ``request`` (prepared as for
        ``stream``) is: what its metrics' ``prompt_tokens`` would be, the same renders, images and
        truncation, without sampling or grammar. Raises what ``stream`` raises for the prompt
        (InvalidRequest, PromptTooLong, Cancelled)."""

    def embed(self, texts: list[str | list[int]], truncate: bool = True,
              cancel: threading.Event | None = None) -> Embedding:
        """Mean-pooled, L2-normalised embeddings of each input: a text (tokenized as a prompt
        is), or a list of token ids embedded as given (OpenAI's token-array input; an empty
        list or an id outside ``[0, n_vocab)`` is :class:`InvalidRequest`). Inputs longer
        than ``num_ctx`` are cut to it when ``truncate``, else :class:`PromptTooLong`. Setting
        ``cancel`` (from any thread) stops the work at the next batch: the call raises
        :class:`Cancelled` and the inputs not yet evaluated never are."""

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        ...

    def detokenize(self, tokens: list[int]) -> str:
        ...

    def close(self) -> None:
        """Stop the batch loop and free the model. Streams still open end with an error."""
