"""Chat prompts: which template a model's prompts are rendered with, rendering it within a
budget, and history truncation.

Which template (chosen by :func:`runner.prepare.prepare`), first match wins:

1. the request's ``template`` (``/api/generate``): Go's text/template, as Ollama takes it, or
   Jinja when it has Jinja's tags or does not parse as Go (pollama took Jinja first);
2. the store model's ``TEMPLATE`` layer, a Go template: one a user set in a Modelfile, or the one
   a model pulled from Ollama's registry carries, curated for that model and what Ollama itself
   renders (Ollama prefers it over the GGUF's Jinja unless the Jinja has more capabilities);
3. the GGUF's ``tokenizer.chat_template`` (Jinja), rendered in :mod:`runner.template.sandbox`;
4. llama.cpp's built-in template for the GGUF's architecture (:mod:`runner.template.builtins`:
   gemma for gemma3, chatml for qwen2…), for chat models whose GGUF carries no template;
5. plain text (:func:`render_plain`), for base models.

The rendering must be *prefix-stable*: turn N+1's prompt starts with exactly turn N's prompt plus
the assistant's answer, so the slot cache hits. Chat templates (ChatML and friends) have that
property; the plain fallback for models without a template is built to have it too. Templates
render within a budget (every template is untrusted: a request's, a Modelfile's, a GGUF's).
"""

from __future__ import annotations

import json
import re
import threading
from typing import Any, Callable, Sequence

from . import builtins as chattemplates, ollama as ollamatemplate, sandbox
from ..api import ChatTemplate, InvalidRequest, Message, ModelInfo, Tool, ToolCall
from .sandbox import DEFAULT_LIMITS, BudgetExceeded, RenderBudget, RenderLimits, sharing

__all__ = ["DEFAULT_LIMITS", "BudgetExceeded", "ChatTemplate", "RenderBudget", "RenderLimits", "chat_prompt",
           "model_template", "render", "render_plain", "render_template", "request_template", "sharing"]


_GO_MARKER = re.compile(r"\{\{-?\s*(?:\.|\$|/\*|(?:if|range|with)\s+[.$(]|(?:end|else)\s*-?\}\}|else\s+(?:if|with)\s)")


def request_template(source: str, origin: str = "the request's template") -> ChatTemplate:
    """A template given as text: Jinja when it has Jinja's ``{%``/``{#`` tags, else Go when it
    parses as Go, else Jinja. Raises InvalidRequest (Go's error) for text with Go's actions
    (``{{ .X``, ``{{ $x``, ``{{ if .X``, ``{{ end }}``…) that does not parse."""
    if "{%" in source or "{#" in source:
        return ChatTemplate("jinja", source, origin)
    try:
        ollamatemplate.parse(source)
        return ChatTemplate("go", source, origin)
    except InvalidRequest as err:
        if _GO_MARKER.search(source):  # Go's actions, which Jinja never writes: Go's error
            raise InvalidRequest(f"invalid template: {err}") from None
        return ChatTemplate("jinja", source, origin)


def model_template(info: ModelInfo, store_template: str | None = None) -> ChatTemplate:
    """The template a model's prompts use when a request names none (rules 2-5 above);
    ``store_template``: the store model's TEMPLATE layer, when it has one."""
    if store_template:  # Go, as Ollama writes it; Jinja tags say a user put Jinja there
        jinja = "{%" in store_template or "{#" in store_template
        return ChatTemplate("jinja" if jinja else "go", store_template, "the model's TEMPLATE")
    if info.chat_template:
        return ChatTemplate("jinja", info.chat_template, "the GGUF's tokenizer.chat_template")
    builtin = chattemplates.for_architecture(info.architecture)
    if builtin is not None:
        return ChatTemplate("builtin", builtin, f"for architecture {info.architecture}")
    return ChatTemplate("plain", "", "the GGUF has no chat template")


class Arguments(dict):
    """A tool call's arguments as a Jinja template sees them: the object, keys in the order
    they came in (``tojson``, ``items()``, ``is mapping``), whose text, where a template writes
    it as one (``{{ arguments }}``, ``~``, or ``+`` with a string, as templates made for
    OpenAI's string arguments do: DeepSeek-R1's), is its JSON as ``tojson`` writes it, not
    Python's repr. So every template writes a call back the one way, whichever API sent it."""

    def __str__(self) -> str:
        return json.dumps(self, ensure_ascii=False)

    def __add__(self, other: Any) -> Any:
        return str(self) + other if isinstance(other, str) else NotImplemented

    def __radd__(self, other: Any) -> Any:
        return other + str(self) if isinstance(other, str) else NotImplemented


def _call_dict(call: ToolCall) -> dict[str, Any]:
    out = call.wire()
    out["function"]["arguments"] = Arguments(call.arguments)
    return out


def message_dict(m: Message) -> dict[str, Any]:
    """A message as HF and llama.cpp templates read it: ``tool_calls`` (with ``function.arguments``
    an :class:`Arguments` object), ``tool_call_id`` and ``name`` (a tool message's tool),
    ``reasoning_content`` (an assistant's thinking). Keys are present only when set: templates
    test ``'tool_calls' in message`` or ``message.x is defined``."""
    out: dict[str, Any] = {"role": m.role, "content": m.content}
    if m.tool_calls:
        out["tool_calls"] = [_call_dict(c) for c in m.tool_calls]
    if m.thinking:
        out["reasoning_content"] = m.thinking
    if m.tool_name:
        out["name"] = m.tool_name
    if m.tool_call_id:
        out["tool_call_id"] = m.tool_call_id
    return out


def render_template(
    source: str,
    messages: Sequence[Message],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: Sequence[Tool] = (),
    think: bool | str | None = None,
    budget: RenderBudget | None = None,
) -> str:
    """Render a Jinja chat template with the globals HF and llama.cpp templates expect, within
    ``budget`` (a fresh one of :data:`DEFAULT_LIMITS` when None): ``messages`` (see
    :func:`message_dict`), ``tools`` (``{"type": "function", "function": {...}}`` each; None when
    there are none), ``add_generation_prompt``, and for a request that sets ``think``,
    ``enable_thinking`` (and ``reasoning_effort`` for a level). Raises InvalidRequest for a
    template that fails or overruns, Cancelled when the budget's cancel event is set."""
    context: dict[str, Any] = {
        "messages": [message_dict(m) for m in messages],
        "bos_token": bos_token,
        "eos_token": eos_token,
        "add_generation_prompt": add_generation_prompt,
        "tools": [t.wire() for t in tools] or None,
    }
    if think is not None:
        context["enable_thinking"] = think is not False
        if isinstance(think, str):
            context["reasoning_effort"] = think
    input_chars = len(source) + sum(len(m.content) + len(m.thinking) for m in messages)
    input_chars += sum(len(json.dumps(c.arguments)) for m in messages for c in m.tool_calls)
    input_chars += sum(len(json.dumps(t.parameters)) + len(t.description) for t in tools)
    return sandbox.render(source, budget or RenderBudget(), input_chars, context)


def render_plain(messages: Sequence[Message]) -> str:
    """For models without a template (base models): the contents as one running text.

    An assistant message continues its prompt directly (it is what the model generated after it);
    any other message starts a new paragraph. So each turn's prompt extends the last one.
    """
    out: list[str] = []
    for message in messages:
        if out and message.role != "assistant":
            out.append("\n\n")
        out.append(message.content)
    return "".join(out)


def render(
    template: ChatTemplate | str | None,
    messages: Sequence[Message],
    *,
    bos_token: str = "",
    eos_token: str = "",
    tokenizer_adds_bos: bool = False,
    tools: Sequence[Tool] = (),
    think: bool | str | None = None,
    add_generation_prompt: bool = True,
    budget: RenderBudget | None = None,
    limits: RenderLimits = DEFAULT_LIMITS,
    cancel: threading.Event | None = None,
) -> str:
    """The prompt text for ``messages`` (``template`` as text: see :func:`request_template`).
    For a Jinja template, when the tokenizer adds BOS itself (``tokenizer_adds_bos``), a BOS the
    template wrote at the start is dropped so it is not sent twice; otherwise the template's
    text is kept whole (SmolLM2's BOS is ``<|im_start|>``, which its template writes and its
    tokenizer does not add). Go and built-in templates write no BOS: the tokenizer adds it."""
    if not messages:
        raise InvalidRequest("no messages provided")
    for message in messages:
        if message.role not in ("system", "user", "assistant", "tool"):
            raise InvalidRequest(f"invalid message role {message.role!r}")
    if isinstance(template, str):
        template = request_template(template) if template else None
    if template is None or template.kind == "plain":
        return render_plain(messages)
    if template.kind == "builtin":
        return chattemplates.apply(template.source, messages)
    budget = budget or RenderBudget(limits, cancel)
    if template.kind == "go":
        return ollamatemplate.render(template.source, messages, budget, tools=tools, think=think)
    text = render_template(template.source, messages, bos_token=bos_token, eos_token=eos_token, tools=tools,
                           think=think, add_generation_prompt=add_generation_prompt, budget=budget)
    if tokenizer_adds_bos and bos_token and text.startswith(bos_token):
        text = text[len(bos_token):]
    return text


def chat_prompt(
    messages: Sequence[Message],
    render_fn: Callable[[Sequence[Message]], str],
    tokenize: Callable[[str], list[int]],
    num_ctx: int,
    truncate: bool = True,
) -> tuple[str, list[int]]:
    """Render ``messages``, dropping the oldest non-system messages until the prompt fits; the
    text and its tokens.

    System messages and the last message are always kept (Ollama's chatPrompt). If even that
    does not fit, the shortest rendering is returned and the runner truncates tokens after
    ``num_keep`` (or refuses, when truncation is off). Each rendering is tokenized at most once,
    and the tokens of the one chosen are returned (a huge prompt costs one tokenization).
    """
    messages = list(messages)
    text = render_fn(messages)
    tokens = tokenize(text)
    if not truncate or len(tokens) <= num_ctx:
        return text, tokens
    droppable = [i for i, m in enumerate(messages[:-1]) if m.role != "system"]
    if not droppable:
        return text, tokens

    def dropping(count: int) -> tuple[str, list[int]]:
        drop = set(droppable[:count])
        candidate = render_fn([m for i, m in enumerate(messages) if i not in drop])
        return candidate, tokenize(candidate)

    best = dropping(len(droppable))
    if len(best[1]) > num_ctx:
        return best  # even the system messages and the last one do not fit
    # the fewest dropped messages that fit: binary search below dropping them all
    lo, hi = 1, len(droppable) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        candidate = dropping(mid)
        if len(candidate[1]) <= num_ctx:
            best, hi = candidate, mid - 1
        else:
            lo = mid + 1
    return best
