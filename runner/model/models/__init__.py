"""Model architectures of the new engine, and the machinery every model shares.

Public API::

    from runner.ml.backend import BackendOptions
    from runner.model.models import Batch, load

    model = load("SmolLM2-135M-Instruct.Q4_1.gguf", BackendOptions(num_threads=2))
    model.init_cache(num_ctx=4096, num_parallel=1, num_batch=512)   # + worst-case reservation
    logits = model.compute(Batch(tokens=[1, 2, 3], positions=[0, 1, 2], sequences=[0, 0, 0],
                                 outputs=[2]))                        # (1, n_vocab) float32
    model.cache.remove(seq=0, begin=1, end=2)                         # context shift (re-RoPE)
    model.close()

A model subclass (``llama.py``, ``qwen2.py``) only writes the math: :meth:`Model.forward` builds
the graph for one batch through ``runner.ml`` tensors, and :meth:`Model.shift` re-applies RoPE
to cached keys. :class:`Model` runs it: it owns the backend, the weights and the KV cache,
reserves the worst-case graph at load, and keeps a few built graphs so that a batch with the
same shape as an earlier one (every decode step inside one 256-cell block of history) only
uploads new inputs instead of rebuilding the graph.
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from runner.kvcache.cache import KvCacheError
from runner.kvcache.causal import CausalCache
from runner.ml.backend import BackendOptions
from runner.ml.ggml import bindings as g
from runner.ml.ggml.backend import GGMLBackend, GGMLTensor, GraphContext
from runner.model.gguf_weights import GGUFError, GGUFFile, Weights

log = logging.getLogger(__name__)

__all__ = [
    "Batch",
    "BatchInputs",
    "Model",
    "ModelLoadError",
    "attention",
    "load",
    "register",
]


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

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if n == 0 or len(self.positions) != n or len(self.sequences) != n:
            raise ValueError(
                f"bad batch: {n} tokens, {len(self.positions)} positions, {len(self.sequences)} sequences"
            )
        if len(self.outputs) == 0:
            raise ValueError("batch without outputs")

    @classmethod
    def sequence(cls, tokens: Sequence[int], start: int = 0, seq: int = 0, all_logits: bool = False) -> Batch:
        """A batch of consecutive ``tokens`` of one sequence from position ``start``; logits of
        the last token (or of all with ``all_logits``)."""
        n = len(tokens)
        return cls(
            tokens=list(tokens),
            positions=list(range(start, start + n)),
            sequences=[seq] * n,
            outputs=list(range(n)) if all_logits else [n - 1],
        )


@dataclass
class BatchInputs:
    """The graph's view of a :class:`Batch`: i32 input tensors ``tokens [n_tokens]``,
    ``positions [n_tokens]`` and ``outputs [n_outputs]`` (``None`` when every token is an
    output, so no row selection is needed)."""

    tokens: GGMLTensor
    positions: GGMLTensor
    outputs: GGMLTensor | None
    n_tokens: int
    n_outputs: int
    embeddings: bool = False


# ------------------------------------------------------------------------------------ attention
def attention(ctx: GraphContext, q: GGMLTensor, k: GGMLTensor, v: GGMLTensor, cache: Any, scale: float) -> GGMLTensor:
    """Attention through the KV cache (Ollama's ``nn.Attention``).

    ``q [head_dim, n_heads, n_tokens]``, ``k``/``v [head_dim, n_kv_heads, n_tokens]`` (RoPE
    already applied). Stores this batch's K/V (``cache.put``), then attends over the history
    the cache returns (``cache.get`` -> K, V, mask): ``softmax(scale * K^T Q + mask) V``.
    Returns ``[head_dim * n_heads, n_tokens]``."""
    cache.put(ctx, k, v)
    k, v, mask = cache.get(ctx)
    config = getattr(cache, "config", None)
    return scaled_dot_product_attention(
        q, k, v, mask, scale, flash=ctx.backend.flash_attention, v_permuted=bool(config and config.permuted_v)
    )


def scaled_dot_product_attention(
    q: GGMLTensor,
    k: GGMLTensor,
    v: GGMLTensor,
    mask: GGMLTensor | None,
    scale: float,
    *,
    flash: bool,
    v_permuted: bool = False,
) -> GGMLTensor:
    """``softmax(scale * K^T Q + mask) V`` per head, grouped-query (``n_heads`` a multiple of
    ``n_kv_heads``). ``q [d, n_heads, n_tokens]``, ``k [d, n_kv_heads, n_kv]``,
    ``v [d_v, n_kv_heads, n_kv]`` (or ``[n_kv, d_v, n_kv_heads]`` when ``v_permuted``),
    ``mask [n_kv, n_tokens]``. Returns ``[d_v * n_heads, n_tokens]``."""
    n_heads, n_tokens = q.dim(1), q.dim(2)
    q = q.permute(0, 2, 1, 3)  # [d, n_tokens, n_heads]
    k = k.permute(0, 2, 1, 3)  # [d, n_kv, n_kv_heads]
    if v_permuted:
        v_t = v  # [n_kv, d_v, n_kv_heads]
        v = v.permute(1, 0, 2, 3)  # [d_v, n_kv, n_kv_heads] (a view)
    else:
        v = v.permute(0, 2, 1, 3)  # [d_v, n_kv, n_kv_heads]
        v_t = None
    d_v = v.dim(0)
    if flash:
        out = q.flash_attention(k, v, mask, scale)  # [d_v, n_heads, n_tokens]
        return out.reshape(d_v * n_heads, n_tokens)
    scores = k.mulmat_f32(q).softmax(mask, scale)  # [n_kv, n_tokens, n_heads]
    if v_t is None:
        v_t = v.transpose().contiguous()  # [n_kv, d_v, n_kv_heads]
    out = v_t.mulmat(scores)  # [d_v, n_tokens, n_heads]
    return out.permute(0, 2, 1, 3).contiguous(d_v * n_heads, n_tokens)


# ---------------------------------------------------------------------------------------- model
@dataclass
class _Graph:
    ctx: GraphContext
    logits: GGMLTensor
    out: np.ndarray


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


class Model:
    """Base of every architecture: weights + backend + KV cache + graph execution."""

    #: architecture names (``general.architecture``) this class loads
    architectures: tuple[str, ...] = ()

    def __init__(self, gguf: GGUFFile, weights: Weights, backend: GGMLBackend) -> None:
        self.gguf = gguf
        self.weights = weights
        self.backend = backend
        self.cache: CausalCache = CausalCache(shift=self.shift)
        self.n_vocab = 0  # set by subclasses
        self.n_embd = 0
        self._graphs: OrderedDict[tuple, _Graph] = OrderedDict()
        self.max_graphs = 4
        self.stats = ForwardStats()
        self._closed = False

    # --- what a model writes ------------------------------------------------------------------
    def forward(self, ctx: GraphContext, batch: BatchInputs) -> GGMLTensor:
        """Build the graph of one batch; return the logits ``[n_vocab, n_outputs]`` (f32)."""
        raise NotImplementedError

    def shift(self, ctx: GraphContext, layer: int, key: GGMLTensor, delta: GGMLTensor) -> GGMLTensor:
        """Re-apply RoPE to cached keys ``key [head_dim, n_kv_heads, n]`` for position deltas
        ``delta`` (i32 ``[n]``) of layer ``layer``; used by the cache's context shift."""
        raise NotImplementedError

    def kv_layout(self) -> list[tuple[int, int, int]] | None:
        """Per layer ``(head_dim, v_head_dim, kv_heads)`` of what the layer stores in the cache,
        so :meth:`init_cache` allocates all of it at once; None: allocate on first use."""
        return None

    # --- cache ----------------------------------------------------------------------------------
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
        self.cache.close()
        try:
            self.cache.init(self.backend, kv_type, num_parallel, per_seq, num_batch)
            layout = self.kv_layout()
            if layout is not None:
                self.cache.allocate(layout)
        except MemoryError as e:
            self.cache.close()
            raise ModelLoadError(f"cannot allocate the KV cache for num_ctx {num_ctx}: {e}") from e
        self.reserve(num_batch, n_outputs=num_parallel)

    def reserve(self, n_tokens: int, n_outputs: int = 1) -> int:
        """Build the worst-case graph (``n_tokens`` tokens attending to the whole cache) and size
        the compute buffer for it; returns the compute buffer's bytes."""
        n_outputs = max(1, min(n_outputs, n_tokens))
        batch = Batch(
            tokens=[0] * n_tokens,
            positions=list(range(n_tokens)),
            sequences=[0] * n_tokens,
            outputs=list(range(n_tokens - n_outputs, n_tokens)),
        )
        try:
            self.cache.start_forward(None, batch, reserve=True)
            ctx = self.backend.new_context()
            try:
                logits = self.forward(ctx, self._inputs(ctx, batch))
                size = ctx.reserve(logits)
            finally:
                ctx.close()
        except (MemoryError, KvCacheError) as e:
            kv = getattr(self.cache, "nbytes", 0)
            cells = getattr(self.cache, "size", "?")
            self.cache.close()
            raise ModelLoadError(
                f"cannot allocate the KV cache ({cells} cells, {kv / 2**20:.0f} MiB so far) "
                f"and compute buffer for a {n_tokens}-token batch: {e}"
            ) from e
        log.info(
            "reserved: KV cache %.1f MiB, compute buffer %.1f MiB",
            getattr(self.cache, "nbytes", 0) / 2**20,
            size / 2**20,
        )
        return size

    # --- running --------------------------------------------------------------------------------
    def _inputs(self, ctx: GraphContext, batch: Batch) -> BatchInputs:
        n, n_out = len(batch.tokens), len(batch.outputs)
        outputs = None
        if n_out != n:
            outputs = ctx.input("outputs", np.asarray(batch.outputs, dtype=np.int32))
        return BatchInputs(
            tokens=ctx.input("tokens", np.asarray(batch.tokens, dtype=np.int32)),
            positions=ctx.input("positions", np.asarray(batch.positions, dtype=np.int32)),
            outputs=outputs,
            n_tokens=n,
            n_outputs=n_out,
            embeddings=batch.embeddings,
        )

    def compute(self, batch: Batch) -> np.ndarray:
        """Run one batch: place it in the cache, build (or reuse) its graph, compute, and return
        the logits of ``batch.outputs`` as float32 ``(n_outputs, n_vocab)``.

        The returned array is reused by the next call with the same graph: copy it to keep it.
        Raises ``runner.kvcache.KvCacheFull`` when the cache has no room (nothing changed), and
        ``ValueError`` for a batch larger than ``num_batch`` (call :meth:`init_cache` first)."""
        t0 = time.perf_counter_ns()
        cache = self.cache
        max_batch = getattr(cache, "max_batch", 0)
        if max_batch and len(batch.tokens) > max_batch:
            raise ValueError(f"batch of {len(batch.tokens)} tokens, the cache was sized for {max_batch}")
        cache.start_forward(None, batch, reserve=False)
        # caches without graph_key()/graph_inputs() (e.g. WrapperCache) get a fresh graph each time
        graph_key = getattr(cache, "graph_key", None)
        key = (len(batch.tokens), len(batch.outputs), batch.embeddings, graph_key()) if graph_key else None
        graph = self._graphs.get(key) if key is not None else None
        t1 = time.perf_counter_ns()
        if graph is None:
            graph = self._build(batch, key)
            t2 = time.perf_counter_ns()
            self.stats.builds += 1
            self.stats.build_ns += t2 - t1
        else:
            self._graphs.move_to_end(key)
            ctx = graph.ctx
            ctx.set_input("tokens", np.asarray(batch.tokens, dtype=np.int32))
            ctx.set_input("positions", np.asarray(batch.positions, dtype=np.int32))
            if ctx.has_input("outputs"):
                ctx.set_input("outputs", np.asarray(batch.outputs, dtype=np.int32))
            for name, data in self.cache.graph_inputs().items():
                if ctx.has_input(name):
                    ctx.set_input(name, data)
            t2 = time.perf_counter_ns()
            self.stats.prepare_ns += t2 - t1
        self.stats.prepare_ns += t1 - t0
        graph.ctx.compute(graph.logits)
        t3 = time.perf_counter_ns()
        # logits [n_vocab, n_outputs] f32, contiguous: copy straight into the reused array
        g.ggml_backend_tensor_get(graph.logits.ptr, graph.out.ctypes.data, 0, graph.out.nbytes)
        t4 = time.perf_counter_ns()
        self.stats.calls += 1
        self.stats.compute_ns += t3 - t2
        self.stats.read_ns += t4 - t3
        return graph.out

    def _build(self, batch: Batch, key: tuple | None) -> _Graph:
        ctx = self.backend.new_context()
        logits = self.forward(ctx, self._inputs(ctx, batch))
        width = self.n_embd if batch.embeddings else self.n_vocab
        if logits.dim(0) != width or logits.dim(1) != len(batch.outputs):
            raise RuntimeError(f"forward returned {logits.shape}, expected [{width}, {len(batch.outputs)}]")
        graph = _Graph(ctx, logits, np.empty((len(batch.outputs), width), dtype=np.float32))
        self._graphs[key if key is not None else ("once", id(ctx))] = graph
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
        self.cache.close()
        self.weights.close()
        self.backend.close()
        self.gguf.close()


# ------------------------------------------------------------------------------------- registry
_REGISTRY: dict[str, type[Model]] = {}


def register(cls: type[Model]) -> type[Model]:
    """Class decorator: make ``cls`` the loader of its ``architectures``."""
    for arch in cls.architectures:
        _REGISTRY[arch] = cls
    return cls


def _ensure_registered() -> None:
    from . import llama, qwen2  # noqa: F401  (registration side effect)


def supported_architectures() -> list[str]:
    _ensure_registered()
    return sorted(_REGISTRY)


def load(path: str | os.PathLike[str], options: BackendOptions | None = None) -> Model:
    """Open the GGUF at ``path``, map its weights, and build the model of its architecture.

    Raises :class:`ModelLoadError` (unsupported architecture, missing tensor, bad file)."""
    _ensure_registered()
    try:
        gguf = GGUFFile.open(path)
    except GGUFError as e:
        raise ModelLoadError(str(e)) from e
    cls = _REGISTRY.get(gguf.arch)
    if cls is None:
        gguf.close()
        raise ModelLoadError(
            f"unsupported architecture {gguf.arch!r} for the new engine "
            f"(supported: {', '.join(sorted(_REGISTRY))})"
        )
    weights = gguf.load_weights()
    backend = GGMLBackend(options)
    try:
        return cls(gguf, weights, backend)
    except (GGUFError, KeyError, ValueError) as e:
        weights.close()
        backend.close()
        gguf.close()
        raise ModelLoadError(f"{path}: {e}") from e
