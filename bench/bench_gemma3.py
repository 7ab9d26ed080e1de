"""gemma3 (gemma-3-270m Q4_K_M, 262k-token vocabulary) on both engines: prints Markdown tables.

(a) prompt and decode tokens/s, old engine (llama.cpp) vs new engine (our GGML graph), same
    model, threads, context, batch and flash attention; the two runners are loaded side by side
    and measured in alternating order, run after run.
(b) aggregate decode tokens/s of 4 concurrent streams (num_parallel 4), both engines.
(c) where the new engine's time per decoded token goes: graph build/reuse, cache bookkeeping and
    inputs, GGML compute, reading the logits out, and sampling over 262k logits (``Model.stats``
    and timers around the same calls the runner makes).

    flock /tmp/pollama-heavy.lock python bench/bench_gemma3.py [--runs 5] [--threads N]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Options, Request  # noqa: E402
from runner.model.models import Batch  # noqa: E402
from runner.sample import Sampler, SamplerOptions  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" if (ROOT.parent / "shared").is_dir() else ROOT / "shared"
PROMPT = " ".join(f"Day {i}: Lily went to the park with her dog and counted {i + 3} birds in the trees." for i in range(24))
N_GEN = 128


def gemma3_path() -> str:
    out = subprocess.run(["bash", str(SHARED / "models" / "fetch-gemma3.sh")], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def load(path: str, engine: str, threads: int, parallel: int = 1):
    cfg = dataclasses.replace(config.load({}), new_engine=(engine == "new"))
    r = runner.load(runner.resolve(path, cfg), Options(num_ctx=2048, num_batch=512, num_thread=threads), cfg, num_parallel=parallel)
    assert r.engine == engine
    return r


def generate(r, prompt: str, n: int):
    opts = Options(temperature=0, repeat_penalty=1.0, num_predict=n)
    final = None
    for chunk in r.stream(Request(prompt=prompt, raw=True, cache_prompt=False, options=opts)):
        if chunk.done:
            final = chunk
    return final


def speed(r) -> tuple[float, float, int, int]:
    """(prompt tok/s, decode tok/s, prompt tokens, decoded tokens) of one cold generation."""
    m = generate(r, PROMPT, N_GEN).metrics
    return (m.prompt_eval_count / (m.prompt_eval_duration / 1e9), (m.eval_count - 1) / (m.eval_duration / 1e9),
            m.prompt_eval_count, m.eval_count)


def streams(r, n_streams: int) -> float:
    prompts = ["Once upon a time in a small village", "The history of the printing press",
               "Here is a recipe for bread:", "The planets of the solar system are"]
    counts = [0] * n_streams

    def work(i: int) -> None:
        counts[i] = generate(r, prompts[i % len(prompts)], 96).metrics.eval_count

    t0 = time.perf_counter()
    ts = [threading.Thread(target=work, args=(i,)) for i in range(n_streams)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return sum(counts) / (time.perf_counter() - t0)


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    args = ap.parse_args()
    path = gemma3_path()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
          f"{platform.python_version()}, {args.threads} threads; model gemma-3-270m Q4_K_M; num_ctx 2048, "
          f"num_batch 512, flash attention {'on' if config.load({}).flash_attention else 'off'}; median of "
          f"{args.runs} runs; load average {os.getloadavg()[0]:.2f}\n")

    # (a) one runner per engine, measured alternately
    runners = {e: load(path, e, args.threads) for e in ("old", "new")}
    rates: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
    n_prompt = n_gen = 0
    for e in ("old", "new"):
        speed(runners[e])  # warm-up
    for i in range(args.runs):
        for e in (("old", "new") if i % 2 == 0 else ("new", "old")):
            pp, tg, n_prompt, n_gen = speed(runners[e])
            rates[e].append((pp, tg))
    print(f"(a) prompt ({n_prompt} tokens) and decode ({n_gen} tokens) speed, alternating runs\n")
    print("| engine | prompt tok/s | decode tok/s | prompt vs old | decode vs old |")
    print("|---|---:|---:|---:|---:|")
    base = {k: med([r[k] for r in rates["old"]]) for k in (0, 1)}
    for e in ("old", "new"):
        pp, tg = med([r[0] for r in rates[e]]), med([r[1] for r in rates[e]])
        print(f"| {e} | {pp:.1f} | {tg:.1f} | {pp / base[0]:.2f}× | {tg / base[1]:.2f}× |")
    print()

    # (c) the new engine's time per decoded token: the same forward passes and greedy sampling as
    # the runner's, driven directly so each part can be timed
    tg_new, tg_old = med([r[1] for r in rates["new"]]), med([r[1] for r in rates["old"]])
    model = runners["new"].model_engine.model
    tokens = runners["new"].tokenize(PROMPT)
    model.cache.remove(0, 0, None)  # slot 0's cache is ours now; this runner is closed afterwards
    for i in range(0, len(tokens), 512):
        logits = model.compute(Batch.sequence(tokens[i : i + 512], start=i))[0]
    sampler = Sampler(SamplerOptions.from_options(Options(temperature=0, repeat_penalty=1.0)), num_ctx=2048)
    model.stats.reset()
    sample_ns, pos = 0, len(tokens)
    t0 = time.perf_counter_ns()
    for _ in range(N_GEN):
        t = time.perf_counter_ns()
        token = sampler.sample(logits)
        sampler.accept(token)
        sample_ns += time.perf_counter_ns() - t
        logits = model.compute(Batch.sequence([token], start=pos))[0]
        pos += 1
    wall = time.perf_counter_ns() - t0
    st = model.stats
    us = lambda ns: ns / N_GEN / 1e3  # noqa: E731
    print(f"(c) new engine, time per decoded token ({N_GEN} tokens after the prompt, {st.builds} graphs built)\n")
    print("| part | µs per token |")
    print("|---|---:|")
    print(f"| graph build (Python, {st.builds} of {st.calls}) | {us(st.build_ns):.0f} |")
    print(f"| cache bookkeeping + graph inputs (Python) | {us(st.prepare_ns):.0f} |")
    print(f"| GGML: upload inputs + compute (262k-row output matmul included) | {us(st.compute_ns):.0f} |")
    print(f"| logits out ({model.n_vocab} floats) | {us(st.read_ns):.0f} |")
    print(f"| greedy sampling over {model.n_vocab} logits | {us(sample_ns):.0f} |")
    print(f"| = model + sampling, driven directly | {us(wall):.0f} |")
    print(f"| new engine's runner (1 / decode tok/s) | {1e6 / tg_new:.0f} |")
    print(f"| old engine's runner (1 / decode tok/s) | {1e6 / tg_old:.0f} |")
    print()
    for label, opts in (("temperature 0.8, top_k 40, top_p 0.9", Options(temperature=0.8, top_k=40, top_p=0.9)),
                        ("temperature 0.8, no top_k", Options(temperature=0.8, top_k=0, top_p=1.0))):
        sampler = Sampler(SamplerOptions.from_options(opts), num_ctx=2048)
        t = time.perf_counter_ns()
        for _ in range(50):
            sampler.sample(logits)
        print(f"sampling {model.n_vocab} logits, {label}: {(time.perf_counter_ns() - t) / 50 / 1e3:.0f} µs")
    print()

    for r in runners.values():
        r.close()

    # (b) 4 concurrent streams, alternating
    par = {e: load(path, e, args.threads, parallel=4) for e in ("old", "new")}
    agg: dict[str, list[float]] = {"old": [], "new": []}
    for e in ("old", "new"):
        streams(par[e], 4)  # warm-up
    for i in range(args.runs):
        for e in (("old", "new") if i % 2 == 0 else ("new", "old")):
            agg[e].append(streams(par[e], 4))
    print("(b) aggregate decode tok/s, 4 concurrent streams of 96 tokens (num_parallel 4)\n")
    print("| engine | 4 streams tok/s | vs old |")
    print("|---|---:|---:|")
    for e in ("old", "new"):
        print(f"| {e} | {med(agg[e]):.1f} | {med(agg[e]) / med(agg['old']):.2f}× |")
    for r in par.values():
        r.close()
    print(f"\nload average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
