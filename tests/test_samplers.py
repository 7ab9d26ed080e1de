"""Samplers: greedy, top_k/top_p/min_p cuts (Ollama's rules), temperature, seeded draws, and
repetition penalties checked against llama.cpp's own ``llama_sampler_init_penalties``."""

from __future__ import annotations

import dataclasses
import random
import time

import numpy as np
import pytest

from runner.sample import Sampler, SamplerOptions, apply_penalties


def opts(**kw: object) -> SamplerOptions:
    base = dict(repeat_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0)
    base.update(kw)
    return SamplerOptions(**base)  # type: ignore[arg-type]


def test_greedy_is_argmax_and_leaves_logits_alone() -> None:
    logits = np.array([0.1, 3.0, -1.0, 2.9], dtype=np.float32)
    before = logits.copy()
    s = Sampler(opts(temperature=0.0, repeat_penalty=1.5))
    s.accept_many([3, 3])
    assert s.sample(logits) == 1
    np.testing.assert_array_equal(logits, before)


def test_top_k_one_is_greedy_at_any_temperature() -> None:
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(1000).astype(np.float32)
    s = Sampler(opts(temperature=5.0, top_k=1, seed=3))
    assert {s.sample(logits) for _ in range(50)} == {int(np.argmax(logits))}


def test_seed_reproducible_and_random_seed_varies() -> None:
    logits = np.zeros(100, dtype=np.float32)
    a = [Sampler(opts(temperature=1.0, top_k=0, top_p=1.0, seed=42)).sample(logits) for _ in range(3)]
    assert len(set(a)) == 1
    s1, s2 = Sampler(opts(temperature=1.0, top_k=0, top_p=1.0, seed=42)), Sampler(
        opts(temperature=1.0, top_k=0, top_p=1.0, seed=42)
    )
    assert [s1.sample(logits) for _ in range(20)] == [s2.sample(logits) for _ in range(20)]
    r = Sampler(opts(temperature=1.0, top_k=0, top_p=1.0, seed=-1))
    assert len({r.sample(logits) for _ in range(50)}) > 1


def test_draws_follow_softmax_at_temperature() -> None:
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.1])).astype(np.float32)
    s = Sampler(opts(temperature=1.0, top_k=0, top_p=1.0, seed=1))
    n = 20000
    counts = np.bincount([s.sample(logits) for _ in range(n)], minlength=4) / n
    np.testing.assert_allclose(counts, [0.5, 0.25, 0.15, 0.1], atol=0.015)
    # temperature 0.5 squares the odds
    s = Sampler(opts(temperature=0.5, top_k=0, top_p=1.0, seed=2))
    p = np.array([0.5, 0.25, 0.15, 0.1]) ** 2
    p /= p.sum()
    counts = np.bincount([s.sample(logits) for _ in range(n)], minlength=4) / n
    np.testing.assert_allclose(counts, p, atol=0.015)


def test_top_p_keeps_the_prefix_that_exceeds_p() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05])).astype(np.float32)
    s = Sampler(opts(temperature=1.0, top_k=0, top_p=0.7, seed=3))
    ids, probs = s._candidates(logits)
    assert ids.tolist() == [0, 1]  # 0.5 <= 0.7 < 0.8
    assert {s.sample(logits) for _ in range(200)} == {0, 1}
    s = Sampler(opts(temperature=1.0, top_k=0, top_p=0.55, seed=3))
    assert s._candidates(logits)[0].tolist() == [0, 1]
    s = Sampler(opts(temperature=1.0, top_k=0, top_p=0.49, seed=3))
    assert s._candidates(logits)[0].tolist() == [0]


def test_min_p_keeps_tokens_above_a_fraction_of_the_best() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05])).astype(np.float32)
    s = Sampler(opts(temperature=1.0, top_k=0, top_p=1.0, min_p=0.29, seed=4))
    assert s._candidates(logits)[0].tolist() == [0, 1, 2]  # 0.15 >= 0.5 * 0.29
    s = Sampler(opts(temperature=1.0, top_k=0, top_p=1.0, min_p=0.31, seed=4))
    assert s._candidates(logits)[0].tolist() == [0, 1]


def test_top_k_then_softmax_over_survivors() -> None:
    logits = np.array([1.0, 4.0, 3.0, 2.0, 0.0], dtype=np.float32)
    s = Sampler(opts(temperature=1.0, top_k=2, top_p=1.0))
    ids, probs = s._candidates(logits)
    assert ids.tolist() == [1, 2]
    np.testing.assert_allclose(probs, np.exp([4.0, 3.0]) / np.exp([4.0, 3.0]).sum())


@pytest.mark.parametrize("top_p,min_p", [(0.9, 0.0), (0.999, 0.0), (1.0, 0.05), (0.95, 0.01), (0.3, 0.2)])
def test_partial_sort_equals_full_sort(top_p: float, min_p: float) -> None:
    """With top_k off the sampler sorts a growing prefix; the result equals a full sort."""
    rng = np.random.default_rng(5)
    for scale in (0.5, 3.0, 10.0):
        logits = (rng.standard_normal(49152) * scale).astype(np.float32)
        s = Sampler(opts(temperature=0.7, top_k=0, top_p=top_p, min_p=min_p))
        ids, probs = s._candidates(logits)
        order = np.argsort(-logits, kind="stable")
        z = logits.astype(np.float64) / 0.7
        p = np.exp(z - z.max())
        p /= p.sum()
        p = p[order]
        end = len(order)
        if top_p < 1.0:
            over = np.flatnonzero(np.cumsum(p) > top_p)
            end = int(over[0]) + 1 if over.size else end
        ref_ids, ref_p = order[:end], p[:end]
        if min_p > 0:
            below = np.flatnonzero(ref_p < ref_p[0] * min_p)
            if below.size:
                ref_ids = ref_ids[: below[0]]
        # equal up to the order of tied logits
        assert len(ids) == len(ref_ids) and set(ids.tolist()) == set(ref_ids.tolist())
        np.testing.assert_array_equal(logits[ids], logits[ref_ids])


def test_repeat_last_n_window_and_off() -> None:
    logits = np.array([1.0, 1.0, 1.0], dtype=np.float32)
    s = Sampler(opts(temperature=0.0, repeat_penalty=2.0, repeat_last_n=2))
    s.accept_many([0, 1, 2])  # window keeps 1, 2
    assert s.sample(logits) == 0
    s = Sampler(opts(temperature=0.0, repeat_penalty=2.0, repeat_last_n=0))
    s.accept_many([0])
    assert not s.penalize and s.sample(logits) == 0
    s = Sampler(opts(temperature=0.0, repeat_penalty=2.0, repeat_last_n=-1), num_ctx=10)
    assert s.history.maxlen == 10


import llama_cpp  # noqa: E402  (the penalties are checked against llama.cpp's own implementation)


@pytest.mark.parametrize(
    "repeat,freq,present,last_n",
    [(1.1, 0.0, 0.0, 64), (1.5, 0.2, 0.3, 8), (0.8, -0.1, 0.5, 16), (1.0, 0.5, 0.0, 64)],
)
def test_penalties_match_llama_cpp(repeat: float, freq: float, present: float, last_n: int) -> None:
    L = llama_cpp
    rng = np.random.default_rng(6)
    n_vocab = 64
    logits = (rng.standard_normal(n_vocab) * 3).astype(np.float32)
    history = rng.integers(0, n_vocab, size=40).tolist()

    smpl = L.llama_sampler_init_penalties(n_vocab, last_n, repeat, freq, present)
    for t in history:
        L.llama_sampler_accept(smpl, t)
    data = (L.llama_token_data * n_vocab)()
    for i in range(n_vocab):
        data[i].id, data[i].logit, data[i].p = i, float(logits[i]), 0.0
    arr = L.llama_token_data_array(data=data, size=n_vocab, selected=-1, sorted=False)
    L.llama_sampler_apply(smpl, ctypes_pointer(arr))
    want = np.array([data[i].logit for i in range(n_vocab)], dtype=np.float32)
    L.llama_sampler_free(smpl)

    s = Sampler(opts(repeat_penalty=repeat, frequency_penalty=freq, presence_penalty=present, repeat_last_n=last_n))
    s.accept_many(history)
    got = apply_penalties(logits, list(s.history), repeat, present, freq)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def ctypes_pointer(obj: object) -> object:
    import ctypes

    return ctypes.pointer(obj)  # type: ignore[arg-type]


def test_sampling_a_49k_vocab_is_fast() -> None:
    """Not a timed assertion: prints the cost per token for the default settings."""
    rng = np.random.default_rng(7)
    logits = (rng.standard_normal(49152) * 4).astype(np.float32)
    for o in (SamplerOptions(), opts(temperature=0.8, top_k=0, top_p=0.9), opts(temperature=0.0)):
        s = Sampler(o)
        s.accept_many(rng.integers(0, 49152, size=64).tolist())
        t0 = time.perf_counter()
        for _ in range(200):
            s.accept(s.sample(logits))
        dt = (time.perf_counter() - t0) / 200
        print(f"top_k={o.top_k} top_p={o.top_p} temp={o.temperature}: {dt * 1e6:.0f} us/token")


@pytest.mark.parametrize("typical_p,top_k", [(0.5, 0), (0.9, 0), (0.2, 40), (0.95, 100)])
def test_typical_p_keeps_what_llama_cpp_keeps(typical_p: float, top_k: int) -> None:
    """Locally typical sampling: the surviving candidates equal llama.cpp's typical sampler's."""
    L = llama_cpp
    rng = np.random.default_rng(11)
    n_vocab = 500
    logits = (rng.standard_normal(n_vocab) * 2.5).astype(np.float32)
    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    if top_k:
        L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(top_k))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_typical(typical_p, 1))
    data = (L.llama_token_data * n_vocab)()
    for i in range(n_vocab):
        data[i].id, data[i].logit, data[i].p = i, float(logits[i]), 0.0
    arr = L.llama_token_data_array(data=data, size=n_vocab, selected=-1, sorted=False)
    L.llama_sampler_apply(chain, ctypes_pointer(arr))
    want = sorted(data[i].id for i in range(arr.size))
    L.llama_sampler_free(chain)

    s = Sampler(opts(temperature=1.0, top_k=top_k, top_p=1.0, min_p=0.0, typical_p=typical_p))
    ids, probs = s._candidates(logits)
    assert sorted(ids.tolist()) == want
    assert 0 < len(want) < (top_k or n_vocab)
    assert list(logits[ids]) == sorted(logits[ids], reverse=True)  # still sorted by logit
    np.testing.assert_allclose(probs.sum(), 1.0)


# --- the fast paths: the tokens a full sort of the vocabulary gives, without the sort ------------
from runner.sample.samplers import top_ids  # noqa: E402


def reference_candidates(logits: np.ndarray, o: SamplerOptions) -> tuple[np.ndarray, np.ndarray]:
    """The slow path: a full stable sort of the vocabulary, the softmax (over the top_k
    survivors, or over everything with the sampler's normaliser), then the top_p and min_p cuts."""
    order = np.argsort(-logits, kind="stable")
    temp = max(o.temperature, 1e-7)
    if 0 < o.top_k < len(logits):
        order = order[: o.top_k]
        z = logits[order].astype(np.float64) / temp
        probs = np.exp(z - z[0])
        probs /= probs.sum()
    else:
        _, log_z = Sampler(o)._softmax_scale(logits)
        probs = np.exp(logits[order].astype(np.float64) / temp - log_z)
    if o.top_p < 1.0:
        over = np.flatnonzero(np.cumsum(probs) > o.top_p)
        if over.size:
            order, probs = order[: over[0] + 1], probs[: over[0] + 1]
    if o.min_p > 0.0:
        below = np.flatnonzero(probs < probs[0] * o.min_p)
        if below.size:
            order, probs = order[: below[0]], probs[: below[0]]
    return order, probs


def reference_draws(logits: np.ndarray, o: SamplerOptions, n: int) -> list[int]:
    """Seeded draws over the slow path's candidates (the sampler's own draw: one uniform number
    per token, scaled by the candidates' total when a cut renormalises them)."""
    ids, probs = reference_candidates(logits, o)
    rng = random.Random(o.seed)  # the sampler's generator
    cum = np.cumsum(probs, dtype=np.float64)
    total = cum[-1] if (0 < o.top_k < len(logits) or o.top_p < 1.0 or o.min_p > 0.0) else 1.0
    return [int(ids[min(int(np.searchsorted(cum, rng.random() * total, side="left")), len(ids) - 1)])
            for _ in range(n)]


def vocab_logits(n: int, shape: str, seed: int) -> np.ndarray:
    """Logits shaped like a model's: a few strong tokens over a long tail ("peaked"), or a flat
    spread where the draw often lands deep in the sorted order ("flat")."""
    rng = np.random.default_rng(seed)
    if shape == "flat":
        return (rng.standard_normal(n) * 0.7).astype(np.float32)
    x = rng.standard_normal(n).astype(np.float32) * 2.5
    x[rng.choice(n, 30, replace=False)] += rng.uniform(6, 14, 30).astype(np.float32)
    return x


@pytest.mark.parametrize("n", [7, 1000, 49152, 262144])
@pytest.mark.parametrize("k", [1, 3, 40, 256, 2048])
def test_top_ids_is_the_stable_sort_prefix(n: int, k: int) -> None:
    rng = np.random.default_rng(n + k)
    x = (rng.standard_normal(n) * 3).astype(np.float32)
    x[rng.choice(n, n // 3, replace=False)] = np.round(x[:n // 3], 1)  # many ties
    np.testing.assert_array_equal(top_ids(x, k), np.argsort(-x, kind="stable")[:k])


def test_top_ids_drops_masked_tokens_when_fewer_than_k_remain() -> None:
    x = np.full(262144, -np.inf, dtype=np.float32)
    x[[5, 100_000, 7]] = [1.0, 3.0, 1.0]
    assert top_ids(x, 40).tolist() == [100_000, 5, 7]


@pytest.mark.parametrize("shape", ["peaked", "flat"])
@pytest.mark.parametrize(
    "top_k,top_p,min_p,temperature",
    [(40, 0.9, 0.0, 0.8), (0, 1.0, 0.0, 0.8), (0, 1.0, 0.0, 1.5), (0, 0.9, 0.0, 0.8), (0, 1.0, 0.05, 1.0),
     (0, 0.95, 0.02, 0.7), (100, 1.0, 0.0, 1.0)],
)
def test_fast_paths_draw_the_tokens_a_full_sort_draws(shape: str, top_k: int, top_p: float, min_p: float,
                                                      temperature: float) -> None:
    """Same seed, same tokens as sorting the whole vocabulary per token. (A flat distribution
    makes the prefix grow to most of the vocabulary: a smaller one keeps the test fast.)"""
    n, draws = (262144, 120) if shape == "peaked" else (16384, 40)
    logits = vocab_logits(n, shape, seed=top_k + int(top_p * 100))
    o = opts(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=1234)
    s = Sampler(o)
    got = [s.sample(logits) for _ in range(draws)]
    assert got == reference_draws(logits, o, draws)
    assert len(set(got)) > 1


def test_penalties_are_undone_and_read_only_logits_work() -> None:
    rng = np.random.default_rng(8)
    logits = (rng.standard_normal(5000) * 3).astype(np.float32)
    before = logits.copy()
    history = rng.integers(0, 5000, size=64).tolist() + [int(np.argmax(logits))] * 3
    for o in (opts(temperature=0.0, repeat_penalty=1.3, frequency_penalty=0.5),
              opts(temperature=0.9, top_k=40, repeat_penalty=1.3, seed=3),
              opts(temperature=0.9, top_k=0, top_p=1.0, repeat_penalty=1.3, seed=3)):
        a, b = Sampler(o), Sampler(o)
        a.accept_many(history)
        b.accept_many(history)
        frozen = logits.copy()
        frozen.flags.writeable = False
        penalized = apply_penalties(logits, list(a.history), o.repeat_penalty, o.presence_penalty,
                                    o.frequency_penalty)
        c = Sampler(dataclasses.replace(o, repeat_penalty=1.0, frequency_penalty=0.0))
        want = [c.sample(penalized) for _ in range(20)]
        assert [a.sample(logits) for _ in range(20)] == want  # in place, then undone
        assert [b.sample(frozen) for _ in range(20)] == want  # on a copy
        np.testing.assert_array_equal(logits, before)


@pytest.mark.parametrize("top_k,top_p", [(40, 0.9), (0, 1.0), (0, 0.9)])
def test_nan_or_masked_logits_are_refused(top_k: int, top_p: float) -> None:
    s = Sampler(opts(temperature=0.8, top_k=top_k, top_p=top_p))
    x = np.zeros(262144, dtype=np.float32)
    x[77] = np.nan
    with pytest.raises(ValueError):
        s.sample(x)
    with pytest.raises(ValueError):
        s.sample(np.full(1000, -np.inf, dtype=np.float32))


@pytest.mark.parametrize("shape", ["peaked", "flat"])
@pytest.mark.parametrize("temperature", [0.3, 0.8, 1.5, 3.0])
def test_softmax_normaliser_matches_float64(shape: str, temperature: float) -> None:
    """The normaliser of the top_k-off path (float64 where the mass is, float32 for the tail)
    against an all-float64 log-sum-exp."""
    logits = vocab_logits(262144, shape, seed=3)
    _, log_z = Sampler(opts(temperature=temperature, top_k=0, top_p=1.0))._softmax_scale(logits)
    z = logits.astype(np.float64) / temperature
    assert abs(log_z - (z.max() + np.log(np.exp(z - z.max()).sum()))) < 1e-7


@pytest.mark.parametrize("repeat,freq,present", [(1.1, 0.0, 0.0), (1.5, 0.3, 0.2), (1.0, 0.0, 0.5), (1.0, 0.0, 0.0)])
@pytest.mark.parametrize("top_k,top_p,min_p", [(40, 0.9, 0.0), (5, 1.0, 0.0), (64, 0.95, 0.05), (1, 1.0, 0.0)])
def test_top_k_path_draws_what_the_general_path_draws(repeat: float, freq: float, present: float,
                                                     top_k: int, top_p: float, min_p: float) -> None:
    """The default path reads only the k + P best logits (P penalised tokens) and finishes in
    Python floats: the same tokens as penalising the whole row and cutting it with NumPy, also
    when the penalties push tokens out of the top k and with many tied logits."""
    rng = np.random.default_rng(int(repeat * 10 + freq * 100 + top_k))
    for trial in range(6):
        logits = vocab_logits(49152, "peaked", seed=trial)
        logits[rng.choice(49152, 2000, replace=False)] = np.round(logits[:2000], 0)  # ties
        top = np.argsort(-logits, kind="stable")[:80]
        history = rng.choice(top, 48).tolist() + rng.integers(0, 49152, 16).tolist()
        o = opts(temperature=0.7, top_k=top_k, top_p=top_p, min_p=min_p, repeat_penalty=repeat,
                 frequency_penalty=freq, presence_penalty=present, seed=trial)
        fast, general = Sampler(o), Sampler(o)
        general._few_k = 0  # the whole row penalised and cut with NumPy
        for s in (fast, general):
            s.accept_many(history)
        got = [fast.sample(logits) for _ in range(30)]
        assert got == [general.sample(logits) for _ in range(30)]
        assert fast._few_k == top_k


def _best(logits: np.ndarray, k: int) -> tuple[list[int], list[float]]:
    """What the new engine gives the sampler: ``best.c``'s k best, a stable sort's prefix."""
    from runner.sample._best import best_lists

    return best_lists(logits, k)


@pytest.mark.parametrize("o,from_top", [
    (opts(temperature=0.0, repeat_penalty=1.0), True),
    (opts(temperature=0.0, repeat_penalty=1.3, frequency_penalty=0.2), True),
    (opts(temperature=0.8, top_k=40, top_p=0.9, repeat_penalty=1.1), True),  # pollama's defaults
    (opts(temperature=1.2, top_k=20, top_p=1.0, min_p=0.05, presence_penalty=0.4), True),
    (opts(temperature=0.8, top_k=100, repeat_penalty=1.1), False),  # 100 + 64 penalised > 128
    (opts(temperature=0.8, top_k=0, top_p=0.9), False),
    (opts(temperature=0.8, top_k=40, typical_p=0.7), False),
    (opts(temperature=0.8, top_k=40, repeat_penalty=0.9), False),  # a penalty that raises logits
])
def test_sample_top_draws_what_the_whole_row_draws(o: SamplerOptions, from_top: bool) -> None:
    """A row's 128 best logits decide greedy and top_k sampling alone (the k + P best are
    among them); other options read the whole row. Same seed, same tokens either way."""
    fast, full = Sampler(dataclasses.replace(o, seed=9)), Sampler(dataclasses.replace(o, seed=9))
    reads = 0
    for step in range(40):
        logits = vocab_logits(49152, "peaked", seed=step)
        ids, vals = _best(logits, 128)

        def row() -> np.ndarray:
            nonlocal reads
            reads += 1
            return logits

        got = fast.sample_top(ids, vals, row)
        assert got == full.sample(logits)
        fast.accept(got)
        full.accept(got)
    assert (reads == 0) == from_top, reads


def test_sample_top_orders_equal_logits_by_id_without_reading_the_row() -> None:
    """Equal logits among the best, at the top, inside and at the edge of the k + P: the
    candidates' stable order (by id, as NumPy's stable sort and argmax give it) decides the same
    token as the whole row, which is not read; a row of equal logits too."""
    for o in (opts(temperature=0.0, repeat_penalty=1.0), opts(temperature=0.0, repeat_penalty=1.2),
              opts(temperature=0.8, top_k=40, top_p=0.9, repeat_penalty=1.1)):
        fast, full = Sampler(dataclasses.replace(o, seed=4)), Sampler(dataclasses.replace(o, seed=4))
        for step in range(30):
            logits = vocab_logits(49152, "peaked", seed=100 + step)
            best = np.argsort(-logits, kind="stable")[:60]
            for a, b in ((0, 1), (5, 9), (30, 31), (39, 40)):  # ties at the top, inside, and at k
                logits[best[b]] = logits[best[a]]
            ids, vals = _best(logits, 128)
            reads = []
            got = fast.sample_top(ids, vals, lambda: reads.append(1) or logits)
            assert got == full.sample(logits) and not reads
            fast.accept(got)
            full.accept(got)
    s = Sampler(opts(temperature=0.0, repeat_penalty=1.0))
    flat = np.zeros(1000, dtype=np.float32)
    reads = []
    assert s.sample_top(*_best(flat, 128), lambda: reads.append(1) or flat) == 0  # the lowest id, as argmax
    assert reads == []


def test_sample_top_reads_the_row_when_infinity_or_nan_is_among_the_best() -> None:
    """+inf among the candidates: the whole row is read and decides as ``sample`` does (greedy
    takes the +inf, a draw refuses it). A NaN anywhere in the row: ``best.c`` refuses it."""
    from runner.sample._best import best_lists

    bad = vocab_logits(49152, "peaked", seed=1)
    bad[7] = np.inf
    for o, want in ((opts(temperature=0.0, repeat_penalty=1.1), 7), (opts(temperature=0.8, top_k=40), None)):
        s, reads = Sampler(o), []
        if want is None:
            with pytest.raises(ValueError, match="NaN, \\+inf"):
                s.sample_top(*_best(bad, 128), lambda: reads.append(1) or bad)
        else:
            assert s.sample_top(*_best(bad, 128), lambda: reads.append(1) or bad) == want
        assert reads == [1]
    bad[7] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        best_lists(bad, 128)


def test_float32_penalty_arithmetic_without_numpy_equals_numpy() -> None:
    """The Python paths (``Sampler.penalty``: the top-candidates path and the old engine's
    in-place writes) round each penalty step to float32 (products and quotients of float32
    values done in double and rounded once are exact): the same values as NumPy's float32
    rule (:func:`penalized`), overflow included."""
    from runner.sample.samplers import _f32, _penalized_counts

    rng = np.random.default_rng(11)
    x = np.concatenate([(rng.standard_normal(20000) * 10).astype(np.float32),
                        np.array([3e38, -3e38, 1e-45, -0.0, 0.0], dtype=np.float32)])
    for rp in (1.1, 1.3, 1.7, 2.0):
        with np.errstate(over="ignore"):  # -3e38 * rp is -inf in float32, on both sides
            want = np.where(x <= 0, x * rp, x / rp)
        r32 = _f32(rp)
        got = [_f32(v * r32) if v <= 0 else _f32(v / r32) for v in x.tolist()]
        np.testing.assert_array_equal(np.array(got, dtype=np.float32), want)
    seen = rng.integers(1, 5, x.size)
    want = (x - (seen * 0.3 + 0.2)).astype(np.float32)
    got = [_f32(v - (c * 0.3 + 0.2)) for v, c in zip(x.tolist(), seen.tolist())]
    np.testing.assert_array_equal(np.array(got, dtype=np.float32), want)
    counts = {i: int(c) for i, c in enumerate(seen.tolist())}
    for rp, fp, pp in ((1.1, 0.0, 0.0), (1.3, 0.3, 0.2), (1.0, 0.5, 0.0), (0.9, 0.0, 0.7)):
        s = Sampler(SamplerOptions(repeat_penalty=rp, frequency_penalty=fp, presence_penalty=pp))
        with np.errstate(over="ignore"):
            ids, want = _penalized_counts(x, counts, rp, pp, fp)
        got = [s.penalty(v, counts[i]) for i, v in zip(ids.tolist(), x[ids].tolist())]
        np.testing.assert_array_equal(np.array(got, dtype=np.float32), want)


def test_old_engine_top_k_feed_penalises_in_place_and_restores_the_row() -> None:
    """The old engine's top_k feed writes the penalties into the logits row through a ctypes
    view and writes the raw values back: the row is bit-identical afterwards (a logprobs request
    reads it next), and the chain got the k best of NumPy's penalised logits, in order."""
    import ctypes

    from runner.api import Options
    from runner.engines.llamacpp.topk import TopKChain
    from runner.sample.samplers import top_ids_values

    rng = np.random.default_rng(5)
    vocab = 4096
    floats = (ctypes.c_float * vocab)(*(rng.standard_normal(vocab) * 3).astype(np.float32).tolist())
    row = np.ctypeslib.as_array(floats)
    history = rng.integers(0, vocab, 48).tolist() + list(np.argsort(-row)[:30].tolist())
    for opts in (Options(seed=3), Options(seed=3, top_k=7, repeat_penalty=1.4, frequency_penalty=0.4,
                                          presence_penalty=0.3, repeat_last_n=128)):
        chain = TopKChain(opts, history, num_ctx=512)
        try:
            before = row.copy()
            chain.sample(row, floats)
            np.testing.assert_array_equal(row, before)
            shadow = Sampler(SamplerOptions.from_options(opts), num_ctx=512)
            shadow.accept_many(history[-shadow.history.maxlen:])
            want_ids, _ = top_ids_values(apply_penalties(
                row, list(shadow.history), opts.repeat_penalty, opts.presence_penalty, opts.frequency_penalty), opts.top_k)
            got = [c.id for c in chain._data[:opts.top_k]]  # llama.cpp's candidates (the chain scaled their logits)
            assert got == want_ids.tolist()
        finally:
            chain.close()


def test_best_is_a_stable_sort_of_the_row_cut_to_k() -> None:
    """``best.c``: the k best of a row in llama_token_data records, equal to a stable descending
    sort cut to k, -inf left out (as ``top_ids_values`` leaves it), p = 0; on rows with many
    ties, infinities, a partial last block of 64, k of 0 and k above the row. A NaN anywhere
    (in a skipped block, a scanned one, the partial last one) raises, as the samplers do."""
    import ctypes

    from runner.sample._best import best

    class Record(ctypes.Structure):
        _fields_ = [("id", ctypes.c_int32), ("logit", ctypes.c_float), ("p", ctypes.c_float)]

    rng = np.random.default_rng(11)
    out = (Record * 300)()
    view = np.frombuffer(out, dtype=np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)]))
    for trial in range(600):
        n = int(rng.integers(1, 3000)) if trial % 3 else int(rng.integers(1, 300))
        row = rng.standard_normal(n).astype(np.float32)
        if trial % 4 == 0:
            row = np.round(row * 2) / 2  # many ties
        if trial % 5 == 0:
            row[rng.integers(0, n, size=max(1, n // 3))] = -np.inf
        if trial % 7 == 0:
            row[rng.integers(0, n, size=max(1, n // 10))] = np.nan
        if trial % 11 == 0:
            row[rng.integers(0, n)] = np.inf
        k = int(rng.integers(0, 300))
        view["p"] = 1.0
        if k and np.isnan(row).any():
            with pytest.raises(ValueError, match="NaN"):
                best(row, k, out)
            continue
        count = best(row, k, out)
        want = [int(i) for i in np.argsort(-row, kind="stable") if row[i] > -np.inf][:k]
        assert view["id"][:count].tolist() == want, (trial, n, k)
        assert view["logit"][:count].tolist() == row[want].tolist()
        assert not view["p"][:count].any()
    with pytest.raises(ValueError, match="fewer than k"):
        best(np.zeros(10, np.float32), 301, out)
    with pytest.raises(ValueError, match="float32"):
        best(b"abc", 1, out)
    with pytest.raises(BufferError):
        best(np.zeros(10, np.float32), 1, bytes(12))  # read-only


def test_sample_top_reads_the_row_when_the_candidates_hold_both_infinities() -> None:
    """+inf and -inf among the candidates sum to NaN: the whole row is read (and refused there,
    as any row with +inf is), never an exception from the candidates' own check."""
    s = Sampler(opts(temperature=0.8, top_k=40))
    row = np.zeros(1000, dtype=np.float32)
    row[3], row[7] = np.inf, -np.inf
    ids = np.arange(128, dtype=np.int32)
    vals = row[ids].copy()
    vals.sort()
    vals = vals[::-1].copy()
    reads = []
    with pytest.raises(ValueError, match="NaN, \\+inf"):
        s.sample_top(ids.tolist(), vals.tolist(), lambda: reads.append(1) or row)
    assert reads == [1]
