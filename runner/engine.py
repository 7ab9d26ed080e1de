"""What both engines share: sequences, the batch loop thread, and per-token post-processing.

An engine subclasses :class:`BatchRunner` and supplies the primitives that differ — tokenize,
token pieces, adding tokens to a batch, decoding it, sampling — and its :class:`KvOps`. This
module owns the Go runner's loop (reference §1.5, §1.6, §2.9): slots are claimed for waiting
sequences, each batch takes inputs from every live sequence (round robin), a full slot is shifted,
and each sampled token goes through EOS / stop / UTF-8 / num_predict handling before it is
streamed. An ``embed`` call is one entry too (:class:`runner.embedding.EmbedJob`): token batches
and its embedding batches take turns.

Threading: only the loop thread touches sequences, slots and the KV memory. Callers only append
to the waiting queue (under ``_lock``) and receive their sequence's output: from a queue they
iterate (:meth:`BatchRunner.generate`, :meth:`BatchRunner.chat`), or pushed to a callback by the
loop thread itself (:meth:`BatchRunner.submit`, for an event loop that should not spend a thread
per stream). Cancelling sets an Event the loop checks before each batch.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np

from . import embedding as _embedding
from . import images as _images
from . import prompt as _prompt
from . import reply as _reply
from .api import (
    Cancelled,
    ChatTemplate,
    Chunk,
    DoneReason,
    Embedding,
    Grammar,
    Image,
    InvalidRequest,
    LoadError,
    Message,
    Metrics,
    ModelInfo,
    NoVision,
    PollamaError,
    PromptTooLong,
    Request,
    TokenLogprob,
)
from .embedding import EmbedJob, EmbedLanes
from .inputcache import ImageInput, Input, InputCache, ReprocessInputs, Slot, image_end, image_start, text_tokens
from .sample.grammar import format_grammar
from .sample.toolgrammar import tool_call_grammar
from .templatefeatures import features as template_features
from .text import (
    contains_stop_suffix,
    decode_flush,
    find_stop,
    incomplete_utf8,
    token_logprobs,
    truncate_stop,
)

log = logging.getLogger(__name__)

_now = time.perf_counter_ns


@dataclass(eq=False)
class Sequence:
    """One request inside the runner (Go's ``Sequence``)."""

    request: Request
    prompt: list[Input]  # the whole prompt after truncation (token ids; an image's positions)
    num_keep: int
    num_predict: int
    stops: list[bytes]
    grammar: Grammar | None = None  # what the sampled tokens must follow (format, forced tool calls)
    reply: _reply.ReplyParser | None = None  # splits the output into thinking, content, tool calls
    t_request: int = field(default_factory=_now)
    out: Any = field(default_factory=queue.SimpleQueue)  # anything with put(item); see submit()
    cancelled: threading.Event = field(default_factory=threading.Event)
    # filled in by the loop
    slot: Slot | None = None
    inputs: list[Input] = field(default_factory=list)  # still to evaluate
    pending_inputs: list[Input] = field(default_factory=list)  # in the batch being decoded
    pending_pieces: list[bytes] = field(default_factory=list)  # held back (stop prefix, UTF-8)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    num_predicted: int = 0
    cached: int = 0
    evaluated: int = 0
    batch_index: int = -1  # row of the last input in the current batch (its logits)
    sampler: Any = None
    t_start: int = 0
    t_first: int = 0
    t_last: int = 0

    def is_cancelled(self) -> bool:
        return self.cancelled.is_set() or self.request.cancel.is_set()


class _Push:
    """A sequence's output that hands each item to a callback instead of queuing it."""

    __slots__ = ("put",)

    def __init__(self, deliver: Callable[[Any], None]) -> None:
        self.put = deliver


class BatchRunner:
    """A loaded model plus its batch loop. Subclasses implement the ``_engine_*`` hooks."""

    engine = "?"
    per_sequence_batch = True  # llamarunner caps each sequence at num_batch; ollamarunner the total
    # Add sequences to a batch in slot order rather than round robin (fair only when each
    # sequence has its own cap, per_sequence_batch).
    batch_in_slot_order = False

    def __init__(self, info: ModelInfo, num_ctx: int, num_parallel: int, num_batch: int, multi_user: bool):
        self.info = info
        self.num_ctx = num_ctx
        self.num_parallel = num_parallel
        self.num_batch = num_batch
        self.multi_user = multi_user
        self.load_duration = 0  # ns, set by load()
        self.memory_size = 0  # bytes besides the weights (KV cache, compute buffers), set by load()
        self.cache: InputCache  # set by the subclass once its KV memory exists
        self._lock = threading.Condition()
        self._waiting: collections.deque[Sequence | EmbedJob] = collections.deque()
        self._seqs: list[Sequence | EmbedJob | None] = [None] * num_parallel
        self._next_seq = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"runner:{info.name}", daemon=True)

    # ----------------------------------------------------------------------- engine hooks
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        raise NotImplementedError

    def piece(self, token: int) -> bytes:
        """The bytes ``token`` renders as in output (control tokens render as nothing)."""
        raise NotImplementedError

    def is_eog(self, token: int) -> bool:
        raise NotImplementedError

    @property
    def add_bos(self) -> bool:
        raise NotImplementedError

    @property
    def special_tokens(self) -> tuple[str, str]:
        """(bos, eos) token texts, for chat templates."""
        raise NotImplementedError

    def _engine_batch_begin(self) -> None:
        raise NotImplementedError

    def _engine_batch_add(self, tokens: list[int], pos: int, seq_id: int) -> int:
        """Append ``tokens`` at positions pos.. of ``seq_id``; the last one produces logits.
        Returns the batch row of the first token."""
        raise NotImplementedError

    def _engine_decode(self) -> None:
        raise NotImplementedError

    def _engine_image_inputs(self, image: Image) -> list[Input]:
        """The inputs ``image`` fills in a prompt (its wrapping tokens and one ImageInput per
        position). Raises NoVision for a model without a projector."""
        raise NoVision()

    def _engine_decode_image(self, image: ImageInput, pos: int, seq_id: int) -> None:
        """Decode the whole image that starts with ``image`` at positions pos.. of ``seq_id``, at
        once (the batch holds nothing yet; the loop adds its tokens after)."""
        raise NoVision()

    def _engine_embed_lanes(self) -> EmbedLanes:
        """Where embedding inputs are evaluated (made on first use, on the loop thread)."""
        raise NotImplementedError

    def _engine_new_sampler(self, seq: Sequence) -> Any:
        raise NotImplementedError

    def _engine_free_sampler(self, sampler: Any) -> None:
        pass

    def _engine_sample(self, seq: Sequence) -> int:
        raise NotImplementedError

    def _engine_logits(self, seq: Sequence) -> np.ndarray:
        raise NotImplementedError

    def _engine_close(self) -> None:
        pass

    # ------------------------------------------------------------------------- public API
    def start(self) -> None:
        self._thread.start()

    def detokenize(self, tokens: list[int]) -> str:
        self._check_open()
        if any(not isinstance(t, int) or t < 0 or t >= self.n_vocab for t in tokens):
            raise InvalidRequest(f"invalid token ids: they must be in [0, {self.n_vocab})")
        return decode_flush(b"".join(self.piece(t) for t in tokens))

    def _check_open(self) -> None:
        if self._closed:
            raise LoadError("the model was unloaded")

    def render_chat(self, messages: list[Message], template: str | None = None, truncate: bool = True,
                    cancel: threading.Event | None = None) -> str:
        """The prompt for ``messages``: the model's template (or ``template``) within one render
        budget for all the renders history truncation takes; ``cancel`` stops it."""
        return self._chat_prompt(messages, template, truncate, cancel)[0]

    def _chat_prompt(self, messages: list[Message], template: str | ChatTemplate | None, truncate: bool,
                     cancel: threading.Event | None, request: Request | None = None,
                     images: list[Image] | None = None) -> tuple[str, list[Input]]:
        """:meth:`render_chat`'s text and its tokens (``template``: a chosen one, or text;
        ``request``: its tools and ``think`` are rendered too; ``images``: the images the
        messages' ``[img-N]`` tags name)."""
        bos, eos = self.special_tokens
        chosen = self._template(template)
        budget = _prompt.RenderBudget(cancel=cancel)
        tools = request.tools if request is not None and request.tool_choice.mode != "none" else []
        think = request.think if request is not None else None

        def render(msgs):
            return _prompt.render(chosen, msgs, bos_token=bos, eos_token=eos, tokenizer_adds_bos=self.add_bos,
                                  tools=tools, think=think, budget=budget)

        return _prompt.chat_prompt(messages, render, self._prompt_tokenizer(images or []), self.num_ctx, truncate)

    def _prompt_tokenizer(self, images: list[Image]) -> Callable[[str], list[Input]]:
        """Tokenize a rendered prompt, with each ``[img-N]`` tag replaced by image N's inputs."""
        if not images:
            return self.tokenize
        found: dict[str, list[Input]] = {}  # per image, once for all the renders truncation tries

        def tokenize(text: str) -> list[Input]:
            out: list[Input] = []
            for piece in _images.split_prompt(text, images):
                if isinstance(piece, str):
                    out.extend(self.tokenize(piece, add_special=not out))
                else:
                    if piece.digest not in found:
                        found[piece.digest] = self._engine_image_inputs(piece)
                    out.extend(found[piece.digest])
            return out

        return tokenize

    def _template(self, template: str | ChatTemplate | None) -> ChatTemplate:
        return template if isinstance(template, ChatTemplate) else _prompt.select(template, self.info)

    def generate(self, request: Request) -> Iterator[Chunk]:
        """Validate and tokenize now (errors raise here); the returned iterator streams."""
        return self._stream(self._prepare(request, chat=False))

    def chat(self, request: Request) -> Iterator[Chunk]:
        return self._stream(self._prepare(request, chat=True))

    def submit(self, request: Request, chat: bool, deliver: Callable[[Any], None]) -> None:
        """Push form of :meth:`generate` / :meth:`chat`.

        Validation errors raise here. Afterwards the loop thread calls ``deliver`` with each
        :class:`Chunk`; the last call is a done chunk or a :class:`PollamaError` (also when the
        request is cancelled before it got a slot, or the runner closes). ``deliver`` runs on the
        loop thread, between batches: it must return at once and must not raise.
        """
        seq = self._prepare(request, chat)
        seq.out = _Push(deliver)
        self._enqueue(seq)

    def _prepare(self, request: Request, chat: bool) -> Sequence:
        self._check_open()
        t0 = _now()
        chosen = self._template(request.chat_template or request.template)
        if _images.has_images(request.messages if chat else None, () if chat else request.images) \
                and not self.info.vision:
            raise NoVision()
        if chat:
            messages = list(request.messages or [])
            if request.system and not any(m.role == "system" for m in messages):
                messages.insert(0, Message("system", request.system))
            messages, images = _images.tag_messages(messages)
            text, tokens = self._chat_prompt(messages, chosen, request.truncate, request.cancel, request, images)
            return self._new_sequence(tokens, request, t0, text, chosen)
        images = list(request.images)
        if request.raw:
            text = _images.tag_prompt(request.prompt, images) if images else request.prompt
        else:
            messages = []
            if request.system:
                messages.append(Message("system", request.system))
            messages.append(Message("user", request.prompt, images=images))
            messages, images = _images.tag_messages(messages)
            text, tokens = self._chat_prompt(messages, chosen, False, request.cancel, request, images)
            if not request.context:
                return self._new_sequence(tokens, request, t0, text, chosen)
        if request.context:
            text = self.detokenize(list(request.context)) + text
        return self._new_sequence(self._prompt_tokenizer(images)(text), request, t0, text,
                                  None if request.raw else chosen)

    def embed(self, texts: list[str], truncate: bool = True, cancel: threading.Event | None = None) -> Embedding:
        """All of ``texts`` go to the loop as one job, evaluated several per decode."""
        self._check_open()
        inputs = []
        for text in texts:
            tokens = self.tokenize(text)
            if not tokens:
                raise InvalidRequest("no input provided")
            if len(tokens) > self.num_ctx:
                if not truncate:
                    raise PromptTooLong(
                        f"the input length ({len(tokens)} tokens) exceeds the context length ({self.num_ctx})"
                    )
                tokens = tokens[: self.num_ctx]
            inputs.append(tokens)
        if not inputs:
            return Embedding([], 0)
        job = EmbedJob(inputs, cancel if cancel is not None else threading.Event())
        self._enqueue(job)
        try:
            result = job.out.get()
        finally:
            job.abandoned.set()  # a caller interrupted while it waits ends the job at the next batch
        if isinstance(result, BaseException):
            raise result
        return Embedding([vector.tolist() for vector in result], sum(len(t) for t in inputs))

    def pending(self) -> int:
        """Sequences waiting for a slot plus sequences running."""
        with self._lock:
            return len(self._waiting) + sum(s is not None for s in self._seqs)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._lock.notify_all()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()
        err = LoadError("the model was unloaded")
        for seq in list(self._waiting) + [s for s in self._seqs if s is not None]:
            seq.out.put(err)
        self._waiting.clear()
        self._seqs = [None] * self.num_parallel
        self._engine_close()

    # ------------------------------------------------------------------------ sequences
    def _new_sequence(self, tokens: list[Input], request: Request, t0: int, text: str = "",
                      template: ChatTemplate | None = None) -> Sequence:
        if not tokens:
            raise InvalidRequest("no input provided")
        grammar = format_grammar(request.format)
        reply = None
        if template is not None:
            found = template_features(template)
            reply = _reply.for_request(request, found, text)
            if request.tools and found.tools is not None and request.tool_choice.mode != "none" \
                    and request.tool_grammar:
                # forced: the whole answer is a call; auto: a call the model starts is well formed
                if request.tool_choice.forced or grammar is None:
                    grammar = tool_call_grammar(found.tools, request.tools, request.tool_choice,
                                                request.parallel_tool_calls)
        opts = request.options
        num_keep = opts.num_keep
        if num_keep < 0:
            num_keep = len(tokens)
        num_keep = max(0, min(num_keep, self.num_ctx - 1))
        if len(tokens) > self.num_ctx:
            if not request.truncate:
                raise PromptTooLong(
                    f"the input length ({len(tokens)} tokens) exceeds the context length ({self.num_ctx})"
                )
            num_keep = image_start(tokens, num_keep)  # images are kept or dropped whole
            discard = image_end(tokens, num_keep + len(tokens) - self.num_ctx) - num_keep
            log.warning("truncating input prompt: limit %d, prompt %d, keep %d", self.num_ctx, len(tokens), num_keep)
            tokens = tokens[:num_keep] + tokens[num_keep + discard :]
        num_predict = opts.num_predict
        if num_predict < 0 or num_predict > 10 * self.num_ctx:
            num_predict = 10 * self.num_ctx
        stops = [s.encode("utf-8") for s in opts.stop if s]
        return Sequence(request, tokens, num_keep, num_predict, stops, grammar=grammar, reply=reply, t_request=t0)

    def _enqueue(self, seq: Sequence | EmbedJob) -> None:
        with self._lock:
            if self._closed:
                raise LoadError("the model was unloaded")
            self._waiting.append(seq)
            self._lock.notify_all()

    def _stream(self, seq: Sequence) -> Iterator[Any]:
        self._enqueue(seq)
        try:
            while True:
                item = seq.out.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.done:
                    return
        finally:
            seq.cancelled.set()
            with self._lock:
                if seq in self._waiting:
                    self._waiting.remove(seq)

    # ------------------------------------------------------------------------- the loop
    def _run(self) -> None:
        while True:
            with self._lock:
                self._admit()
                while not self._closed and not any(self._seqs):
                    self._lock.wait()
                    self._admit()
                if self._closed:
                    return
            try:
                self._process_batch()
            except Exception as err:  # a decode failure must not kill the loop or leak slots
                log.exception("batch failed")
                failure = err if isinstance(err, PollamaError) else LoadError(f"model runner error: {err}")
                for i, seq in enumerate(self._seqs):
                    if isinstance(seq, EmbedJob):
                        self._end_embedding(i, seq, failure)
                    elif seq is not None:
                        seq.out.put(failure)
                        self._release(i, seq)

    def _admit(self) -> None:
        """Give free sequence entries to waiting sequences, in arrival order (lock held).

        A waiting sequence whose request was cancelled leaves the queue at once, with a last
        chunk, so its stream ends now rather than when a slot frees up.
        """
        if any(seq.is_cancelled() for seq in self._waiting):
            for seq in [seq for seq in self._waiting if seq.is_cancelled()]:
                self._waiting.remove(seq)
                if isinstance(seq, EmbedJob):
                    seq.out.put(Cancelled("the embedding request was cancelled"))
                    continue
                seq.out.put(Chunk(done=True, done_reason=DoneReason.CONNECTION_CLOSED,
                                  metrics=Metrics(total_duration=_now() - seq.t_request)))
        while self._waiting and None in self._seqs:
            seq = self._waiting.popleft()
            i = self._seqs.index(None)
            if isinstance(seq, EmbedJob):
                self._admit_embedding(i, seq)
                continue
            try:
                sampler = self._engine_new_sampler(seq)
            except Exception as err:  # e.g. a format that does not compile: fail this request only
                log.debug("cannot start sequence: %s", err)
                seq.out.put(err if isinstance(err, PollamaError) else LoadError(str(err)))
                continue
            slot, remaining = self.cache.load_slot(seq.prompt, cache_prompt=seq.request.cache_prompt)
            seq.slot, seq.inputs, seq.sampler = slot, remaining, sampler
            seq.cached = len(seq.prompt) - len(remaining)
            seq.evaluated = len(remaining)
            seq.t_start = _now()
            self._seqs[i] = seq
            log.debug(
                "slot %d: prompt %d tokens, cached %d, evaluating %d",
                slot.id, len(seq.prompt), seq.cached, len(remaining),
            )

    def _process_batch(self) -> None:
        n = self.num_parallel
        order = [(self._next_seq + k) % n for k in range(n)]
        self._next_seq = (self._next_seq + 1) % n
        for i in order:
            entry = self._seqs[i]
            if entry is not None and entry.is_cancelled():
                if isinstance(entry, EmbedJob):
                    self._end_embedding(i, entry, None)
                else:
                    self._finish(i, entry, DoneReason.CONNECTION_CLOSED)
        # Token and embedding batches take turns: the first live entry in round-robin order
        # picks this batch's kind (an embedding batch is one job's).
        first = next((i for i in order if self._seqs[i] is not None), None)
        if first is None:
            return
        job = self._seqs[first]
        if isinstance(job, EmbedJob):
            self._embedding_step(first, job)
            return
        self._engine_batch_begin()
        in_batch: list[tuple[int, Sequence]] = []
        total = 0
        if self.batch_in_slot_order:
            order.sort(key=lambda i: self._seqs[i].slot.id if isinstance(self._seqs[i], Sequence) else n)
        for i in order:
            seq = self._seqs[i]
            if not isinstance(seq, Sequence):
                continue
            added = self._fill(i, seq, total)
            if added:
                total += added
                in_batch.append((i, seq))
        if not in_batch:
            return
        self._engine_decode()
        for i, seq in in_batch:
            assert seq.slot is not None
            seq.slot.inputs.extend(seq.pending_inputs)
            seq.pending_inputs = []
            if seq.inputs:
                continue  # still evaluating the prompt
            token = self._engine_sample(seq)
            self._on_token(i, seq, token)

    def _fill(self, i: int, seq: Sequence, total: int) -> int:
        """Move as many of ``seq``'s inputs into the batch as the caps allow; shift when full."""
        assert seq.slot is not None
        added = 0
        while seq.inputs:
            used = len(seq.slot.inputs) + len(seq.pending_inputs)
            room = self.num_ctx - used
            if room < 1:
                if seq.pending_inputs:
                    break
                if not seq.request.shift:
                    self._finish(i, seq, DoneReason.LENGTH)
                    return 0
                try:
                    self.cache.shift_slot(seq.slot, seq.num_keep)
                except ReprocessInputs as redo:
                    seq.inputs = redo.inputs + seq.inputs
                continue
            head = seq.inputs[0]
            if isinstance(head, ImageInput):
                # An image is decoded whole, at once, before this sequence has anything in the
                # batch (its positions attend to what the cache holds before them); the tokens
                # after it follow. Other sequences' inputs in the batch are in other KV streams.
                if added or seq.pending_inputs:
                    break
                if room < head.count:
                    try:
                        shifted = seq.request.shift and self.cache.shift_slot(seq.slot, seq.num_keep) > 0
                    except ReprocessInputs as redo:
                        seq.inputs = redo.inputs + seq.inputs
                        continue
                    if not shifted:
                        self._finish(i, seq, DoneReason.LENGTH)
                        return 0
                    continue
                self._engine_decode_image(head, used, seq.slot.id)
                seq.slot.inputs.extend(seq.inputs[:head.count])
                seq.inputs = seq.inputs[head.count:]
                continue
            cap = self.num_batch - (added if self.per_sequence_batch else total + added)
            take = min(len(seq.inputs), room, cap)
            take = next((k for k in range(take) if isinstance(seq.inputs[k], ImageInput)), take)
            if take <= 0:
                break
            tokens = seq.inputs[:take]
            seq.inputs = seq.inputs[take:]
            last_out = not seq.inputs
            first = self._engine_batch_add(tokens, used, seq.slot.id)
            seq.batch_index = first + take - 1
            seq.pending_inputs.extend(tokens)
            added += take
            if last_out:
                break
        return added

    # ---------------------------------------------------------------- per-token handling
    def _on_token(self, i: int, seq: Sequence, token: int) -> None:
        now = _now()
        if not seq.t_first:
            seq.t_first = now
        seq.t_last = now
        seq.num_predicted += 1
        if self.is_eog(token):
            self._finish(i, seq, DoneReason.STOP)
            return
        piece = self.piece(token)
        seq.generated.append(token)
        seq.inputs = [token]  # decoded by the next batch, which puts it in the KV cache
        if seq.request.logprobs:
            seq.pending_logprobs.append(
                token_logprobs(self._engine_logits(seq), token, seq.request.top_logprobs, self.piece)
            )
        seq.pending_pieces.append(piece)
        joined = b"".join(seq.pending_pieces)
        stop = find_stop(joined, seq.stops)
        if stop is not None:
            self._cut_at_stop(seq, stop)
            self._finish(i, seq, DoneReason.STOP)
            return
        if seq.num_predict > 0 and seq.num_predicted >= seq.num_predict:
            self._finish(i, seq, DoneReason.LENGTH)
            return
        if contains_stop_suffix(joined, seq.stops) or incomplete_utf8(joined):
            return
        self._flush(seq)

    def _cut_at_stop(self, seq: Sequence, stop: bytes) -> None:
        """Trim the held-back text at ``stop`` and the slot's history to match (§1.6)."""
        assert seq.slot is not None
        orig = len(seq.pending_pieces)
        pieces, truncated = truncate_stop(seq.pending_pieces, stop)
        removed = orig - len(pieces)
        seq.pending_pieces = pieces
        if seq.pending_logprobs:
            seq.pending_logprobs = seq.pending_logprobs[: len(seq.pending_logprobs) - removed]
        # The last sampled token is not in the cache yet: count it, then drop what was cut.
        keep = len(seq.slot.inputs) + 1 - removed
        if truncated or removed == 0:
            keep -= 1
        del seq.slot.inputs[max(keep, 0):]
        cut = removed + (1 if truncated or removed == 0 else 0)
        if cut:
            del seq.generated[max(len(seq.generated) - cut, 0):]
        seq.inputs = []

    def _flush(self, seq: Sequence, final: bool = False) -> None:
        """Send the held-back output (``final``: the reply ended, so its parser holds nothing)."""
        if not seq.pending_pieces and not seq.pending_logprobs and not (final and seq.reply):
            return
        text = decode_flush(b"".join(seq.pending_pieces))
        chunk = Chunk(text=text, logprobs=seq.pending_logprobs or None)
        if seq.reply is not None:
            parts = seq.reply.feed(text, final)
            chunk.text, chunk.thinking, chunk.tool_calls = parts.content, parts.thinking, parts.tool_calls or None
        seq.pending_pieces, seq.pending_logprobs = [], []
        if chunk.text or chunk.thinking or chunk.tool_calls or chunk.logprobs or seq.reply is None:
            seq.out.put(chunk)

    def _metrics(self, seq: Sequence) -> Metrics:
        end = seq.t_last or _now()
        first = seq.t_first or end
        return Metrics(
            prompt_eval_count=seq.evaluated,
            prompt_cached_count=seq.cached,
            prompt_eval_duration=max(first - seq.t_start, 0) if seq.t_start else 0,
            eval_count=seq.num_predicted,
            eval_duration=max(end - first, 0),
            load_duration=0,
            total_duration=_now() - seq.t_request,
        )

    def _finish(self, i: int, seq: Sequence, reason: DoneReason) -> None:
        if reason is not DoneReason.CONNECTION_CLOSED:
            self._flush(seq, final=True)
        final = Chunk(done=True, done_reason=reason, metrics=self._metrics(seq),
                      context=text_tokens(seq.prompt) + seq.generated)
        self._release(i, seq)  # before the caller sees done: its slot is already free
        seq.out.put(final)

    def _release(self, i: int, seq: Sequence) -> None:
        """Free a token sequence's entry, sampler and slot."""
        if seq.sampler is not None:
            self._engine_free_sampler(seq.sampler)
            seq.sampler = None
        if seq.slot is not None:
            if seq.pending_inputs:  # never decoded: the cache ends before them
                seq.pending_inputs = []
            self.cache.release(seq.slot)
        self._seqs[i] = None

    # -------------------------------------------------------------------------- embeddings
    def _admit_embedding(self, i: int, job: EmbedJob) -> None:
        """Give ``job`` sequence entry ``i`` and the room its lanes need (lock held)."""
        try:
            job.slot = self._engine_embed_lanes().reserve(self.cache)
        except Exception as err:  # no memory for the lanes: fail this request only
            log.warning("cannot start an embedding: %s", err)
            job.out.put(err if isinstance(err, PollamaError) else LoadError(f"cannot evaluate embeddings: {err}"))
            return
        self._seqs[i] = job
        log.debug("embedding: %d inputs, %d tokens", len(job.inputs), sum(len(t) for t in job.inputs))

    def _embedding_step(self, i: int, job: EmbedJob) -> None:
        try:
            _embedding.step(job, self._engine_embed_lanes(), self.num_batch, self.num_ctx)
        except Exception as err:  # a failed embedding batch fails its own request only
            log.exception("embedding batch failed")
            self._end_embedding(i, job, err if isinstance(err, PollamaError) else LoadError(f"model runner error: {err}"))
            return
        if job.finished:
            self._end_embedding(i, job, None)

    def _end_embedding(self, i: int, job: EmbedJob, error: PollamaError | None) -> None:
        _embedding.end(job, self._engine_embed_lanes(), self.cache, error)
        self._seqs[i] = None
