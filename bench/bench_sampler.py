"""Microseconds per sampled token, by sampling options and vocabulary size (49k: SmolLM2; 262k:
gemma3), optionally against another checkout's sampler, interleaved in one process.

    python bench/bench_sampler.py [--against /work/main] [--draws 200]

Logits are shaped like a model's (a few strong tokens over a long tail); 64 tokens of history
for the repeat penalty. The figure is the median of 5 batches of ``--draws`` draws.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

CASES = [
    ("default (temp 0.8, top_k 40, top_p 0.9, repeat 1.1)", {}),
    ("greedy, repeat 1.1", {"temperature": 0.0}),
    ("top_k 0, top_p 0.9", {"top_k": 0}),
    ("top_k 0, top_p 1 (full distribution)", {"top_k": 0, "top_p": 1.0}),
]


def load_samplers(checkout: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, checkout / "runner/sample/samplers.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def logits(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(n).astype(np.float32) * 2.5
    x[rng.choice(n, 30, replace=False)] += rng.uniform(6, 14, 30).astype(np.float32)
    return x


def per_token_us(module, n: int, options: dict, draws: int) -> float:
    x = logits(n)
    history = np.random.default_rng(1).integers(0, n, size=64).tolist()
    s = module.Sampler(module.SamplerOptions(seed=7, **options))
    s.accept_many(history)
    times = []
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(draws):
            s.sample(x)
        times.append((time.perf_counter_ns() - t0) / draws / 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", help="another pollama checkout whose sampler to compare")
    ap.add_argument("--draws", type=int, default=100)
    args = ap.parse_args()
    ours = load_samplers(ROOT, "samplers_here")
    other = load_samplers(Path(args.against), "samplers_other") if args.against else None
    if other:
        print(f"| options | vocab | {args.against} us/token | this checkout us/token | speed-up |")
        print("|---|---:|---:|---:|---:|")
    else:
        print("| options | vocab | us/token |")
        print("|---|---:|---:|")
    for label, options in CASES:
        for n in (49152, 262144):
            draws = max(3, args.draws // 20) if other and n > 100_000 and options.get("top_k") == 0 else args.draws
            mine = per_token_us(ours, n, options, args.draws)
            if other:
                theirs = per_token_us(other, n, options, draws)
                print(f"| {label} | {n} | {theirs:.0f} | {mine:.0f} | {theirs / mine:.1f}x |")
            else:
                print(f"| {label} | {n} | {mine:.0f} |")


if __name__ == "__main__":
    main()
