"""Request -> sequence: templating, system messages, context, truncation and options.

:class:`Prompter` turns a :class:`runner.api.Request` into a :class:`Sequence` on the caller's
thread, so a bad request fails where it was made (template errors, an empty prompt, a prompt too
long with truncation off) before the batch loop sees it. A sequence carries what the loop needs
to run it (prompt tokens, ``num_keep``, sampler settings, grammar) and its
:class:`runner.loop.output.Output`, which turns sampled tokens into chunks.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from . import replies as _replies
from .. import images as _images
from ..api import ChatTemplate, Grammar, Image, InvalidRequest, Message, NoVision, PromptTooLong, Request
from ..sample.grammar import format_grammar
from ..sample.grammarcheck import GrammarCheck
from ..sample.toolgrammar import tool_call_grammar
from ..spec.controller import SeqDrafts
from ..template import prompt as _prompt
from ..template.features import features as template_features
from .engine import Engine
from .output import Output
from .slots import Input, Slot, image_end, image_start
from .text import decode_flush

log = logging.getLogger(__name__)


@dataclass(eq=False)
class Sequence:
    """One request inside the runner (Go's ``Sequence``)."""

    request: Request
    prompt: list[Input]  # the whole prompt after truncation (token ids; an image's positions)
    num_keep: int
    output: Output
    grammar: Grammar | None = None  # what the sampled tokens must follow (format, forced tool calls)
    cancelled: threading.Event = field(default_factory=threading.Event)
    # filled in by the loop
    slot: Slot | None = None
    inputs: list[Input] = field(default_factory=list)  # still to evaluate (not in any batch yet)
    sampler: Any = None
    drafts: SeqDrafts | None = None  # speculative decoding's record of the sequence (runner.spec)

    def is_cancelled(self) -> bool:
        return self.cancelled.is_set() or self.request.cancel.is_set()


class Prompter:
    """Prepares requests for one loaded model (``engine``'s vocabulary, ``num_ctx`` tokens)."""

    def __init__(self, engine: Engine, num_ctx: int, template: ChatTemplate) -> None:
        """``template``: the loaded model's, for a request that comes without its chosen one
        (``Request.chat_template``, set by :func:`runner.prepare.prepare`)."""
        self.engine = engine
        self.num_ctx = num_ctx
        self.template = template
        self.grammars = GrammarCheck()

    def close(self) -> None:
        self.grammars.close()

    def detokenize(self, tokens: list[int], field: str = "") -> str:
        """The text of ``tokens``; ``field``: the request field they came in, for the error."""
        n_vocab = self.engine.n_vocab
        if any(not isinstance(t, int) or t < 0 or t >= n_vocab for t in tokens):
            what = f"invalid {field}: token ids" if field else "invalid token ids: they"
            raise InvalidRequest(f"{what} must be in [0, {n_vocab})")
        return decode_flush(b"".join(self.engine.piece(t) for t in tokens))

    def chat_prompt(self, messages: list[Message], chosen: ChatTemplate, truncate: bool,
                    cancel: threading.Event | None, request: Request | None = None,
                    images: list[Image] | None = None) -> tuple[str, list[Input]]:
        """The prompt for ``messages`` and its inputs, rendered with ``chosen`` within one render
        budget for all the renders history truncation takes; ``request``: its tools and
        ``think`` are rendered too; ``images``: the images the messages' ``[img-N]`` tags name."""
        bos, eos = self.engine.special_tokens
        budget = _prompt.RenderBudget(cancel=cancel)
        tools = request.tools if request is not None else []
        think = request.think if request is not None else None
        add_bos = self.engine.add_bos

        def render(msgs):
            return _prompt.render(chosen, msgs, bos_token=bos, eos_token=eos, tokenizer_adds_bos=add_bos,
                                  tools=tools, think=think, budget=budget)

        return _prompt.chat_prompt(messages, render, self._tokenizer(images or []), self.num_ctx, truncate)

    def _tokenizer(self, images: list[Image]) -> Callable[[str], list[Input]]:
        """Tokenize a rendered prompt, with each ``[img-N]`` tag replaced by image N's inputs
        (the engine's, made once per image for all the renders truncation tries)."""
        if not images:
            return self.engine.tokenize
        found: dict[str, list[Input]] = {}

        def tokenize(text: str) -> list[Input]:
            out: list[Input] = []
            for piece in _images.split_prompt(text, images):
                if isinstance(piece, str):
                    out.extend(self.engine.tokenize(piece, add_special=not out))
                else:
                    if piece.digest not in found:
                        found[piece.digest] = self.engine.image_inputs(piece)
                    out.extend(found[piece.digest])
            return out

        return tokenize

    def sequence(self, request: Request) -> Sequence:
        """The sequence for ``request`` (a chat when it has ``messages``, else a completion of its
        ``prompt``), prepared by :func:`runner.prepare.prepare`. Its renders (the prompt's, history
        truncation's, the template's feature probes) share one render budget, or the caller's
        when it shares one already. At debug level (``OLLAMA_DEBUG``) the prompt's text is
        logged, one line. Raises InvalidRequest / PromptTooLong / Cancelled (rendering was
        cancelled)."""
        with _prompt.sharing(_prompt.RenderBudget(cancel=request.cancel)):
            tokens, text, template = self._prompt_of(request)
            if log.isEnabledFor(logging.DEBUG):  # Ollama's "chat request" debug line: the prompt as rendered
                log.debug("prompt: %d inputs, text %s", len(tokens), json.dumps(text, ensure_ascii=False))
            return self._sequence(tokens, text, template, request)

    def count(self, request: Request) -> int:
        """How many inputs the prompt of ``request`` is, as :meth:`sequence` would make it (the
        same renders, images and truncation; no grammar, no output); raises what it raises."""
        with _prompt.sharing(_prompt.RenderBudget(cancel=request.cancel)):
            tokens, _, _ = self._prompt_of(request)
            return len(self._truncated(tokens, request)[0])

    def _prompt_of(self, request: Request) -> tuple[list[Input], str, ChatTemplate | None]:
        """The prompt's inputs before truncation, its text, and the template it was rendered
        with (None: sent raw)."""
        chosen = request.chat_template or self.template
        chat = request.messages is not None
        if _images.has_images(request.messages, request.images) and not self.engine.info.vision:
            raise NoVision()  # prepare refuses it first; a request that skipped it must not crash
        if chat:
            messages = list(request.messages or [])
            if request.system and not any(m.role == "system" for m in messages):
                messages.insert(0, Message("system", request.system))
            messages, images = _images.tag_messages(messages)
            text, tokens = self.chat_prompt(messages, chosen, request.truncate, request.cancel, request, images)
            return tokens, text, chosen
        images = list(request.images)
        if request.raw:
            text = _images.tag_prompt(request.prompt, images) if images else request.prompt
        else:
            messages = []
            if request.system:
                messages.append(Message("system", request.system))
            messages.append(Message("user", request.prompt, images=images))
            messages, images = _images.tag_messages(messages)
            text, tokens = self.chat_prompt(messages, chosen, False, request.cancel, request, images)
            if not request.context:
                return tokens, text, chosen
        if request.context:
            text = self.detokenize(list(request.context), "context") + text
        return self._tokenizer(images)(text), text, None if request.raw else chosen

    def embed_inputs(self, texts: list[str | list[int]], truncate: bool) -> list[list[int]]:
        """The tokens of each input of an embedding request (a text's, or the token ids given,
        checked against the vocabulary), cut to ``num_ctx`` when ``truncate``."""
        inputs = []
        n_vocab = self.engine.n_vocab
        for k, text in enumerate(texts):
            if isinstance(text, str):
                tokens = self.engine.tokenize(text)
            else:
                tokens = list(text)
                if any(type(t) is not int or not 0 <= t < n_vocab for t in tokens):
                    raise InvalidRequest(f"invalid input[{k}]: token ids must be in [0, {n_vocab})")
            if not tokens:
                raise InvalidRequest("no input provided")
            if len(tokens) > self.num_ctx:
                if not truncate:
                    raise PromptTooLong(
                        f"the input length ({len(tokens)} tokens) exceeds the context length ({self.num_ctx})"
                    )
                tokens = tokens[: self.num_ctx]
            inputs.append(tokens)
        return inputs

    def _sequence(self, tokens: list[Input], text: str, template: ChatTemplate | None, request: Request) -> Sequence:
        if not tokens:
            raise InvalidRequest("no input provided")
        grammar = format_grammar(request.format, self.grammars, request.cancel)
        reply = None
        if template is not None:
            found = template_features(template)
            reply = _replies.for_request(request, found, text)
            if request.tools and found.tools is not None and request.tool_grammar:
                # forced: the whole answer is a call; auto: a call the model starts is well formed
                if request.tool_choice.forced or grammar is None:
                    grammar = tool_call_grammar(found.tools, request.tools, request.tool_choice,
                                                request.parallel_tool_calls, self.grammars, request.cancel)
        tokens, num_keep = self._truncated(tokens, request)
        num_ctx = self.num_ctx
        opts = request.options
        if opts.repeat_last_n > num_ctx:  # no penalty window reaches past the context
            request.options = opts = dataclasses.replace(opts, repeat_last_n=num_ctx)
        num_predict = opts.num_predict
        if num_predict < 0 or num_predict > 10 * num_ctx:
            num_predict = 10 * num_ctx
        stops = [s.encode("utf-8") for s in opts.stop if s]
        output = Output(stops, num_predict, reply=reply,
                        top_logprobs=request.top_logprobs if request.logprobs else None)
        return Sequence(request, tokens, num_keep, output, grammar=grammar)

    def _truncated(self, tokens: list[Input], request: Request) -> tuple[list[Input], int]:
        """The prompt cut to the context (``num_keep`` inputs kept at its start, the oldest after
        them dropped; images whole) and its ``num_keep``; PromptTooLong when it does not fit and
        truncation is off."""
        if not tokens:
            raise InvalidRequest("no input provided")
        num_ctx = self.num_ctx
        num_keep = request.options.num_keep
        if num_keep < 0:
            num_keep = len(tokens)
        num_keep = max(0, min(num_keep, num_ctx - 1))
        if len(tokens) > num_ctx:
            if not request.truncate:
                raise PromptTooLong(
                    f"the input length ({len(tokens)} tokens) exceeds the context length ({num_ctx})"
                )
            num_keep = image_start(tokens, num_keep)  # images are kept or dropped whole
            discard = image_end(tokens, num_keep + len(tokens) - num_ctx) - num_keep
            log.warning("truncating input prompt: limit %d, prompt %d, keep %d", num_ctx, len(tokens), num_keep)
            tokens = tokens[:num_keep] + tokens[num_keep + discard :]
        return tokens, num_keep

