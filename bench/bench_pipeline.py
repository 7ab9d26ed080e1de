"""Pipelined decoding (POLLAMA_PIPELINE) vs inline, per engine: prints a Markdown table.

For each engine, two runners of the same model are loaded side by side, one decoding inline on
the loop thread and one on a compute thread with the next batch built meanwhile
(runner.loop.pipeline). The runs interleave (inline, pipelined, inline, ...) so that load on the
machine hits both alike; every figure is the median of --runs runs:

- prompt tok/s: a ~250-token prompt evaluated from an empty slot;
- decode tok/s: one stream, --tokens greedy tokens;
- N streams tok/s: --streams concurrent streams, generated tokens / wall time.

    python bench/bench_pipeline.py [--runs 5] [--threads N] [--tokens 128] [--streams 4]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Options, Request  # noqa: E402

PROMPT = (
    "The history of the printing press begins long before Gutenberg. Carved wooden blocks were used "
    "to print patterns on cloth and later pages of text, and movable type made of ceramic and then "
    "metal appeared in East Asia centuries before it reached Europe. "
) * 4
STREAM_PROMPTS = ["Write a story about a lighthouse keeper.", "Explain how bread rises.",
                  "Describe a walk in an autumn forest.", "What makes a good friend?"]


def load(model: str | None, engine: str, pipeline: bool, threads: int, parallel: int):
    cfg = dataclasses.replace(config.load({}), new_engine=(engine == "new"), pipeline=pipeline)
    r = runner.load(runner.resolve(model, cfg), Options(num_ctx=1024, num_thread=threads), cfg, num_parallel=parallel)
    assert r.engine == engine, (r.engine, engine)
    return r


def options(tokens: int) -> Options:
    return Options().merged({"temperature": 0, "repeat_penalty": 1.0, "num_predict": tokens})


def single(r, tokens: int) -> tuple[float, float]:
    """(prompt tok/s, decode tok/s) of one stream from an empty slot."""
    final = None
    for chunk in r.stream(Request(prompt=PROMPT, raw=True, cache_prompt=False, options=options(tokens))):
        if chunk.done:
            final = chunk
    m = final.metrics
    return m.prompt_eval_count / (m.prompt_eval_duration / 1e9), m.eval_count / (m.eval_duration / 1e9)


def streams(r, tokens: int, n: int) -> float:
    """Generated tok/s of ``n`` concurrent streams (wall time)."""
    counts = [0] * n

    def work(i: int) -> None:
        request = Request(prompt=STREAM_PROMPTS[i % len(STREAM_PROMPTS)], cache_prompt=False, options=options(tokens))
        for chunk in r.stream(request):
            if chunk.done:
                counts[i] = chunk.metrics.eval_count

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None, help="store name or .gguf path (default: SmolLM2)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--engines", default="new,old")
    args = ap.parse_args()

    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {args.threads} threads, "
          f"load average {os.getloadavg()[0]:.2f} at start; model {args.model or 'SmolLM2-135M Q4_1'}; "
          f"median of {args.runs} interleaved runs\n")
    print(f"| engine | decoder | prompt tok/s | decode tok/s | {args.streams} streams tok/s |")
    print("|---|---|---:|---:|---:|")
    for engine in args.engines.split(","):
        runners = {p: load(args.model, engine, p, args.threads, args.streams) for p in (False, True)}
        results: dict[bool, list[tuple[float, float, float]]] = {False: [], True: []}
        try:
            for p in (False, True):  # warm-up: graphs built, pages touched
                single(runners[p], 16)
            for k in range(args.runs):
                for p in ((False, True) if k % 2 == 0 else (True, False)):
                    pp, tg = single(runners[p], args.tokens)
                    results[p].append((pp, tg, streams(runners[p], args.tokens, args.streams)))
        finally:
            for r in runners.values():
                r.close()
        base = None
        for p in (False, True):
            med = [statistics.median(col) for col in zip(*results[p])]
            if base is None:
                base = med
                ratio = ["", "", ""]
            else:
                ratio = [f" ({m / b:.2f}x)" for m, b in zip(med, base)]
            name = "pipelined" if p else "inline"
            print(f"| {engine} | {name} | {med[0]:.0f}{ratio[0]} | {med[1]:.1f}{ratio[1]} | {med[2]:.1f}{ratio[2]} |")
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
