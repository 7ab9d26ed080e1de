"""llama.cpp's per-sequence KV state, read and laid out again for a sliding-window import.

``llama_state_seq_get_data`` writes (llama.cpp's ``src/llama-kv-cache.cpp``, ``state_write``):
u32 magic, i32 sequence id, then per KV cache (a sliding-window model's ``llama_kv_cache_iswa``:
the global layers' cache, then the window's) a *section*: u32 stream count and per stream u32
cell count, then for a non-empty stream per cell i32 position, u32 1, i32 sequence id; u32
``v_trans``, u32 layers; per layer i32 K type, u64 row bytes and the K rows, cell after cell; per
layer the V rows the same way, or transposed (``v_trans``, flash attention off): i32 type, u32
element bytes, u32 V width, then per V component one element of every cell.

The window's cells are written in cell order, the ones no later token can see left out, and
``llama_state_seq_set_data`` puts them into an empty stream's cells one after another, from its
first. Evaluating a sequence from an empty stream puts position ``p`` in cell ``p % ring`` instead
(the window's stream is a ring of ``ring`` cells, filled in order and overwritten once a position
falls out of every later token's window). Attention sums over the cells in cell order (flash
attention's running softmax, the V product's dot products without it), so the same rows in other
cells round differently, and gemma's post-norms make that a logit or two. :func:`relay_window`
writes the window's cells in ring order, with zero-filled *filler* cells where the ring holds
nothing of the window, at positions that no later token can see (what a recompute holds there), so
the import puts every position where a recompute puts it.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

MAGIC = 0xAF143CD8  # llama_context's io_magic


@dataclass
class _Stream:
    """One stream's cells in a section, as views into the state."""

    positions: np.ndarray  # int32, in cell order
    seq: int
    v_trans: int
    k: list[tuple[bytes, np.ndarray]]  # per layer: its header, rows (cells, row bytes)
    v: list[tuple[bytes, np.ndarray]]  # per layer: its header, rows (cells, bytes) or (width, cells, bytes)


class _Reader:
    def __init__(self, data: memoryview) -> None:
        self.data, self.at = data, 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.data):
            raise ValueError("truncated state")
        out = self.data[self.at : self.at + n]
        self.at += n
        return out

    def unpack(self, fmt: str) -> tuple[int, ...]:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))

    def array(self, shape: tuple[int, ...], dtype: str = "u1") -> np.ndarray:
        n = int(np.prod(shape))
        return np.frombuffer(self.take(n * np.dtype(dtype).itemsize), dtype=dtype, count=n).reshape(shape)


def _read_section(r: _Reader) -> list[_Stream | None]:
    (n_stream,) = r.unpack("<I")
    streams: list[_Stream | None] = []
    for _ in range(n_stream):
        (count,) = r.unpack("<I")
        if count == 0:
            streams.append(None)
            continue
        meta = r.array((count, 3), "<i4")
        if not (meta[:, 1] == 1).all() or not (meta[:, 2] == meta[0, 2]).all():
            raise ValueError("not one sequence's cells")  # or cells carry more than (pos, seq)
        v_trans, n_layer = r.unpack("<II")
        k = []
        for _ in range(n_layer):
            head = bytes(r.take(12))
            (row,) = struct.unpack("<Q", head[4:])
            k.append((head, r.array((count, row))))
        v = []
        for _ in range(n_layer):  # every layer of the caches llama.cpp builds for gemma has V
            if v_trans:
                head = bytes(r.take(12))
                el, width = struct.unpack("<II", head[4:])
                v.append((head, r.array((width, count, el))))
            else:
                head = bytes(r.take(12))
                (row,) = struct.unpack("<Q", head[4:])
                v.append((head, r.array((count, row))))
        streams.append(_Stream(meta[:, 0], int(meta[0, 2]), v_trans, k, v))
    return streams


def _read(state: bytes | bytearray) -> tuple[memoryview, int, list[list[_Stream | None]]]:
    """The state's sections and where they start; ValueError when it is not two sections that
    end where the state ends (a model without a sliding window, a format we do not know)."""
    data = memoryview(state).cast("B")
    r = _Reader(data)
    magic, _seq = r.unpack("<Ii")
    if magic != MAGIC:
        raise ValueError("not a sequence state")
    base = _read_section(r)
    start = r.at
    window = _read_section(r)
    if r.at != len(data):
        raise ValueError("unknown state layout")
    return data, start, [base, window]


def relay_window(state: bytes | bytearray, ring: int) -> tuple[bytes | bytearray, int] | None:
    """``state`` with its window section in ring order: position ``p`` the ``p % ring``-th cell,
    filler cells (zero rows, at a position below the window's that ``p % ring`` names) where the
    window holds nothing below its last cell. Also the window's first position: the sequence's
    own from there, fillers below. None when the state is not a sliding-window model's sequence
    whose window fits ``ring`` cells once each (the caller imports it as it is)."""
    try:
        data, start, (_, window) = _read(state)
    except (ValueError, struct.error):
        return None
    held = [s for s in window if s is not None]
    if len(held) != 1:
        return None
    cells = held[0]
    pos = cells.positions.astype(np.int64)
    first = int(pos.min())
    where = pos % ring
    if first < 0 or len(np.unique(where)) != len(where):
        return None
    count = int(where.max()) + 1
    source = np.full(count, -1, dtype=np.int64)  # the state's cell each ring cell takes, -1: filler
    source[where] = np.arange(len(pos))
    if (source == np.arange(count)).all():
        return state, first  # already in ring order, no fillers
    filler = source < 0
    new_pos = np.empty(count, dtype=np.int64)
    new_pos[where] = pos
    cell = np.nonzero(filler)[0]
    new_pos[cell] = cell + ((first - 1 - cell) // ring) * ring  # the last p < first with p % ring == cell
    if (new_pos[cell] < 0).any():
        return None  # cannot happen with a window that starts at its position modulo ring
    take = np.where(filler, 0, source)

    out = [bytes(data[:start]), struct.pack("<I", len(window))]
    for stream in window:
        if stream is None:
            out.append(struct.pack("<I", 0))
            continue
        meta = np.stack([new_pos, np.ones(count, np.int64), np.full(count, stream.seq, np.int64)], axis=1)
        out += [struct.pack("<I", count), meta.astype("<i4").tobytes()]
        out.append(struct.pack("<II", stream.v_trans, len(stream.k)))
        for head, rows in stream.k:
            out += [head, _relaid(rows, take, filler, axis=0)]
        for head, rows in stream.v:
            out += [head, _relaid(rows, take, filler, axis=1 if stream.v_trans else 0)]
    return bytearray().join(out), first


def _relaid(rows: np.ndarray, take: np.ndarray, filler: np.ndarray, axis: int) -> bytes:
    moved = np.take(rows, take, axis=axis)
    if axis == 0:
        moved[filler] = 0
    else:
        moved[:, filler] = 0
    return moved.tobytes()
