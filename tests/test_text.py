"""Stop sequences, partial UTF-8 and logprobs (Go's runner/common stop_test.go, logprob_test.go)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from runner.loop.text import (
    contains_stop_suffix,
    decode_flush,
    find_stop,
    incomplete_utf8,
    token_logprobs,
    truncate_stop,
)


@pytest.mark.parametrize(
    "pieces,stop,expected,truncated",
    [
        (["hello", "world"], "world", ["hello"], False),  # single word
        (["hello", "wor"], "or", ["hello", "w"], True),  # partial
        (["Hello", " there", "!"], "!", ["Hello", " there"], False),  # suffix
        (["Hello", " the", "re!"], "there!", ["Hello", " "], True),  # suffix partial
        (["hello", " wor"], "llo w", ["he"], True),  # middle
        (["a", "b"], "zz", ["a", "b"], False),  # absent
    ],
)
def test_truncate_stop(pieces, stop, expected, truncated):
    assert truncate_stop(pieces, stop) == (expected, truncated)
    # the runner works on bytes: same answer
    got, trunc = truncate_stop([p.encode() for p in pieces], stop.encode())
    assert ([g.decode() for g in got], trunc) == (expected, truncated)


def test_find_stop_and_suffix():
    assert find_stop("say hello there", ["xyz", "hello"]) == "hello"
    assert find_stop("say hi", ["hello"]) is None
    assert contains_stop_suffix("say hel", ["hello"])
    assert not contains_stop_suffix("say hex", ["hello"])
    assert not contains_stop_suffix("say hello", ["hello"])  # a whole stop is found, not a suffix


@pytest.mark.parametrize("char", ["é", "€", "😀"])
def test_incomplete_unicode(char):
    data = char.encode()
    assert not incomplete_utf8(b"ab" + data)
    for missing in range(1, len(data)):
        assert incomplete_utf8(b"ab" + data[:-missing]), (char, missing)


def test_incomplete_unicode_plain():
    assert not incomplete_utf8(b"")
    assert not incomplete_utf8(b"hello")


def test_decode_flush_drops_invalid_tail():
    assert decode_flush("hé".encode() + "😀".encode()[:2]) == "hé"
    assert decode_flush(b"ok") == "ok"


def piece(tid: int) -> bytes:
    return f"t{tid}".encode()


def test_logprobs_basic_and_sorted():
    logits = np.array([1.0, 3.0, 2.0, 0.5], dtype=np.float32)
    out = token_logprobs(logits, 2, 3, piece)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    assert out.token == "t2" and out.bytes == list(b"t2")
    assert out.logprob == pytest.approx(math.log(probs[2]), rel=1e-6)
    assert [t.token for t in out.top_logprobs] == ["t1", "t2", "t0"]
    values = [t.logprob for t in out.top_logprobs]
    assert values == sorted(values, reverse=True)


def test_logprobs_numerically_stable():
    logits = np.array([1000.0, 999.0, -1000.0], dtype=np.float32)
    out = token_logprobs(logits, 0, 3, piece)
    assert math.isfinite(out.logprob) and out.logprob < 0
    assert sum(math.exp(t.logprob) for t in out.top_logprobs) == pytest.approx(1.0, rel=1e-6)


def test_logprobs_top_k_larger_than_vocab():
    out = token_logprobs(np.zeros(2, dtype=np.float32), 1, 10, piece)
    assert len(out.top_logprobs) == 2
