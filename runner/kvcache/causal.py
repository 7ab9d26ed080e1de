"""The causal KV cache, tensor side (Ollama's ``kvcache/causal.go``).

:class:`CellTable` (``cells.py``) decides where tokens go and what each batch may see; this class
applies its plans to GGML storage:

- per layer, K and V storage ``[head_dim, kv_heads, n_cells]`` in the cache dtype (f16 by
  default), allocated on the layer's first :meth:`CausalCache.put`; with ``permuted_v`` (the
  non-flash-attention layout) V is stored transposed, ``[n_cells, v_head_dim, kv_heads]``, so
  attention multiplies by it without a copy;
- :meth:`~CausalCache.put`: ``set_rows`` scatter of the batch's K/V into the cells chosen by the
  plan (``locs``), so no contiguous free block is needed (permuted V: one element per row);
- :meth:`~CausalCache.get`: views over the plan's cell range ``[start, start+length)`` plus the
  mask (an input of the graph, ``[length, n_batch]``);
- :meth:`~CausalCache.remove`: the table renumbers the later cells; here their keys are
  re-rotated by the model's ``shift`` function (RoPE by the position delta), one graph per chunk
  of at most ``max_batch`` cells.

Graph reuse: the inputs this cache adds to a graph (cell indices and mask) are *named* inputs,
so a graph built once for a shape (:meth:`graph_key`) can run again with the data of a later
batch (:meth:`graph_inputs`). That keeps decoding from rebuilding the graph every token.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Sequence

import numpy as np

from . import snapshot
from .cache import Batch, CacheConfig, KvCacheError, LayerShape, NotSupported
from .cells import CellTable, ForwardPlan, ShiftPlan, cache_geometry

log = logging.getLogger(__name__)

__all__ = ["CausalCache", "ShiftFn"]

#: ``shift(ctx, layer, key, delta) -> key'``: re-apply RoPE to ``key [head_dim, kv_heads, n]``
#: (a view of the storage, bound to ``ctx``) for per-cell position deltas ``delta`` (i32 ``[n]``).
ShiftFn = Callable[[Any, int, Any, Any], Any]

_KV_DTYPES = ("f16", "f32", "q8_0", "q4_0")
_instance_counter = 0


def _next_prefix() -> str:
    global _instance_counter
    _instance_counter += 1
    return f"kv{_instance_counter}"


class CausalCache:
    """A causal (optionally sliding-window or chunked) KV cache over GGML storage.

    Implements ``runner.kvcache.cache.Cache``."""

    def __init__(
        self,
        shift: ShiftFn | None = None,
        *,
        swa_window: int = 0,
        swa_memory: int = 0,
        chunk_size: int = 0,
    ) -> None:
        """``shift`` is the model's RoPE re-application (``None``: context shift unsupported,
        :meth:`remove` in the middle raises :class:`NotSupported`). ``swa_window`` > 0 makes a
        sliding-window cache (``swa_memory``: how much history to keep, default the window);
        ``chunk_size`` > 0 chunked attention."""
        self.shift_fn = shift
        self.swa_window = swa_window
        self.swa_memory = swa_memory
        self.chunk_size = chunk_size
        self._config: CacheConfig | None = None
        self._config_set = False
        self.backend: Any = None
        self.dtype = "f16"
        self.table: CellTable | None = None
        self.max_batch = 0
        self.max_sequences = 0
        self.capacity = 0
        self.layer = 0
        self._prefix = _next_prefix()
        self._storage: dict[int, Any] = {}  # layer -> Storage with "k" and "v"
        self._keys: dict[int, Any] = {}
        self._values: dict[int, Any] = {}
        self._plan: ForwardPlan | None = None
        self._element_base: dict[int, np.ndarray] = {}  # width -> arange(width) * size
        self._v_widths: list[int] | None = None
        self._generation = 0  # bumped when storage is freed: graphs built before must not run
        self._exported = bytearray()  # the last export's buffer: the next export reuses it if free

    # ----------------------------------------------------------------------------- configuration
    @property
    def config(self) -> CacheConfig:
        """See ``Cache.config``."""
        if self._config is None:
            raise RuntimeError("cache used before init()")
        return self._config

    def set_config(self, config: CacheConfig) -> None:
        """See ``Cache.set_config``."""
        if self._config_set:
            raise RuntimeError("cache config set twice")
        self._config = config
        self._config_set = True

    def init(self, backend: Any, dtype: str, max_sequences: int, capacity: int, max_batch: int) -> None:
        """See ``Cache.init``. ``dtype`` ``q8_0``/``q4_0`` needs flash attention: with
        ``permuted_v`` (the non-FA layout) V is scattered one element per row, which a quantized
        type cannot hold: ValueError (the load plan falls back to f16 before asking)."""
        if dtype not in _KV_DTYPES:
            raise ValueError(f"unsupported KV cache type {dtype!r} (one of {', '.join(_KV_DTYPES)})")
        if self._config is None:
            self._config = backend.cache_config()
        if dtype not in ("f16", "f32") and self._config.permuted_v:
            raise ValueError(f"KV cache type {dtype} needs flash attention (V not permuted): "
                             "runner.loading.plan.kv_cache_type decides the type a load uses")
        self.backend = backend
        self.dtype = dtype
        self._element_base = {}
        self.max_batch = max_batch
        self.max_sequences = max_sequences
        self.capacity = capacity
        geo = cache_geometry(
            max_sequences,
            capacity,
            max_batch,
            padding=self._config.cache_padding,
            swa_window=self.swa_window,
            swa_memory=self.swa_memory,
        )
        self.table = CellTable(
            geo.size,
            padding=self._config.cache_padding,
            swa_window=geo.swa_window or 0,
            swa_memory=geo.swa_memory or 0,
            chunk_size=self.chunk_size,
            in_order=self._config.cells_in_order,
        )

    @property
    def size(self) -> int:
        """Number of cells."""
        return self._table().size

    @property
    def nbytes(self) -> int:
        """Bytes of K/V storage allocated so far."""
        return sum(s.nbytes for s in {id(s): s for s in self._storage.values()}.values())

    def allocate(self, layers: Sequence[LayerShape]) -> None:
        """See ``Cache.allocate``: every layer's K and V in one buffer (``kv_heads`` 0: nothing
        for that layer). The whole size is known before anything is allocated, so a cache that
        does not fit fails here with nothing kept, instead of layer by layer on the first batch."""
        if self._storage:
            raise RuntimeError("cache storage allocated twice")
        n = self.size
        permuted = self._config is not None and self._config.permuted_v
        specs = []
        for layer, (head_dim, v_head_dim, kv_heads) in enumerate(layers):
            if kv_heads:
                v_shape = (n, v_head_dim, kv_heads) if permuted else (v_head_dim, kv_heads, n)
                specs.append((f"cache_k_l{layer}", self.dtype, (head_dim, kv_heads, n)))
                specs.append((f"cache_v_l{layer}", self.dtype, v_shape))
        if not specs:
            return
        storage = self.backend.new_storage(specs)
        self._v_widths = None
        for layer, (_, _, kv_heads) in enumerate(layers):
            if kv_heads:
                self._storage[layer] = storage
                self._keys[layer] = storage.tensors[f"cache_k_l{layer}"]
                self._values[layer] = storage.tensors[f"cache_v_l{layer}"]

    def close(self) -> None:
        """See ``Cache.close``."""
        for s in self._storage.values():
            s.close()
        self._generation += 1
        self._storage.clear()
        self._keys.clear()
        self._values.clear()
        self._v_widths = None
        self._plan = None

    def _table(self) -> CellTable:
        if self.table is None:
            raise RuntimeError("cache used before init()")
        return self.table

    # ------------------------------------------------------------------------------ forward pass
    def set_layer(self, layer: int) -> None:
        """See ``Cache.set_layer``."""
        self.layer = layer

    def start_forward(self, ctx: Any, batch: Batch, reserve: bool) -> None:
        """See ``Cache.start_forward``. ``ctx`` is not used here: the locations and mask become
        graph inputs when a layer first calls :meth:`put`/:meth:`get` in a graph."""
        self._plan = self._table().start_forward(batch.positions, batch.sequences, reserve=reserve,
                                                 causal_except=batch.causal_except)

    @property
    def plan(self) -> ForwardPlan:
        if self._plan is None:
            raise RuntimeError("put/get before start_forward")
        return self._plan

    def graph_key(self) -> tuple[int, int, int, int]:
        """What a graph built for the current batch depends on: ``(storage generation, start,
        length, n_batch)``. Two batches with equal keys can share one graph (only input data
        differ); a graph built before :meth:`close` never matches again."""
        p = self.plan
        return (self._generation, p.start, p.length, p.n_batch)

    def graph_inputs(self) -> dict[str, np.ndarray]:
        """The current batch's data for this cache's graph inputs (by name)."""
        p = self.plan
        inputs = {f"{self._prefix}.locs": p.locs_array, f"{self._prefix}.mask": p.mask}
        if self._config is not None and self._config.permuted_v:
            if self._v_widths is None:  # the layers' V row widths, read once from the storage
                self._v_widths = sorted({v.dim(1) * v.dim(2) for v in self._values.values()})
            for width in self._v_widths:
                inputs[f"{self._prefix}.vlocs{width}"] = self._element_locs(width)
        return inputs

    def _element_locs(self, width: int) -> np.ndarray:
        """For permuted V: the flat index of every element of this batch's V rows. Storage
        ``[n_cells, v_head_dim, kv_heads]`` seen as ``[1, n]``: element ``e`` of the V vector of
        the token stored in cell ``c`` lives at ``e * n_cells + c``."""
        base = self._element_base.get(width)
        if base is None:
            base = self._element_base[width] = np.arange(width, dtype=np.int64) * self.size
        locs = self.plan.locs
        if len(locs) == 1:
            return base + locs[0]
        return (base[None, :] + np.array(locs, dtype=np.int64)[:, None]).ravel()

    def _locs(self, ctx: Any) -> Any:
        return ctx.input(f"{self._prefix}.locs", self.plan.locs_array)

    def _mask(self, ctx: Any) -> Any:
        assert self._config is not None
        return ctx.input(f"{self._prefix}.mask", self.plan.mask, dtype=self._config.mask_dtype)

    def put(self, ctx: Any, k: Any, v: Any) -> None:
        """See ``Cache.put``: ``k [head_dim, kv_heads, n_batch]``, ``v [v_head_dim, kv_heads,
        n_batch]``, scattered into the planned cells with ``set_rows``."""
        head_dim, kv_heads, n_batch = k.dim(0), k.dim(1), k.dim(2)
        v_head_dim = v.dim(0)
        if n_batch != self.plan.n_batch or v.dim(2) != n_batch:
            raise ValueError(
                f"inconsistent batch sizes (layer {self.layer}: put {n_batch}, "
                f"batch {self.plan.n_batch})"
            )
        keys, values = self._layer_storage(head_dim, v_head_dim, kv_heads)
        locs = self._locs(ctx)
        n_cells = self.size
        ctx.forward(
            keys.on(ctx)
            .reshape(head_dim * kv_heads, n_cells)
            .set_rows(k.reshape(head_dim * kv_heads, n_batch), locs)
        )
        width = v_head_dim * kv_heads
        if self._config is not None and self._config.permuted_v:
            # one "row" per element: V lands transposed, [n_cells, v_head_dim, kv_heads]
            vlocs = ctx.input(f"{self._prefix}.vlocs{width}", self._element_locs(width))
            ctx.forward(
                values.on(ctx).reshape(1, width * n_cells).set_rows(v.reshape(1, width * n_batch), vlocs)
            )
        else:
            ctx.forward(values.on(ctx).reshape(width, n_cells).set_rows(v.reshape(width, n_batch), locs))

    def get(self, ctx: Any) -> tuple[Any, Any, Any]:
        """See ``Cache.get``: views ``[head_dim, kv_heads, length]`` of K and V (permuted V:
        ``[length, v_head_dim, kv_heads]``) over the plan's cell range, and the mask
        ``[length, n_batch]``."""
        keys = self._keys.get(self.layer)
        values = self._values.get(self.layer)
        if keys is None or values is None:
            raise RuntimeError(f"get before put on layer {self.layer}")
        p = self.plan
        k = keys.on(ctx).view(
            keys.stride(2) * p.start, (keys.dim(0), keys.dim(1), p.length), (keys.stride(1), keys.stride(2))
        )
        if self._config is not None and self._config.permuted_v:  # [n_cells, v_head_dim, kv_heads]
            v = values.on(ctx).view(
                values.stride(0) * p.start,
                (p.length, values.dim(1), values.dim(2)),
                (values.stride(1), values.stride(2)),
            )
        else:
            v = values.on(ctx).view(
                values.stride(2) * p.start,
                (values.dim(0), values.dim(1), p.length),
                (values.stride(1), values.stride(2)),
            )
        return k, v, self._mask(ctx)

    def _layer_storage(self, head_dim: int, v_head_dim: int, kv_heads: int) -> tuple[Any, Any]:
        keys = self._keys.get(self.layer)
        if keys is None:
            n = self.size
            permuted = self._config is not None and self._config.permuted_v
            v_shape = (n, v_head_dim, kv_heads) if permuted else (v_head_dim, kv_heads, n)
            storage = self.backend.new_storage(
                [
                    (f"cache_k_l{self.layer}", self.dtype, (head_dim, kv_heads, n)),
                    (f"cache_v_l{self.layer}", self.dtype, v_shape),
                ]
            )
            self._storage[self.layer] = storage
            self._v_widths = None
            keys = self._keys[self.layer] = storage.tensors[f"cache_k_l{self.layer}"]
            self._values[self.layer] = storage.tensors[f"cache_v_l{self.layer}"]
        elif keys.dim(0) != head_dim or keys.dim(1) != kv_heads:
            raise ValueError(f"layer {self.layer}: K shape changed from {keys.shape}")
        return keys, self._values[self.layer]

    def layer_tensors(self, layer: int) -> tuple[Any, Any] | None:
        """``(keys, values)`` storage of ``layer`` (``None`` before its first put); for tests."""
        k = self._keys.get(layer)
        return None if k is None else (k, self._values[layer])

    # ------------------------------------------------------------------------------- sequences
    def copy_prefix(self, src_seq: int, dst_seq: int, length: int) -> None:
        """See ``Cache.copy_prefix`` (shares cells; no data moves)."""
        self._table().copy_prefix(src_seq, dst_seq, length)

    def can_resume(self, seq: int, pos: int) -> bool:
        """See ``Cache.can_resume``."""
        return self._table().can_resume(seq, pos)

    # ------------------------------------------------------------------------ export and import
    @property
    def state_layout(self) -> str:
        """See ``Cache.state_layout``: the format, the dtype, the V layout and the window."""
        window = f" swa={self.swa_window}" if self.swa_window else ""
        return f"{snapshot.FORMAT} {self.dtype} {'v-permuted' if self.config.permuted_v else 'v'}{window}"

    def geometry(self) -> snapshot.Geometry:
        """What this cache's states hold per cell: the allocated layers' rows."""
        layers = []
        for layer in sorted(self._keys):
            keys, values = self._keys[layer], self._values[layer]
            head_dim, kv_heads = keys.dim(0), keys.dim(1)
            if self.config.permuted_v:  # [n_cells, v_head_dim, kv_heads]
                v_head_dim, v_row = values.dim(1), values.dim(1) * values.dim(2) * values.stride(0)
            else:  # [v_head_dim, kv_heads, n_cells]
                v_head_dim, v_row = values.dim(0), values.stride(2)
            layers.append(snapshot.LayerRows(layer, head_dim, kv_heads, v_head_dim, keys.stride(2), v_row))
        return snapshot.Geometry(self.dtype, self.config.permuted_v, tuple(layers))

    def export_seq(self, seq: int, start: int = 0) -> bytearray | memoryview:
        """See ``Cache.export_seq``: the rows are read run by run of consecutive cells (permuted
        V: the cells' columns of every element row, where the storage lies)."""
        table = self._table()
        cells = np.asarray(table.seq_cells(seq), dtype=np.int64)
        positions = np.asarray(table.seq_positions(seq), dtype=np.int64)
        order = np.argsort(positions, kind="stable")
        cells, positions = cells[order], positions[order]
        if start:
            keep = positions >= start
            cells, positions = cells[keep], positions[keep]
        geometry = self.geometry()
        # the last export's buffer when nothing references it any more (the store kept its
        # pages, as copies; a caller that holds it keeps it): first-touch page faults of a new
        # 50 MB buffer cost more than filling it. A part from ``start`` on gets its own: the
        # store keeps it as it is
        size = snapshot.size(geometry, len(cells))
        if not start and (len(self._exported) < size or sys.getrefcount(self._exported) > 2):
            self._exported = bytearray(size + size // 8)  # room to grow by a turn or two
        out = snapshot.Writer(geometry, positions, cells, None if start else self._exported)
        for i, rows in enumerate(geometry.layers):
            keys, values = self._keys[rows.layer], self._values[rows.layer]
            _read_rows(keys, cells, out.k_rows(i))
            if self.config.permuted_v:
                _read_columns(values, cells, out.v_rows(i))
            else:
                _read_rows(values, cells, out.v_rows(i))
        return out.finish()

    def import_seq(self, seq: int, data: bytes | bytearray | memoryview) -> bool:
        """See ``Cache.import_seq``: the state is read and checked whole before any cell is
        taken; the rows are written run by run of consecutive cells (permuted V: into the chosen
        cells' columns of every element row)."""
        table = self._table()
        table.restore(seq, ())  # empty it first, whatever follows
        try:
            state = snapshot.read(data)
        except snapshot.SnapshotError as err:
            log.warning("KV state of sequence %d refused: %s", seq, err)
            return False
        if state.geometry != self.geometry():
            log.warning("KV state of sequence %d refused: another cache geometry (%s %s, %d layers)", seq,
                        state.geometry.dtype, "v-permuted" if state.geometry.permuted_v else "v",
                        len(state.geometry.layers))
            return False
        try:
            cells = np.asarray(table.restore(seq, state.positions, state.cells), dtype=np.int64)
        except KvCacheError as err:
            log.warning("KV state of sequence %d refused: %s", seq, err)
            return False
        for i, rows in enumerate(state.geometry.layers):
            keys, values = self._keys[rows.layer], self._values[rows.layer]
            _write_rows(keys, cells, state.k_rows(i))
            if self.config.permuted_v:
                _write_columns(values, cells, state.v_rows(i))
            else:
                _write_rows(values, cells, state.v_rows(i))
        return True

    def remove(self, seq: int, begin: int, end: int | None) -> None:
        """See ``Cache.remove``: the later cells' keys are re-RoPEd by ``begin - end``."""
        plan = self._table().remove(seq, begin, end)
        if not plan:
            return
        if self.shift_fn is None:
            raise NotSupported("the model cannot shift its cache (no shift function)")
        self._shift(plan)

    def _shift(self, plan: ShiftPlan) -> None:
        """Re-rotate the keys of ``plan.cells`` in every allocated layer."""
        if not self._keys:
            return
        assert self.shift_fn is not None
        for chunk in plan.chunks(max(1, self.max_batch)):
            ctx = self.backend.new_context()
            try:
                n = len(chunk.offsets)
                delta = ctx.input(f"{self._prefix}.shift", chunk.offsets)
                for layer, keys in self._keys.items():
                    view = keys.on(ctx).view(
                        keys.stride(2) * chunk.start,
                        (keys.dim(0), keys.dim(1), n),
                        (keys.stride(1), keys.stride(2)),
                    )
                    src = view if self.dtype in ("f16", "f32") else view.cast("f32")
                    rotated = self.shift_fn(ctx, layer, src, delta)
                    if rotated is None:
                        raise NotSupported("the model cannot shift its cache")
                    ctx.forward(rotated.copy(view))
                ctx.compute()
            except KvCacheError:
                raise
            finally:
                ctx.close()


# ------------------------------------------------------------------------------- row copies
def _runs(cells: np.ndarray) -> list[tuple[int, int, int]]:
    """``cells`` split into runs of consecutive cell indices: ``(first index in cells, first
    cell, length)`` each."""
    if len(cells) == 0:
        return []
    breaks = np.flatnonzero(np.diff(cells) != 1) + 1
    starts = [0, *breaks.tolist()]
    ends = [*breaks.tolist(), len(cells)]
    return [(a, int(cells[a]), b - a) for a, b in zip(starts, ends)]


def _read_rows(storage: Any, cells: np.ndarray, out: np.ndarray) -> None:
    """Row ``cells[i]`` of ``storage`` (``[..., n_cells]``, one contiguous row a cell) into
    ``out[i]`` (uint8 ``(len(cells), row)``)."""
    row = out.shape[1]
    for at, cell, length in _runs(cells):
        storage.read_bytes(cell * row, out[at : at + length])


def _write_rows(storage: Any, cells: np.ndarray, rows: np.ndarray) -> None:
    """``rows[i]`` into row ``cells[i]`` of ``storage`` (the inverse of :func:`_read_rows`)."""
    row = rows.shape[1]
    for at, cell, length in _runs(cells):
        storage.write_bytes(cell * row, np.ascontiguousarray(rows[at : at + length]))


_MANY_RUNS = 32  # past this many runs of cells, permuted V moves by one index instead of a slice a run


def _columns(storage: Any) -> tuple[int, int, np.dtype]:
    """Permuted V ``[n_cells, v_head_dim, kv_heads]`` seen as ``width`` element rows of
    ``n_cells`` columns: ``(width, n_cells, element dtype)``."""
    elt = storage.stride(0)
    return storage.dim(1) * storage.dim(2), storage.dim(0), np.dtype(f"u{elt}")  # f16: u2, f32: u4


def _element_rows(storage: Any) -> tuple[np.ndarray, bool]:
    """Permuted V's element rows, ``(width, n_cells)`` of its element type: where they lie when
    the storage is host memory (True: nothing to write back), else a copy read in one call."""
    width, n_cells, elt = _columns(storage)
    where = storage.host_bytes()
    if where is not None:
        return where.view(elt).reshape(width, n_cells), True
    every = np.empty((width, n_cells), dtype=elt)
    storage.read_bytes(0, every)
    return every, False


def _read_columns(storage: Any, cells: np.ndarray, out: np.ndarray) -> None:
    """Permuted V: column ``cells[i]`` of every element row into ``out``'s element rows, at
    ``i`` (uint8 ``(width, len(cells) * element size)``: the snapshot's permuted V)."""
    if len(cells) == 0:
        return
    every, _ = _element_rows(storage)
    dest = out.view(every.dtype)  # (width, len(cells))
    runs = _runs(cells)
    if len(runs) > _MANY_RUNS:  # cells scattered (sequences that decoded side by side): one index
        np.take(every, cells, axis=1, out=dest)
        return
    for at, cell, length in runs:  # slices, several times faster than an index
        dest[:, at : at + length] = every[:, cell : cell + length]


def _write_columns(storage: Any, cells: np.ndarray, rows: np.ndarray) -> None:
    """Permuted V: ``rows``' element rows into columns ``cells`` (the inverse of
    :func:`_read_columns`). Storage that is not host memory is read and written back whole (no
    graph computes meanwhile: ``Cache.import_seq``'s contract)."""
    if len(cells) == 0:
        return
    every, in_place = _element_rows(storage)
    src = rows.view(every.dtype)  # (width, len(cells))
    runs = _runs(cells)
    if len(runs) > _MANY_RUNS:  # cells scattered: one index
        every[:, cells] = src
    for at, cell, length in runs if len(runs) <= _MANY_RUNS else ():  # slices, faster than an index
        every[:, cell : cell + length] = src[:, at : at + length]
    if not in_place:
        storage.write_bytes(0, every)
