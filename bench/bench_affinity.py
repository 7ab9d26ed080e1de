"""Prefix affinity of a remote model's replicas (issue 27): how much of each returning turn's
prompt the upstreams' own caches serve, routed by pollama against round-robin; prints a table.

    python bench/bench_affinity.py [--replicas 3] [--conversations 12] [--turns 3]

Three llama-servers (built from the pinned sdist, as bench_decode.py builds llama-bench; SmolLM2,
one slot each, their default ``--cache-ram``, one thread each) are the replicas. Each conversation
has its own system prompt; the turns go round the conversations (turn 1 of each, then turn 2 of
each, ..., in a shuffled order each round, the same in both modes), one request at a time, greedy, 16 tokens an answer. Through pollama: one remote model
``FROM`` all three, so its router picks the replica. Round-robin: the client sends request ``i``
to replica ``i mod 3`` directly, what a plain load balancer does. The hit rate is the returning
turns' prompt tokens that an upstream's cache served (``cache_n``, passed through as
``usage.prompt_tokens_details.cached_tokens``) over all their prompt tokens.
"""

from __future__ import annotations

import argparse
import os
import random
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

WORDS = ("harbor lantern river stone orchard winter market letter engine garden silver morning thunder valley "
         "bridge candle meadow paper window forest copper island harvest signal").split()


def system_prompt(i: int, words: int = 250) -> str:
    rng = random.Random(i)
    return f"You are assistant number {i}. Background: " + " ".join(rng.choice(WORDS) for _ in range(words))


def chat(url: str, model: str, messages: list[dict]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    r = httpx.post(url + "/chat/completions", timeout=600, json={
        "model": model, "messages": messages, "max_tokens": 16, "temperature": 0, "seed": 1})
    r.raise_for_status()
    return r.json(), (time.perf_counter() - t0) * 1e3


def run(urls: list[str], model: str, conversations: int, turns: int) -> tuple[float, float, int]:
    """(hit rate of the returning turns, their median ms, requests) sending request ``k`` to
    ``urls[k % len(urls)]`` (one URL: the router decides)."""
    histories = [[{"role": "system", "content": system_prompt(c)}] for c in range(conversations)]
    cached = total = k = 0
    ms: list[float] = []
    order = random.Random(7)
    for turn in range(turns):
        turn_order = list(range(conversations))
        order.shuffle(turn_order)  # conversations come back in any order (the same in both modes)
        for c in turn_order:
            history = histories[c]
            history.append({"role": "user", "content": f"Turn {turn + 1}: tell me one more thing about {WORDS[c]}."})
            body, took = chat(urls[k % len(urls)], model, history)
            k += 1
            history.append({"role": "assistant", "content": body["choices"][0]["message"]["content"]})
            if turn:
                usage = body["usage"]
                cached += int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
                total += int(usage["prompt_tokens"])
                ms.append(took)
    return cached / max(total, 1), statistics.median(ms) if ms else float("nan"), k


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--conversations", type=int, default=12)
    ap.add_argument("--turns", type=int, default=3)
    a = ap.parse_args()
    binary = bench_decode.llama_cpp_tool("llama-server")
    print(f"machine: {bench_decode.machine()}; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    rows = []
    for mode in ("round-robin, direct", "pollama, prefix affinity"):
        # fresh replicas for each mode: no cache carried over from the other
        servers = [bench_decode.LlamaServer(binary, ["-m", str(bench_decode.smollm2()), "-np", "1", "-c", "8192",
                                                     "-t", "1", "-tb", "1", "-a", "smollm2"])
                   for _ in range(a.replicas)]
        front = None
        try:
            urls = [f"http://127.0.0.1:{s.port}/v1" for s in servers]
            if mode.startswith("pollama"):
                front = ServerProcess(env={"OLLAMA_KEEP_ALIVE": "-1"}).start()
                r = httpx.post(front.url + "/api/create", timeout=60, json={
                    "model": "replicas", "remote_hosts": urls, "parameters": {"upstream_model": "smollm2"},
                    "stream": False})
                r.raise_for_status()
                rows.append((mode, *run([front.url + "/v1"], "replicas", a.conversations, a.turns)))
            else:
                rows.append((mode, *run(urls, "smollm2", a.conversations, a.turns)))
        finally:
            if front is not None:
                front.stop()
            for s in servers:
                s.close()
    print(f"\n{a.replicas} llama-server replicas (SmolLM2, 1 slot, --cache-ram default), {a.conversations} "
          f"conversations x {a.turns} turns, ~{len(system_prompt(0).split())}-word system prompts\n")
    print("| routing | returning turns' prompt tokens from an upstream cache | median ms of a returning turn | requests |")
    print("|---|---:|---:|---:|")
    for mode, rate, ms, k in rows:
        print(f"| {mode} | {rate:.1%} | {ms:.0f} | {k} |")


if __name__ == "__main__":
    main()
