"""Chat prompts: the GGUF's ``tokenizer.chat_template`` rendered with jinja2, and history truncation.

The rendering must be *prefix-stable*: turn N+1's prompt starts with exactly turn N's prompt plus
the assistant's answer, so the slot cache hits. Chat templates (ChatML and friends) have that
property; the plain fallback for models without a template is built to have it too. Templates
render in :mod:`runner.sandbox`, within a budget (both a request's template and a GGUF's are
untrusted).
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

from . import sandbox
from .api import InvalidRequest, Message
from .sandbox import DEFAULT_LIMITS, RenderBudget, RenderLimits

__all__ = ["DEFAULT_LIMITS", "RenderBudget", "RenderLimits", "chat_prompt", "render", "render_plain",
           "render_template"]


def render_template(
    source: str,
    messages: Sequence[Message],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    budget: RenderBudget | None = None,
) -> str:
    """Render a Jinja chat template with the globals HF and llama.cpp templates expect, within
    ``budget`` (a fresh one of :data:`DEFAULT_LIMITS` when None). Raises InvalidRequest for a
    template that fails or overruns, Cancelled when the budget's cancel event is set."""
    context = {
        "messages": [{"role": m.role, "content": m.content} for m in messages],
        "bos_token": bos_token,
        "eos_token": eos_token,
        "add_generation_prompt": add_generation_prompt,
        "tools": None,
    }
    input_chars = len(source) + sum(len(m.content) for m in messages)
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
    template: str | None,
    messages: Sequence[Message],
    *,
    bos_token: str = "",
    eos_token: str = "",
    tokenizer_adds_bos: bool = False,
    budget: RenderBudget | None = None,
    limits: RenderLimits = DEFAULT_LIMITS,
    cancel: threading.Event | None = None,
) -> str:
    """The prompt text for ``messages``. When the tokenizer adds BOS itself
    (``tokenizer_adds_bos``), a BOS the template wrote at the start is dropped so it is not sent
    twice; otherwise the template's text is kept whole (SmolLM2's BOS is ``<|im_start|>``, which
    its template writes and its tokenizer does not add)."""
    if not messages:
        raise InvalidRequest("no messages provided")
    for message in messages:
        if message.role not in ("system", "user", "assistant", "tool"):
            raise InvalidRequest(f"invalid message role {message.role!r}")
    if template:
        budget = budget or RenderBudget(limits, cancel)
        text = render_template(template, messages, bos_token=bos_token, eos_token=eos_token, budget=budget)
        if tokenizer_adds_bos and bos_token and text.startswith(bos_token):
            text = text[len(bos_token):]
        return text
    return render_plain(messages)


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
