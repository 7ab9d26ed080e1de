"""A short answer beside a long prompt: how long the short one waits, and what it costs the long one.

    python bench/bench_shared_batch.py [--rounds 3] [--engines old,new] [--chunks 512,64]

One runner (SmolLM2, ``num_parallel`` 2, ``num_ctx`` 4096) per engine. Each round, for each
value of ``runner.loop.runner.SHARED_PROMPT_CHUNK`` (512 is the batch size: no cap, the behaviour
before it existed), in alternating order: a long prompt (~3,000 tokens, one token answered)
starts; once its prefill runs, a short prompt asks for 16 tokens. Reported, as medians over the
rounds: the short request's time to first token and total time, and the long prompt's prompt
tok/s and total time. The short request's ratio to its time alone shows what sharing costs it.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import runner.loop.runner as engine_module  # noqa: E402
from conftest import load  # noqa: E402
from runner.api import Options, Request  # noqa: E402

LONG = "The quick brown fox jumps over the lazy dog. " * 300  # ~3,000 tokens
SHORT = "Write a poem about the sea."


def _request(prompt: str, num_predict: int) -> Request:
    """Uncached (every round evaluates its whole prompt), greedy, never stopping early."""
    return Request(prompt=prompt, cache_prompt=False, options=Options().merged(
        {"num_predict": num_predict, "temperature": 0, "num_ctx": 4096, "stop": []}))


def _short(runner) -> tuple[float, float]:
    """(time to first token, total) in seconds."""
    start = time.perf_counter()
    first = None
    for chunk in runner.stream(_request(SHORT, 16)):
        if first is None and (chunk.text or chunk.done):
            first = time.perf_counter() - start
        if chunk.done:
            assert chunk.metrics is not None and chunk.metrics.eval_count == 16, chunk
    return first or 0.0, time.perf_counter() - start


def one_round(runner, chunk: int) -> dict[str, float]:
    engine_module.SHARED_PROMPT_CHUNK = chunk
    long_done: dict[str, float] = {}

    def run_long() -> None:
        start = time.perf_counter()
        final = [c for c in runner.stream(_request(LONG, 1)) if c.done][0]
        m = final.metrics
        long_done["total"] = time.perf_counter() - start
        long_done["rate"] = m.prompt_eval_count / (m.prompt_eval_duration / 1e9)

    thread = threading.Thread(target=run_long)
    thread.start()
    time.sleep(1.0)  # the long prompt's prefill is under way
    ttft, total = _short(runner)
    thread.join()
    return {"short_ttft": ttft, "short_total": total, "long_rate": long_done["rate"], "long_total": long_done["total"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engines", default="old,new")
    parser.add_argument("--chunks", default="512,64")
    args = parser.parse_args()
    chunks = [int(c) for c in args.chunks.split(",")]
    print(f"# {platform.node()} {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.2f}")
    print("| engine | SHARED_PROMPT_CHUNK | short alone total s | short TTFT s | short total s | "
          "short total / alone | long prompt tok/s | long total s |")
    print("|---|---|---|---|---|---|---|---|")
    for name in args.engines.split(","):
        runner = load(None, name, num_parallel=2, num_ctx=4096)
        try:
            _short(runner)  # warm
            alone = statistics.median(_short(runner)[1] for _ in range(3))
            results: dict[int, list[dict[str, float]]] = {c: [] for c in chunks}
            for r in range(args.rounds):
                for chunk in (chunks if r % 2 == 0 else chunks[::-1]):
                    results[chunk].append(one_round(runner, chunk))
            for chunk in chunks:
                med = {k: statistics.median(x[k] for x in results[chunk]) for k in results[chunk][0]}
                print(f"| {name} | {chunk} | {alone:.2f} | {med['short_ttft']:.2f} | {med['short_total']:.2f} | "
                      f"{med['short_total'] / alone:.1f}x | {med['long_rate']:.0f} | {med['long_total']:.1f} |",
                      flush=True)
        finally:
            runner.close()
    print(f"# load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
