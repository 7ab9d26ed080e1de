"""Verifying a draft (runner.spec.verify): rows sampled in order, accepted up to the first
mismatch, each token emitted before the next row is read, stopped where the output ends."""

from __future__ import annotations

from runner.spec.verify import verify


def run(draft, target, ends_at=None):
    sampled, emitted = [], []

    def sample(i):
        sampled.append(i)
        return target[i]

    def emit(i, token):
        assert sampled[-1] == i  # handed over before the next row is sampled
        emitted.append((i, token))
        return ends_at is None or i < ends_at

    return verify(draft, sample, emit), sampled, emitted


def test_all_accepted_gives_a_bonus_token():
    result, sampled, emitted = run([5, 6, 7], [5, 6, 7, 8])
    assert (result.tokens, result.accepted, result.ended) == ([5, 6, 7, 8], 3, False)
    assert sampled == [0, 1, 2, 3] and emitted == [(0, 5), (1, 6), (2, 7), (3, 8)]


def test_the_first_mismatch_takes_the_targets_token():
    result, sampled, _ = run([5, 6, 7], [5, 9, 7, 8])
    assert (result.tokens, result.accepted, result.ended) == ([5, 9], 1, False)
    assert sampled == [0, 1]  # the rows after a mismatch are never sampled
    result, sampled, _ = run([5, 6, 7], [4, 6, 7, 8])
    assert (result.tokens, result.accepted) == ([4], 0) and sampled == [0]


def test_an_empty_draft_is_one_plain_step():
    result, sampled, _ = run([], [3])
    assert (result.tokens, result.accepted, result.ended) == ([3], 0, False) and sampled == [0]


def test_stops_where_the_output_ends_the_sequence():
    result, sampled, emitted = run([5, 6, 7], [5, 6, 7, 8], ends_at=1)
    assert (result.tokens, result.accepted, result.ended) == ([5, 6], 1, True)
    assert sampled == [0, 1] and emitted == [(0, 5), (1, 6)]
    result, _, _ = run([5, 6], [5, 6, 9], ends_at=2)  # the bonus ends it
    assert (result.tokens, result.accepted, result.ended) == ([5, 6, 9], 2, True)
