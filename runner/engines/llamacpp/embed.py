"""The old engine's embedding lanes: a ``llama_context`` of their own.

The main context gives each slot one KV stream (``kv_unified`` off), and a stream holds one
sequence, so its slots cannot evaluate several independent inputs in one decode. This context
can: one unified KV buffer of ``num_ctx`` cells (a job's room) shared by up to ``max_lanes``
sequences, with outputs for every token. It is made at the first embedding, with the main
context's threads, flash attention and KV type, and costs about one slot's KV cache plus a
compute buffer for one embedding batch (128 tokens: ~25 MiB for SmolLM2). Its Q4_1 products go
to our kernels as the main context's do (its own :class:`~.graph_ops.GraphOps`; no attention is
taken: embeddings are never drafted).
"""

from __future__ import annotations

import logging

import llama_cpp as L
import numpy as np

from ...api import LoadError
from ...loop.slots import InputCache, Slot
from .graph_ops import GraphOps

log = logging.getLogger(__name__)


class EmbedContext:
    """:class:`runner.loop.embedding.EmbedLanes` over a llama.cpp context made for embeddings."""

    def __init__(self, model, base: L.llama_context_params, batch, *, num_ctx: int, num_batch: int,
                 max_lanes: int, n_embd: int, ops: GraphOps | None = None) -> None:
        """``base``: the main context's parameters; ``batch``: a ``_Batch`` of ``num_batch``
        tokens that this context fills; ``ops``: this context's eval callback state (closed with
        it), or None."""
        params = L.llama_context_params.from_buffer_copy(base)
        params.n_ctx = num_ctx
        params.n_batch = params.n_ubatch = num_batch
        params.n_seq_max = max_lanes
        params.kv_unified = True
        params.embeddings = True
        params.pooling_type = L.LLAMA_POOLING_TYPE_NONE  # every token's row: the loop averages them
        params.cb_eval = L.ggml_backend_sched_eval_callback()  # not the model context's (graph_ops.py)
        params.cb_eval_user_data = None
        self._ops = ops
        if ops is not None:
            ops.hook(params)
        self.max_lanes = max_lanes
        self._model = model
        self._params = params
        self._n_embd = n_embd
        self._batch = batch
        self._ctx = None
        self._mem = None

    def reserve(self, cache: InputCache) -> Slot | None:
        return None  # the lanes live in this context: the slots keep their caches

    def seq(self, lane: int) -> int:
        return lane

    def begin(self) -> None:
        if self._ctx is None:
            self._ctx = L.llama_init_from_model(self._model, self._params)
            if not self._ctx:
                self._ctx = None
                raise LoadError(f"cannot create a context of {self._params.n_ctx} tokens for embeddings")
            self._mem = L.llama_get_memory(self._ctx)
            log.info("embedding context: %d cells, %d lanes", self._params.n_ctx, self.max_lanes)
        self._batch.n = 0

    def add(self, tokens: list[int], pos: int, seq: int) -> int:
        return self._batch.add(tokens, pos, seq, len(tokens))

    def decode(self) -> None:
        self._batch.struct.n_tokens = self._batch.n
        rc = L.llama_decode(self._ctx, self._batch.struct)
        if self._ops is not None and self._ops.failed():  # asked after every decode (graph_ops.py)
            raise LoadError("llama_decode failed: out of memory for our kernels' rows")
        if rc != 0:
            raise LoadError(f"llama_decode failed with code {rc}")

    def rows(self, first: int, count: int) -> np.ndarray:
        out = np.empty((count, self._n_embd), dtype=np.float32)
        for k in range(count):
            ptr = L.llama_get_embeddings_ith(self._ctx, first + k)
            out[k] = np.ctypeslib.as_array(ptr, shape=(self._n_embd,))
        return out

    def forget(self, seq: int) -> None:
        if self._mem is not None:
            L.llama_memory_seq_rm(self._mem, seq, 0, -1)

    def close(self) -> None:
        if self._ctx is not None:
            L.llama_free(self._ctx)
            self._ctx = self._mem = None
        if self._ops is not None:
            self._ops.close()
            self._ops = None
