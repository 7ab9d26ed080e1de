"""The prompt store's RAM tier (issue 25, first slice): old engine, SmolLM2, in process.

    python bench/bench_prompt_store.py [--convs 4] [--tokens 2000] [--sizes 2048,4096,8000] [--threads 1]

(a) ``--convs`` conversations of ~``--tokens`` tokens take turns on one slot (raw prompts, greedy,
one generated token: TTFT = the request's wall time). Cold = each conversation's first turn;
returning = each conversation's second turn, after all the others had the slot, on a runner with
``OLLAMA_CACHE_RAM`` on (restored from RAM) and one with it off (re-evaluated).
(b) Restore vs recompute of one sequence of each of ``--sizes`` tokens on the engine itself:
evaluating the tokens (``num_batch`` 512 a batch) against ``export_seq`` + ``import_seq``.

One llama.cpp thread by default: on 2 shared cores, more threads spin against each other.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Options, Request  # noqa: E402
from runner.engines.llamacpp.engine import LlamaEngine  # noqa: E402

WORDS = ("harbor lantern river stone orchard winter market letter engine garden silver morning "
         "thunder valley bridge candle meadow paper window forest copper island harvest signal").split()


def text(seed: int, tokens: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(int(tokens * 1.15)))  # a word is ~1 token; (b) cuts


def load(cache_ram: int, threads: int, num_ctx: int):
    cfg = dataclasses.replace(config.load({}), new_engine=False, cache_ram=cache_ram)
    return runner.load(runner.resolve(None, cfg), Options().merged({"num_ctx": num_ctx, "num_thread": threads}),
                       cfg, num_parallel=1)


def ttft(r, prompt: str) -> tuple[float, int]:
    """(ms, prompt tokens evaluated) of a one-token greedy request."""
    request = Request(prompt=prompt, raw=True, options=Options().merged({"temperature": 0, "num_predict": 1}))
    t0 = time.perf_counter()
    final = None
    for chunk in r.stream(request):
        if chunk.done:
            final = chunk
    return (time.perf_counter() - t0) * 1e3, final.metrics.prompt_eval_count


def turns(args) -> None:
    docs = [text(k, args.tokens) for k in range(args.convs)]
    follow = "\nQuestion: which word came up most often, and why might that be?\nAnswer:"
    rows = {}
    for label, cache_ram in (("RAM store on", 1024), ("RAM store off", 0)):
        r = load(cache_ram, args.threads, args.tokens * 2 + 256)
        try:
            cold = [ttft(r, d) for d in docs]
            back = [ttft(r, d + follow) for d in docs]  # each after all the others had the slot
            rows[label] = (cold, back)
        finally:
            r.close()
    print(f"\n(a) {args.convs} conversations of ~{args.tokens} tokens on 1 slot, returning turn TTFT\n")
    print("| runner | cold TTFT (ms) | returning TTFT (ms) | evaluated, returning | returning / cold |")
    print("|---|---:|---:|---:|---:|")
    for label, (cold, back) in rows.items():
        c = statistics.median(ms for ms, _ in cold)
        b = statistics.median(ms for ms, _ in back)
        n = statistics.median(k for _, k in back)
        print(f"| {label} | {c:.1f} | {b:.1f} | {n:.0f} | {b / c:.3f} |")


def restore(args) -> None:
    cfg = dataclasses.replace(config.load({}), new_engine=False)
    info = runner.resolve(None, cfg).info
    sizes = [int(s) for s in args.sizes.split(",")]
    plan = runner.load_options(info, Options().merged({"num_ctx": max(sizes) + 16, "num_batch": 512,
                                                       "num_thread": args.threads}), cfg, 1)
    engine = LlamaEngine(info, plan)
    print("\n(b) one sequence: evaluate its tokens vs export + import its state\n")
    print("| tokens | state (MB) | recompute (ms) | export (ms) | import (ms) | recompute / restore |")
    print("|---:|---:|---:|---:|---:|---:|")
    try:
        for n in sizes:
            tokens = engine.tokenize(text(100 + n, n))[:n]
            engine.kv.seq_rm(0, 0, None)
            t0 = time.perf_counter()
            for i in range(0, len(tokens), 512):
                engine.batch_begin()
                engine.batch_add(tokens[i : i + 512], i, 0)
                engine.prepare()
                engine.decode()
            recompute = (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            state = engine.kv.export_seq(0)
            export = (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            assert engine.kv.import_seq(0, state)
            load_ms = (time.perf_counter() - t0) * 1e3
            print(f"| {len(tokens)} | {len(state) / 1e6:.1f} | {recompute:.0f} | {export:.1f} | {load_ms:.1f} | "
                  f"{recompute / (export + load_ms):.0f}× |")
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--convs", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--sizes", default="2048,4096,8000")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip", default="", help="comma-separated: turns,restore")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {args.threads} llama.cpp thread(s), "
          f"SmolLM2-135M, old engine; load average {os.getloadavg()[0]:.2f}")
    if "turns" not in args.skip:
        turns(args)
    if "restore" not in args.skip:
        restore(args)


if __name__ == "__main__":
    main()
