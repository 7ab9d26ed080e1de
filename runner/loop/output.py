"""Sampled token -> text chunks: stop sequences, partial UTF-8, logprobs, num_predict, metrics.

One :class:`Output` per sequence (reference §1.6). The batch loop hands it each sampled token
with the token's bytes; it holds text back while it may still be the start of a stop sequence or
of a UTF-8 character, cuts the text at a stop, counts towards ``num_predict``, splits the reply
into thinking / content / tool calls (:mod:`runner.loop.replies`) and puts :class:`runner.api.Chunk` s
on its ``sink`` (the first with the prompt's counts, the last with the metrics and the stop that
ended it). Plain Python over bytes: testable without a model.
"""

from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field
from typing import Any

from . import replies as _replies
from ..api import Chunk, DoneReason, Metrics, TokenLogprob
from .slots import Input, text_tokens
from .text import contains_stop_suffix, decode_flush, find_stop, incomplete_utf8, truncate_stop

_now = time.perf_counter_ns


@dataclass(frozen=True)
class Verdict:
    """What the loop does after a token: go on (``done`` None: the token is the next input), or
    end the sequence with ``done``. ``drop``: tokens to take off the end of the slot's cached
    history, because the stop sequence that ended the sequence began that many tokens back."""

    done: DoneReason | None = None
    drop: int = 0


GO_ON = Verdict()


@dataclass(eq=False)
class Output:
    """A sequence's output so far, and the text it still holds back."""

    stops: list[bytes]
    num_predict: int  # > 0: at most this many tokens (the loop bounds it); <= 0: no limit
    reply: _replies.ReplyParser | None = None  # splits the output into thinking, content, tool calls
    top_logprobs: int | None = None  # None: no logprobs; else alternatives listed per token
    sink: Any = field(default_factory=queue.SimpleQueue)  # anything with put(item)
    generated: list[int] = field(default_factory=list)
    num_predicted: int = 0
    pending_pieces: list[bytes] = field(default_factory=list)  # held back (stop prefix, UTF-8)
    pending_logprobs: list[TokenLogprob] = field(default_factory=list)
    stopped_by: bytes | None = None  # the stop sequence that ended the output, once one has
    announced: bool = False  # a chunk with the prompt's counts was sent (the first one)
    cached: int = 0  # prompt tokens found in the slot or restored from the prompt store
    cached_from: str = ""  # "slot", "ram", "disk" ("" when none were)
    evaluated: int = 0  # prompt tokens evaluated
    draft_n: int = 0  # drafted tokens verified (runner.spec)
    draft_n_accepted: int = 0  # of which the model agreed with
    t_start: int = 0
    t_first: int = 0
    t_last: int = 0

    @property
    def wants_logprobs(self) -> bool:
        return self.top_logprobs is not None

    def started(self, cached: int, evaluated: int, cached_from: str = "", since: int = 0) -> None:
        """The sequence took a slot holding ``cached`` prompt tokens (from ``cached_from``);
        ``evaluated`` remain. ``since``: when it began to claim the slot (a restore from the
        prompt store is prompt time too); now when 0."""
        self.cached, self.evaluated, self.cached_from = cached, evaluated, cached_from
        self.t_start = since or _now()

    def token(self, token: int, piece: bytes, eog: bool, logprob: TokenLogprob | None = None) -> Verdict:
        """Take one sampled ``token`` (its bytes ``piece``; ``eog``: it ends generation;
        ``logprob`` when :attr:`wants_logprobs`). Sends the text that is certain by now."""
        now = _now()
        if not self.t_first:
            self.t_first = now
        self.t_last = now
        self.num_predicted += 1
        if eog:
            return Verdict(DoneReason.STOP)
        self.generated.append(token)
        if logprob is not None:
            self.pending_logprobs.append(logprob)
        self.pending_pieces.append(piece)
        joined = b"".join(self.pending_pieces)
        stops = self.stops
        stop = find_stop(joined, stops) if stops else None
        if stop is not None:
            self.stopped_by = stop
            return Verdict(DoneReason.STOP, self._cut_at_stop(stop))
        if self.num_predict > 0 and self.num_predicted >= self.num_predict:
            return Verdict(DoneReason.LENGTH)
        if (stops and contains_stop_suffix(joined, stops)) or (not joined.isascii() and incomplete_utf8(joined)):
            return GO_ON
        self.flush()
        return GO_ON

    def _cut_at_stop(self, stop: bytes) -> int:
        """Trim the held-back text at ``stop`` and the generated tokens to match (§1.6); returns
        how many tokens of the slot's history to drop (the last token is not in it yet)."""
        orig = len(self.pending_pieces)
        pieces, truncated = truncate_stop(self.pending_pieces, stop)
        removed = orig - len(pieces)
        self.pending_pieces = pieces
        if self.pending_logprobs:
            self.pending_logprobs = self.pending_logprobs[: max(len(self.pending_logprobs) - removed, 0)]
        cut = removed + (1 if truncated or removed == 0 else 0)
        del self.generated[max(len(self.generated) - cut, 0):]
        return cut - 1

    def flush(self, final: bool = False) -> None:
        """Send the held-back output (``final``: the reply ended, so its parser holds nothing)."""
        if not self.pending_pieces and not self.pending_logprobs and not (final and self.reply):
            return
        text = decode_flush(b"".join(self.pending_pieces))
        chunk = Chunk(text=text, logprobs=self.pending_logprobs or None)
        if self.reply is not None:
            parts = self.reply.feed(text, final)
            chunk.text, chunk.thinking, chunk.tool_calls = parts.content, parts.thinking, parts.tool_calls or None
        self.pending_pieces, self.pending_logprobs = [], []
        if chunk.text or chunk.thinking or chunk.tool_calls or chunk.logprobs or self.reply is None:
            if not self.announced:  # the first chunk says how big the prompt is (runner.api.Chunk)
                self.announced = True
                chunk.metrics = Metrics(prompt_eval_count=self.evaluated, prompt_cached_count=self.cached,
                                        prompt_cache_source=self.cached_from)
            self.sink.put(chunk)

    def metrics(self) -> Metrics:
        end = self.t_last or _now()
        first = self.t_first or end
        return Metrics(
            prompt_eval_count=self.evaluated,
            prompt_cached_count=self.cached,
            prompt_cache_source=self.cached_from,
            prompt_eval_duration=max(first - self.t_start, 0) if self.t_start else 0,
            eval_count=self.num_predicted,
            eval_duration=max(end - first, 0),
            draft_n=self.draft_n,
            draft_n_accepted=self.draft_n_accepted,
        )  # load_duration and total_duration are the caller's: it knows when the request began

    def final(self, reason: DoneReason, prompt: list[Input]) -> Chunk:
        """Flush what is held back (unless the client left) and make the last chunk, whose
        ``context`` is ``prompt``'s token ids plus the generated tokens and ``stop`` the stop
        sequence that ended the output, if one did. The caller puts it on the sink."""
        if reason is not DoneReason.CONNECTION_CLOSED:
            self.flush(final=True)
        stop = self.stopped_by.decode("utf-8") if self.stopped_by is not None and reason is DoneReason.STOP else None
        return Chunk(done=True, done_reason=reason, metrics=self.metrics(), context=text_tokens(prompt) + self.generated,
                     stop=stop)

    def put(self, item: Chunk | BaseException) -> None:
        self.sink.put(item)
