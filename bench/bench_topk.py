"""The decode graph's top-k as it was (:func:`graph_top`, here since the runner dropped it), split in how many parts.

    python bench/bench_topk.py [--threads 2] [--widths 49152,262144] [--runs 5] [--iters 200]

GGML's ``top_k`` works each row on one thread (a heap of K = 128 over the row), so the decode
graph splits a row of logits in parts (one per thread) and picks the K best of the parts' K
best. This times ``graph_top`` over one row of random logits, as a graph of its own on GGML's
CPU backend, for 1, 2, 4, 16 and 64 parts, next to a graph that only adds the row to itself
(the cost of running any graph over the row: upload, dispatch, one pass). Medians of
``--runs`` interleaved rounds of ``--iters`` computes each, in microseconds per compute.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.ml.backend import BackendOptions  # noqa: E402
from runner.ml.ggml.backend import GGMLBackend, GGMLTensor  # noqa: E402
from runner.model.model import TOP_CANDIDATES  # noqa: E402

PARTS = (1, 2, 4, 16, 64)


def graph_top(logits: GGMLTensor, parts: int) -> tuple[GGMLTensor, GGMLTensor]:
    """The TOP_CANDIDATES best of each row of ``logits`` (f32 ``[width, rows]``, contiguous):
    their ids (i32) and logits, each ``[1, K, rows]``, sorted by logit, descending (ties in no
    particular order). GGML's top_k works a row on one thread: each row is split in ``parts``
    (dividing ``width``), whose K best hold the row's K best, and a second top_k picks those
    from the parts' K * parts. (The decode graph ended this way until 2026-11-24's fifth pass;
    the sampler now picks them in C, ``runner/sample/best.c``.)"""
    width, rows = logits.dim(0), logits.dim(1)
    k = TOP_CANDIDATES
    part = width // parts
    ids = logits.reshape(part, parts * rows).top_k(k)  # [k, parts*rows], in no order
    vals = logits.reshape(1, part, parts * rows).rows(ids)  # [1, k, parts*rows]
    if parts > 1:
        first = np.tile(np.arange(parts, dtype=np.float32) * part, rows)[:, None]  # each part's first id
        ids = ids.cast("f32").add(logits.ctx.input("top.first", first))  # row ids, exact below 2**24
        best = vals.reshape(k * parts, rows).top_k(k)  # [k, rows]
        vals = vals.reshape(1, k * parts, rows).rows(best)
        ids = ids.reshape(1, k * parts, rows).rows(best).cast("i32")
    order = vals.reshape(k, rows).argsort_desc()
    return ids.reshape(1, k, rows).rows(order), vals.rows(order)


def timed(backend: GGMLBackend, row: np.ndarray, parts: int | None, iters: int) -> float:
    """Microseconds per compute of one graph: ``graph_top`` in ``parts`` (None: row + row)."""
    ctx = backend.new_context()
    try:
        x = ctx.input("logits", row.reshape(1, -1))  # GGML [width, 1]
        outs = (x.add(x),) if parts is None else graph_top(x, parts)
        ctx.compute(*outs)  # placement, first touch
        t0 = time.perf_counter_ns()
        for _ in range(iters):
            ctx.compute(*outs)
        return (time.perf_counter_ns() - t0) / iters / 1e3
    finally:
        ctx.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--widths", default="49152,262144", help="vocabulary sizes (SmolLM2, gemma3)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    backend = GGMLBackend(BackendOptions(num_threads=args.threads))
    rng = np.random.default_rng(0)
    widths = [int(w) for w in args.widths.split(",")]
    cases = [None, *PARTS]
    samples: dict[tuple[int, int | None], list[float]] = {}
    for _ in range(args.runs):
        for width in widths:
            row = (rng.standard_normal(width) * 3).astype(np.float32)
            for parts in cases:
                if parts is not None and (width % parts or width // parts < TOP_CANDIDATES):
                    continue
                samples.setdefault((width, parts), []).append(timed(backend, row, parts, args.iters))
    backend.close()
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, {args.threads} threads, K = {TOP_CANDIDATES}; "
          f"median of {args.runs} interleaved runs x {args.iters} computes; load average {os.getloadavg()[0]:.2f}\n")
    print("| width | graph | us per compute | vs 1 part |")
    print("|---:|---|---:|---:|")
    for width in widths:
        one = statistics.median(samples[(width, 1)])
        for parts in cases:
            if (width, parts) not in samples:
                continue
            us = statistics.median(samples[(width, parts)])
            name = "row + row (no top-k)" if parts is None else f"top-k in {parts} part{'s' if parts > 1 else ''}"
            print(f"| {width} | {name} | {us:.0f} | {us / one:.2f}x |")


if __name__ == "__main__":
    main()
