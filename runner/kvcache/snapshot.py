"""The byte format of an exported sequence (:meth:`runner.kvcache.cache.Cache.export_seq`).

One causal cache's state (little-endian throughout)::

    header    magic "PKVC", version u16, flags u16 (bit 0: permuted V), dtype 8 bytes (ASCII,
              NUL-padded: "f16", "q8_0", ...), n_layers u32, n_cells u32
    layers    n_layers x (layer, head_dim, kv_heads, v_head_dim, k_row, v_row) u32:
              the geometry; k_row/v_row are the bytes of one cell's K/V as stored
    positions n_cells x i32, ascending: the sequence's positions
    cells     n_cells x i32: the cell each position was stored in (where the import puts it
              back when that cell is free)
    rows      per layer: n_cells K rows, in position order (a row is the cell's data as the
              storage holds it, quantized blocks as they are), then V: unpermuted, n_cells V
              rows likewise; permuted V (``[n_cells, v_head_dim, kv_heads]``, f16 or f32) as
              the storage holds it, element row after element row (element ``d + h *
              v_head_dim``), each holding the n_cells values of that element in position order

Version 2 keeps two costs out of a restore, which a returning turn pays on ~50 MB states:

- no checksum: a state lives in this process's memory (the slot cache hands it to the prompt
  store and back) and reaches a disk only through the store's disk tier, whose files carry their
  own (:mod:`runner.kvstore.disk`), as llama.cpp's states do; version 1's CRC-32 was computed
  again at every export, split, join and import;
- permuted V in the storage's own layout: an export and an import copy runs of cells, where
  version 1's row order transposed every 2-byte element both ways (a :func:`split` and a
  :func:`join` copy the element rows' runs instead, as llama.cpp's transposed V state does).

A cache made of several (:class:`runner.kvcache.wrapper.WrapperCache`) packs its caches' states::

    magic "PKVW", version u16, count u16, count x u64 (each state's length), the states

:func:`read` refuses (:class:`SnapshotError`) anything truncated, padded, of another format
(magic, version, flags) or inconsistent (positions not ascending, a negative cell); the
importing cache compares the :class:`Geometry` with its own. The format holds no model identity and no token ids: the prompt
store's key holds those.

Pages (the prompt store's, :mod:`runner.kvstore.ram`): :func:`split` cuts one cache's state of
positions ``0..n-1`` into the states of position ranges (each a whole state of this format),
:func:`join` puts such states back together; joining what was split gives the original bytes. A wrapper's state (a sliding window beside global layers: the window holds
only the last cells, not pages of the conversation) is not split.
"""

from __future__ import annotations

import functools
import itertools
import struct
from dataclasses import dataclass
from typing import Collection, Sequence

import numpy as np

__all__ = ["FORMAT", "Geometry", "LayerRows", "Snapshot", "SnapshotError", "Writer", "join", "pack", "read", "split",
           "unpack"]

VERSION = 2  # 1: a CRC-32 at the end, permuted V in row order
#: what :attr:`Cache.state_layout` strings start with: the format and its version
FORMAT = f"pollama-kvcache/{VERSION}"

_MAGIC = b"PKVC"
_WRAPPER_MAGIC = b"PKVW"
_HEADER = struct.Struct("<4sHH8sII")
_LAYER = struct.Struct("<6I")
_WRAPPER = struct.Struct("<4sHH")
_LENGTH = struct.Struct("<Q")
_PERMUTED_V = 1


class SnapshotError(ValueError):
    """A state that cannot be read: truncated, damaged, or of another format."""


@dataclass(frozen=True)
class LayerRows:
    """What one layer stores per cell: head sizes, and the bytes of a K and a V row."""

    layer: int
    head_dim: int
    kv_heads: int
    v_head_dim: int
    k_row: int
    v_row: int


@dataclass(frozen=True)
class Geometry:
    """What the bytes of a state mean: the cache dtype, the V layout, the layers' rows. Two
    caches read each other's states only when their geometries are equal."""

    dtype: str
    permuted_v: bool
    layers: tuple[LayerRows, ...]

    def v_width(self, i: int) -> int:
        """Layer ``layers[i]``'s V elements per cell (``v_head_dim * kv_heads``): the element
        rows a permuted V holds."""
        ly = self.layers[i]
        return ly.v_head_dim * ly.kv_heads

    @property
    def cell_bytes(self) -> int:
        """Bytes of one cell's rows over all layers."""
        return sum(ly.k_row + ly.v_row for ly in self.layers)

    @functools.cached_property
    def regular(self) -> bool:
        """Whether every layer stores the same rows (no per-layer head counts): then a state's
        rows of every layer are one strided array (:meth:`Writer.stacked`)."""
        return len({(ly.head_dim, ly.kv_heads, ly.v_head_dim, ly.k_row, ly.v_row) for ly in self.layers}) <= 1

    @functools.cached_property
    def _starts(self) -> tuple[int, ...]:
        """Per layer, the bytes of one cell's rows in the layers before it (a state of ``n``
        cells keeps layer ``i``'s rows from ``n * _starts[i]`` of its rows region)."""
        return tuple(itertools.accumulate((ly.k_row + ly.v_row for ly in self.layers), initial=0))


def size(geometry: Geometry, n: int) -> int:
    """The bytes of a state of ``n`` cells of ``geometry``."""
    return _size(geometry, n)


def _size(geometry: Geometry, n: int) -> int:
    return _HEADER.size + len(geometry.layers) * _LAYER.size + 8 * n + n * geometry.cell_bytes


class Writer:
    """Builds one cache's state: header, positions and cells at once, then the rows filled in
    place through :meth:`k_rows`/:meth:`v_rows`, then :meth:`finish`."""

    def __init__(self, geometry: Geometry, positions: np.ndarray, cells: np.ndarray,
                 into: bytearray | None = None) -> None:
        """``positions`` ascending and ``cells`` aligned with them (int arrays of one length).
        ``into``: a buffer to write the state at the start of when it is large enough (the
        state is then a view of it): a new buffer of a 50 MB state costs ~13,000 first-touch
        page faults, more than filling it."""
        n = len(positions)
        dtype = geometry.dtype.encode("ascii")
        if len(dtype) > 8:
            raise ValueError(f"dtype name {geometry.dtype!r} too long for the format")
        self.geometry = geometry
        self.n = n
        size = _size(geometry, n)
        self.buf: bytearray | memoryview = memoryview(into)[:size] if into is not None and len(into) >= size \
            else bytearray(size)
        flags = _PERMUTED_V if geometry.permuted_v else 0
        _HEADER.pack_into(self.buf, 0, _MAGIC, VERSION, flags, dtype, len(geometry.layers), n)
        at = _HEADER.size
        for ly in geometry.layers:
            _LAYER.pack_into(self.buf, at, ly.layer, ly.head_dim, ly.kv_heads, ly.v_head_dim, ly.k_row, ly.v_row)
            at += _LAYER.size
        body = np.frombuffer(self.buf, dtype=np.uint8)
        body[at : at + 4 * n].view("<i4")[:] = positions
        body[at + 4 * n : at + 8 * n].view("<i4")[:] = cells
        self._rows = at + 8 * n
        self._body = body

    def k_rows(self, i: int) -> np.ndarray:
        """Layer ``geometry.layers[i]``'s K rows to fill: uint8 ``(n, k_row)``, position order."""
        return _layer_rows(self._body[self._rows :], self.geometry, self.n, i, value=False)

    def v_rows(self, i: int) -> np.ndarray:
        """Layer ``geometry.layers[i]``'s V to fill: uint8 ``(n, v_row)``, position order;
        permuted V: ``(width, n * element size)``, element row after element row."""
        return _layer_rows(self._body[self._rows :], self.geometry, self.n, i, value=True)

    def stacked(self, value: bool) -> np.ndarray:
        """Every layer's K (or with ``value`` V) to fill at once, a leading layer axis before
        :meth:`k_rows`'s (:meth:`v_rows`'s) shape; only for a :attr:`Geometry.regular` one."""
        return _stacked(self._body[self._rows :], self.geometry, self.n, value)

    def finish(self) -> bytearray | memoryview:
        """The state (the writer must not be used afterwards)."""
        return self.buf


@dataclass(frozen=True)
class Snapshot:
    """A state read back: geometry, positions (ascending), exported cells, and read-only views
    of the rows (no copy of ``data``)."""

    geometry: Geometry
    positions: np.ndarray  # int32
    cells: np.ndarray  # int32
    _body: np.ndarray  # the rows region, uint8

    @property
    def n(self) -> int:
        return len(self.positions)

    def k_rows(self, i: int) -> np.ndarray:
        """Layer ``geometry.layers[i]``'s K rows: uint8 ``(n, k_row)``, position order."""
        return _layer_rows(self._body, self.geometry, self.n, i, value=False)

    def v_rows(self, i: int) -> np.ndarray:
        """Layer ``geometry.layers[i]``'s V: uint8 ``(n, v_row)``, position order; permuted V:
        ``(width, n * element size)``, element row after element row."""
        return _layer_rows(self._body, self.geometry, self.n, i, value=True)

    def stacked(self, value: bool) -> np.ndarray:
        """See :meth:`Writer.stacked`."""
        return _stacked(self._body, self.geometry, self.n, value)


def read(data: bytes | bytearray | memoryview) -> Snapshot:
    """Parse one cache's state (views into ``data``, which must outlive the result). Raises
    :class:`SnapshotError` for a state that is not exactly one state of this format."""
    view = memoryview(data).cast("B")
    if len(view) < _HEADER.size:
        raise SnapshotError(f"state of {len(view)} bytes is too short")
    magic, version, flags, dtype, n_layers, n = _HEADER.unpack_from(view, 0)
    if magic != _MAGIC:
        raise SnapshotError("not a pollama KV cache state (magic)")
    if version != VERSION:
        raise SnapshotError(f"KV cache state version {version}, this build reads {VERSION}")
    if flags & ~_PERMUTED_V:
        raise SnapshotError(f"unknown flags {flags:#x}")
    table_end = _HEADER.size + n_layers * _LAYER.size
    if len(view) < table_end:
        raise SnapshotError("state truncated in its layer table")
    geometry = _geometry(flags, dtype, bytes(view[_HEADER.size : table_end]))
    size = _size(geometry, n)
    if len(view) != size:
        raise SnapshotError(f"state of {len(view)} bytes, its header says {size}")
    body = np.frombuffer(view, dtype=np.uint8)
    positions = body[table_end : table_end + 4 * n].view("<i4")
    cells = body[table_end + 4 * n : table_end + 8 * n].view("<i4")
    if n and (int(positions.min()) < 0 or int(cells.min()) < 0):
        raise SnapshotError("negative position or cell")
    if n > 1 and not bool(np.all(positions[1:] > positions[:-1])):
        raise SnapshotError("positions not ascending")
    return Snapshot(geometry, positions, cells, body[table_end + 8 * n :])


@functools.lru_cache(maxsize=64)
def _geometry(flags: int, dtype: bytes, table: bytes) -> Geometry:
    """The geometry a header's flags, dtype and layer table say (one object per distinct header:
    the pages of a join are read, and compared, once per kind)."""
    layers = tuple(LayerRows(*_LAYER.unpack_from(table, k * _LAYER.size)) for k in range(len(table) // _LAYER.size))
    try:
        name = dtype.rstrip(b"\0").decode("ascii")
    except UnicodeDecodeError:
        raise SnapshotError("damaged dtype name") from None
    permuted = bool(flags & _PERMUTED_V)
    if permuted and any(ly.v_head_dim * ly.kv_heads == 0 or ly.v_row % (ly.v_head_dim * ly.kv_heads) for ly in layers):
        raise SnapshotError("permuted V rows that are not whole elements")
    return Geometry(dtype=name, permuted_v=permuted, layers=layers)


def split(data: bytes | bytearray | memoryview, bounds: Sequence[int],
          held: Collection[int] = ()) -> list[bytearray | None] | None:
    """The states of positions ``[bounds[i], bounds[i + 1])`` of ``data``, one cache's state of
    exactly the positions ``0..bounds[-1]-1`` (``bounds`` ascending from 0), None in place of
    each range whose index is in ``held``; their cells stay the ones exported. None when
    ``data`` is not such a state (a wrapper's, a window that slid, another format)."""
    try:
        state = read(data)
    except SnapshotError:
        return None
    if len(bounds) < 2 or bounds[0] != 0:
        return None
    n = bounds[-1]
    if state.n != n or not np.array_equal(state.positions, np.arange(n)):
        return None
    layers = range(len(state.geometry.layers))
    permuted = state.geometry.permuted_v
    stacks = (state.stacked(False), state.stacked(True)) if state.geometry.regular and layers else None
    elt = _element(state.geometry, 0) if layers else 0
    parts: list[bytearray | None] = []
    for k, (begin, end) in enumerate(zip(bounds, bounds[1:])):
        if k in held:
            parts.append(None)
            continue
        out = Writer(state.geometry, state.positions[begin:end], state.cells[begin:end])
        if stacks is not None:  # every layer in one copy
            out.stacked(False)[:] = stacks[0][:, begin:end]
            out.stacked(True)[:] = stacks[1][:, :, begin * elt : end * elt] if permuted else stacks[1][:, begin:end]
        for i in layers if stacks is None else ():
            out.k_rows(i)[:] = state.k_rows(i)[begin:end]
            v = state.v_rows(i)
            if permuted:  # (width, n * element): the range's run of every element row
                e = _element(state.geometry, i)
                out.v_rows(i)[:] = v[:, begin * e : end * e]
            else:
                out.v_rows(i)[:] = v[begin:end]
        parts.append(out.finish())
    return parts


def join(parts: Sequence[bytes | bytearray | memoryview | tuple[bytes | bytearray | memoryview, int, int]],
         into: bytearray | None = None) -> bytearray | memoryview:
    """One state of all the positions ``parts`` hold, in order (what :func:`split` cut, joined
    back: the same bytes), written into ``into`` when it is large enough and no part lies in it,
    else, ``into`` given, into a new buffer a turn or two larger, for the caller to reuse (a view
    of it is returned; see :class:`Writer`). A part is a state, or ``(state, lo, hi)``: that
    state's positions at indices ``lo..hi-1`` only (a page kept within a larger state: one run
    per layer and V element row however many pages it holds). :class:`SnapshotError` when one is
    truncated, of another geometry, a range is out of its state, or the positions do not ascend
    from part to part."""
    ranges = [p if isinstance(p, tuple) else (p, 0, None) for p in parts]
    states = [read(p) for p, _, _ in ranges]
    if not states:
        raise SnapshotError("no states to join")
    geometry = states[0].geometry
    if any(s.geometry != geometry for s in states):
        raise SnapshotError("states of different geometries")
    cuts = [(lo, s.n if hi is None else hi) for s, (_, lo, hi) in zip(states, ranges)]
    if any(not 0 <= lo < hi <= s.n for s, (lo, hi) in zip(states, cuts)):
        raise SnapshotError("a range out of its state")
    positions = np.concatenate([s.positions[lo:hi] for s, (lo, hi) in zip(states, cuts)])
    if len(positions) > 1 and not bool(np.all(positions[1:] > positions[:-1])):
        raise SnapshotError("positions not ascending")
    if into is not None and any(np.may_share_memory(np.frombuffer(into, np.uint8), np.frombuffer(p, np.uint8))
                                for p, _, _ in ranges):
        into = None
    size = _size(geometry, len(positions))
    if into is not None and len(into) < size:
        into = bytearray(size + size // 8)  # a conversation grows: its next join fits
    out = Writer(geometry, positions, np.concatenate([s.cells[lo:hi] for s, (lo, hi) in zip(states, cuts)]), into)
    if geometry.regular and geometry.layers:  # every layer of a part in one copy
        k, v, at = out.stacked(False), out.stacked(True), 0
        elt = _element(geometry, 0)
        for s, (lo, hi) in zip(states, cuts):
            m = hi - lo
            _runs_into(k[:, at : at + m], s.stacked(False)[:, lo:hi], 1)
            if geometry.permuted_v:  # the part's run in each element row
                _runs_into(v[:, :, at * elt : (at + m) * elt], s.stacked(True)[:, :, lo * elt : hi * elt], 2)
            else:
                _runs_into(v[:, at : at + m], s.stacked(True)[:, lo:hi], 1)
            at += m
        return out.finish()
    for i in range(len(geometry.layers)):
        np.concatenate([s.k_rows(i)[lo:hi] for s, (lo, hi) in zip(states, cuts)], axis=0, out=out.k_rows(i))
        if geometry.permuted_v:  # the parts' runs side by side in each element row
            e = _element(geometry, i)
            np.concatenate([s.v_rows(i)[:, lo * e : hi * e] for s, (lo, hi) in zip(states, cuts)], axis=1,
                           out=out.v_rows(i))
        else:
            np.concatenate([s.v_rows(i)[lo:hi] for s, (lo, hi) in zip(states, cuts)], axis=0, out=out.v_rows(i))
    return out.finish()


def pack(states: Sequence[bytes | bytearray | memoryview], into: bytearray | None = None) -> bytearray | memoryview:
    """Several caches' states as one (a wrapper cache's), in order: written at the start of
    ``into`` when it is large enough (a view of it is returned), else into a new buffer."""
    head = _WRAPPER.size + len(states) * _LENGTH.size
    size = head + sum(len(st) for st in states)
    out: bytearray | memoryview = memoryview(into)[:size] if into is not None and len(into) >= size \
        else bytearray(size)
    _WRAPPER.pack_into(out, 0, _WRAPPER_MAGIC, VERSION, len(states))
    at = _WRAPPER.size
    for st in states:
        _LENGTH.pack_into(out, at, len(st))
        at += _LENGTH.size
    for st in states:
        out[at : at + len(st)] = st
        at += len(st)
    return out


def unpack(data: bytes | bytearray | memoryview, count: int) -> list[memoryview]:
    """The ``count`` states :func:`pack` packed (views into ``data``); :class:`SnapshotError`
    when ``data`` is not exactly that (each state is checked when it is read)."""
    view = memoryview(data).cast("B")
    head = _WRAPPER.size + count * _LENGTH.size
    if len(view) < head:
        raise SnapshotError(f"state of {len(view)} bytes is too short")
    magic, version, n = _WRAPPER.unpack_from(view, 0)
    if magic != _WRAPPER_MAGIC:
        raise SnapshotError("not a pollama wrapper cache state (magic)")
    if version != VERSION:
        raise SnapshotError(f"wrapper state version {version}, this build reads {VERSION}")
    if n != count:
        raise SnapshotError(f"state of {n} caches, this cache has {count}")
    lengths = [_LENGTH.unpack_from(view, _WRAPPER.size + k * _LENGTH.size)[0] for k in range(count)]
    if head + sum(lengths) != len(view):
        raise SnapshotError(f"state of {len(view)} bytes, its header says {head + sum(lengths)}")
    parts, at = [], head
    for length in lengths:
        parts.append(view[at : at + length])
        at += length
    return parts


def _layer_rows(rows: np.ndarray, geometry: Geometry, n: int, i: int, value: bool) -> np.ndarray:
    """The K (or with ``value`` the V) of layer ``geometry.layers[i]`` in the rows region
    ``rows`` of a state of ``n`` cells (per layer: K, then V): uint8 ``(n, row)``; permuted V
    ``(width, n * element size)``."""
    start = n * geometry._starts[i]
    ly = geometry.layers[i]
    if not value:
        return rows[start : start + n * ly.k_row].reshape(n, ly.k_row)
    start += n * ly.k_row
    region = rows[start : start + n * ly.v_row]
    if geometry.permuted_v:
        return region.reshape(geometry.v_width(i), n * (ly.v_row // geometry.v_width(i)))
    return region.reshape(n, ly.v_row)


def _runs_into(dst: np.ndarray, src: np.ndarray, lead: int) -> None:
    """``dst[...] = src`` (uint8, the same shape), whose axes after the first ``lead`` are
    contiguous bytes (a layer's cells, an element row's run): copied as one item each, not byte
    by byte (a page's V runs are 32 bytes: three times faster)."""
    run = dst[(0,) * lead].nbytes
    if run:
        runs = dst.reshape(*dst.shape[:lead], run)
        if np.may_share_memory(runs, dst):  # a view, not a copy
            dst, src = runs.view(f"V{run}"), src.reshape(*src.shape[:lead], run).view(f"V{run}")
    dst[...] = src


def _element(geometry: Geometry, i: int) -> int:
    """Bytes of one V element of layer ``geometry.layers[i]`` (permuted V's run unit)."""
    return geometry.layers[i].v_row // geometry.v_width(i)


def _stacked(rows: np.ndarray, geometry: Geometry, n: int, value: bool) -> np.ndarray:
    """Every layer's K (or with ``value`` V) in the rows region ``rows`` of a state of ``n``
    cells of a regular ``geometry`` (:attr:`Geometry.regular`), as one strided array with a
    leading layer axis (no copy): ``(layers, n, row)``; permuted V ``(layers, width, n * element)``."""
    ly = geometry.layers[0]
    step = n * (ly.k_row + ly.v_row)  # one layer's K and V
    offset = n * ly.k_row if value else 0
    if not value:
        shape, strides = (len(geometry.layers), n, ly.k_row), (step, ly.k_row, 1)
    elif geometry.permuted_v:
        elt = _element(geometry, 0)
        shape, strides = (len(geometry.layers), geometry.v_width(0), n * elt), (step, n * elt, 1)
    else:
        shape, strides = (len(geometry.layers), n, ly.v_row), (step, ly.v_row, 1)
    return np.ndarray(shape, np.uint8, rows, offset, strides)  # a view; as_strided costs 10x more a call
