"""What every architecture of the new engine shares: batches, the :class:`Model` base that runs a
model's graph, and the cache of built graphs.

An architecture (``models/<arch>.py``) subclasses :class:`Model` and writes only the math:
:meth:`Model.forward` builds the graph of one batch through ``runner.ml`` tensors,
:meth:`Model.shift` re-applies RoPE to cached keys, :meth:`Model.new_cache` says which KV cache it
attends through (a causal cache by default; gemma3 a sliding-window + global wrapper).
:class:`Model` runs it: it owns the backend, the weights and the KV cache, reserves the
worst-case graph at load, and keeps a few built graphs so that a batch whose shape and cache view
equal an earlier one's (every decode step inside one 256-cell block of history) only uploads new
inputs instead of rebuilding the graph.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable, Sequence

import numpy as np

from runner.kvcache.cache import Cache, KvCacheError, LayerShape
from runner.kvcache.causal import CausalCache
from runner.ml.ggml.backend import GGMLBackend, GGMLTensor, GraphContext
from runner.model.gguf_weights import GGUFFile, Weights
from runner.sample._best import best_lists

log = logging.getLogger(__name__)

__all__ = ["Batch", "BatchInputs", "ForwardStats", "Model", "ModelLoadError", "Outputs", "Prepared", "TOP_CANDIDATES"]

#: Each output row's largest logits picked for the sampler (:meth:`Outputs.top`): the k + P best
#: hold the k best after penalties that lower logits (runner.sample), so top_k 40 with 64
#: penalised tokens is decided from these without reading the whole row into NumPy.
TOP_CANDIDATES = 128
_TOP_ROWS = 64  # a batch with more output rows (all logits of a prompt) is read whole


class ModelLoadError(RuntimeError):
    """The model cannot be loaded or its cache cannot be sized (one-line message)."""


# ------------------------------------------------------------------------------------- batches
@dataclass
class Batch:
    """One forward pass (Ollama's ``input.Batch``): token i of the batch is ``tokens[i]`` at
    position ``positions[i]`` of sequence ``sequences[i]``; ``outputs`` are the batch indices
    (ascending) whose logits are wanted."""

    tokens: Sequence[int]
    positions: Sequence[int]
    sequences: Sequence[int]
    outputs: Sequence[int]
    embeddings: bool = False  # return the final normed hidden states instead of logits
    # float32 ``(n_tokens, n_embd)``: the inputs' embeddings as given (an image's soft tokens),
    # used instead of ``tokens``' rows of the embedding table (and not scaled as those are)
    embeds: np.ndarray | None = None
    # batch indices that also see the later positions of their sequence in this batch (gemma3's
    # image rows attend to each other both ways); every other input is causal
    causal_except: Sequence[int] = ()
    # the tokens are decoded ones (a sampled one, alone or with drafted ones to verify): each
    # row is computed the same alone as in a batch, where that costs little
    # (``Backend.new_context``'s decoded), so a verified draft's logits are those one token at a
    # time gives (a prompt's rows are computed as llama.cpp computes a prompt)
    decode: bool = False

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0 or len(self.positions) != n or len(self.sequences) != n:
            raise ValueError(
                f"bad batch: {n} tokens, {len(self.positions)} positions, {len(self.sequences)} sequences"
            )
        if len(self.outputs) == 0:
            raise ValueError("batch without outputs")
        if self.embeds is not None and self.embeds.shape[0] != n:
            raise ValueError(f"bad batch: {n} tokens, {self.embeds.shape[0]} embedding rows")

    @classmethod
    def sequence(cls, tokens: Sequence[int], start: int = 0, seq: int = 0, all_logits: bool = False,
                 decode: bool = False) -> Batch:
        """A batch of consecutive ``tokens`` of one sequence from position ``start``; logits of
        the last token (or of all with ``all_logits``, or as decoded tokens with ``decode``)."""
        n = len(tokens)
        return cls(
            tokens=list(tokens),
            positions=list(range(start, start + n)),
            sequences=[seq] * n,
            outputs=list(range(n)) if all_logits or decode else [n - 1],
            decode=decode,
        )


@dataclass
class BatchInputs:
    """The graph's view of a :class:`Batch`: i32 input tensors ``tokens [n_tokens]``,
    ``positions [n_tokens]`` and ``outputs [n_outputs]`` (``None`` when every token is an
    output, so no row selection is needed); for a batch of given embeddings, ``embeds`` (f32
    ``[n_embd, n_tokens]``) instead of ``tokens`` (then ``None``)."""

    tokens: GGMLTensor | None
    positions: GGMLTensor
    outputs: GGMLTensor | None
    n_tokens: int
    n_outputs: int
    embeddings: bool = False
    embeds: GGMLTensor | None = None


# ---------------------------------------------------------------------------------- statistics
@dataclass
class ForwardStats:
    """Where the time of :meth:`Model.compute` went (nanoseconds, cumulative)."""

    calls: int = 0
    builds: int = 0
    build_ns: int = 0  # Python: building graphs
    prepare_ns: int = 0  # Python: cache bookkeeping + input arrays
    compute_ns: int = 0  # GGML: allocation, upload, compute
    read_ns: int = 0  # copying logits out

    def reset(self) -> None:
        self.calls = self.builds = self.build_ns = self.prepare_ns = self.compute_ns = self.read_ns = 0


@dataclass
class _Graph:
    ctx: GraphContext
    logits: GGMLTensor
    out: np.ndarray
    # True: the sampler picks each row's best from the logits where GGML left them
    # (Outputs.top); False: execute() copies the whole logits into ``out`` (read)
    picks: bool = False
    read: Callable[[], None] | None = None
    width: int = 0
    _rows: memoryview | None = None  # the logits in place, as the graph's placement _rows_at put them
    _rows_at: int = 0

    @property
    def outputs(self) -> tuple[GGMLTensor, ...]:
        return (self.logits,)

    def rows(self) -> memoryview:
        """The computed logits in place (flat f32), re-made when the allocator moved them."""
        at = self.ctx.placement
        if at != self._rows_at or self._rows is None:
            self._rows, self._rows_at = self.logits.host_floats(), at
        return self._rows


class Outputs:
    """What :meth:`Model.execute` computed: every output row's best logits (:meth:`top`, picked
    on demand) and the whole rows (:meth:`logits`, copied out of GGML on the first call).
    Valid until the model computes again: the arrays are reused, and the compute buffer the
    rows are read from belongs to the next graph then (both raise)."""

    __slots__ = ("_model", "_graph", "_epoch", "_read")

    def __init__(self, model: Model, graph: _Graph, epoch: int, read: bool) -> None:
        self._model, self._graph, self._epoch, self._read = model, graph, epoch, read

    def top(self, row: int) -> tuple[list[int], list[float]] | None:
        """Row ``row``'s TOP_CANDIDATES best logits as lists (ids, logits), by logit descending,
        equal logits by id, -inf left out; ValueError when the row holds a NaN. One pass of C
        over the row where GGML left it (``runner/sample/best.c``: ~50 us with the lists on 49k
        logits right after a decode; GGML's top_k at the end of the decode graph cost more).
        None when the graph is read whole instead (embeddings, many output rows)."""
        graph = self._graph
        if not graph.picks:
            return None
        self._check()
        width = graph.width
        return best_lists(graph.rows()[row * width:(row + 1) * width], TOP_CANDIDATES)

    def logits(self) -> np.ndarray:
        """float32 ``(n_outputs, n_vocab)`` (or ``n_embd`` for embeddings)."""
        if not self._read:
            self._check()
            t0 = time.perf_counter_ns()
            self._graph.logits.read_into(self._graph.out)
            self._model.stats.read_ns += time.perf_counter_ns() - t0
            self._read = True
        return self._graph.out

    def _check(self) -> None:
        if self._model._epoch != self._epoch:
            raise RuntimeError("logits of a batch read after the model computed another one")


@dataclass(frozen=True)
class Prepared:
    """A batch placed in the cache with its graph ready, waiting for its token ids
    (:meth:`Model.prepare`, then :meth:`Model.execute`)."""

    graph: _Graph


#: built graphs a model keeps, the least recently used dropped first. A conversation that guesses
#: steps through ~8 batch sizes (1 row, and 4, 8, 12, 16, 20, 24 or 32 for a draft: each its own
#: graph) besides its prompt's chunks, and building one costs 2-5 ms (SmolLM2): with 4 kept, a
#: drafted 300-token rewrite built 19 graphs in ~100 ms, ~5% of its time; with 16, none after the
#: first answer. A graph's own memory is its node list (~6 MB reserved, less touched) and its
#: inputs: its tensors live in the one compute buffer every graph is placed in
MAX_GRAPHS = 16


# ---------------------------------------------------------------------------------------- model
class Model:
    """Base of every architecture: weights + backend + KV cache + graph execution."""

    def __init__(self, gguf: GGUFFile, weights: Weights, backend: GGMLBackend) -> None:
        self.gguf = gguf
        self.weights = weights
        self.backend = backend
        self._cache: Cache | None = None
        self.n_vocab = 0  # set by subclasses
        self.n_embd = 0
        self._graphs: OrderedDict[Hashable, _Graph] = OrderedDict()
        self.max_graphs = MAX_GRAPHS
        self.stats = ForwardStats()
        self._epoch = 0  # computes so far: an Outputs is readable while it is current
        self._closed = False

    # --- what a model writes ------------------------------------------------------------------
    def forward(self, ctx: GraphContext, batch: BatchInputs) -> GGMLTensor:
        """Build the graph of one batch; return the logits ``[n_vocab, n_outputs]`` (f32)."""
        raise NotImplementedError

    def shift(self, ctx: GraphContext, layer: int, key: GGMLTensor, delta: GGMLTensor) -> GGMLTensor:
        """Re-apply RoPE to cached keys ``key [head_dim, n_kv_heads, n]`` for position deltas
        ``delta`` (i32 ``[n]``) of layer ``layer``; used by the cache's context shift."""
        raise NotImplementedError

    def kv_layout(self) -> list[LayerShape]:
        """Per layer ``(head_dim, v_head_dim, kv_heads)`` of what the layer stores in the cache,
        so :meth:`init_cache` allocates all of it at once."""
        raise NotImplementedError

    def new_cache(self) -> Cache:
        """A fresh, uninitialised KV cache of the kind this architecture attends through: by
        default one causal cache for every layer, shifted by :meth:`shift`."""
        return CausalCache(shift=self.shift)

    # --- cache ----------------------------------------------------------------------------------
    @property
    def cache(self) -> Cache:
        """The KV cache (``RuntimeError`` before :meth:`init_cache`)."""
        if self._cache is None:
            raise RuntimeError("the model's cache is not initialised: call init_cache() first")
        return self._cache

    def init_cache(
        self, num_ctx: int, num_parallel: int = 1, num_batch: int = 512, kv_type: str = "f16"
    ) -> None:
        """Size the KV cache (Ollama's ``NewInputCache`` + ``reserveWorstCaseGraph``):
        ``num_ctx`` tokens in total, split over ``num_parallel`` sequences, batches of up to
        ``num_batch`` tokens. Allocates every layer's storage and the compute buffer for the
        worst-case batch now, so a context that does not fit fails here with
        :class:`ModelLoadError`."""
        per_seq = num_ctx // max(1, num_parallel)
        if per_seq < num_batch:
            raise ModelLoadError(
                f"kv size must be at least as large as batch size * parallel "
                f"(num_ctx {num_ctx}, num_batch {num_batch}, parallel {num_parallel})"
            )
        self.drop_graphs()
        if self._cache is not None:
            self._cache.close()
        cache = self._cache = self.new_cache()
        try:
            cache.init(self.backend, kv_type, num_parallel, per_seq, num_batch)
            cache.allocate(self.kv_layout())
        except MemoryError as e:
            cache.close()
            raise ModelLoadError(f"cannot allocate the KV cache for num_ctx {num_ctx}: {e}") from e
        self.reserve(num_batch, n_outputs=num_parallel)

    def reserve(self, n_tokens: int, n_outputs: int = 1, embeds: bool = False, decode: bool = False) -> int:
        """Build the worst-case graph (``n_tokens`` tokens attending to the whole cache; with
        ``embeds``, given embeddings instead of tokens: an image batch; with ``decode``, decoded
        tokens, every one an output: a step verifying a draft, whose graph is laid out otherwise)
        and size the compute buffer for it (the buffer only grows); returns the compute buffer's
        bytes."""
        n_outputs = n_tokens if decode else max(1, min(n_outputs, n_tokens))
        batch = Batch(
            tokens=[0] * n_tokens,
            positions=list(range(n_tokens)),
            sequences=[0] * n_tokens,
            outputs=list(range(n_tokens - n_outputs, n_tokens)),
            embeds=np.zeros((n_tokens, self.n_embd), dtype=np.float32) if embeds else None,
            decode=decode,
        )
        cache = self.cache
        try:
            cache.start_forward(None, batch, reserve=True)
            ctx = self.backend.new_context(decoded=decode)
            try:
                size = ctx.reserve(self.forward(ctx, self._inputs(ctx, batch)))
            finally:
                ctx.close()
        except (MemoryError, KvCacheError) as e:
            kv = cache.nbytes
            cache.close()
            raise ModelLoadError(
                f"cannot allocate the KV cache ({kv / 2**20:.0f} MiB so far) "
                f"and compute buffer for a {n_tokens}-token batch: {e}"
            ) from e
        log.info("reserved: KV cache %.1f MiB, compute buffer %.1f MiB", cache.nbytes / 2**20, size / 2**20)
        return size

    @property
    def memory_size(self) -> int:
        """Bytes this model holds besides its (memory-mapped) weights: KV cache and compute
        buffer."""
        kv = self._cache.nbytes if self._cache is not None else 0
        return kv + self.backend.compute_buffer_size

    # --- running --------------------------------------------------------------------------------
    def _inputs(self, ctx: GraphContext, batch: Batch) -> BatchInputs:
        n, n_out = len(batch.tokens), len(batch.outputs)
        outputs = None
        if n_out != n:
            outputs = ctx.input("outputs", np.asarray(batch.outputs, dtype=np.int32))
        given = batch.embeds is not None
        return BatchInputs(
            tokens=None if given else ctx.input("tokens", np.asarray(batch.tokens, dtype=np.int32)),
            positions=ctx.input("positions", np.asarray(batch.positions, dtype=np.int32)),
            outputs=outputs,
            n_tokens=n,
            n_outputs=n_out,
            embeddings=batch.embeddings,
            embeds=ctx.input("embeds", np.asarray(batch.embeds, dtype=np.float32)) if given else None,
        )

    def compute(self, batch: Batch) -> np.ndarray:
        """Run one batch: place it in the cache, build (or reuse) its graph, compute, and return
        the logits of ``batch.outputs`` as float32 ``(n_outputs, n_vocab)``.

        The returned array is reused by the next call with the same graph: copy it to keep it.
        Raises ``runner.kvcache.KvCacheFull`` when the cache has no room (nothing changed), and
        ``ValueError`` for a batch larger than ``num_batch`` (call :meth:`init_cache` first)."""
        return self.execute(self.prepare(batch), np.asarray(batch.tokens, dtype=np.int32)).logits()

    def prepare(self, batch: Batch) -> Prepared:
        """:meth:`compute`'s first half: place the batch in the cache and build (or reuse) its
        graph with every input but the token ids (``batch.tokens`` may hold placeholders). May
        run while the previous batch computes, once that one's inputs are uploaded; batches are
        then executed in the order they were prepared."""
        t0 = time.perf_counter_ns()
        cache = self.cache
        if len(batch.tokens) > cache.max_batch:
            raise ValueError(f"batch of {len(batch.tokens)} tokens, the cache was sized for {cache.max_batch}")
        cache.start_forward(None, batch, reserve=False)
        key = (len(batch.tokens), len(batch.outputs), batch.embeddings, batch.embeds is not None, batch.decode,
               cache.graph_key())
        graph = self._graphs.get(key)
        if graph is not None and graph.ctx.stale:  # placed in a compute buffer since replaced
            del self._graphs[key]
            graph.ctx.close()
            graph = None
        t1 = time.perf_counter_ns()
        if graph is None:
            graph = self._build(batch, key)
            t2 = time.perf_counter_ns()
            self.stats.builds += 1
            self.stats.build_ns += t2 - t1
        else:
            self._graphs.move_to_end(key)
            inputs = {"positions": np.asarray(batch.positions, dtype=np.int32), **cache.graph_inputs()}
            if len(batch.outputs) != len(batch.tokens):  # else the graph has no "outputs" input
                inputs["outputs"] = np.asarray(batch.outputs, dtype=np.int32)
            if batch.embeds is not None:
                inputs["embeds"] = np.asarray(batch.embeds, dtype=np.float32)
            graph.ctx.set_inputs(inputs)
            t2 = time.perf_counter_ns()
            self.stats.prepare_ns += t2 - t1
        self.stats.prepare_ns += t1 - t0
        return Prepared(graph)

    def execute(self, prepared: Prepared, tokens: np.ndarray, started: threading.Event | None = None) -> Outputs:
        """:meth:`compute`'s second half: set the token ids (int32 ``[n_tokens]``), compute, and
        return the :class:`Outputs` (the whole rows read now unless the sampler picks each row's
        best in place). ``started`` is set once the inputs are uploaded (the next
        :meth:`prepare` may begin). A batch of given embeddings has no token ids to set."""
        graph = prepared.graph
        t2 = time.perf_counter_ns()
        graph.ctx.set_inputs({"tokens": tokens})  # none for a batch of given embeddings
        graph.ctx.compute(*graph.outputs, started=started)
        self._epoch += 1
        t3 = time.perf_counter_ns()
        out = Outputs(self, graph, self._epoch, read=not graph.picks)
        if graph.read is not None:
            graph.read()  # the whole [n_vocab, n_outputs] f32 into the reused array
        t4 = time.perf_counter_ns()
        self.stats.calls += 1
        self.stats.compute_ns += t3 - t2
        self.stats.read_ns += t4 - t3
        return out

    @staticmethod
    def _picks(logits: GGMLTensor, batch: Batch) -> bool:
        """Whether the sampler picks each output row's best logits in place (:meth:`Outputs.top`)
        rather than reading them all: not for embeddings, a small vocabulary, many output rows."""
        width, rows = logits.dim(0), logits.dim(1)
        return not batch.embeddings and width > TOP_CANDIDATES and rows <= _TOP_ROWS and logits.is_contiguous()

    def _build(self, batch: Batch, key: Hashable) -> _Graph:
        ctx = self.backend.new_context(decoded=batch.decode)
        logits = self.forward(ctx, self._inputs(ctx, batch))
        width = self.n_embd if batch.embeddings else self.n_vocab
        if logits.dim(0) != width or logits.dim(1) != len(batch.outputs):
            ctx.close()
            raise RuntimeError(f"forward returned {logits.shape}, expected [{width}, {len(batch.outputs)}]")
        graph = _Graph(ctx, logits, np.empty((len(batch.outputs), width), dtype=np.float32), width=width)
        graph.picks = self._picks(logits, batch)
        graph.read = None if graph.picks else logits.reader(graph.out)
        self._graphs[key] = graph
        while len(self._graphs) > self.max_graphs:
            _, old = self._graphs.popitem(last=False)
            old.ctx.close()
        return graph

    def drop_graphs(self) -> None:
        """Forget the built graphs (they reference cache storage)."""
        for gr in self._graphs.values():
            gr.ctx.close()
        self._graphs.clear()

    def close(self) -> None:
        """Free graphs, cache, weights and backend."""
        if self._closed:
            return
        self._closed = True
        self.drop_graphs()
        if self._cache is not None:
            self._cache.close()
        self.weights.close()
        self.backend.close()
        self.gguf.close()
