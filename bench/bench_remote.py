"""The forwarding hop's cost: time to first token and tokens/s of one streamed chat, asked of an
upstream directly and through a pollama remote model in front of it; prints a table.

The upstream is an OpenAI-compatible server: ``--upstream URL`` (e.g. a llama-server built from
the pinned sdist, ``http://127.0.0.1:8080/v1``), or by default a ``pollama serve`` of SmolLM2 started
here. The front is a ``pollama serve`` with a remote model ``FROM`` that URL. Runs alternate
direct / through, greedy, the same prompt; medians over ``--runs``. Issue 27's targets: through
pollama within 5% of direct on tokens/s and at most +10 ms on TTFT.

    python bench/bench_remote.py [--upstream URL] [--runs 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

import bench_decode  # noqa: E402
from serverproc import ServerProcess  # noqa: E402

PROMPT = [{"role": "user", "content": "Write a short story about a lighthouse keeper."}]


def one(url: str, model: str, tokens: int) -> tuple[float, float]:
    """(TTFT in ms, tokens/s after the first) of one streamed greedy chat."""
    body = {"model": model, "messages": PROMPT, "stream": True, "max_tokens": tokens, "temperature": 0,
            "seed": 1, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    first = last = 0.0
    count = 0
    with httpx.stream("POST", url + "/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    last = time.perf_counter()
                    first = first or last
                    count += 1
    rate = (count - 1) / (last - first) if count > 1 and last > first else 0.0
    return (first - t0) * 1e3, rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", help="an OpenAI-compatible base URL ending in /v1 (default: a pollama serve here)")
    parser.add_argument("--model", default="", help="the model's name upstream (default: its only one)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    started: list[ServerProcess] = []
    try:
        upstream = args.upstream
        if upstream is None:
            started.append(ServerProcess(env={"OLLAMA_KEEP_ALIVE": "-1"}).start())
            upstream = started[-1].url + "/v1"
        front = ServerProcess(env={"OLLAMA_KEEP_ALIVE": "-1"}).start()
        started.append(front)
        params = {"upstream_model": args.model} if args.model else {}
        r = httpx.post(front.url + "/api/create", timeout=60, json={"model": "remote", "from": upstream,
                                                                    "parameters": params, "stream": False})
        r.raise_for_status()
        model = args.model or httpx.get(upstream + "/models").json()["data"][0]["id"]
        one(upstream, model, 4)  # warm both: the upstream's load, the front's connections
        one(front.url + "/v1", "remote", 4)
        results: dict[str, list[tuple[float, float]]] = {"direct": [], "through pollama": []}
        for _ in range(args.runs):
            results["direct"].append(one(upstream, model, args.tokens))
            results["through pollama"].append(one(front.url + "/v1", "remote", args.tokens))
        print(f"machine: {bench_decode.machine()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        print(f"upstream {upstream} ({model}), {args.tokens} tokens, median of {args.runs} interleaved runs\n")
        print("| path | TTFT ms | tokens/s | vs direct |")
        print("|---|---:|---:|---:|")
        base = statistics.median(s for _, s in results["direct"])
        for name, runs in results.items():
            rate = statistics.median(s for _, s in runs)
            print(f"| {name} | {statistics.median(t for t, _ in runs):.1f} | {rate:.1f} | {rate / base:.3f}× |")
    finally:
        for server in reversed(started):
            server.stop()


if __name__ == "__main__":
    main()
