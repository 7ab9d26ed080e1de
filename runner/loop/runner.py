"""The batch loop: admission, batching, context shift and release, over an :class:`Engine`.

:class:`BatchRunner` implements the runner contract (:class:`runner.api.Runner`) for any engine
(:mod:`runner.loop.engine`); it holds one and never asks which. It owns the Go runner's loop
(reference §1.5, §2.9): slots are claimed for waiting sequences, each batch takes inputs from
every live sequence (the batch's capacity shared round robin), a full slot is shifted, and each
sampled token goes to its sequence's :class:`runner.loop.output.Output`. Requests become sequences in
:mod:`runner.loop.sequence`; an ``embed`` call is one entry too (:class:`runner.loop.embedding.EmbedJob`):
token batches and its embedding batches take turns.

Speculative decoding (:mod:`runner.spec`): a sequence whose only pending input is the token it
just sampled may get a draft, tokens guessed to follow it (prompt lookup), added to the same batch
row run with an output for each. After the decode the sequence's sampler verifies them row by row
(:func:`runner.spec.verify.verify`); only the tokens it emits enter the slot's inputs, and the
rejected positions leave the KV cache (``kv.seq_rm``). The output is the one decoding without a
draft gives, for the same logits. :class:`runner.spec.controller.Speculation` decides how deep
to draft, or not at all.

Decodes run through the loop's :class:`runner.loop.pipeline.Decoder`. While a batch still decodes
(a compute thread), the loop builds and prepares the next one, with a placeholder for each token
the running batch will sample; after sampling it fills them in, or drops that batch when one of
its sequences ended meanwhile. A batch whose decode is done at once (inline) is followed by one
built from the sampled tokens. No batch is built ahead of one that verifies a draft (how many
tokens it gives is not known), and a batch built ahead is dropped when a sampled token would get
a draft.

Threading: only the loop thread touches sequences, slots and the KV memory. Callers only append
to the waiting queue (under ``_lock``) and receive their sequence's output: from a queue they
iterate (:meth:`BatchRunner.stream`), or pushed to a callback by the
loop thread itself (:meth:`BatchRunner.submit`, for an event loop that should not spend a thread
per stream). Cancelling sets an Event the loop checks before each batch.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from . import embedding as _embedding
from ..api import (
    Cancelled,
    ChatTemplate,
    Chunk,
    DoneReason,
    Embedding,
    LoadError,
    Message,
    ModelInfo,
    Offload,
    PollamaError,
    Request,
)
from ..kvstore.store import PromptStore
from ..spec.controller import Speculation
from ..spec.verify import verify
from .embedding import EmbedJob
from .engine import PLACEHOLDER, Engine
from .pipeline import Decoder, InlineDecoder
from .sequence import Prompter, Sequence
from .slots import ImageInput, Input, InputCache, ReprocessInputs, text_tokens
from .text import token_logprobs

log = logging.getLogger(__name__)

#: Prompt tokens one sequence may add to a batch while another sequence is about to sample (it
#: is generating, or has at most this many prompt tokens left). On a CPU a batch costs about its
#: token count, so a 512-token chunk of a long prompt made every token of the other streams wait
#: for it (a 5-token answer beside a long prompt: 20-60 s instead of 0.1 s). Measured in
#: bench/bench_shared_batch.py.
SHARED_PROMPT_CHUNK = 64


class _Push:
    """A sequence's output that hands each item to a callback instead of queuing it."""

    __slots__ = ("put",)

    def __init__(self, deliver: Callable[[Any], None]) -> None:
        self.put = deliver


@dataclass(eq=False)
class _Row:
    """One sequence's part of a batch."""

    index: int  # the sequence's entry in BatchRunner._seqs
    seq: Sequence
    tokens: list[int]  # PLACEHOLDER: sampled from the batch decoding before this one (never an image)
    pos: int  # position of the first token
    samples: bool  # the last token is the prompt's last (or a generated one): sample after it
    row: int = -1  # the engine batch's row of the last token
    draft: list[int] = field(default_factory=list)  # drafted tokens: the last of ``tokens``, one output each


@dataclass(eq=False)
class _Batch:
    rows: list[_Row]


class BatchRunner:
    """A loaded model (an :class:`Engine`) plus its batch loop thread."""

    def __init__(self, engine: Engine, *, template: ChatTemplate, num_ctx: int, num_parallel: int,
                 num_batch: int, multi_user: bool, decoder: Decoder | None = None,
                 store: PromptStore | None = None, speculation: Speculation | None = None) -> None:
        """``template``: the loaded model's, for requests that come without their chosen one;
        ``decoder``: where decodes run (:mod:`runner.loop.pipeline`; default on the loop thread);
        ``store``: the prompt store the slot cache saves to and restores from (None: none);
        ``speculation``: drafts and their depth (default :class:`Speculation` with its defaults)."""
        self.model_engine = engine
        self.decoder: Decoder = decoder if decoder is not None else InlineDecoder()
        self._ahead: _Batch | None = None  # the next batch, built while the last one decoded
        self.info: ModelInfo = engine.info
        self.n_vocab = engine.n_vocab
        self.num_ctx = num_ctx
        self.num_parallel = num_parallel
        self.num_batch = num_batch
        self.load_duration = 0  # ns, set by runner.load(): the caller reports it
        self.memory_size = engine.memory_size  # bytes besides the weights; runner.load() fills in an estimate
        self.offload = Offload()  # the CPU; runner.load() says where the layers went
        self.cache = InputCache(engine.kv, num_ctx * num_parallel, num_parallel, multi_user, store)
        self.speculation = speculation if speculation is not None else Speculation()
        self.prompter = Prompter(engine, num_ctx, template)
        self._lock = threading.Condition()
        self._waiting: collections.deque[Sequence | EmbedJob] = collections.deque()
        self._seqs: list[Sequence | EmbedJob | None] = [None] * num_parallel
        self._next_seq = 0
        self._closed = False
        self._serving = False  # a request waits for its first token (the store's disk writer holds off)
        self._thread = threading.Thread(target=self._run, name=f"runner:{engine.info.name}", daemon=True)

    @property
    def engine(self) -> str:
        """Which engine runs the model: "old" (llama.cpp) or "new" (our GGML code)."""
        return self.model_engine.name

    # ------------------------------------------------------------------------- public API
    def start(self) -> None:
        self._thread.start()

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        self._check_open()
        return self.model_engine.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens: list[int]) -> str:
        self._check_open()
        return self.prompter.detokenize(tokens)

    def _check_open(self) -> None:
        if self._closed:
            raise LoadError("the model was unloaded")

    def render_chat(self, messages: list[Message], truncate: bool = True,
                    cancel: threading.Event | None = None) -> str:
        """The prompt for ``messages`` with the loaded model's template, within one render budget
        for all the renders history truncation takes; ``cancel`` stops it."""
        self._check_open()
        return self.prompter.chat_prompt(messages, self.prompter.template, truncate, cancel)[0]

    def stream(self, request: Request) -> Iterator[Chunk]:
        """Stream the answer to ``request`` (prepared by :func:`runner.prepare.prepare`): a chat
        when it has ``messages``, else a completion of its ``prompt``. Validation and
        tokenization happen now (errors raise here); the returned iterator streams."""
        return self._stream(self._sequence(request))

    def submit(self, request: Request, deliver: Callable[[Any], None]) -> None:
        """Push form of :meth:`stream`.

        Validation errors raise here. Afterwards the loop thread calls ``deliver`` with each
        :class:`Chunk`; the last call is a done chunk or a :class:`PollamaError` (also when the
        request is cancelled before it got a slot, or the runner closes). ``deliver`` runs on the
        loop thread, between batches: it must return at once and must not raise.
        """
        seq = self._sequence(request)
        seq.output.sink = _Push(deliver)
        self._enqueue(seq)

    def count(self, request: Request) -> int:
        """The size in inputs of the prompt :meth:`submit` would run for ``request``, on the
        caller's thread; the loop is not involved."""
        self._check_open()
        return self.prompter.count(request)

    def _sequence(self, request: Request) -> Sequence:
        self._check_open()
        return self.prompter.sequence(request)

    def embed(self, texts: list[str | list[int]], truncate: bool = True,
              cancel: threading.Event | None = None) -> Embedding:
        """All of ``texts`` (texts or token ids, :meth:`runner.api.Runner.embed`) go to the loop
        as one job, evaluated several per decode; inputs with the same tokens are evaluated
        once (their vectors are the same)."""
        self._check_open()
        inputs = self.prompter.embed_inputs(texts, truncate)
        if not inputs:
            return Embedding([], 0)
        unique: dict[tuple[int, ...], int] = {}
        which = [unique.setdefault(tuple(tokens), len(unique)) for tokens in inputs]
        job = EmbedJob([list(tokens) for tokens in unique], cancel if cancel is not None else threading.Event())
        self._enqueue(job)
        try:
            result = job.out.get()
        finally:
            job.abandoned.set()  # a caller interrupted while it waits ends the job at the next batch
        if isinstance(result, BaseException):
            raise result
        vectors = [vector.tolist() for vector in result]
        return Embedding([vectors[k] for k in which], sum(len(t) for t in inputs))

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
        for entry in list(self._waiting) + [s for s in self._seqs if s is not None]:
            _put(entry, err)
        self._waiting.clear()
        self._seqs = [None] * self.num_parallel
        self._ahead = None
        self._save_slots()
        self.prompter.close()
        self.decoder.close()
        self.speculation.close()
        self.model_engine.close()

    def _save_slots(self) -> None:
        """At an unload: the slots' conversations go to the prompt store (and, with a disk tier,
        reach the disk before the engine goes), so they outlive the model and the process."""
        store = self.cache.store
        if store is None:
            return
        self._serve(False)  # the writes wait for no prompt of this load any more
        try:
            self.decoder.close()  # no decode may still be writing the KV cache
            self.cache.save_all()
            if not store.flush(timeout=60.0):
                log.warning("prompt cache: the disk writes took over 60 s; some states were not kept")
        except Exception:  # an unload must finish: a lost cache entry is only a slower next turn
            log.exception("prompt cache: saving the slots at unload failed")

    # ------------------------------------------------------------------------ sequences
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
                item = seq.output.sink.get()
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
                self._serve(self._serving_now())  # before an admission saves a slot for the disk
                self._admit()
                while not self._closed and not any(self._seqs):
                    self._serve(False)
                    self._lock.wait()
                    self._serve(self._serving_now())
                    self._admit()
                if self._closed:
                    return
            try:
                self._process_batch()
            except Exception as err:  # a decode failure must not kill the loop or leak slots
                log.exception("batch failed")
                self._ahead = None  # its sequences fail below; their slots start over when claimed
                failure = err if isinstance(err, PollamaError) else LoadError(f"model runner error: {err}")
                for i, seq in enumerate(self._seqs):
                    if isinstance(seq, EmbedJob):
                        self._end_embedding(i, seq, failure)
                    elif seq is not None:
                        seq.output.put(failure)
                        self._release(i, seq)

    def _serving_now(self) -> bool:
        """Whether a request waits for its first token: queued, evaluating its prompt, or an
        embedding (all prompt)."""
        return bool(self._waiting) or any(isinstance(entry, EmbedJob) or (entry is not None and not entry.output.t_first)
                                          for entry in self._seqs)

    def _serve(self, serving: bool) -> None:
        """Tell the prompt store when this load starts and stops serving prompts: its disk
        writer starts no file meanwhile (:meth:`runner.kvstore.disk.DiskStore.hold`), since a
        restored turn's joins and imports are Python that a write beside them slows."""
        if serving != self._serving and self.cache.store is not None:
            self.cache.store.serving(serving)
        self._serving = serving

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
                seq.output.put(seq.output.final(DoneReason.CONNECTION_CLOSED, seq.prompt))
        while self._waiting and None in self._seqs:
            seq = self._waiting.popleft()
            i = self._seqs.index(None)
            if isinstance(seq, EmbedJob):
                self._admit_embedding(i, seq)
                continue
            try:
                sampler = self.model_engine.new_sampler(seq.request.options, seq.grammar, text_tokens(seq.prompt))
            except Exception as err:  # e.g. a format that does not compile: fail this request only
                log.debug("cannot start sequence: %s", err)
                seq.output.put(err if isinstance(err, PollamaError) else LoadError(str(err)))
                continue
            since = time.perf_counter_ns()
            slot, remaining = self.cache.load_slot(seq.prompt, cache_prompt=seq.request.cache_prompt)
            seq.slot, seq.inputs, seq.sampler = slot, remaining, sampler
            seq.drafts = self.speculation.begin(seq.prompt, seq.request.options.draft_num_predict, slot.id)
            seq.output.started(cached=len(seq.prompt) - len(remaining), evaluated=len(remaining),
                               cached_from=slot.cached_from, since=since)
            self._seqs[i] = seq
            log.debug("slot %d: prompt %d tokens, cached %d, evaluating %d",
                      slot.id, len(seq.prompt), len(seq.prompt) - len(remaining), len(remaining))

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
        if self._ahead is not None and not self._live(self._ahead):
            self._discard(self._ahead)
        # Token and embedding batches take turns: the first live entry in round-robin order
        # picks this batch's kind (an embedding batch is one job's).
        first = next((i for i in order if self._seqs[i] is not None), None)
        if first is None:
            return
        job = self._seqs[first]
        if isinstance(job, EmbedJob):
            if self._ahead is not None:
                self._discard(self._ahead)  # the embedding's decode places its own batch
            self._embedding_step(first, job)
            return
        batch = self._ahead if self._ahead is not None else self._build_batch(order)
        self._ahead = None
        if batch is None:
            return
        self.decoder.start(self.model_engine)
        try:
            drafts = any(row.draft for row in batch.rows)  # how far its sequences get is not known yet
            ahead = self._build_ahead(order, batch) if self.decoder.running() and not drafts else None
        finally:
            self.decoder.wait()  # one decode at a time, also when building ahead failed
        self._after_decode(batch, ahead)

    def _build_batch(self, order: list[int]) -> _Batch | None:
        """The next batch, built while no batch decodes: the capacity is shared in round-robin
        ``order`` (who comes first this time); a full slot is shifted first."""
        capacity = self.model_engine.batch_capacity
        chunk = self._prompt_chunk()
        taken: list[_Row] = []
        total = 0
        for i in order:
            seq = self._seqs[i]
            if not isinstance(seq, Sequence):
                continue
            cap = min(chunk, capacity - total)
            count = self._plan(i, seq, cap)
            if count:
                assert seq.slot is not None
                tokens, seq.inputs = seq.inputs[:count], seq.inputs[count:]
                draft = self._draft(seq, cap - 1) if count == 1 and not seq.inputs else []
                total += count + len(draft)
                taken.append(_Row(i, seq, tokens + draft, len(seq.slot.inputs), samples=not seq.inputs, draft=draft))
        return self._engine_batch(taken)

    def _draft(self, seq: Sequence, room: int) -> list[int]:
        """The draft for a sequence whose only pending input is the token it sampled last (none
        for a prompt's last token), at most ``room`` tokens, none that would pass the end of
        the context or ``num_predict``. Pure: asking again before the decode gives the same."""
        out, slot = seq.output, seq.slot
        assert slot is not None and seq.drafts is not None
        if not out.generated:
            return []
        limit = min(room, self.num_ctx - len(slot.inputs) - 1)
        if out.num_predict > 0:  # 0: no limit
            limit = min(limit, out.num_predict - out.num_predicted - 1)
        others = sum(entry is not None for entry in self._seqs) - 1
        return self.speculation.propose(seq.drafts, out.generated, limit, others)

    def _build_ahead(self, order: list[int], running: _Batch) -> _Batch | None:
        """The batch after ``running``, built while it decodes: a sequence that samples from
        ``running`` gets a placeholder for that token. None when a slot would need a shift
        (KV memory is not touched while a batch decodes): the next batch is built afterwards."""
        capacity = self.model_engine.batch_capacity
        chunk = self._prompt_chunk()
        before = {row.seq: row for row in running.rows}
        taken: list[_Row] = []
        total = 0
        for i in order:
            seq = self._seqs[i]
            if not isinstance(seq, Sequence):
                continue
            assert seq.slot is not None
            prev = before.get(seq)
            pos = len(seq.slot.inputs) + (len(prev.tokens) if prev is not None else 0)
            if not seq.inputs and (prev is None or not prev.samples):
                continue
            if pos >= self.num_ctx:
                return self._undo(taken)
            cap = min(chunk, capacity - total)
            if cap <= 0:
                continue
            if seq.inputs:
                take = _text_run(seq.inputs, min(len(seq.inputs), self.num_ctx - pos, cap))
                if not take:  # an image is decoded on its own, by the loop thread: not meanwhile
                    return self._undo(taken)
                tokens, seq.inputs = seq.inputs[:take], seq.inputs[take:]
            else:
                tokens = [PLACEHOLDER]
            total += len(tokens)
            taken.append(_Row(i, seq, tokens, pos, samples=not seq.inputs))
        return self._engine_batch(taken)

    def _prompt_chunk(self) -> int:
        """The most inputs one sequence adds to the next batch: ``num_batch``, or
        :data:`SHARED_PROMPT_CHUNK` while a sequence is about to sample (generating, or its
        prompt nearly done), so that its next token does not wait for a long prompt's chunk."""
        chunk = min(self.num_batch, SHARED_PROMPT_CHUNK)
        if any(isinstance(s, Sequence) and len(s.inputs) <= chunk for s in self._seqs):
            return chunk
        return self.num_batch

    def _undo(self, taken: list[_Row]) -> None:
        """Give the rows' known tokens back to their sequences (not the drafted ones)."""
        for row in taken:
            known = [t for t in row.tokens[: len(row.tokens) - len(row.draft)] if t != PLACEHOLDER]
            row.seq.inputs = known + row.seq.inputs
        return None

    def _engine_batch(self, taken: list[_Row]) -> _Batch | None:
        """Add the rows to a new engine batch in slot order (llama.cpp evaluates a run of
        consecutive KV streams as one ubatch; our engine does not mind) and prepare it."""
        if not taken:
            return None
        engine = self.model_engine
        engine.batch_begin()
        if len(taken) > 1:
            taken.sort(key=lambda r: r.seq.slot.id if r.seq.slot is not None else 0)
        for row in taken:
            assert row.seq.slot is not None
            row.row = engine.batch_add(row.tokens, row.pos, row.seq.slot.id, 1 + len(row.draft))
        try:
            engine.prepare()
        except BaseException:
            self._undo(taken)
            raise
        return _Batch(taken)

    def _after_decode(self, batch: _Batch, ahead: _Batch | None) -> None:
        """Record what ``batch`` put in the cache, sample its sequences, and hand each sampled
        token to the batch built ahead (its placeholder) or to the sequence's next inputs."""
        engine = self.model_engine
        waiting = {row.seq: row for row in ahead.rows if row.tokens == [PLACEHOLDER]} if ahead else {}
        for row in batch.rows:
            seq = row.seq
            if self._seqs[row.index] is not seq:
                continue  # ended meanwhile: its results are discarded
            assert seq.slot is not None
            if row.draft:
                self._verify(row)
                continue
            seq.slot.inputs.extend(row.tokens)
            if not row.samples:
                continue  # still evaluating the prompt
            token = engine.sample(seq.sampler, row.row)
            if not self._on_token(row.index, seq, token, row.row):
                continue
            slot_row = waiting.get(seq)
            if slot_row is not None and not self._draft(seq, self.num_batch - 1):
                del waiting[seq]
                engine.fill(slot_row.row, token)
                slot_row.tokens = [token]
            else:  # decoded by the next batch, which puts it in the KV cache (the one ahead, if
                seq.inputs = [token]  # any, is dropped: this token gets a draft)
        if ahead is None:
            return
        if waiting or not self._live(ahead):
            self._discard(ahead)
        else:
            self._ahead = ahead

    def _verify(self, row: _Row) -> None:
        """Sample a row that carries a draft: its sequence's sampler decides each drafted
        position in turn (:func:`runner.spec.verify.verify`), each token goes to the output as
        without a draft, and the positions after the last accepted token leave the KV cache."""
        engine, seq, draft = self.model_engine, row.seq, row.draft
        slot, out = seq.slot, seq.output
        assert slot is not None and seq.drafts is not None
        first = row.row - len(draft)  # the sampled token's row; drafted token i's is first + 1 + i
        slot.inputs.append(row.tokens[0])
        out.draft_n += len(draft)
        at = len(out.generated)

        def emit(i: int, token: int) -> bool:
            if i:  # draft[i - 1] was right: it is the sequence's input, as if decoded alone
                slot.inputs.append(draft[i - 1])
                out.draft_n_accepted += 1
            return self._on_token(row.index, seq, token, first + i)

        result = verify(draft, lambda i: engine.sample(seq.sampler, first + i), emit)
        self.speculation.verified(seq.drafts, at, len(draft), result.accepted)
        if not self.cache.kv.seq_rm(slot.id, len(slot.inputs), None):
            # a memory that cannot drop a sequence's tail (recurrent): start the slot over,
            # and draft no more on this model
            log.warning("the KV memory cannot drop drafted positions: speculative decoding is off for this model")
            self.speculation.enabled = False
            self.cache.kv.seq_rm(slot.id, 0, None)
            if not result.ended:
                seq.inputs = slot.inputs + [result.tokens[-1]]
            slot.inputs = []
            return
        if not result.ended:
            seq.inputs = [result.tokens[-1]]

    def _live(self, batch: _Batch) -> bool:
        return all(self._seqs[row.index] is row.seq for row in batch.rows)

    def _discard(self, batch: _Batch) -> None:
        """Drop a prepared batch that will not be decoded: its cells leave the KV cache and
        its known tokens go back to their sequences."""
        if batch is self._ahead:
            self._ahead = None
        self._undo([row for row in batch.rows if self._seqs[row.index] is row.seq])
        for row in batch.rows:
            slot = row.seq.slot
            assert slot is not None
            if not self.cache.kv.seq_rm(slot.id, row.pos, None):  # no partial erasure: start over
                self.cache.kv.seq_rm(slot.id, 0, None)
                row.seq.inputs = slot.inputs + row.seq.inputs
                slot.inputs = []

    def _plan(self, i: int, seq: Sequence, cap: int) -> int:
        """How many of ``seq``'s inputs the next batch takes (at most ``cap``), after shifting
        its slot when it is full; 0 when none (or the sequence ended: no room, no shift).

        An image at the head of the inputs is decoded here, whole and at once, before the batch
        (its positions attend to what the slot holds before them; the engine decodes it in the
        slot's own KV sequence, so other sequences' rows are not disturbed); the text after it
        goes in the batch. A batch's rows are text only: a run of text stops at an image."""
        assert seq.slot is not None
        while seq.inputs:
            head = seq.inputs[0]
            need = head.count if isinstance(head, ImageInput) else 1
            room = self.num_ctx - len(seq.slot.inputs)
            if room >= need:
                if not isinstance(head, ImageInput):
                    n = max(0, min(len(seq.inputs), room, cap))
                    return n if n <= 1 else _text_run(seq.inputs, n)  # the head is text
                self.model_engine.decode_image(head, len(seq.slot.inputs), seq.slot.id)
                seq.slot.inputs.extend(seq.inputs[:head.count])
                seq.inputs = seq.inputs[head.count:]
                continue
            if not seq.request.shift:
                self._finish(i, seq, DoneReason.LENGTH)
                return 0
            try:
                if self.cache.shift_slot(seq.slot, seq.num_keep) <= 0:
                    self._finish(i, seq, DoneReason.LENGTH)  # nothing left to discard: no room
                    return 0
            except ReprocessInputs as redo:
                seq.inputs = redo.inputs + seq.inputs
        return 0

    # ---------------------------------------------------------------- per-token handling
    def _on_token(self, i: int, seq: Sequence, token: int, row: int) -> bool:
        """Hand ``token`` (sampled from batch row ``row``) to the sequence's output; False when
        that ended the sequence."""
        engine, out = self.model_engine, seq.output
        eog = engine.is_eog(token)
        logprob = None
        if out.wants_logprobs and not eog:
            logprob = token_logprobs(engine.logits(row), token, out.top_logprobs or 0, engine.piece)
        verdict = out.token(token, b"" if eog else engine.piece(token), eog, logprob)
        if verdict.done is None:
            return True
        if verdict.drop:
            assert seq.slot is not None
            del seq.slot.inputs[max(len(seq.slot.inputs) - verdict.drop, 0):]
        seq.inputs = []
        self._finish(i, seq, verdict.done)
        return False

    def _finish(self, i: int, seq: Sequence, reason: DoneReason) -> None:
        final = seq.output.final(reason, seq.prompt)
        self._release(i, seq)  # before the caller sees done: its slot is already free
        seq.output.put(final)

    def _release(self, i: int, seq: Sequence) -> None:
        """Free a token sequence's entry, sampler and slot."""
        if seq.sampler is not None:
            self.model_engine.free_sampler(seq.sampler)
            seq.sampler = None
        if seq.slot is not None:
            self.cache.release(seq.slot)
        self._seqs[i] = None

    # -------------------------------------------------------------------------- embeddings
    def _admit_embedding(self, i: int, job: EmbedJob) -> None:
        """Give ``job`` sequence entry ``i`` and the room its lanes need (lock held)."""
        try:
            job.slot = self.model_engine.embed_lanes().reserve(self.cache)
        except Exception as err:  # no memory for the lanes: fail this request only
            log.warning("cannot start an embedding: %s", err)
            job.out.put(err if isinstance(err, PollamaError) else LoadError(f"cannot evaluate embeddings: {err}"))
            return
        self._seqs[i] = job
        log.debug("embedding: %d inputs, %d tokens", len(job.inputs), sum(len(t) for t in job.inputs))

    def _embedding_step(self, i: int, job: EmbedJob) -> None:
        try:
            _embedding.step(job, self.model_engine.embed_lanes(), self.num_batch, self.num_ctx)
        except Exception as err:  # a failed embedding batch fails its own request only
            log.exception("embedding batch failed")
            self._end_embedding(i, job, err if isinstance(err, PollamaError) else LoadError(f"model runner error: {err}"))
            return
        if job.finished:
            self._end_embedding(i, job, None)

    def _end_embedding(self, i: int, job: EmbedJob, error: PollamaError | None) -> None:
        _embedding.end(job, self.model_engine.embed_lanes(), self.cache, error)
        self._seqs[i] = None


def _text_run(inputs: list[Input], n: int) -> int:
    """How many of the first ``n`` inputs come before the first image among them."""
    return next((k for k in range(n) if isinstance(inputs[k], ImageInput)), n)


def _put(entry: Sequence | EmbedJob, item: Any) -> None:
    if isinstance(entry, EmbedJob):
        entry.out.put(item)
    else:
        entry.output.put(item)
