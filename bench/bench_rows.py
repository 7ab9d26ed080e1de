"""What one decode step costs by its rows: the numbers behind speculative decoding's cost tables
(``runner/spec/controller.py``; issue 26).

    python bench/bench_rows.py [--models smollm2,smollm2-q4_k_m,smollm2-q8_0,gemma3] [--engines new,old]
                               [--rows 1,2,3,4,5,8,12,15,16,24,31,32] [--rounds 8] [--history 400]
                               [--threads 2] [--invariant on] [--json costs.json]

A draft of ``k`` tokens is verified in one step of ``1 + k`` rows, so it pays only if that step
costs less than the ``1 + a + ... + a^k`` one-row steps it replaces. What a row costs depends on
how GGML's CPU kernels multiply the model's weights: a type with a batched kernel (repacked
Q4_0/Q4_K/IQ4_NL, llamafile's tiles for Q8_0/Q5_0/F16, the tiled K-quants from 8 rows) reads each
weight once for all rows; a type without one (Q4_1, Q5_1) runs one dot product per weight row and
batch row, so its rows cost nearly as much as steps of their own.

For each model and engine: a ``--history``-token prompt, then steps of n rows (one sequence,
positions after the prompt, every row's logits read back as verification reads them), each rolled
back (``kv.seq_rm``) before the next; three steps of a size in a row, the first (which builds the
graph of that size) not timed; the sizes interleaved round by round, medians of ``--rounds``.
Printed: each step's time relative to one row, the controller's table for the model
(:meth:`runner.spec.controller.StepCost.of`), and ``n / cost``, the most a draft of ``n - 1``
tokens could gain with every token accepted.

Models (bench_decode.py's): ``smollm2`` (Q4_1, the default model), ``gemma3`` (Q4_K_M), and
``smollm2-q4_k_m``, ``smollm2-q8_0``: SmolLM2 requantized from its Q4_1 by llama.cpp's own
quantizer into ``~/.cache/pollama-bench/models`` on first use.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Options  # noqa: E402
from runner.spec.controller import StepCost  # noqa: E402

import bench_decode  # noqa: E402

ROWS = (1, 2, 3, 4, 5, 8, 12, 15, 16, 24, 31, 32)
TEXT = (HERE / "data" / "account.py.txt").read_text()


INVARIANT = False  # --invariant on: the new engine's batch-invariant mode (POLLAMA_BATCH_INVARIANT)


def load_engine(path: Path, engine: str, threads: int):
    """``engine``: "old", "new", or either with "-ggml" (POLLAMA_ROW_KERNELS=0: GGML's one-row
    products for Q4_1 weights, as llama.cpp itself multiplies them); "old-batched": the old engine
    with llama.cpp's batched weight products in decoded batches, not lone rows'
    (``runner/ml/ggml/lone_rows.py``: what a verified draft's rows being its tokens' alone costs)."""
    cfg = dataclasses.replace(config.load({}), new_engine=engine.startswith("new"), batch_invariant=INVARIANT,
                              row_kernels=not engine.endswith("-ggml"))
    info = runner.resolve(str(path), cfg).info
    plan = runner.load_options(info, Options().merged({"num_ctx": 2048, "num_batch": 512, "num_thread": threads}),
                               cfg, 1)
    if cfg.new_engine:
        from runner.engines.ggml.engine import GGMLEngine

        return info, GGMLEngine(info, plan)
    from runner.engines.llamacpp import engine as llamacpp

    if engine.endswith("-batched"):
        return info, llamacpp.LlamaEngine(info, plan, lone_rows=False)
    return info, llamacpp.LlamaEngine(info, plan)


def step(engine, tokens: list[int], pos: int) -> float:
    """Seconds to decode ``tokens`` at ``pos`` of sequence 0, every row's logits read."""
    t0 = time.perf_counter()
    engine.batch_begin()
    last = engine.batch_add(tokens, pos, 0, len(tokens))
    engine.prepare()
    engine.decode()
    for row in range(last - len(tokens) + 1, last + 1):
        engine.logits(row)
    return time.perf_counter() - t0


def measure(path: Path, engine_name: str, rows: list[int], rounds: int, history: int,
            threads: int) -> tuple[object, StepCost, dict[int, float]]:
    """(model info, the controller's table for it on this engine, median seconds by rows)."""
    info, engine = load_engine(path, engine_name, threads)
    try:
        ids = engine.tokenize(TEXT * 4)
        prompt, nxt = ids[:history], ids[history:history + max(rows)]
        engine.kv.seq_rm(0, 0, None)
        for i in range(0, len(prompt), 512):
            engine.batch_begin()
            engine.batch_add(prompt[i:i + 512], i, 0, 1)
            engine.prepare()
            engine.decode()
        times: dict[int, list[float]] = {n: [] for n in rows}
        for r in range(rounds):
            for n in (rows if r % 2 else rows[::-1]):
                # three steps of a size in a row, the last two timed: the first builds the graph
                # of that size (an engine reuses a graph while the batch keeps its shape)
                ts = []
                for _ in range(3):
                    ts.append(step(engine, nxt[:n], len(prompt)))
                    if not engine.kv.seq_rm(0, len(prompt), None):
                        raise SystemExit("the engine could not roll back a step")
                times[n] += ts[1:]
        table = StepCost.of(info.quantization, engine.multiplies)
        return info, table, {n: statistics.median(ts) for n, ts in times.items()}
    finally:
        engine.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,smollm2-q4_k_m,smollm2-q8_0,gemma3",
                    help="comma list of: " + ",".join(bench_decode.MODELS))
    ap.add_argument("--engines", default="new,old", help="comma list of: new, old, new-ggml, old-ggml (an "
                    "engine without our Q4_1 row kernels, POLLAMA_ROW_KERNELS=0), old-batched (decoded rows "
                    "multiplied by llama.cpp's batched kernels, not as lone rows)")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma list of step sizes (rows)")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--history", type=int, default=400, help="prompt tokens before the steps (default 400)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--invariant", choices=("off", "on"), default="off",
                    help="the new engine's batch-invariant mode (POLLAMA_BATCH_INVARIANT; default off)")
    ap.add_argument("--json", help="also write the costs to this file")
    args = ap.parse_args()
    global INVARIANT
    INVARIANT = args.invariant == "on"
    rows = sorted({int(n) for n in args.rows.split(",")} | {1})
    engines = args.engines.split(",")
    print(f"machine: {bench_decode.machine()}; {args.threads} threads; a {args.history}-token prompt, then steps of "
          f"n rows rolled back; median of {args.rounds} interleaved rounds; batch-invariant {args.invariant}; "
          "load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"pollama: {bench_decode.git_head(HERE.parent)}")
    found: dict[str, dict[str, dict[int, float]]] = {}
    for model in args.models.split(","):
        label, path = bench_decode.MODELS[model][0], bench_decode.MODELS[model][1]()
        costs, ones, tables = {}, {}, {}
        for engine in engines:
            info, tables[engine], t = measure(path, engine, rows, args.rounds, args.history, args.threads)
            costs[engine] = {n: t[n] / t[1] for n in rows}
            ones[engine] = t[1] * 1e3
        found[model] = costs
        names = list(dict.fromkeys(t.name for t in tables.values()))  # the tables these engines use
        by_name = {t.name: t for t in tables.values()}
        print(f"\n### {label} (load average {os.getloadavg()[0]:.2f})\n")
        print("one row: " + ", ".join(f"{e} engine {ones[e]:.2f} ms (table \"{tables[e].name}\")" for e in engines)
              + "\n")
        print("| rows | " + " | ".join(f"{e} engine" for e in engines) + " | "
              + " | ".join(f"table \"{name}\"" for name in names) + " | "
              + " | ".join(f"n / cost, {e}" for e in engines) + " |")
        print("|---:|" + "---:|" * (2 * len(engines) + len(names)))
        for n in rows:
            print(f"| {n} | " + " | ".join(f"{costs[e][n]:.2f}" for e in engines) + " | "
                  + " | ".join(f"{by_name[name](n):.2f}" for name in names) + " | "
                  + " | ".join(f"{n / costs[e][n]:.2f}" for e in engines) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(found, indent=1))


if __name__ == "__main__":
    main()
