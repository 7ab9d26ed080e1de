"""Pages of a state cut and joined back, for both engines' formats, on synthetic states whose
layers store rows of one size (every layer moves in one copy) or of several (one copy a layer):
each page holds exactly its cells' rows, and joining the pages gives the state's bytes back."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from runner.engines.llamacpp import kvstate
from runner.kvcache import snapshot

BOUNDS = [0, 16, 32, 48, 53]  # three full pages and a partial one


# --------------------------------------------------------------------------- the new engine's
def new_state(rng: np.random.Generator, permuted: bool, regular: bool, n: int = 53) -> bytes:
    layers = []
    for i in range(4):
        heads = 2 if regular or i % 2 == 0 else 1
        layers.append(snapshot.LayerRows(i, 8, heads, 8, 8 * heads * 2, 8 * heads * 2))
    geometry = snapshot.Geometry("f16", permuted, tuple(layers))
    assert geometry.regular == regular
    out = snapshot.Writer(geometry, np.arange(n), np.arange(n) + 3)
    for i in range(len(layers)):
        out.k_rows(i)[:] = rng.integers(0, 256, out.k_rows(i).shape)
        out.v_rows(i)[:] = rng.integers(0, 256, out.v_rows(i).shape)
    return bytes(out.finish())


@pytest.mark.parametrize("regular", [True, False], ids=["one-row-size", "per-layer-sizes"])
@pytest.mark.parametrize("permuted", [False, True], ids=["v", "permuted-v"])
def test_new_engine_pages_hold_their_cells_and_join_back(permuted: bool, regular: bool) -> None:
    state = new_state(np.random.default_rng(1), permuted, regular)
    parts = snapshot.split(state, BOUNDS)
    assert parts is not None and len(parts) == 4
    whole = snapshot.read(state)
    for (begin, end), part in zip(zip(BOUNDS, BOUNDS[1:]), parts):
        page = snapshot.read(part)
        assert page.positions.tolist() == list(range(begin, end))
        assert page.cells.tolist() == [c + 3 for c in range(begin, end)]
        for i, ly in enumerate(whole.geometry.layers):
            np.testing.assert_array_equal(page.k_rows(i), whole.k_rows(i)[begin:end])
            if permuted:  # element rows: each page holds its cells' run of every one
                e = ly.v_row // (ly.v_head_dim * ly.kv_heads)
                np.testing.assert_array_equal(page.v_rows(i), whole.v_rows(i)[:, begin * e : end * e])
            else:
                np.testing.assert_array_equal(page.v_rows(i), whole.v_rows(i)[begin:end])
    assert bytes(snapshot.join(parts)) == state
    assert bytes(snapshot.join(parts[:2])) == bytes(snapshot.split(state, [0, 32, 53])[0])
    held = snapshot.split(state, BOUNDS, held={0, 2})
    assert held is not None and held[0] is None and held[2] is None and held[1] == parts[1] and held[3] == parts[3]


# --------------------------------------------------------------------------- the old engine's
def llama_state(rng: np.random.Generator, v_trans: bool, regular: bool, n: int = 53) -> bytes:
    """A llama.cpp sequence state of one KV cache, two streams (the second holds the cells)."""
    rows = [16 if regular or i % 2 == 0 else 8 for i in range(4)]  # bytes of a K row per layer
    out = [struct.pack("<Ii", kvstate.MAGIC, 5), struct.pack("<I", 2), struct.pack("<I", 0), struct.pack("<I", n)]
    out.append(np.stack([np.arange(n), np.ones(n, int), np.full(n, 5)], axis=1).astype("<i4").tobytes())
    out.append(struct.pack("<II", int(v_trans), len(rows)))
    for row in rows:
        out += [struct.pack("<iQ", 1, row), rng.integers(0, 256, n * row, dtype=np.uint8).tobytes()]
    for row in rows:
        if v_trans:  # per V component one 2-byte element of every cell
            out += [struct.pack("<iII", 1, 2, row // 2), rng.integers(0, 256, n * row, dtype=np.uint8).tobytes()]
        else:
            out += [struct.pack("<iQ", 1, row), rng.integers(0, 256, n * row, dtype=np.uint8).tobytes()]
    return b"".join(out)


@pytest.mark.parametrize("regular", [True, False], ids=["one-row-size", "per-layer-sizes"])
@pytest.mark.parametrize("v_trans", [False, True], ids=["v", "v-trans"])
def test_old_engine_pages_hold_their_cells_and_join_back(v_trans: bool, regular: bool) -> None:
    state = llama_state(np.random.default_rng(2), v_trans, regular)
    parts = kvstate.split(state, BOUNDS)
    assert parts is not None and len(parts) == 4
    stream = kvstate._one_stream(state)[3]
    for (begin, end), part in zip(zip(BOUNDS, BOUNDS[1:]), parts):
        _, n_stream, index, page = kvstate._one_stream(part)
        assert (n_stream, index, page.seq, page.v_trans) == (2, 1, 5, int(v_trans))
        assert page.positions.tolist() == list(range(begin, end))
        for (head, rows), (whole_head, whole) in zip(page.k, stream.k):
            assert head == whole_head
            np.testing.assert_array_equal(rows, whole[begin:end])
        for (head, rows), (whole_head, whole) in zip(page.v, stream.v):
            assert head == whole_head
            np.testing.assert_array_equal(rows, whole[:, begin:end] if v_trans else whole[begin:end])
    assert bytes(kvstate.join(parts)) == state
    scratch = bytearray(len(state) + 100)
    joined = kvstate.join(parts, scratch)
    assert bytes(joined) == state and isinstance(joined, memoryview)  # written into the buffer given
    held = kvstate.split(state, BOUNDS, held={1})
    assert held is not None and held[1] is None and held[0] == parts[0]


# ------------------------------------------------------------- ranges of a larger state (groups)
FORMATS = {"new": (snapshot, lambda rng, ok: new_state(rng, True, ok)), "old": (kvstate, lambda rng, ok: llama_state(rng, True, ok))}


@pytest.mark.parametrize("regular", [True, False], ids=["one-row-size", "per-layer-sizes"])
@pytest.mark.parametrize("engine", ["new", "old"])
def test_ranges_of_a_group_join_like_the_pages_they_hold(engine: str, regular: bool) -> None:
    """The prompt store keeps a save's new pages as one state (a group) and each page as a range
    of it: a join of ranges (runs of pages merged, or each page alone) gives the bytes a join of
    the pages gives, and a range on its own is the page's state."""
    fmt, make = FORMATS[engine]
    state = make(np.random.default_rng(3), regular)
    pages = fmt.split(state, BOUNDS)
    _, group = fmt.split(state, [0, 16, 53], held={0})  # pages 1..3 as one state of positions 16..52
    spans = [(group, 0, 16), (group, 16, 32), (group, 32, 37)]
    assert bytes(fmt.join([pages[0], *spans])) == state
    assert bytes(fmt.join([pages[0], (group, 0, 37)])) == state  # merged: one run per layer and element
    assert bytes(fmt.join([pages[0], (group, 0, 16)])) == bytes(fmt.join(pages[:2]))
    for (lo, hi), page in zip([(0, 16), (16, 32), (32, 37)], pages[1:]):
        assert bytes(fmt.join([(group, lo, hi)])) == bytes(page)  # a page cut from its group
    scratch = bytearray(len(state) + 100)
    assert bytes(fmt.join([pages[0], (group, 0, 37)], scratch)) == state
    for bad in ([(group, 0, 38)], [(group, 5, 5)], [(group, 16, 32), (group, 0, 16)]):
        with pytest.raises(ValueError):  # past the group's end, empty, positions not ascending
            fmt.join([pages[0], *bad])
