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

Pages (the prompt store's, :mod:`runner.kvstore.ram`): :func:`split` cuts the state of a model
without a sliding window (one section, one stream holding positions ``0..n-1`` in cell order,
which is how a slot filled in order holds them) into the states of position ranges, each a state
llama.cpp imports on its own, and :func:`join` puts such states back together: the cells one
after another, the K rows and (without ``v_trans``) the V rows cell after cell, with ``v_trans``
each V component's elements cell after cell. Joining what was split gives the original bytes.
Whatever stream or sequence id a part names, the import puts its cells into the destination
sequence's stream (llama.cpp reads the ids and drops them). A sliding-window state (two sections:
the window holds only its last cells) is kept whole.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Collection, Sequence

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
        n = math.prod(shape)
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


def _sections(state: bytes | bytearray | memoryview) -> tuple[memoryview, list[int], list[list[_Stream | None]]]:
    """The state, its sections (one per KV cache) and where each starts; ValueError when it is
    not a sequence state whose sections end where it ends."""
    data = memoryview(state).cast("B")
    r = _Reader(data)
    magic, _seq = r.unpack("<Ii")
    if magic != MAGIC:
        raise ValueError("not a sequence state")
    starts, sections = [], []
    while r.at < len(data):
        starts.append(r.at)
        sections.append(_read_section(r))
    return data, starts, sections


def _read(state: bytes | bytearray) -> tuple[memoryview, int, list[list[_Stream | None]]]:
    """The state's sections and where the second starts; ValueError when it is not two sections
    (a model without a sliding window, a format we do not know)."""
    data, starts, sections = _sections(state)
    if len(sections) != 2:
        raise ValueError("unknown state layout")
    return data, starts[1], sections


def _one_stream(state: bytes | bytearray | memoryview) -> tuple[memoryview, int, int, _Stream]:
    """A one-section state's (data, stream count, index of the one stream holding cells, that
    stream); ValueError for any other."""
    data, _, sections = _sections(state)
    if len(sections) != 1:
        raise ValueError("not one KV cache's state")
    held = [i for i, s in enumerate(sections[0]) if s is not None]
    if len(held) != 1:
        raise ValueError("not one stream's cells")
    stream = sections[0][held[0]]
    assert stream is not None
    return data, len(sections[0]), held[0], stream


def _frame(head: bytes, n_stream: int, index: int, seq: int, positions: np.ndarray, stream: _Stream,
           into: bytearray | None = None) -> tuple[bytearray | memoryview, list[np.ndarray], list[np.ndarray]]:
    """A one-section state with its rows left to fill: ``head`` (magic, sequence id),
    ``n_stream`` streams of which ``index`` holds cells at ``positions`` with ``stream``'s layer
    headers; per layer the views of its K and V rows to fill, shaped as :class:`_Stream` holds
    them (``(cells, bytes)``, transposed V ``(width, cells, element)``). Written at the start of
    ``into`` when it is large enough, else, when ``into`` is given, into a new buffer with room
    for a turn or two more (the caller reuses it: the state is then a view of its start); with
    no ``into``, into a buffer of its own size."""
    count = len(positions)
    meta = np.stack([positions, np.ones(count, np.int64), np.full(count, seq, np.int64)], axis=1)
    start = [head, struct.pack("<I", n_stream), struct.pack("<I", 0) * index, struct.pack("<I", count),
             meta.astype("<i4").tobytes(), struct.pack("<II", stream.v_trans, len(stream.k))]
    shapes = [(header, (count, rows.shape[1])) for header, rows in stream.k]
    shapes += [(header, (rows.shape[0], count, rows.shape[2]) if stream.v_trans else (count, rows.shape[1]))
               for header, rows in stream.v]
    size = sum(len(x) for x in start) + sum(len(h) + math.prod(shape) for h, shape in shapes)
    total = size + 4 * (n_stream - index - 1)  # the streams after: 0 cells each
    out: bytearray | memoryview
    if into is not None:
        if len(into) < total:
            into = bytearray(total + total // 8)  # a conversation grows: its next join fits
        out = memoryview(into)[:total]
        out[size:] = bytes(total - size)
    else:
        out = bytearray(total)
    body = np.frombuffer(out, dtype=np.uint8)
    at = 0
    for x in start:
        out[at : at + len(x)] = x
        at += len(x)
    views = []
    for header, shape in shapes:
        out[at : at + len(header)] = header
        at += len(header)
        n = math.prod(shape)
        views.append(body[at : at + n].reshape(shape))
        at += n
    return out, views[: len(stream.k)], views[len(stream.k) :]


def _stacked(views: list[np.ndarray]) -> np.ndarray | list[np.ndarray]:
    """Per-layer row views of one buffer as one array with a leading layer axis (no copy), when
    they are laid out alike: the same shape and strides, each the same bytes after the one before
    (every layer's rows of one size, as models without per-layer head counts have them); else
    ``views`` as they are. A page's every layer then moves in one copy instead of one a layer."""
    if not views:
        return views
    first = views[0]
    if any(v.shape != first.shape or v.strides != first.strides for v in views):
        return views
    starts = [v.__array_interface__["data"][0] for v in views]
    step = starts[1] - starts[0] if len(starts) > 1 else 0
    if any(b - a != step for a, b in zip(starts, starts[1:])):
        return views
    return np.lib.stride_tricks.as_strided(first, (len(views), *first.shape), (step, *first.strides),
                                           writeable=first.flags.writeable)


def _copy_cells(dst: np.ndarray | list[np.ndarray], src: np.ndarray | list[np.ndarray], at: int, begin: int,
                end: int, axis: int) -> None:
    """Cells ``[begin, end)`` of every layer's rows ``src`` into cells ``at..`` of ``dst``
    (:func:`_stacked` each), the cells along ``axis`` (0: rows cell after cell, 1: transposed
    V): one copy for all layers when both stack, else one a layer."""
    cut = (slice(None),) * axis
    if isinstance(dst, np.ndarray) and isinstance(src, np.ndarray):
        to = dst[(slice(None), *cut, slice(at, at + end - begin))]
        of = src[(slice(None), *cut, slice(begin, end))]
        lead = to.shape[: axis + 1]
        run = to[(0,) * len(lead)].nbytes  # a layer's cells (an element row's, transposed V)
        if run:  # each run one item: numpy copies it whole, not a byte or an element at a time
            runs = to.reshape(*lead, run)
            if np.may_share_memory(runs, to):  # a view (the cells' bytes are contiguous), not a copy
                to, of = runs.view(f"V{run}"), of.reshape(*lead, run).view(f"V{run}")
        to[...] = of
        return
    for d, r in zip(dst, src):
        d[(*cut, slice(at, at + end - begin))] = r[(*cut, slice(begin, end))]


def split(state: bytes | bytearray | memoryview, bounds: list[int],
          held: Collection[int] = ()) -> list[bytearray | None] | None:
    """The states of positions ``[bounds[i], bounds[i + 1])`` of ``state``, a sequence state
    holding exactly positions ``0..bounds[-1]-1`` in cell order, in one stream of one KV cache
    (``bounds`` ascending from 0); None in place of each range whose index is in ``held``. None
    for any other state (a sliding window's, a slot whose cells a context shift reordered,
    another format): it is kept whole."""
    try:
        data, n_stream, index, stream = _one_stream(state)
    except (ValueError, struct.error):
        return None
    if len(bounds) < 2 or bounds[0] != 0 or not np.array_equal(stream.positions, np.arange(bounds[-1])):
        return None
    k_rows, v_rows = _stacked([rows for _, rows in stream.k]), _stacked([rows for _, rows in stream.v])
    v_axis = 1 if stream.v_trans else 0
    head = bytes(data[:8])
    layouts: dict[int, _Layout] = {}  # by cell count: the pages of one count lie out their bytes alike
    parts: list[bytearray | None] = []
    for i, (begin, end) in enumerate(zip(bounds, bounds[1:])):
        if i in held:
            parts.append(None)
            continue
        count = end - begin
        layout = layouts.get(count)
        if layout is None:  # the first page of this count is framed whole, the others like it
            out = _frame(head, n_stream, index, stream.seq, stream.positions[begin:end], stream)[0]
            layout = layouts[count] = _Layout.of(memoryview(out), _one_stream(out)[3])
            body = np.frombuffer(out, dtype=np.uint8)
        else:
            out = bytearray(layout.size)
            body = np.frombuffer(out, dtype=np.uint8)
            body[layout.head_index] = layout.head_bytes
            out[:8] = head
            meta = body[layout.meta_at : layout.meta_at + 12 * count].view("<i4").reshape(count, 3)
            meta[:, 0], meta[:, 1], meta[:, 2] = stream.positions[begin:end], 1, stream.seq
        _copy_cells(layout.rows(body, layout.k), k_rows, 0, begin, end, 0)
        _copy_cells(layout.rows(body, layout.v), v_rows, 0, begin, end, v_axis)
        parts.append(out)
    return parts


def tail(state: bytes | bytearray | memoryview, start: int) -> bytearray | None:
    """The state of positions ``start..n-1`` of ``state``, which holds ``0..n-1`` as :func:`split`
    takes it (a new buffer); None for any other state, or ``start`` not inside it."""
    try:
        n = len(_one_stream(state)[3].positions)
    except (ValueError, struct.error):
        return None
    if not 0 < start < n:
        return None
    parts = split(state, [0, start, n], held={0})
    return None if parts is None else parts[1]


def join(parts: Sequence[bytes | bytearray | memoryview | tuple[bytes | bytearray | memoryview, int, int]],
         into: bytearray | None = None) -> bytearray | memoryview:
    """One state of all the cells ``parts`` hold, in order (what :func:`split` cut, joined back:
    the same bytes), in the first part's stream and sequence id. A part is a state, or ``(state,
    lo, hi)``: that state's cells ``lo..hi-1`` only (a page kept within a larger state: one run
    per layer and V element however many pages it holds). ValueError when a part is not a
    one-stream state, the parts' layouts differ (streams, V layout, layer headers), a range is
    out of its state, or their positions do not ascend.

    Every part of one cell count lies out its bytes alike, so only the first part of each count
    is parsed (:class:`_Layout`); the others are checked against it (their size, and every header
    byte at once) and their rows taken at its offsets: a page costs a few views, not a parse.

    ``into``: a buffer to write the state into when it is large enough (and no part lies in it),
    else a new one a turn or two larger: a view of its start is returned. A restore's state is read once, by the import, so the
    caller reuses one buffer, whose pages the system has handed out already: a new buffer of
    a 50 MB state costs ~13,000 first-touch page faults, more than the copy itself."""
    if not parts:
        raise ValueError("no states to join")
    ranges = [p if isinstance(p, tuple) else (p, 0, None) for p in parts]
    data, n_stream, index, first = _one_stream(ranges[0][0])
    heads = _Layout.of(data, first).heads
    layouts: dict[tuple[int, int], _Layout] = {}  # by (stream, cells): a part's may be any stream
    positions, entries = [], []
    for part, lo, hi in ranges:
        body = np.frombuffer(part, dtype=np.uint8)
        if len(body) < 12 + 4 * n_stream:
            raise ValueError("truncated state")
        counts = body[12 : 12 + 4 * n_stream].view("<u4")  # stream count u32, then the streams' cell counts
        held = np.flatnonzero(counts)
        key = (int(held[0]), int(counts[held[0]])) if len(held) else (-1, 0)
        layout = layouts.get(key)
        if layout is None:
            stream_count, i, stream = _one_stream(part)[1:]
            layout = _Layout.of(memoryview(part).cast("B"), stream)
            if stream_count != n_stream or layout.heads != heads:
                raise ValueError("states of different layouts")
            layouts[(i, len(stream.positions))] = layout
        hi = layout.count if hi is None else hi
        if not 0 <= lo < hi <= layout.count:
            raise ValueError(f"cells {lo}..{hi} of a state of {layout.count}")
        positions.append(layout.cells(body)[lo:hi])
        entries.append((layout, body, lo, hi))
    cells = np.concatenate(positions).astype(np.int64)
    if len(cells) > 1 and not bool(np.all(cells[1:] > cells[:-1])):
        raise ValueError("positions not ascending")
    if into is not None and any(np.may_share_memory(np.frombuffer(into, np.uint8), np.frombuffer(p, np.uint8))
                                for p, _, _ in ranges):
        into = None
    out, k, v = _frame(bytes(data[:8]), n_stream, index, first.seq, cells, first, into)
    k_to, v_to, v_axis = _stacked(k), _stacked(v), 1 if first.v_trans else 0
    at = 0
    for layout, body, lo, hi in entries:
        _copy_cells(k_to, layout.rows(body, layout.k), at, lo, hi, 0)
        _copy_cells(v_to, layout.rows(body, layout.v), at, lo, hi, v_axis)
        at += hi - lo
    return out


@dataclass(frozen=True)
class _Layout:
    """Where a one-stream state of a given cell count keeps its parts: the offsets of its cells'
    triples and of each layer's rows, and its header bytes (everything but cells and rows), so
    another state of that count is checked with one comparison and read by slicing."""

    size: int
    meta_at: int
    count: int
    k: tuple  # where the K rows lie: (offset, shape, strides) of them stacked, or per layer (offset, shape)
    v: tuple  # the V rows likewise
    head_index: np.ndarray  # the offsets of every header byte (the layer headers and the prefix)
    head_bytes: np.ndarray
    heads: tuple  # the layer headers and V layout, to compare layouts of different counts

    @staticmethod
    def of(data: memoryview, stream: _Stream) -> "_Layout":
        base = np.frombuffer(data, dtype=np.uint8)

        def at(a: np.ndarray) -> int:  # where a view into ``data`` starts
            return a.__array_interface__["data"][0] - base.__array_interface__["data"][0]

        def where(layers: list[tuple[bytes, np.ndarray]]) -> tuple:
            rows = _stacked([r for _, r in layers])
            if isinstance(rows, np.ndarray):
                return (at(rows), rows.shape, rows.strides)
            return tuple((at(r), r.shape) for r in rows)

        count = len(stream.positions)
        meta_at = at(stream.positions) if count else 0
        # everything but the sequence id the part was exported from, the cells and the rows:
        # spans between those (a state is ~50 MB, its headers a few hundred bytes)
        skip = sorted([(4, 8), (meta_at, meta_at + 12 * count)] +
                      [(at(rows), at(rows) + rows.nbytes) for _, rows in stream.k + stream.v])
        spans, start = [], 0
        for a, b in skip:
            if a > start:
                spans.append(np.arange(start, a))
            start = max(start, b)
        spans.append(np.arange(start, len(base)))
        index = np.concatenate(spans)
        heads = (tuple(h for h, _ in stream.k), tuple(h for h, _ in stream.v), stream.v_trans)
        return _Layout(len(base), meta_at, count, where(stream.k), where(stream.v), index, base[index].copy(), heads)

    @staticmethod
    def rows(body: np.ndarray, where: tuple) -> np.ndarray | list[np.ndarray]:
        """The rows at ``where`` (:attr:`k` or :attr:`v`) of ``body``, a state of this layout
        (checked by :meth:`cells`, or one being written): stacked, or one view a layer
        (:func:`_stacked`); writable when ``body`` is."""
        if where and isinstance(where[0], int):
            offset, shape, strides = where
            return np.ndarray(shape, np.uint8, body, offset, strides)  # a view; as_strided costs 10x more a call
        return [body[offset : offset + math.prod(shape)].reshape(shape) for offset, shape in where]

    def cells(self, body: np.ndarray) -> np.ndarray:
        """The positions of ``body``, a state of this layout; ValueError when it is not one."""
        if len(body) != self.size or not np.array_equal(body[self.head_index], self.head_bytes):
            raise ValueError("states of different layouts")
        meta = body[self.meta_at : self.meta_at + 12 * self.count].view("<i4").reshape(self.count, 3)
        if not (meta[:, 1] == 1).all() or not (meta[:, 2] == meta[0, 2]).all():
            raise ValueError("not one sequence's cells")
        return meta[:, 0]


def relay_window(state: bytes | bytearray | memoryview, ring: int,
                 into: bytearray | None = None) -> tuple[bytes | bytearray | memoryview, int] | None:
    """``state`` with its window section in ring order: position ``p`` the ``p % ring``-th cell,
    filler cells (zero rows, at a position below the window's that ``p % ring`` names) where the
    window holds nothing below its last cell. Also the window's first position: the sequence's
    own from there, fillers below. None when the state is not a sliding-window model's sequence
    whose window fits ``ring`` cells once each (the caller imports it as it is). ``into``: a
    buffer (not ``state``'s) to write the result at the start of when it is large enough, as
    :func:`join` does; the import reads it at once. The result is a view of ``into``, or of a new
    buffer with room to spare (its ``obj``), for the caller's next relay."""
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

    # the pieces in order: bytes as they are, or (rows, axis) to write relaid; then one buffer,
    # each row moved once (np.take straight into it)
    pieces: list = [data[:start], struct.pack("<I", len(window))]
    for stream in window:
        if stream is None:
            pieces.append(struct.pack("<I", 0))
            continue
        meta = np.stack([new_pos, np.ones(count, np.int64), np.full(count, stream.seq, np.int64)], axis=1)
        pieces += [struct.pack("<I", count), meta.astype("<i4").tobytes()]
        pieces.append(struct.pack("<II", stream.v_trans, len(stream.k)))
        for head, rows in stream.k:
            pieces += [head, (rows, 0)]
        for head, rows in stream.v:
            pieces += [head, (rows, 1 if stream.v_trans else 0)]

    def nbytes(piece) -> int:
        if isinstance(piece, tuple):
            rows, axis = piece
            return rows.nbytes // rows.shape[axis] * count
        return len(piece)

    size = sum(nbytes(piece) for piece in pieces)
    if into is None or len(into) < size:
        into = bytearray(size + size // 4)  # room for a turn or two more: the caller reuses it
    out = memoryview(into)[:size]
    body = np.frombuffer(out, dtype=np.uint8)
    # the filler cells: one run (a slice) unless the window wrapped oddly (then by index)
    fill: slice | np.ndarray = slice(int(cell[0]), int(cell[-1]) + 1) \
        if len(cell) and int(cell[-1]) - int(cell[0]) + 1 == len(cell) else cell
    at = 0
    for piece in pieces:
        n = nbytes(piece)
        if isinstance(piece, tuple):
            rows, axis = piece
            shape = list(rows.shape)
            shape[axis] = count
            moved = body[at : at + n].reshape(shape)
            np.take(rows, take, axis=axis, out=moved, mode="clip")  # "clip": no buffered copy
            if axis == 0:
                moved[fill] = 0
            else:
                moved[:, fill] = 0
        else:
            out[at : at + n] = piece
        at += n
    return out, first
