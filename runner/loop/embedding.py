"""Embedding requests in the batch loop: many inputs per decode, one KV sequence (a *lane*) each.

An ``embed`` call becomes one :class:`EmbedJob`. The loop gives it a sequence entry like a chat,
and on its turns :func:`step` packs the job's inputs into one decode: every input that fits in
the batch (:func:`batch_size` tokens) and in the job's room (``num_ctx`` cells) starts in a lane
of its own, positions from 0, so attention never crosses between inputs; an input longer than
the batch keeps its lane over several turns. When an input is complete its token rows are averaged
and L2-normalised, and its lane is forgotten.

Evaluating the inputs one sequence at a time cost a whole forward pass per input (weights read,
threads synchronised) however short the input: 200 one-token inputs took 200 decodes. Packed,
they take four (64 lanes a decode). The engine supplies the lanes (:class:`EmbedLanes`): llama.cpp needs a context
of its own with one sequence per lane (its slots each own one KV stream), our engine uses spare
sequence ids in its own cell pool.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from ..api import Cancelled, LoadError, PollamaError
from .slots import InputCache, Slot

#: inputs one embedding decode carries at most (llama.cpp allows up to 256 sequences a context)
MAX_LANES = 64
#: tokens one embedding decode carries at most. On a CPU a token costs about the same in a batch
#: of 128 as in one of 512, and the loop checks for cancellation (and lets chats take their
#: turn) between decodes: a 512-token decode of SmolLM2 takes seconds on a busy machine.
MAX_BATCH = 128


class EmbedLanes(Protocol):
    """Where the batch loop evaluates embedding inputs, several per decode.

    A lane is one KV sequence holding one input, at positions 0..n-1. The loop adds tokens for
    up to :attr:`max_lanes` lanes to a batch of at most :func:`batch_size` tokens, decodes it, reads
    every token's output row, and forgets a lane once its input is done. All the lanes of one
    job hold at most ``num_ctx`` cells at a time.
    """

    max_lanes: int  # inputs one decode may carry

    def reserve(self, cache: InputCache) -> Slot | None:
        """Make room for one job's lanes (``num_ctx`` cells) before its first decode; returns the
        cache slot taken for it (released by the loop when the job ends), or None if the lanes
        use memory of their own. Raises PollamaError when the room cannot be made."""

    def seq(self, lane: int) -> int:
        """The KV sequence id of lane ``lane`` (``0 <= lane < max_lanes``)."""

    def begin(self) -> None:
        """Start a new batch."""

    def add(self, tokens: list[int], pos: int, seq: int) -> int:
        """Append ``tokens`` at positions ``pos..`` of sequence ``seq``, each producing an output
        row; returns the row of the first."""

    def decode(self) -> None:
        """Evaluate the batch (raises on failure; the loop then ends the job with the error)."""

    def rows(self, first: int, count: int) -> np.ndarray:
        """Float32 ``(count, n_embd)``: the hidden states of rows ``first..first+count-1`` of the
        last decode (a copy)."""

    def forget(self, seq: int) -> None:
        """Drop every cell of sequence ``seq``."""


@dataclass
class _Lane:
    index: int  # which input
    seq: int  # KV sequence id
    tokens: list[int]
    done: int = 0  # tokens evaluated
    total: np.ndarray | None = None  # float64 sum of their rows


@dataclass(eq=False)
class EmbedJob:
    """One ``embed`` call inside the runner. Only the loop thread touches the lane state."""

    inputs: list[list[int]]
    cancel: threading.Event = field(default_factory=threading.Event)  # the caller's (client left, shutdown)
    abandoned: threading.Event = field(default_factory=threading.Event)  # the caller stopped waiting
    out: Any = field(default_factory=queue.SimpleQueue)  # receives the vectors, or a PollamaError
    t_request: int = field(default_factory=time.perf_counter_ns)
    slot: Slot | None = None  # what EmbedLanes.reserve took
    next: int = 0  # the next input to start
    lanes: dict[int, _Lane] = field(default_factory=dict)  # lane number -> its input
    vectors: list[np.ndarray | None] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.vectors = [None] * len(self.inputs)

    def is_cancelled(self) -> bool:
        return self.cancel.is_set() or self.abandoned.is_set()

    @property
    def finished(self) -> bool:
        return self.next == len(self.inputs) and not self.lanes


def batch_size(num_batch: int) -> int:
    """Tokens in one embedding decode."""
    return max(1, min(num_batch, MAX_BATCH))


def step(job: EmbedJob, lanes: EmbedLanes, num_batch: int, num_ctx: int) -> None:
    """One decode for ``job``: continue its open lanes, start new ones while the batch
    (:func:`batch_size` tokens), the lanes and the job's room allow, then average the inputs
    that are complete."""
    lanes.begin()
    room = batch_size(num_batch)
    added: list[tuple[_Lane, int, int]] = []  # lane, first row, count
    for lane in job.lanes.values():  # long inputs first: their cells are already spent
        take = min(len(lane.tokens) - lane.done, room)
        if take <= 0:
            break
        added.append((lane, lanes.add(lane.tokens[lane.done : lane.done + take], lane.done, lane.seq), take))
        room -= take
    free = [n for n in range(lanes.max_lanes) if n not in job.lanes]
    while room > 0 and free and job.next < len(job.inputs):
        tokens = job.inputs[job.next]
        # Start an input only if all of it fits beside what the open lanes will hold.
        if sum(len(ln.tokens) for ln in job.lanes.values()) + len(tokens) > num_ctx:
            break
        number = free.pop(0)
        lane = job.lanes[number] = _Lane(job.next, lanes.seq(number), tokens)
        job.next += 1
        take = min(len(tokens), room)
        added.append((lane, lanes.add(tokens[:take], 0, lane.seq), take))
        room -= take
    if not added:
        return
    lanes.decode()
    for lane, first, count in added:
        total = lanes.rows(first, count).sum(axis=0, dtype=np.float64)
        lane.total = total if lane.total is None else lane.total + total
        lane.done += count
    for number, lane in list(job.lanes.items()):
        if lane.done < len(lane.tokens):
            continue
        assert lane.total is not None
        lanes.forget(lane.seq)
        del job.lanes[number]
        mean = lane.total / len(lane.tokens)
        norm = float(np.linalg.norm(mean))
        if not np.isfinite(norm):
            raise LoadError("embedding contains NaN or Inf values")
        job.vectors[lane.index] = (mean / norm if norm > 0 else mean).astype(np.float32)


def end(job: EmbedJob, lanes: EmbedLanes | None, cache: InputCache, error: PollamaError | None) -> None:
    """Forget the job's lanes, give back its room, and deliver its vectors (or ``error``)."""
    if lanes is not None:
        for lane in job.lanes.values():
            lanes.forget(lane.seq)
    job.lanes.clear()
    if job.slot is not None:
        cache.release(job.slot)
        job.slot = None
    if error is None and job.is_cancelled():
        error = Cancelled("the embedding request was cancelled")
    job.out.put(error if error is not None else [v for v in job.vectors])
