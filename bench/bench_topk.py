"""The decode graph's top-k (``runner.model.model.graph_top``), split in how many parts.

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
from runner.ml.ggml.backend import GGMLBackend  # noqa: E402
from runner.model.model import TOP_CANDIDATES, graph_top  # noqa: E402

PARTS = (1, 2, 4, 16, 64)


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
