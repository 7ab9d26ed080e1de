"""Parallel decoding through ``pollama serve``: aggregate tokens/s of 1, 2 and 4 concurrent streams
against the same streams run one after another, and the time to first token of a request that
arrives while others stream.

    python bench/bench_parallel.py [--runs 5] [--tokens 128] [--model smollm2:135m]

A real server subprocess (``OLLAMA_NUM_PARALLEL=4``) on a free port; each stream is a greedy
``/api/generate`` of ``--tokens`` tokens (prompts that ask for long text, so none stops early; a
stream that does stop early is reported). Aggregate = generated tokens / wall time. Medians of
``--runs`` runs. Run it on a quiet machine: llama.cpp's threads slow down badly when the cores
are shared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serverproc import ServerProcess  # noqa: E402

PROMPTS = [
    "Write a long, detailed story about a dragon who learns to paint. Describe every scene.",
    "Explain in great detail how a steam engine works, step by step, with examples.",
    "Write a long essay about the history of the printing press and its effects on Europe.",
    "Describe, at length, a walk through a busy market in a city you imagine, with all its sounds.",
    "Write a very long letter from a sailor to his family describing a year at sea.",
    "Give a long, thorough explanation of how plants turn sunlight into food.",
]


@dataclass
class Stream:
    tokens: int
    seconds: float
    ttft: float
    done_reason: str


STREAMING = True  # --no-stream: one JSON answer per request (no per-token client work)


def stream(url: str, model: str, prompt: str, tokens: int, started: threading.Event | None = None,
           streaming: bool | None = None) -> Stream:
    streaming = STREAMING if streaming is None else streaming
    body = {"model": model, "prompt": prompt, "stream": streaming,
            "options": {"temperature": 0, "num_predict": tokens, "seed": 1}}
    t0 = time.perf_counter()
    ttft = 0.0
    final: dict = {}
    with httpx.Client(timeout=600) as client:
        with client.stream("POST", url + "/api/generate", json=body) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if not line:
                    continue
                item = json.loads(line)
                if "error" in item:
                    raise RuntimeError(item["error"])
                if not ttft:
                    ttft = time.perf_counter() - t0
                    if started is not None:
                        started.set()
                if item.get("done"):
                    final = item
    return Stream(final.get("eval_count", 0), time.perf_counter() - t0, ttft, final.get("done_reason", "?"))


def concurrent(url: str, model: str, prompts: list[str], tokens: int) -> tuple[float, list[Stream]]:
    results: list[Stream | None] = [None] * len(prompts)

    def run(i: int) -> None:
        results[i] = stream(url, model, prompts[i], tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = [r for r in results if r is not None]
    if len(done) != len(prompts):
        raise RuntimeError("a stream failed")
    return wall, done


def sequential(url: str, model: str, prompts: list[str], tokens: int) -> tuple[float, list[Stream]]:
    t0 = time.perf_counter()
    done = [stream(url, model, p, tokens) for p in prompts]
    return time.perf_counter() - t0, done


def ttft_under_load(url: str, model: str, tokens: int, busy: int) -> float:
    """TTFT of one more request while ``busy`` streams are decoding."""
    flags = [threading.Event() for _ in range(busy)]
    threads = [threading.Thread(target=stream, args=(url, model, PROMPTS[i], tokens * 2, flags[i], True))
               for i in range(busy)]
    for t in threads:
        t.start()
    for f in flags:
        f.wait(120)
    time.sleep(0.2)  # well inside their decode
    probe = stream(url, model, PROMPTS[busy], 4, streaming=True)
    for t in threads:
        t.join()
    return probe.ttft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--streams", default="1,2,4")
    parser.add_argument("--no-stream", action="store_true",
                        help="aggregate runs ask for one JSON answer (stream: false) instead of NDJSON")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra server environment, e.g. --env OLLAMA_FLASH_ATTENTION=1")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    global STREAMING
    STREAMING = not args.no_stream
    counts = [int(n) for n in args.streams.split(",")]

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.machine()} {platform.processor() or ''} · {os.cpu_count()} CPUs · "
          f"{platform.system()} {platform.release()} · Python {platform.python_version()} · load {load:.2f}")
    print(f"model {args.model}, {args.tokens} tokens per stream, greedy, OLLAMA_NUM_PARALLEL=4, "
          f"median of {args.runs} runs, {'NDJSON streams' if STREAMING else 'stream: false'}" + "".join(f", {k}={v}" for k, v in extra.items()))

    with ServerProcess({"OLLAMA_NUM_PARALLEL": "4", "OLLAMA_CONTEXT_LENGTH": "1024", **extra}) as server:
        url = server.url
        stream(url, args.model, PROMPTS[0], 8)  # load + warm up
        concurrent(url, args.model, PROMPTS[:max(counts)], 16)  # every slot has run once
        # Runs outer, stream counts inner, each sequential pass next to its concurrent one: a
        # drift in the machine's speed (shared cores) lands on both sides of every ratio.
        seq_rates = {n: [] for n in counts}
        par_rates = {n: [] for n in counts}
        par_ttft = {n: [] for n in counts}
        early = set()
        for _ in range(args.runs):
            for n in counts:
                prompts = PROMPTS[:n]
                wall, done = sequential(url, args.model, prompts, args.tokens)
                seq_rates[n].append(sum(s.tokens for s in done) / wall)
                early |= {s.done_reason for s in done if s.tokens != args.tokens}
                wall, done = concurrent(url, args.model, prompts, args.tokens)
                par_rates[n].append(sum(s.tokens for s in done) / wall)
                par_ttft[n].append(statistics.mean(s.ttft for s in done))
                early |= {s.done_reason for s in done if s.tokens != args.tokens}
        one = statistics.median(seq_rates[min(counts)])
        rows = []
        for n in counts:
            seq, par = statistics.median(seq_rates[n]), statistics.median(par_rates[n])
            ratio = statistics.median(p / q for p, q in zip(par_rates[n], seq_rates[n]))
            rows.append((n, seq, par, ratio, par / one, statistics.median(par_ttft[n]) * 1e3))
        idle = statistics.median(stream(url, args.model, PROMPTS[4], 4, streaming=True).ttft
                                 for _ in range(args.runs))
        busy = statistics.median(ttft_under_load(url, args.model, args.tokens, 3) for _ in range(args.runs))

    print()
    ttft_head = "mean TTFT (concurrent)" if STREAMING else "mean latency to answer"
    print(f"{'streams':>7}  {'one after another':>18}  {'concurrent':>11}  {'ratio':>6}  "
          f"{'vs 1 stream':>11}  {ttft_head:>22}")
    for n, seq, par, ratio, vs_one, ttft in rows:
        print(f"{n:>7}  {seq:>14.1f} t/s  {par:>7.1f} t/s  {ratio:>5.2f}×  {vs_one:>10.2f}×  {ttft:>19.0f} ms")
    print()
    print("ratio: concurrent / the same streams one after another (median of the per-run ratios); "
          "vs 1 stream: concurrent / one stream alone")
    print()
    print(f"time to first token: idle {idle * 1e3:.0f} ms; arriving while 3 streams decode {busy * 1e3:.0f} ms")
    if early:
        print(f"note: some streams ended before {args.tokens} tokens ({', '.join(sorted(early))}); "
              "rates count the tokens actually generated")


if __name__ == "__main__":
    main()
