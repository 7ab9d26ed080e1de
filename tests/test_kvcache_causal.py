"""The causal KV cache's tensor side with real GGML storage: put (set_rows scatter), get (views
and mask), remove (RoPE re-application of the moved keys), copy_prefix sharing, graph reuse."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from runner.kvcache.cache import NotSupported
from runner.ml.backend import CacheConfig
from runner.kvcache.causal import CausalCache
from runner.ml.backend import BackendOptions
from runner.ml.ggml.backend import GGMLBackend

HEAD_DIM, KV_HEADS = 8, 2
NEG = -np.inf


@pytest.fixture(scope="module")
def backend() -> Any:
    b = GGMLBackend(BackendOptions(num_threads=1, flash_attention=True))
    yield b
    b.close()


def rope_shift(ctx: Any, layer: int, key: Any, delta: Any) -> Any:
    return key.rope(delta, HEAD_DIM, 10000.0, neox=False)


def np_rope(x: np.ndarray, delta: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """LLaMA-style RoPE of ``x (n, heads, head_dim)`` by ``delta (n,)`` (pairs 2i, 2i+1)."""
    x = x.astype(np.float64)
    out = x.copy()
    d = x.shape[-1]
    for i in range(d // 2):
        theta = delta[:, None] * base ** (-2.0 * i / d)
        c, s = np.cos(theta), np.sin(theta)
        a, b = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., 2 * i] = a * c - b * s
        out[..., 2 * i + 1] = a * s + b * c
    return out


class B:
    """A minimal batch (positions + sequences)."""

    def __init__(self, positions: list[int], sequences: list[int]) -> None:
        self.positions = positions
        self.sequences = sequences
        self.causal_except: list[int] = []


def make_cache(
    backend: Any, dtype: str = "f32", shift: Any = rope_shift, cells: int = 16, seqs: int = 1, permuted: bool = False
) -> CausalCache:
    c = CausalCache(shift=shift)
    c.set_config(CacheConfig(cache_padding=1, mask_dtype="f32", permuted_v=permuted))
    c.init(backend, dtype, seqs, cells // seqs, 8)
    return c


def step(backend: Any, cache: CausalCache, positions: list[int], seqs: list[int], k: np.ndarray, v: np.ndarray):
    """One forward pass that only puts K/V and gets the history: returns (k, v, mask) as NumPy
    arrays ``(n_history, heads, head_dim)`` and ``(n_batch, n_history)``."""
    cache.start_forward(None, B(positions, seqs), reserve=False)
    ctx = backend.new_context()
    try:
        kt = ctx.input("k", k.astype(np.float32))
        vt = ctx.input("v", v.astype(np.float32))
        cache.set_layer(0)
        cache.put(ctx, kt, vt)
        hk, hv, mask = cache.get(ctx)
        # copies, so the outputs are fresh contiguous tensors
        outs = [hk.cast("f32"), hv.cast("f32"), mask]
        ctx.compute(*outs)
        n, length = len(positions), cache.plan.length
        v_hist = outs[1].numpy()
        if cache.config is not None and cache.config.permuted_v:  # [length, head_dim, heads]
            v_hist = v_hist.reshape(KV_HEADS, HEAD_DIM, length).transpose(2, 0, 1)
        return (
            outs[0].numpy().reshape(length, KV_HEADS, HEAD_DIM),
            v_hist.reshape(length, KV_HEADS, HEAD_DIM),
            outs[2].numpy().reshape(n, length),
        )
    finally:
        ctx.close()


def rand_kv(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.standard_normal((n, KV_HEADS, HEAD_DIM)), rng.standard_normal((n, KV_HEADS, HEAD_DIM))


@pytest.mark.parametrize("permuted", [False, True], ids=["v", "permuted_v"])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_store_two_batches(backend: Any, dtype: str, permuted: bool) -> None:
    rng = np.random.default_rng(0)
    cache = make_cache(backend, dtype, permuted=permuted)
    tol = 0 if dtype == "f32" else 2e-3
    k1, v1 = rand_kv(rng, 3)
    hk, hv, mask = step(backend, cache, [0, 1, 2], [0, 0, 0], k1, v1)
    assert hk.shape == (3, KV_HEADS, HEAD_DIM)
    np.testing.assert_allclose(hk, k1, atol=tol)
    np.testing.assert_allclose(hv, v1, atol=tol)
    np.testing.assert_array_equal(mask, [[0, NEG, NEG], [0, 0, NEG], [0, 0, 0]])

    k2, v2 = rand_kv(rng, 2)
    hk, hv, mask = step(backend, cache, [3, 4], [0, 0], k2, v2)
    np.testing.assert_allclose(hk, np.concatenate([k1, k2]), atol=tol)
    np.testing.assert_allclose(hv, np.concatenate([v1, v2]), atol=tol)
    np.testing.assert_array_equal(mask, [[0, 0, 0, 0, NEG], [0, 0, 0, 0, 0]])
    cache.close()


@pytest.mark.parametrize("permuted", [False, True], ids=["v", "permuted_v"])
def test_sequences_interleaved(backend: Any, permuted: bool) -> None:
    rng = np.random.default_rng(1)
    cache = make_cache(backend, seqs=2, permuted=permuted)
    k, v = rand_kv(rng, 4)
    hk, hv, mask = step(backend, cache, [0, 0, 1, 1], [0, 1, 0, 1], k, v)
    np.testing.assert_array_equal(hk, k.astype(np.float32))
    np.testing.assert_array_equal(hv, v.astype(np.float32))
    np.testing.assert_array_equal(
        mask,
        [[0, NEG, NEG, NEG], [NEG, 0, NEG, NEG], [0, NEG, 0, NEG], [NEG, 0, NEG, 0]],
    )
    k2, v2 = rand_kv(rng, 1)
    hk, hv, mask = step(backend, cache, [2], [1], k2, v2)
    np.testing.assert_array_equal(hv[3], v2[0].astype(np.float32))
    # the batch holds only seq 1, whose cells are 1, 3 and now 4: the history is cells 1..4
    assert cache.plan.start == 1 and cache.plan.length == 4
    np.testing.assert_array_equal(hk[3], k2[0].astype(np.float32))
    np.testing.assert_array_equal(hk[:3], k[1:].astype(np.float32))
    np.testing.assert_array_equal(mask, [[0, NEG, 0, 0]])
    cache.close()


@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_remove_middle_rerotates_keys(backend: Any, dtype: str) -> None:
    rng = np.random.default_rng(2)
    cache = make_cache(backend, dtype)
    k, v = rand_kv(rng, 6)
    step(backend, cache, list(range(6)), [0] * 6, k, v)
    keys, values = cache.layer_tensors(0)  # type: ignore[misc]
    before_k = keys.numpy()[:6].copy()
    before_v = values.numpy()[:6].copy()

    cache.remove(0, 1, 3)  # positions 3,4,5 become 1,2,3: keys rotate by -2
    after_k = keys.numpy()[:6]
    after_v = values.numpy()[:6]
    assert cache.table is not None
    assert cache.table.seq_positions(0) == [0, 1, 2, 3]
    assert cache.table.seq_cells(0) == [0, 3, 4, 5]
    tol = 1e-5 if dtype == "f32" else 4e-3
    np.testing.assert_array_equal(after_k[:3], before_k[:3])  # unmoved cells untouched
    np.testing.assert_allclose(after_k[3:], np_rope(before_k[3:], np.full(3, -2.0)), atol=tol)
    np.testing.assert_array_equal(after_v, before_v)  # values never move

    # the next token sees cells 0,3,4,5 (1,2 are free, then reused)
    k2, v2 = rand_kv(rng, 1)
    hk, _, mask = step(backend, cache, [4], [0], k2, v2)
    assert cache.table.seq_cells(0) == [0, 1, 3, 4, 5]
    np.testing.assert_array_equal(mask, [[0, 0, NEG, 0, 0, 0]])
    cache.close()


def test_remove_to_end_and_unsupported_shifts(backend: Any) -> None:
    rng = np.random.default_rng(3)
    cache = make_cache(backend, shift=None, seqs=2)
    k, v = rand_kv(rng, 4)
    step(backend, cache, [0, 1, 2, 3], [0, 0, 0, 0], k, v)
    cache.remove(0, 3, None)  # to the end: no shift needed
    assert cache.table is not None and cache.table.seq_positions(0) == [0, 1, 2]
    with pytest.raises(NotSupported):
        cache.remove(0, 0, 1)  # would shift, but there is no shift function
    cache.close()

    cache = make_cache(backend, seqs=2)
    step(backend, cache, [0, 1, 2, 3], [0, 0, 0, 0], k, v)
    cache.copy_prefix(0, 1, 4)
    with pytest.raises(NotSupported, match="shared"):
        cache.remove(0, 0, 1)
    cache.close()


def test_copy_prefix_shares_cells(backend: Any) -> None:
    rng = np.random.default_rng(4)
    cache = make_cache(backend, seqs=2)
    k, v = rand_kv(rng, 3)
    step(backend, cache, [0, 1, 2], [0, 0, 0], k, v)
    cache.copy_prefix(0, 1, 2)  # seq 1 = positions 0, 1 of seq 0
    k2, v2 = rand_kv(rng, 1)
    hk, _, mask = step(backend, cache, [2], [1], k2, v2)
    np.testing.assert_array_equal(mask, [[0, 0, NEG, 0]])
    np.testing.assert_array_equal(hk[:3], k.astype(np.float32))
    np.testing.assert_array_equal(hk[3], k2[0].astype(np.float32))
    cache.close()


def test_graph_reuse_with_new_inputs(backend: Any) -> None:
    """A graph built for one batch runs again for a later batch of the same shape with the
    cache's new inputs (cell indices, mask) and gives the same result as a fresh graph."""
    rng = np.random.default_rng(5)
    cache = make_cache(backend, cells=8)
    k, v = rand_kv(rng, 1)
    cache.start_forward(None, B([0], [0]), reserve=False)
    key0 = cache.graph_key()
    ctx = backend.new_context()
    kt, vt = ctx.input("k", k.astype(np.float32)), ctx.input("v", v.astype(np.float32))
    cache.set_layer(0)
    cache.put(ctx, kt, vt)
    hk, _, mask = cache.get(ctx)
    out = hk.cast("f32")
    ctx.compute(out, mask)
    # range is [0, 1): a later token at position 1 has range [0, 2): a different key
    cache.start_forward(None, B([1], [0]), reserve=False)
    assert cache.graph_key() != key0
    cache.remove(0, 1, None)
    # same shape again after removing: reuse the graph with new inputs
    cache.remove(0, 0, None)
    cache.start_forward(None, B([0], [0]), reserve=False)
    assert cache.graph_key() == key0
    k2, v2 = rand_kv(rng, 1)
    ctx.set_input("k", k2.astype(np.float32))
    ctx.set_input("v", v2.astype(np.float32))
    for name, data in cache.graph_inputs().items():
        ctx.set_input(name, data)
    ctx.compute()
    np.testing.assert_array_equal(out.numpy().reshape(k2.shape), k2.astype(np.float32))
    ctx.close()
    cache.close()


def test_batch_size_mismatch_is_an_error(backend: Any) -> None:
    cache = make_cache(backend)
    cache.start_forward(None, B([0, 1], [0, 0]), reserve=False)
    ctx = backend.new_context()
    try:
        k = ctx.input("k", np.zeros((3, KV_HEADS, HEAD_DIM), dtype=np.float32))
        with pytest.raises(ValueError, match="batch"):
            cache.put(ctx, k, k)
    finally:
        ctx.close()
        cache.close()


# ------------------------------------------------------------------------ export and import
def history(backend: Any, cache: CausalCache, seq: int, pos: int) -> tuple[np.ndarray, np.ndarray]:
    """The K and V that a token of ``seq`` at ``pos`` attends to (zeros put for it), in the order
    of the cells: ``(n, heads, head_dim)`` each; the token itself is the last row."""
    z = np.zeros((1, KV_HEADS, HEAD_DIM))
    hk, hv, mask = step(backend, cache, [pos], [seq], z, z)
    seen = mask[0] == 0
    return hk[seen], hv[seen]


@pytest.mark.parametrize("permuted", [False, True], ids=["v", "permuted_v"])
@pytest.mark.parametrize("dtype", ["f32", "f16"])
def test_export_import_moves_the_rows_exactly(backend: Any, dtype: str, permuted: bool) -> None:
    rng = np.random.default_rng(5)
    cache = make_cache(backend, dtype, cells=32, seqs=2, permuted=permuted)
    k, v = rand_kv(rng, 10)
    # interleaved: seq 0 at positions 0..4 in cells 0, 2, 4, 6, 8; seq 1 in the others
    step(backend, cache, [0, 0, 1, 1, 2, 2, 3, 3, 4, 4], [0, 1] * 5, k, v)
    state = cache.export_seq(0)
    assert cache.import_seq(1, state)  # seq 0's cells are taken: the lowest free ones
    assert cache.table is not None
    assert cache.table.seq_positions(1) == [0, 1, 2, 3, 4] and cache.table.seq_cells(1) == [1, 3, 5, 7, 9]
    rows = 5 * cache.geometry().cell_bytes
    assert cache.export_seq(1)[-rows:] == state[-rows:]
    want_k, want_v = history(backend, cache, 0, 5)
    got_k, got_v = history(backend, cache, 1, 5)
    np.testing.assert_array_equal(got_k[:5], want_k[:5])
    np.testing.assert_array_equal(got_v[:5], want_v[:5])
    stored = np.float16 if dtype == "f16" else np.float32
    np.testing.assert_array_equal(got_k[:5], k[0::2].astype(stored).astype(np.float32))

    # scattered free cells (permuted V: the element rows between them are read and written back)
    cache.remove(1, 0, None)
    cache.remove(0, 3, None)  # seq 0 keeps positions 0..2, in cells 0, 2, 4
    part = cache.export_seq(0)
    cache.remove(0, 0, None)
    step(backend, cache, [0, 1, 2, 3], [1] * 4, *rand_kv(rng, 4))  # seq 1 takes cells 0..3
    cache.remove(1, 1, 2)  # and frees cell 1
    assert cache.table.seq_cells(1) == [0, 2, 3]
    held = cache.export_seq(1)
    assert cache.import_seq(0, part) and cache.table.seq_cells(0) == [1, 4, 5]  # cell 0 is taken
    assert cache.export_seq(1) == held  # seq 1's rows between them untouched
    got_k, got_v = history(backend, cache, 0, 3)
    np.testing.assert_array_equal(got_k[:3], want_k[:3])
    np.testing.assert_array_equal(got_v[:3], want_v[:3])
    cache.close()


@pytest.mark.parametrize("permuted", [False, True], ids=["v", "permuted_v"])
def test_export_import_of_cells_scattered_in_many_runs(backend: Any, permuted: bool) -> None:
    """Two sequences that decoded side by side: each holds every other cell, 40 runs of one cell
    (past the count where permuted V moves by one index instead of a slice a run)."""
    rng = np.random.default_rng(9)
    cache = make_cache(backend, "f16", cells=128, seqs=3, permuted=permuted)
    k, v = rand_kv(rng, 80)
    step(backend, cache, [p for p in range(40) for _ in (0, 1)], [0, 1] * 40, k, v)
    state = cache.export_seq(0)
    assert cache.import_seq(2, state)  # the lowest free cells: 80..119, one run
    assert cache.table is not None and cache.table.seq_cells(2) == list(range(80, 120))
    want_k, want_v = history(backend, cache, 0, 40)
    got_k, got_v = history(backend, cache, 2, 40)
    np.testing.assert_array_equal(got_k[:40], want_k[:40])
    np.testing.assert_array_equal(got_v[:40], want_v[:40])
    np.testing.assert_array_equal(got_v[:40], v[0::2].astype(np.float16).astype(np.float32))
    cache.remove(0, 0, None)
    assert cache.import_seq(0, cache.export_seq(2))  # back into the scattered cells it left
    assert cache.table.seq_cells(0)[:40] == list(range(0, 80, 2))  # (then the history token above)
    got_k, got_v = history(backend, cache, 0, 40)
    np.testing.assert_array_equal(got_v[:40], want_v[:40])
    cache.close()


def test_import_refuses_damaged_foreign_or_oversized_states(backend: Any) -> None:
    rng = np.random.default_rng(6)
    cache = make_cache(backend, "f16", cells=16, seqs=2)
    step(backend, cache, list(range(6)), [0] * 6, *rand_kv(rng, 6))
    step(backend, cache, [0, 1], [1, 1], *rand_kv(rng, 2))
    state = cache.export_seq(0)
    other = cache.export_seq(1)
    assert cache.table is not None

    def refused(data: Any) -> None:
        cache.copy_prefix(1, 1, 2)  # (seq 1 keeps what it holds)
        assert not cache.import_seq(1, data)
        assert cache.table.seq_cells(1) == [] and cache.table.seq_positions(0) == list(range(6))
        assert cache.import_seq(1, other)  # seq 1 back for the next case

    refused(state[: len(state) // 2])  # truncated
    refused(bytes(state) + b"\0")  # padded
    refused(b"")
    for at in (0, 4, 40):  # magic, version, layer table (the rows carry no checksum: the store's files do)
        bad = bytearray(state)
        bad[at] ^= 0x10
        refused(bad)
    f32 = make_cache(backend, "f32", cells=16, seqs=2)
    step(backend, f32, [0], [0], *rand_kv(rng, 1))
    refused(f32.export_seq(0))  # another dtype
    permuted = make_cache(backend, "f16", cells=16, seqs=2, permuted=True)
    step(backend, permuted, [0], [0], *rand_kv(rng, 1))
    refused(permuted.export_seq(0))  # another V layout
    f32.close()
    permuted.close()

    big = make_cache(backend, "f16", cells=32, seqs=1)
    step(backend, big, list(range(12)), [0] * 12, *rand_kv(rng, 12))
    refused(big.export_seq(0))  # 12 rows, 10 free cells (seq 1's own 2 included)
    big.close()
    cache.close()


def test_wrapper_import_is_all_or_nothing(backend: Any) -> None:
    from runner.kvcache import WrapperCache
    from runner.kvcache import snapshot

    rng = np.random.default_rng(7)
    a, b = make_cache(backend, "f16", seqs=2), make_cache(backend, "f16", seqs=2)
    for c in (a, b):
        step(backend, c, [0, 1, 2], [0, 0, 0], *rand_kv(rng, 3))
    w = WrapperCache(a, b)
    assert w.state_layout == f"wrapper[{snapshot.FORMAT} f16 v; {snapshot.FORMAT} f16 v]"
    state = w.export_seq(0)
    assert w.import_seq(1, state)
    assert a.table is not None and b.table is not None
    assert a.table.seq_positions(1) == b.table.seq_positions(1) == [0, 1, 2]
    bad = bytearray(state)
    bad[len(state) - len(b.export_seq(0)) + 4] ^= 1  # the second cache's version: the first imports, then is emptied again
    assert not w.import_seq(1, bad)
    assert a.table.seq_cells(1) == b.table.seq_cells(1) == []
    assert not a.import_seq(1, state)  # a wrapper's state is not a causal cache's
    a.close()
    b.close()
