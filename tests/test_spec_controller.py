"""How deep to draft (runner.spec.controller): the cost of rows against acceptance."""

from __future__ import annotations

import pytest

from runner.ml import kernels
from runner.spec import controller as C
from runner.spec.controller import Acceptance, Speculation, StepCost, best_depth, expected_tokens
from runner.spec.ngram import POOL, PRIORS

LLAMA_CPP = kernels.multiplies(ggml_batched=True, tiled=False)  # the old engine's


class Fixed:
    """A drafter that always guesses the same ``n`` tokens, of one kind."""

    kinds = ("fixed",)
    kind = "fixed"
    priors = {"fixed": C.PRIOR}

    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0
        self.limits: list[int] = []

    def propose(self, generated, limit):
        self.calls += 1
        self.limits.append(limit)
        return list(range(100, 100 + min(self.n, limit)))


class Pooled(Fixed):
    """A drafter whose guesses all come from the shared pool."""

    kinds = (POOL,)
    kind = POOL
    priors = {POOL: PRIORS[POOL]}


class TwoKinds:
    """A drafter whose guesses are of kind "long" after an even history, "short" after an odd one."""

    kinds = ("long", "short")
    kind = "long"
    priors = {"long": C.PRIOR, "short": C.PRIOR}

    def propose(self, generated, limit):
        self.kind = "long" if len(generated) % 2 == 0 else "short"
        return list(range(200, 200 + limit))


def test_step_cost_interpolates_and_extends():
    cost = StepCost(((1, 1.0), (2, 2.0), (4, 3.0)))
    assert [cost(r) for r in (1, 2, 3, 4, 6)] == [1.0, 2.0, 2.5, 3.0, 4.0]
    assert StepCost()(16) == 7.1
    with pytest.raises(ValueError):
        StepCost(((2, 1.0), (4, 2.0)))


def test_rows_past_a_multiple_of_four_cost_their_leftover():
    """Where weights are repacked or tiled, rows past a multiple of 4 cost another pass: the
    cheap drafts are 4k - 1 tokens deep, and a guess is cut back to one when that pays."""
    cost = StepCost(((1, 1.0), (4, 2.5), (8, 3.5), (16, 5.0)), (0.0, 1.0, 1.4, 1.8))
    assert [cost(r) for r in (3, 4, 5, 7, 8, 12, 13, 16, 17)] == [2.0, 2.5, 3.5, 4.3, 3.5, 4.25, 5.25, 5.0, 6.0]
    assert best_depth(0.999, 16, cost) == 15  # 16 rows, not 17
    assert best_depth(0.999, 14, cost) == 11  # a 14-token guess: 12 rows beat 15
    assert StepCost.of("Q4_K_M", LLAMA_CPP)(33) > StepCost.of("Q4_K_M", LLAMA_CPP)(32) + 1
    with pytest.raises(ValueError):
        StepCost(((1, 1.0), (4, 2.0)), (0.0, 1.0))


def test_expected_tokens():
    assert expected_tokens(1.0, 5) == 6
    assert expected_tokens(0.0, 5) == 1
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)


def test_draft_long_or_not_at_all():
    cost = StepCost()
    assert best_depth(1.0, 16, cost) == 16  # everything right: as deep as allowed
    assert best_depth(1.0, 1, cost) == 0  # one token never pays: 2 tokens for 2.2x the cost
    assert best_depth(0.6, 16, cost) == 0
    assert 6 <= best_depth(0.9, 16, cost) <= 10
    flat = StepCost(((1, 1.0), (64, 1.0)))  # a device where rows are free: any acceptance pays
    assert best_depth(0.3, 8, flat) == 8


def test_acceptance_learns_and_drifts_back():
    a = Acceptance()
    a.record(10, 8, 8)
    assert a.alpha > C.PRIOR
    a.record(20, 8, 0)
    a.record(30, 8, 0)
    assert a.alpha < C.PRIOR and a.fails == 2
    assert C.PRIOR - a.now(30 + 346) == pytest.approx((C.PRIOR - a.alpha) / 2, rel=0.01)  # half way back
    later = a.now(30 + 2000)
    assert a.alpha < later < C.PRIOR and later == pytest.approx(C.PRIOR, abs=0.01)


def test_drafts_that_keep_succeeding_are_not_drift():
    """The tokens a draft yields are no time without drafts: a sequence whose drafts are all
    right learns it, and drafts as deep as that pays (it stayed at ~0.96 when they drifted)."""
    a, n = Acceptance(), 0
    for _ in range(6):
        a.record(n, 16, 16)
        n += 17  # 16 accepted and the target's own token
    assert a.now(n) > 0.99
    assert best_depth(a.now(n), 32, StepCost.of("Q4_K_M", LLAMA_CPP)) == 31  # 32 rows: 33 cost a pass more
    assert a.now(n + 1500) == pytest.approx(C.PRIOR, abs=0.02)  # 1500 tokens without drafts: back


def test_drafts_that_keep_failing_pause_the_sequence():
    a = Acceptance()
    for k in range(C.MAX_FAILS):
        a.record(10 * k, 8, 0)
    assert a.paused_until == 10 * (C.MAX_FAILS - 1) + C.PAUSE and a.pause == 2 * C.PAUSE
    a.record(100, 8, 3)  # something accepted: the next pause starts short again
    assert a.pause == C.PAUSE and a.fails == 0


def test_speculation_caps_and_conditions():
    spec = Speculation()
    seq = spec.begin([1, 2, 3], depth=16)
    seq.drafter = Fixed(12)
    seq.acceptance("fixed").alpha = 1.0  # every draft so far was right: as deep as the guess goes
    assert spec.propose(seq, [5], limit=16, others=0) == list(range(100, 112))
    assert spec.propose(seq, [5], limit=16, others=1) == []  # shares the batch: no drafts
    assert spec.propose(seq, [5], limit=4, others=0) == [100, 101, 102, 103]  # context, num_predict
    assert spec.begin([1], depth=0).depth == 0
    assert spec.begin([1], depth=1000).depth == C.MAX_DRAFT
    off = Speculation(enabled=False, pool=True)
    assert off.pool is None  # POLLAMA_SPECULATIVE=off: nothing to learn for
    off = off.begin([1, 2, 3], depth=16)
    assert off.depth == 0 and spec.propose(off, [5], limit=16, others=0) == []
    # paused: no guess asked for, but the drafter sees the history (the shared pool learns it)
    seq.acceptance("fixed").paused_until = 50
    seq.drafter.limits = []
    assert spec.propose(seq, [5] * 49, limit=16, others=0) == [] and seq.drafter.limits == [0]
    assert spec.propose(seq, [5] * 49, limit=16, others=2) == [] and seq.drafter.limits == [0, 0]
    assert spec.propose(seq, [5] * 50, limit=16, others=0) != []


def test_a_failing_sequence_stops_drafting_and_is_probed_again_later():
    spec = Speculation()
    seq = spec.begin([1, 2, 3], depth=16)
    seq.drafter = Fixed(16)
    drafts = []
    for generated in range(1000):
        draft = spec.propose(seq, [7] * (generated + 1), limit=16, others=0)
        if draft:
            drafts.append(generated)
            spec.verified(seq, generated + 1, len(draft), 0)
    assert drafts[:2] == [0, 1]  # tried at once (the prior), then less deep
    # then not until the estimate has drifted back to where a draft pays: probed again every
    # hundred tokens or more
    assert 4 <= len(drafts) <= 10
    assert all(b - a >= 100 for a, b in zip(drafts[1:], drafts[2:]))


def test_guesses_right_for_a_token_then_wrong_stop_being_drafted():
    """A guess every 8 tokens whose first token is right and second wrong never fails outright,
    so it never pauses: the estimate itself must fall to where drafting does not pay. (gemma-3-270m
    explaining a bicycle: with a faster drift back to the prior, the estimate sat at ~0.78, it
    drafted 7 tokens every 8 and ran at 0.79-0.85x.)"""
    cost = StepCost.of("Q4_K_M", LLAMA_CPP)  # gemma-3-270m's
    spec = Speculation(cost=cost)
    seq = spec.begin([1, 2, 3], depth=32)
    seq.drafter = Fixed(31)
    drafts, spent, generated = 0, 0.0, 0
    while generated < 300:
        generated += 1
        draft = spec.propose(seq, [7] * generated, limit=32, others=0) if generated % 8 == 0 else []
        spent += cost(1 + len(draft))
        if draft:
            drafts += 1
            spec.verified(seq, generated, len(draft), 1)
            generated += 1
    assert drafts <= 8  # 24 before
    assert generated / spent > 0.95  # tokens per one-row step: about no drafts' (0.88 before)


def test_each_kind_of_guess_has_its_own_record():
    """Short keys that keep failing pause, and do not hold back long keys that are right."""
    spec = Speculation()
    seq = spec.begin([1, 2, 3], depth=16)
    seq.drafter = TwoKinds()
    long_drafts = short_drafts = 0
    for generated in range(1, 400):
        draft = spec.propose(seq, [7] * generated, limit=16, others=0)
        if not draft:
            continue
        right = seq.kind == "long"
        long_drafts += right
        short_drafts += not right
        spec.verified(seq, generated, len(draft), len(draft) if right else 0)
    assert seq.acceptance("long").alpha > 0.99 and seq.acceptance("short").alpha < C.PRIOR
    assert long_drafts >= 190  # every even step: never paused by the short ones' failures
    assert short_drafts <= 12  # paused after three failures, for longer each time
    # what the controller lets through follows the kind: the long kind's record says all 16
    assert spec.propose(seq, [7] * 400, limit=16, others=0) == list(range(200, 216))


def test_the_cost_table_follows_how_the_weights_are_multiplied():
    """Rows of weights GGML multiplies for several rows at once (Q4_K_M, Q8_0, ...) cost less
    than Q4_1's in llama.cpp, one dot product per row (bench/bench_rows.py): at the same
    acceptance such a model drafts deeper; a file type not known to batch gets the dearer table.
    The new engine's own Q4_1 kernels make Q4_1 rows the cheapest: short drafts pay at an
    acceptance where the others draft nothing."""
    batched, per_row = StepCost.of("Q4_K_M", LLAMA_CPP), StepCost.of("Q4_1", LLAMA_CPP)
    assert (batched.name, per_row.name) == ("batched", "per-row")
    assert batched(16) == 5.07 and per_row(16) == StepCost()(16) == 7.1
    assert StepCost.of("q8_0", LLAMA_CPP).name == StepCost.of("F16", LLAMA_CPP).name == "batched"
    assert StepCost.of("Q5_1", LLAMA_CPP).name == StepCost.of("unknown", LLAMA_CPP).name == "per-row"
    invariant = kernels.multiplies(ggml_batched=False, tiled=False)  # each row alone
    assert StepCost.of("Q4_K_M", invariant).name == "per-row"
    assert best_depth(0.95, 32, batched) > best_depth(0.95, 32, per_row) > 8
    tiled = StepCost.of("q4_1", kernels.multiplies(ggml_batched=True, tiled=True))
    assert tiled.name == "tiled" and tiled(16) < batched(16) and tiled(5) > tiled(4)
    assert StepCost.of("Q4_1", kernels.multiplies(ggml_batched=False, tiled=True)).name == "tiled"
    assert best_depth(0.6, 32, tiled) > 0 == best_depth(0.6, 32, batched) == best_depth(0.6, 32, per_row)
    # an engine whose decoded rows' products are lone rows' (lone_rows.py) has a table of its
    # own, with the leftover rows of its Q8_0 output matrix (llamafile's tiles) still dear;
    # Q8_0's tiles need no such products
    lone_kinds = kernels.multiplies(ggml_batched=True, tiled=True, lone=True)
    lone = StepCost.of("Q4_K_M", lone_kinds)
    assert lone.name == "lone" and lone(5) > lone(4) and lone(16) < lone(15)
    assert StepCost.of("Q8_0", lone_kinds).name == "batched" and StepCost.of("Q4_1", lone_kinds).name == "tiled"
    assert StepCost.of("Q4_K_M", kernels.multiplies(ggml_batched=False, tiled=True, lone=True)).name == "per-row"
    assert 0 < best_depth(0.9, 32, lone) < best_depth(0.95, 32, lone)


def test_the_prior_is_where_each_kind_starts_and_drifts_back_to():
    seq = Speculation(prior=0.7).begin([1, 2, 3], depth=16)
    a = seq.acceptance("short")
    assert a.now(0) == 0.7
    a.record(10, 8, 8)
    assert a.alpha > 0.7 and a.now(10 + 5000) == pytest.approx(0.7, abs=0.01)
    assert Speculation(prior=0.7).begin([1], depth=16).acceptance("long").now(0) == 0.7


def test_prompt_lookup_s_short_keys_start_lower():
    """Without a prior given, each kind starts where its drafter says: prompt lookup's long keys
    and pool at 0.9, its short keys at 0.85. A first short guess is then 3 tokens on the tiled
    table (our Q4_1 kernels), 5 where each row is multiplied alone, 7 on GGML's batched kernels;
    a first long one is 6 or more on all."""
    from runner.spec.ngram import PRIORS

    seq = Speculation(pool=True).begin([1, 2, 3], depth=32)
    assert {k: seq.acceptance(k).now(0) for k in ("long", "short", "pool")} == {"long": C.PRIOR, "short": 0.85,
                                                                                  "pool": C.PRIOR} == PRIORS
    tiled = StepCost(*C.ROW_COSTS["tiled"])
    assert best_depth(PRIORS["short"], 32, tiled) == 3
    assert best_depth(PRIORS["short"], 32, StepCost(*C.ROW_COSTS["batched"])) == 7
    assert best_depth(PRIORS["short"], 32, StepCost(*C.ROW_COSTS["per-row"])) == 5
    assert min(best_depth(PRIORS["long"], 32, StepCost(*C.ROW_COSTS[t])) for t in C.ROW_COSTS) >= 6
    # the long-key prompt: text repeated after a 12-token key guesses deep; a 4-token one, 3 deep
    text = list(range(100, 140))
    spec = Speculation(cost=tiled)
    long_seq = spec.begin(text + [7] + text[:20], depth=32)
    assert len(spec.propose(long_seq, [text[20]], limit=32, others=0)) > 3 and long_seq.kind == "long"
    short_seq = spec.begin(text + [7, 8, 9] + text[17:20], depth=32)
    assert len(spec.propose(short_seq, [text[20]], limit=32, others=0)) == 3 and short_seq.kind == "short"


def test_the_shared_pool_s_record_is_the_model_s():
    """The pool is the model's, and so is the record of its guesses: a sequence's starts where
    the sequences before left it, so a request asked again drafts the first answer as deep as
    allowed from its first guess on, and a pool guess that fails lowers it for the next."""
    spec = Speculation(pool=True, cost=StepCost(*C.ROW_COSTS["lone"]))

    def drafts(right: bool = True) -> list[int]:
        seq = spec.begin([1, 2, 3], depth=C.MAX_DRAFT)
        seq.drafter = Pooled(C.MAX_DRAFT)
        depths, n = [], 1
        while n < 300:
            draft = spec.propose(seq, [7] * n, limit=C.MAX_DRAFT, others=0)
            spec.verified(seq, n, len(draft), len(draft) if right else 0)
            depths.append(len(draft))
            n += (len(draft) if right else 0) + 1
            if not right:
                return depths
        return depths

    first = drafts()
    assert first[0] == best_depth(PRIORS[POOL], C.MAX_DRAFT, spec.cost) < max(first)  # from the prior up
    deepest = max(first)
    assert deepest >= C.MAX_DRAFT - C.ROW_GROUP and spec.pooled > 0.99  # 59 tokens: 60 rows, a multiple of 4
    assert drafts()[0] == deepest  # asked again: as deep at once
    before = spec.pooled
    assert drafts(right=False) == [deepest]  # a guess with nothing right ...
    assert spec.pooled == pytest.approx(before * (1 - C.WEIGHT))
    assert 0 < drafts()[0] < deepest  # ... and the next sequence starts lower
    # with a prior given (bench_spec_replay.py), every kind starts there, the pool's too
    assert Speculation(pool=True, prior=0.7).begin([1, 2, 3], depth=16).acceptance(POOL).now(0) == 0.7
