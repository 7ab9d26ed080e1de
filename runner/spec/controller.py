"""How deep to draft: :class:`Speculation` weighs what a draft is expected to give against what
its rows cost, per sequence, and drafts only when that beats not drafting.

A decode step of ``1 + k`` rows (the sampled token and ``k`` drafted ones) costs more than one of
a single row, and how much more depends on how the CPU kernels multiply the model's weights
(:mod:`runner.ml.kernels`; ``bench/bench_rows.py`` measures it): GGML has no kernel for several
rows of Q4_1 or Q5_1 weights, one dot product per weight row and batch row, so 2 rows cost 2.2x
one, 8 rows 4.5x, 16 rows 7.1x (SmolLM2 Q4_1 in llama.cpp); the other types are repacked or tiled
for batches and read once for all rows (gemma-3-270m Q4_K_M, and SmolLM2 requantized to Q4_K_M or
Q8_0: 16 rows ~5x), and the new engine's own Q4_1 kernels hold 4 rows at a time, 8 on AVX-512
(SmolLM2 Q4_1: 16 rows 4.3-5.5x); rows past a multiple of 4 cost another pass over the weights, so such drafts are
4k - 1 tokens deep. If each drafted token is right with probability ``a`` given that the ones before it were (the sequence's
*acceptance*), the step yields ``1 + a + a^2 + ... + a^k`` tokens on average. So a draft of ``k``
pays when that sum over ``cost(1 + k) / cost(1)`` beats 1, and the best ``k`` maximises it: on
the per-row table, with ``a`` = 0.9 about 8 tokens (1.3x), with every draft right as deep as
allowed (16 tokens: 2.3x), below ``a`` ~ 0.84 none ("draft long or not at all": a draft of one
token never pays, 2 tokens for 2.2x the cost); on the tiled one, at 0.9 6 tokens (1.9x), and
drafts of 3 tokens from ``a`` ~ 0.55.

Acceptance is learnt per sequence and per kind of guess (:attr:`runner.spec.drafter.Drafter.kinds`:
prompt lookup's long keys guess far better than its short ones, and the shared pool's 24-token
keys better still, so each has its own record, and hopeful guesses failing do not hold back
confident ones): a moving average over the drafted positions verified so far (accepted ones, and
the first rejected one; positions after it tell nothing), starting from :data:`PRIOR`. While a
sequence does not draft it drifts back towards the prior, slowly (half way in ~350 tokens), so a
sequence whose text turns repetitive later is probed again. A kind of guess that keeps failing
(no token accepted :data:`MAX_FAILS` drafts in a row) is not drafted for :data:`PAUSE` tokens,
twice as long each time it happens again.

The shared pool's guesses are the exception: the pool is the model's, and so is their record.
What they scored in the sequences before is where a new sequence's record of them starts (and
drifts back to), so a request asked again drafts the first answer as deep as allowed from its
first guess on, where a record of its own started at :data:`PRIOR` again and took ~65 tokens
in 5 steps of 8 to 24 rows to get there (gemma-3-270m asked again for bench_spec's story, old
engine, 32 tokens deep at most: 14 steps, 3.07-3.08x no drafts' speed, against 11 steps and
3.30-3.31x). A pool guess that fails in any sequence lowers it for the next.

Guesses right for a token or two and then wrong are the costly case: they never fail outright,
so they never pause. gemma-3-270m explaining how a bicycle works found a short key every ~8
tokens, 1-2 of 7 drafted tokens right (~0.5 per position); with a drift back of 2% a token the
estimate sat at ~0.78, just where 7-token drafts pay on its table, and the answer ran at
0.79-0.85x of no drafts (bench_spec's "explain"). With the drift below, it falls under that line
after a few such drafts, and the kind is probed again every hundred tokens or more.

The cost table is fixed (:data:`ROW_COST`), not measured: learnt costs would make the depth, and
with it the rows a token is computed in, depend on timing noise, and batched rows round
differently from single ones on these kernels (notes §C), so the same request could give another
answer on a busy machine. With a fixed table the drafts follow from the tokens alone.

In this first version a sequence drafts only while it is alone in the batch: beside another
sequence the batch already uses the spare compute (llama.cpp measured 0.77x at 8 slots with
lookup always on). The caller says how many other sequences are live.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from ..ml import kernels
from .drafter import DraftSource, Drafter, NoDrafter
from .ngram import POOL, PRIORS, PromptLookup
from .pool import NgramPool

#: (rows, cost relative to a one-row decode) where the weights are multiplied one row at a time
#: (:data:`runner.ml.kernels.PER_ROW`: Q4_1 and Q5_1 in llama.cpp, every type but Q4_1 in the new
#: engine's batch-invariant mode, file types not known to batch): SmolLM2-135M Q4_1 measured to 16 rows
#: (issue 26 notes §D), beyond that extrapolated
ROW_COST: tuple[tuple[int, float], ...] = ((1, 1.0), (2, 2.2), (4, 3.1), (8, 4.5), (16, 7.1), (32, 12.0),
                                           (64, 22.0))
#: GGML's CPU kernels multiply repacked weights (Q4_0, Q4_K, IQ4_NL) 4 rows at a time, with
#: another pass over the matrix for the rows left over, and llamafile's tiles (Q8_0, Q5_0, ...)
#: take narrower, slower tiles for them; our Q4_1 kernels hold 4 activation rows at a time. Where
#: a model's weights are mostly of those types, a step of 4k + j rows costs its table's 4k rows
#: plus a leftover cost of j rows (:data:`ROW_COSTS`). Measured (2 cores, new engine, after a
#: 400-token prompt, medians of 8): gemma-3-270m Q4_K_M 12 rows 4.09x one, 13 5.21x, 14 5.58x,
#: 15 5.97x, 16 4.56x, and 5 to 7 rows dearer than 8; so its cheap drafts are 4k - 1 tokens, 31
#: rather than 32 (33 rows cost ~30% more than 32). SmolLM2's Q4_1 rows by GGML's one-row products
#: cost about the line (12 rows 4.75x, 13 5.12x, 14 5.39x, 15 5.68x, 16 5.69x)
ROW_GROUP = 4
#: the tables by how the weights are multiplied (:mod:`runner.ml.kernels`, :meth:`StepCost.of`):
#: "batched", GGML's batched kernels, measured on gemma-3-270m Q4_K_M to 32 rows (2 cores,
#: llama.cpp through the old engine, after a 200-token prompt) with the leftover costs of 1, 2
#: and 3 rows past a multiple of :data:`ROW_GROUP`, and matched by SmolLM2 requantized to Q4_K_M
#: and Q8_0; "lone", a decoded batch's products as lone rows' (runner/ml/ggml/lone_rows.c, its
#: Q5_0 ones by its own tiles), measured on gemma-3-270m Q4_K_M (old engine, ``bench_rows.py
#: --rounds 8``, 400-token prompt, two runs: about what its batched products cost in the same
#: run, 16 rows 5.26x against 5.16x, 32 9.39x against 9.27x; its Q8_0 output matrix, the largest,
#: stays on llamafile's tiles, whose leftover rows still cost a second pass, 5 rows 3.25x against
#: 8 rows' 3.18x); "tiled", our Q4_1 kernels, measured on SmolLM2-135M Q4_1 (new engine, the median of
#: three runs of medians of 6-8 rounds, whose 16 rows read 4.42x, 4.92x and 5.54x on this shared
#: machine: 2 rows 1.51x, 4 1.91x, 8 3.16x, 16 4.92x, 32 8.71x; 4k + 1, 2, 3 rows ~0.6, 0.8, 0.9
#: more than 4k; the wide AVX-512 tiles later made 5-16 rows 10-20% cheaper, 16 rows 4.27x, but a
#: replay with the table refit to that drafted more and gained less, so it stands); "per-row",
#: :data:`ROW_COST` (``bench/bench_rows.py`` measures them all). A fixed
#: table, not one measured at load: the depth, and with it which rows are computed in one batch,
#: must follow from the tokens alone (see above)
ROW_COSTS: dict[str, tuple[tuple[tuple[int, float], ...], tuple[float, ...] | None]] = {
    kernels.BATCHED: (((1, 1.0), (2, 2.07), (3, 2.35), (4, 2.72), (8, 3.71), (16, 5.07), (32, 8.45), (64, 15.0)),
                      (0.0, 1.05, 1.45, 1.85)),
    kernels.LONE: (((1, 1.0), (2, 1.77), (3, 1.95), (4, 2.20), (8, 3.22), (12, 4.28), (16, 5.45), (32, 9.55),
                    (64, 17.0)),
                   (0.0, 1.05, 1.5, 1.8)),
    kernels.TILED: (((1, 1.0), (2, 1.51), (3, 1.84), (4, 1.91), (8, 3.16), (16, 4.92), (32, 8.71), (64, 16.3)),
                    (0.0, 0.6, 0.8, 0.9)),
    kernels.PER_ROW: (ROW_COST, None),
}
#: the most tokens one draft may have, whatever ``draft_num_predict`` says (an engine reserves
#: room for ``1 + MAX_DRAFT`` output rows per sequence). Where every guess is right (the pool,
#: asked again) deeper drafts pay on batched and tiled weights: gemma-3-270m's 64 rows cost
#: 16.9-19.9 single ones against 32 rows' 9.4-10.6, 60 rows 16.3-16.9 (bench_rows.py), and
#: bench_spec's story asked again ran 3.68-3.69x no drafts' speed 59 deep against ~3.3x 31 deep;
#: llama-server's ngram-mod drafts up to 64. 62, not 64: GGML's CPU flash attention takes 64 rows or more to tiles that sum otherwise
#: than a lone row (ops.cpp, GGML_FA_TILE_Q), so a step stays at 63 rows (the controller's table
#: makes it 60, a multiple of :data:`ROW_GROUP`)
MAX_DRAFT = 62
#: draft only when the expected tokens per unit of time beat not drafting by this factor
GAIN = 1.05
#: a sequence's acceptance of a kind of guess before any was verified, unless its drafter says
#: otherwise (:attr:`runner.spec.drafter.Drafter.priors`: prompt lookup's short keys start at
#: 0.85): its first drafts are made on this alone, and an answer too short to learn from pays for
#: them (bench/bench_spec_replay.py compares priors over recorded answers)
PRIOR = 0.9
#: weight of one verified position in the moving average of acceptance
WEIGHT = 0.05
#: per token generated without a draft, the distance of acceptance from the prior shrinks by this
#: (0.98 undid a failed draft's lesson in the ~8 tokens to the next guess: see above)
RECOVERY = 0.998
#: drafts in a row with nothing accepted after which a sequence pauses drafting
MAX_FAILS = 3
#: the first pause, in generated tokens (doubling each time, up to :data:`MAX_PAUSE`)
PAUSE = 32
MAX_PAUSE = 1024


class StepCost:
    """The cost of a decode step by rows, relative to one row: piecewise linear through a table
    of (rows, cost), extended along its last piece; with ``leftover``, only at multiples of
    :data:`ROW_GROUP` rows (and below one), the rows past the last multiple adding
    ``leftover[rows % ROW_GROUP]``."""

    @classmethod
    def of(cls, file_type: str, kinds: Mapping[str, str]) -> "StepCost":
        """The cost table of a model whose GGUF file type is ``file_type`` (``Q4_K_M``, ``Q4_1``,
        ...; :attr:`runner.api.ModelInfo.quantization`) on an engine that multiplies several rows
        as ``kinds`` says (:attr:`runner.loop.engine.Engine.multiplies`): a type it does not name
        costs "per-row", the dearest, so that an unknown type drafts less rather than slows down."""
        name = kernels.kind_of(file_type, kinds)
        table, leftover = ROW_COSTS[name]
        return cls(table, leftover, name)

    def __init__(self, table: Sequence[tuple[int, float]] = ROW_COST,
                 leftover: Sequence[float] | None = None, name: str = "") -> None:
        self.name = name or "custom"  # which table (bench_rows.py prints it)
        self.table = sorted((int(r), float(c)) for r, c in table)
        if len(self.table) < 2 or self.table[0][0] != 1:
            raise ValueError("a cost table needs at least two rows, the first for 1 row")
        if leftover is not None and (len(leftover) != ROW_GROUP or leftover[0] != 0):
            raise ValueError(f"leftover costs: {ROW_GROUP} of them, the first 0")
        self.leftover = None if leftover is None else tuple(float(c) for c in leftover)

    def __call__(self, rows: int) -> float:
        if self.leftover is None or rows < ROW_GROUP:
            return self._line(rows)
        return self._line(rows - rows % ROW_GROUP) + self.leftover[rows % ROW_GROUP]

    def _line(self, rows: int) -> float:
        pieces = list(zip(self.table, self.table[1:]))
        (r0, c0), (r1, c1) = next((p for p in pieces if rows <= p[1][0]), pieces[-1])
        return c0 + (c1 - c0) * (rows - r0) / (r1 - r0)


def expected_tokens(alpha: float, k: int) -> float:
    """Tokens a step with ``k`` drafted tokens yields on average: ``1 + a + ... + a^k``."""
    total, term = 1.0, 1.0
    for _ in range(k):
        term *= alpha
        total += term
    return total


def best_depth(alpha: float, most: int, cost: Callable[[int], float], token_cost: float = 0.0) -> int:
    """The draft length in ``0..most`` that gives the most tokens per unit of cost at acceptance
    ``alpha``, when drafting a token costs ``token_cost`` (a draft model's decode; prompt lookup:
    0); 0 unless that beats not drafting by :data:`GAIN`."""
    base = 1.0 / cost(1)
    best_k, best_rate = 0, base
    for k in range(1, most + 1):
        rate = expected_tokens(alpha, k) / (cost(1 + k) + k * token_cost)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k if best_rate > GAIN * base else 0


def learnt(alpha: float, proposed: int, accepted: int) -> float:
    """Acceptance ``alpha`` after a draft of ``proposed`` tokens had its first ``accepted`` right:
    each right token moves it :data:`WEIGHT` of the way to 1, the first wrong one (if any) that
    much towards 0; the positions after it tell nothing."""
    alpha = 1.0 - (1.0 - alpha) * (1.0 - WEIGHT) ** accepted
    return alpha * (1.0 - WEIGHT) if accepted < proposed else alpha


@dataclass
class Acceptance:
    """One sequence's record of its drafts."""

    alpha: float = PRIOR  # estimated chance a drafted token is right (given the ones before were)
    prior: float = PRIOR  # what ``alpha`` starts from and drifts back to
    at: int = 0  # tokens generated when ``alpha`` was last updated
    fails: int = 0  # drafts in a row with nothing accepted
    pause: int = PAUSE  # the next pause's length
    paused_until: int = 0  # no drafts before this many tokens are generated

    def now(self, generated: int) -> float:
        """The acceptance estimate after ``generated`` tokens: drifted towards the prior for
        each token generated since the last verified draft."""
        return self.prior + (self.alpha - self.prior) * RECOVERY ** max(generated - self.at, 0)

    def record(self, generated: int, proposed: int, accepted: int) -> None:
        """A draft of ``proposed`` tokens was verified after ``generated`` tokens and
        ``accepted`` of them were right."""
        alpha = learnt(self.now(generated), proposed, accepted)
        # the step yielded the accepted tokens and the target's own: drafted tokens, not time
        # without drafts (counted so, a sequence drafting 16 right at a time drifted 30% of the
        # way back to the prior at every draft, and gemma3 never drafted past 16 at ~0.96)
        self.alpha, self.at = alpha, generated + accepted + 1
        if accepted:
            self.fails, self.pause = 0, PAUSE
            return
        self.fails += 1
        if self.fails >= MAX_FAILS:
            self.fails = 0
            self.paused_until = generated + self.pause
            self.pause = min(2 * self.pause, MAX_PAUSE)


@dataclass(eq=False)
class SeqDrafts:
    """What :class:`Speculation` keeps for one sequence."""

    drafter: Drafter
    depth: int  # the most tokens one draft may have (0: never drafts)
    kinds: dict[str, Acceptance] = field(default_factory=dict)  # the record of each kind of guess
    kind: str = ""  # the kind of the last draft proposed
    prior: float | None = None  # every kind's acceptance before its first draft (None: the drafter's)

    def acceptance(self, kind: str) -> Acceptance:
        """The record of the sequence's guesses of ``kind``."""
        record = self.kinds.get(kind)
        if record is None:
            prior = self.prior if self.prior is not None else self.drafter.priors.get(kind, PRIOR)
            record = self.kinds[kind] = Acceptance(prior, prior)
        return record


class Speculation:
    """The runner's speculative decoding: a drafter per sequence and the depth of each draft."""

    def __init__(self, enabled: bool = True, cost: Callable[[int], float] | None = None,
                 draft: DraftSource | None = None, pool: bool = False, prior: float | None = None) -> None:
        """``enabled`` False: no sequence ever drafts (``POLLAMA_SPECULATIVE=off``, or a model
        whose KV memory cannot drop a sequence's tail); ``cost``: a decode's cost by rows
        (default :class:`StepCost` over :data:`ROW_COST`); ``draft``: a draft model, which
        then drafts for every sequence instead of prompt lookup (Modelfile ``DRAFT``, the
        ``draft`` option); ``pool``: prompt lookup also drafts from an n-gram pool the
        sequences share (``POLLAMA_NGRAM_POOL``); ``prior``: every kind of guess's acceptance
        before its first draft (default: what the drafter says of each kind,
        :attr:`runner.spec.drafter.Drafter.priors`; bench_spec_replay.py compares others)."""
        self.enabled = enabled
        self.prior = prior
        self.cost = cost if cost is not None else StepCost()
        self.draft = draft
        # what the sequences that draft by lookup have read and written
        self.pool = NgramPool() if pool and enabled else None
        # what the pool's guesses have scored over the sequences so far (:func:`learnt` over
        # their verified positions): where a new sequence's record of them starts
        self.pooled = PRIORS[POOL]

    def begin(self, prompt: Sequence[Any], depth: int, slot: int = 0) -> SeqDrafts:
        """A sequence starts in slot ``slot`` with ``prompt`` (its inputs) and ``depth``, its
        request's ``draft_num_predict`` (the most tokens a draft may have; 0 turns drafting off)."""
        depth = max(0, min(depth, MAX_DRAFT)) if self.enabled else 0
        drafter: Drafter | None = NoDrafter()
        if depth:
            drafter = PromptLookup(prompt, pool=self.pool) if self.draft is None else self.draft.drafter(slot, prompt)
        seq = SeqDrafts(drafter or NoDrafter(), depth if drafter is not None else 0, prior=self.prior)
        if self.pool is not None and self.prior is None and POOL in seq.drafter.kinds:
            seq.kinds[POOL] = Acceptance(self.pooled, self.pooled)
        return seq

    def close(self) -> None:
        """Free the draft model, if any (the runner unloads)."""
        if self.draft is not None:
            self.draft.close()
            self.draft = None

    def propose(self, seq: SeqDrafts, generated: Sequence[int], limit: int, others: int) -> list[int]:
        """The tokens to verify after ``generated``'s last (just sampled) token: at most
        ``limit`` (what the context, ``num_predict`` and the batch leave), none while ``others``
        other sequences share the runner's batches. Pure: asking again gives the same draft."""
        n = len(generated)
        most = min(seq.depth, limit) if self.enabled else 0
        token_cost = self.draft.token_cost if self.draft is not None else 0.0
        # as deep as pays for the best kind not paused, then as deep as pays for the kind the
        # guess is (a guess may also be shorter)
        alphas = [a.now(n) for a in map(seq.acceptance, seq.drafter.kinds) if n >= a.paused_until]
        ask = best_depth(max(alphas), most, self.cost, token_cost) if most > 0 and others == 0 and alphas else 0
        guess = seq.drafter.propose(generated, ask) if seq.depth else []  # at 0 the pool still learns
        if not guess:
            return []
        seq.kind = seq.drafter.kind
        kind = seq.acceptance(seq.kind)
        if n < kind.paused_until:
            return []
        return guess[: best_depth(kind.now(n), len(guess), self.cost, token_cost)]

    def verified(self, seq: SeqDrafts, generated: int, proposed: int, accepted: int) -> None:
        """A draft of ``proposed`` tokens, made after ``generated`` tokens, had its first
        ``accepted`` tokens confirmed."""
        seq.acceptance(seq.kind).record(generated, proposed, accepted)
        if seq.kind == POOL and self.pool is not None:
            self.pooled = learnt(self.pooled, proposed, accepted)
