"""Embedding throughput: 200 one-token inputs on SmolLM2, per engine, prints a Markdown table.

For each engine and run, in interleaved order: load the model, embed the 200 inputs in one call
(the first embedding after the load), again (warm), then one call per input (each input its own
decode, which is what every call did before inputs shared decodes). Wall time and process CPU
time (all threads) per call; medians over --runs. With --server the same first/warm calls go
through `pollama serve`'s /api/embed (server process CPU). "old-ggml": the old engine with
POLLAMA_ROW_KERNELS=0 (llama.cpp's own Q4_1 products, not our kernels).

    python bench/bench_embed.py [--runs 3] [--threads N] [--server]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Options  # noqa: E402

N_INPUTS = 200


def load(engine: str, threads: int):
    """``engine``: "old", "new", or "old-ggml" (POLLAMA_ROW_KERNELS=0: llama.cpp's own Q4_1 products)."""
    cfg = dataclasses.replace(config.load({}), new_engine=engine.startswith("new"),
                              row_kernels=not engine.endswith("-ggml"))
    r = runner.load(runner.resolve(None, cfg), Options(num_thread=threads), cfg)
    assert r.engine == engine.split("-")[0]
    return r


def one_token_words(r, n: int) -> list[str]:
    """``n`` distinct texts that each tokenize to exactly one token."""
    out = []
    for token in range(1000, r.n_vocab):
        text = r.detokenize([token]).strip()
        if text and r.tokenize(text) == [r.tokenize(text)[0]] and text not in out:
            out.append(text)
            if len(out) == n:
                return out
    raise RuntimeError("not enough one-token words")


def timed(fn) -> tuple[float, float]:
    """(wall s, process CPU s) of ``fn()``."""
    t0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t0, time.process_time() - c0


def in_process(engine: str, threads: int, words: list[str]) -> dict[str, tuple[float, float]]:
    r = load(engine, threads)
    try:
        out = {"first": timed(lambda: r.embed(words)), "warm": timed(lambda: r.embed(words))}
        out["one per call"] = timed(lambda: [r.embed([w]) for w in words])
        return out
    finally:
        r.close()


def _cpu(pid: int) -> float:
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def through_server(engine: str, threads: int, words: list[str]) -> dict[str, tuple[float, float]]:
    from serverproc import ServerProcess

    out = {}
    with ServerProcess({"OLLAMA_NEW_ENGINE": "1" if engine == "new" else "0"}) as proc:
        body = {"model": "smollm2:135m", "options": {"num_thread": threads}}
        httpx.post(proc.url + "/api/embed", json={**body, "input": []}, timeout=300).raise_for_status()  # load only
        for name in ("first", "warm"):
            c0, t0 = _cpu(proc.proc.pid), time.perf_counter()
            httpx.post(proc.url + "/api/embed", json={**body, "input": words}, timeout=600).raise_for_status()
            out[name] = (time.perf_counter() - t0, _cpu(proc.proc.pid) - c0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--server", action="store_true", help="also measure /api/embed through pollama serve")
    args = ap.parse_args()

    r = load("old", args.threads)
    words = one_token_words(r, N_INPUTS)
    r.close()
    kinds = [("in-process", in_process)] + ([("/api/embed", through_server)] if args.server else [])
    results: dict[tuple[str, str, str], list[tuple[float, float]]] = {}
    for _ in range(args.runs):  # interleaved: every configuration once per round
        for where, fn in kinds:
            for engine in ("old", "old-ggml", "new") if fn is in_process else ("old", "new"):
                for name, value in fn(engine, args.threads, words).items():
                    results.setdefault((where, engine, name), []).append(value)

    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}, "
          f"{args.threads} threads; model SmolLM2-135M-Instruct Q4_1; {N_INPUTS} one-token inputs; "
          f"median of {args.runs} runs; load average {os.getloadavg()[0]:.2f}")
    print()
    print("| path | engine | call | wall (s) | CPU (s) | ms per input |")
    print("|---|---|---|---:|---:|---:|")
    for (where, engine, name), values in results.items():
        wall = statistics.median(v[0] for v in values)
        cpu = statistics.median(v[1] for v in values)
        print(f"| {where} | {engine} | {name} | {wall:.2f} | {cpu:.2f} | {1000 * wall / N_INPUTS:.1f} |")


if __name__ == "__main__":
    main()
