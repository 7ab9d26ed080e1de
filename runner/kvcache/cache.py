"""The KV cache contract of the new engine (Ollama's ``kvcache/cache.go``).

A model's attention layers talk to a :class:`Cache`: the runner calls :meth:`Cache.start_forward`
once per batch, then each layer calls :meth:`Cache.set_layer`, :meth:`Cache.put` (this batch's
K/V) and :meth:`Cache.get` (the history to attend to, with its mask). Between batches the runner's
InputCache manages sequences with :meth:`Cache.copy_prefix`, :meth:`Cache.can_resume` and
:meth:`Cache.remove`, and the prompt store keeps whole sequences outside the cache with
:meth:`Cache.export_seq` and :meth:`Cache.import_seq`.

Positions are token positions inside one sequence (0-based); sequences are small ints (the slot
id). Tensors follow GGML's dimension order (fastest-varying first), as in Ollama:
K and V of a batch are ``[head_dim, kv_heads, n_batch]``; the history returned by ``get`` is
``[head_dim, kv_heads, n_history]`` and the mask ``[n_history, n_batch]`` (so, seen from NumPy
in row-major order, ``(n_batch, n_history)``: row i = batch token i).

This module names the tensor/backend/context types as ``Any``; of the tensor layer it uses only
:class:`runner.ml.CacheConfig`, the layout a backend wants its cache in.
"""

from __future__ import annotations

from typing import Any, Hashable, Protocol, Sequence, runtime_checkable

import numpy as np

from runner.ml.backend import CacheConfig

__all__ = [
    "Batch",
    "Cache",
    "KvCacheError",
    "LayerShape",
    "KvCacheFull",
    "NotSupported",
]


# --------------------------------------------------------------------------------------- errors
class KvCacheError(Exception):
    """Base class of the cache's errors (internal to the engine; the runner turns them into
    reprocessing, a shorter batch, or a :class:`runner.api.PollamaError`)."""


class KvCacheFull(KvCacheError):
    """No free cell is left for a token of the batch (Go's ``ErrKvCacheFull``).

    The runner's batch formation keeps each sequence inside its context, so this means the
    batch was too big for what is free; nothing was written when it is raised.
    """

    MESSAGE = "could not find a kv cache slot"

    def __init__(self, detail: str = "") -> None:
        super().__init__(f"{self.MESSAGE} ({detail})" if detail else self.MESSAGE)


class NotSupported(KvCacheError):
    """The operation cannot be done by this cache (Go's ``ErrNotSupported``): e.g. a shift on a
    model without a shift function, or on cells shared by several sequences. The caller then
    drops the whole sequence (``remove(seq, 0, None)``) and reprocesses its inputs."""


#: What one layer stores: ``(head_dim, v_head_dim, kv_heads)``; ``kv_heads`` 0 means nothing.
LayerShape = tuple[int, int, int]


# ---------------------------------------------------------------------------------------- batch
@runtime_checkable
class Batch(Protocol):
    """What a cache needs of a batch (Go's ``input.Batch``): one entry per token, in batch order."""

    @property
    def positions(self) -> Sequence[int]: ...

    @property
    def sequences(self) -> Sequence[int]: ...

    @property
    def causal_except(self) -> Sequence[int]:
        """Batch indices that also see the later positions of their sequence in the batch (an
        image's rows, non-causal among themselves); empty for an all-causal batch."""
        ...


# ---------------------------------------------------------------------------------------- cache
class Cache(Protocol):
    """A KV cache shared by all layers of one model (Go's ``kvcache.Cache``)."""

    def set_layer(self, layer: int) -> None:
        """Select the layer that the next :meth:`get` / :meth:`put` act on (0-based).

        Called by every attention layer before it touches the cache, in any order."""
        ...

    def get(self, ctx: Any) -> tuple[Any, Any, Any]:
        """Return ``(k, v, mask)`` for the current layer and batch.

        ``k`` is a view ``[head_dim, kv_heads, n_history]`` over the cells this batch may see
        (``n_history`` is a multiple of ``cache_padding``); ``v`` is the same, or
        ``[n_history, v_head_dim, kv_heads]`` when ``permuted_v``; ``mask`` is
        ``[n_history, n_batch]`` of 0 / -inf in ``mask_dtype``. Only valid after :meth:`put` of the
        same layer in the same forward pass (a layer's storage is allocated on its first put)."""
        ...

    def put(self, ctx: Any, k: Any, v: Any) -> None:
        """Store this batch's keys and values for the current layer.

        ``k`` is ``[head_dim, kv_heads, n_batch]``, ``v`` is ``[v_head_dim, kv_heads, n_batch]``;
        token i goes to the cell chosen for it by :meth:`start_forward`. ``n_batch`` must equal the
        batch given to :meth:`start_forward` (a mismatch is a programming error: ``ValueError``)."""
        ...

    def set_config(self, config: CacheConfig) -> None:
        """Override the backend's :class:`CacheConfig` (models that need a special layout).

        Must come before :meth:`init`; setting it twice raises ``RuntimeError``."""
        ...

    def init(
        self, backend: Any, dtype: str, max_sequences: int, capacity: int, max_batch: int
    ) -> None:
        """Size the cache: ``max_sequences`` parallel sequences of up to ``capacity`` tokens each,
        batches of at most ``max_batch`` tokens, K/V stored as ``dtype`` (``"f16"``, ``"q8_0"``,
        ``"q4_0"``, ``"f32"``). Takes the :class:`CacheConfig` from the backend unless
        :meth:`set_config` gave one. Storage is allocated lazily, per layer, on first :meth:`put`."""
        ...

    def allocate(self, layers: Sequence[LayerShape]) -> None:
        """Allocate the storage of every layer now (after :meth:`init`), ``layers[i]`` being what
        layer ``i`` stores, so a cache that does not fit fails here (``MemoryError``, nothing
        kept) instead of on a later batch. A cache that holds only some layers (one half of a
        :class:`~runner.kvcache.wrapper.WrapperCache`) allocates only those."""
        ...

    def close(self) -> None:
        """Free all storage. The cache is unusable afterwards; calling it twice is harmless."""
        ...

    @property
    def config(self) -> CacheConfig:
        """The layout in effect (after :meth:`init`): attention reads V as ``permuted_v`` says,
        the mask comes in ``mask_dtype``. ``RuntimeError`` before :meth:`init`."""
        ...

    @property
    def max_batch(self) -> int:
        """The most tokens one batch may have (the ``max_batch`` given to :meth:`init`)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes of K/V storage allocated so far."""
        ...

    def graph_key(self) -> Hashable:
        """What a compute graph built for the current batch depends on besides the batch's size
        (after :meth:`start_forward`). Two batches with equal keys can run one graph, only with
        different :meth:`graph_inputs`; a graph built before :meth:`close` never matches again."""
        ...

    def graph_inputs(self) -> dict[str, np.ndarray]:
        """The current batch's data for the named graph inputs this cache adds to a graph (cell
        indices, mask), to re-run a graph built for an earlier batch with an equal key."""
        ...

    def start_forward(self, ctx: Any, batch: Batch, reserve: bool) -> None:
        """Prepare for one forward pass over ``batch`` (called before the model's forward).

        Not ``reserve``: slide SWA windows, pick a free cell for every token, record the tokens'
        positions and sequences there, and build the mask. Raises :class:`KvCacheFull` (and
        changes nothing) when there are not enough free cells.

        ``reserve``: only shape the graph for the worst case (memory reservation): nothing is
        recorded, tokens go to cells ``0..n-1`` and the history covers the whole cache."""
        ...

    def copy_prefix(self, src_seq: int, dst_seq: int, length: int) -> None:
        """Make ``dst_seq`` hold exactly the entries of ``src_seq`` at positions ``[0, length)``.

        Whatever ``dst_seq`` held before is dropped. Zero-copy: the cells become shared by both
        sequences."""
        ...

    def can_resume(self, seq: int, pos: int) -> bool:
        """Whether ``seq`` can continue by processing position ``pos`` next, keeping its entries at
        positions ``< pos``. Always true for a full-history cache; a sliding-window cache says no
        when the window of ``pos`` needs entries it has already dropped."""
        ...

    def remove(self, seq: int, begin: int, end: int | None) -> None:
        """Drop ``seq``'s entries at positions ``[begin, end)``; ``end=None`` means to the end.

        Entries after ``end`` move down by ``end - begin`` positions (keys re-RoPEd), so the
        sequence stays contiguous. Raises :class:`NotSupported` when that shift is impossible
        (no shift function, or cells shared with another sequence); the caller must then
        ``remove(seq, 0, None)`` and reprocess. Removing to the end never shifts."""
        ...

    # The prompt store's side (issue 25): a sequence's entries copied out of the cache and back.
    # Both run between forward passes, on the thread that runs them (no graph computes meanwhile).

    @property
    def state_layout(self) -> str:
        """What a state of :meth:`export_seq` is tied to, in one string: the format
        (:mod:`runner.kvcache.snapshot`) and its version, the dtype, the V layout, the window
        (after :meth:`init`). Two loads of one model whose caches have equal strings read each
        other's states; "" when this cache cannot export."""
        ...

    def export_seq(self, seq: int, start: int = 0) -> bytes | bytearray | memoryview:
        """A host copy of everything ``seq`` holds: per cell its position, per layer the K and V
        rows as stored (the cache's dtype, quantized blocks as they are), in the format of
        :mod:`runner.kvcache.snapshot`. A sequence that holds nothing gives an empty state (which
        imports as an empty sequence). Changes nothing in the cache. The copy is the caller's
        while it holds a reference (a cache may reuse the buffer of an export nothing
        references any more). ``start`` > 0: only the positions from ``start`` on, in a buffer
        of their own (the prompt store's new pages); a cache whose state is not one row per
        position (a sliding window's wrapper) raises :class:`NotSupported`."""
        ...

    def import_seq(self, seq: int, data: bytes | bytearray | memoryview) -> bool:
        """Make ``seq`` hold exactly what ``data`` (an :meth:`export_seq` of a cache with this
        :attr:`state_layout`) holds: the same positions and the same K/V bytes, so a sequence
        continues as the exported one would have. Each entry goes back to the cell it was
        exported from when all those cells are free (the same cells in the same order: the
        same logits, bit for bit, for the same batches), else to the lowest free cells in
        position order (where a recompute from an empty sequence puts them).

        ``seq`` is emptied first. False, with ``seq`` empty and no other sequence touched, when
        ``data`` is refused: truncated or padded, another format or geometry (dtype, V layout,
        layers, head sizes), positions out of order, or more entries than free cells (the
        state carries no checksum: the prompt store's files carry theirs). Never half-restored."""
        ...
