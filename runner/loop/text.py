"""Engine-independent text handling of generated pieces (reference §1.6, Ollama's runner/common).

Pieces are the bytes each sampled token decodes to. The functions are generic over ``str`` and
``bytes`` (the reference's vectors are strings; the runner works on bytes so that a UTF-8 sequence
split across tokens is never decoded half-way).
"""

from __future__ import annotations

import math
from typing import Sequence, TypeVar

import numpy as np

from ..api import TokenLogprob

T = TypeVar("T", str, bytes)


def find_stop(text: T, stops: Sequence[T]) -> T | None:
    """The first stop sequence contained anywhere in ``text``, or None."""
    for stop in stops:
        if stop and stop in text:
            return stop
    return None


def contains_stop_suffix(text: T, stops: Sequence[T]) -> bool:
    """Whether ``text`` ends with a proper prefix of some stop: the text must be held back."""
    for stop in stops:
        for n in range(1, len(stop)):
            if text.endswith(stop[:n]):
                return True
    return False


def truncate_stop(pieces: list[T], stop: T) -> tuple[list[T], bool]:
    """Cut ``pieces`` at the first occurrence of ``stop``; keep the original piece boundaries.

    Returns the kept pieces and whether the last kept piece was cut short (``tokenTruncated``).
    """
    if not pieces:
        return [], False
    joined = pieces[0][:0].join(pieces)
    index = joined.find(stop)
    if index == -1:
        return list(pieces), False
    kept: list[T] = []
    total = 0
    truncated = False
    for piece in pieces:
        if total >= index:
            break
        room = index - total
        if len(piece) > room:
            kept.append(piece[:room])
            truncated = True
            break
        kept.append(piece)
        total += len(piece)
    return kept, truncated


def incomplete_utf8(data: bytes) -> bool:
    """Whether ``data`` ends inside a multi-byte UTF-8 sequence (more bytes may complete it)."""
    for back in range(1, min(4, len(data)) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if byte & 0xE0 == 0xC0:
            need = 2
        elif byte & 0xF0 == 0xE0:
            need = 3
        elif byte & 0xF8 == 0xF0:
            need = 4
        else:
            return False
        return back < need
    return False


def decode_flush(data: bytes) -> str:
    """Decode held-back bytes for output, dropping an invalid tail (Go's flushPending)."""
    while data:
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as err:
            if err.end >= len(data) or err.start >= len(data) - 3:
                data = data[: err.start]
                continue
            return data.decode("utf-8", errors="replace")
    return ""


def token_logprobs(
    logits: np.ndarray, token: int, top_k: int, piece: callable
) -> TokenLogprob:
    """Log-softmax over the full vocabulary (numerically stable) for the sampled ``token``.

    ``piece(id) -> bytes`` names tokens; ``top_k`` alternatives are sorted by descending logprob.
    """
    x = logits.astype(np.float64, copy=False)
    m = float(np.max(x))
    lse = m + math.log(float(np.sum(np.exp(x - m))))
    def entry(tid: int) -> TokenLogprob:
        raw = piece(tid)
        return TokenLogprob(
            token=raw.decode("utf-8", errors="replace"),
            logprob=float(x[tid] - lse),
            bytes=list(raw),
        )
    out = entry(token)
    if top_k > 0:
        k = min(top_k, x.shape[0])
        idx = np.argpartition(-x, k - 1)[:k]
        idx = idx[np.argsort(-x[idx], kind="stable")]
        out.top_logprobs = [entry(int(i)) for i in idx]
    return out
