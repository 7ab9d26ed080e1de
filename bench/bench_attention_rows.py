"""What summing a drafted step's attention as a row alone is summed costs (issue 26).

    python bench/bench_attention_rows.py [--models smollm2,smollm2-q8_0] [--history 400,1500]
                                         [--rows 1,2,4,8,16,17,32] [--rounds 6] [--threads 2]
                                         [--answers rewrite,story] [--answer-runs 4] [--apart]

GGML multiplies attention's K·Q and V products by llamafile's tiles for 2 rows or more, and a
row alone by its one-row dot products, which sum in another order: a drafted row's logits then
differ from the same token's decoded alone, and near-ties part the texts. The new engine builds
a batch of decoded tokens (a sampled token and its drafted ones) with ``decoded``
(``runner.ml.backend.Backend.new_context``): its attention products are summed as a lone row's,
by our f16 kernels (``runner/ml/ggml/f16_rows.c``), or, where those do not run, with the rows
laid apart so that GGML takes each to its dot products (``--apart`` measures that way). Here two
copies of a model, one built that way and one with GGML's own products, decode the same steps
of n rows after a ``--history``-token prompt, rolled back each time; the copies and the sizes
interleaved, three steps each (the fastest kept), medians of ``--rounds``. Printed: each step's
time relative to one row with GGML's own products, and the ratio of the two. Flash attention off
(SmolLM2's default, and where the products are used).

Then whole answers (``--answers``, bench_spec.py's tasks, greedy, 300 tokens, drafts of up to 32):
two runners of the model, one each way, answer in turn, ``--answer-runs`` times; printed: the
drafted tok/s each way, their ratio (the median of the runs' ratios), the drafts taken, and
whether each way's answer is the text decoding without drafts gives.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from runner.ml.backend import BackendOptions  # noqa: E402
from runner.ml.ggml import f16_rows  # noqa: E402
from runner.ml.ggml.backend import GGMLBackend  # noqa: E402
from runner.model.models import Batch  # noqa: E402
from runner.model.models import load as load_model  # noqa: E402

import bench_decode  # noqa: E402

WAYS = ("GGML's own", "as a row alone (pollama)")


@contextlib.contextmanager
def batched_attention():
    """Graphs built meanwhile ignore ``decoded``: GGML's own attention products."""
    new_context = GGMLBackend.new_context
    GGMLBackend.new_context = lambda self, decoded=False, max_nodes=None: new_context(self, False, max_nodes)
    try:
        yield
    finally:
        GGMLBackend.new_context = new_context


APART = False  # --apart: the pollama way without our f16 kernels, the rows laid apart


@contextlib.contextmanager
def way_of(way: str):
    """Graphs built meanwhile are built ``way``."""
    if way == WAYS[0]:
        with batched_attention():
            yield
    elif APART:
        product = f16_rows.product
        f16_rows.product = lambda c, a, b: None
        try:
            yield
        finally:
            f16_rows.product = product
    else:
        yield


def step(model, tokens: list[int], start: int) -> float:
    t0 = time.perf_counter()
    model.compute(Batch.sequence(tokens, start=start, decode=True))
    elapsed = time.perf_counter() - t0
    model.cache.remove(0, start, None)
    return elapsed


def measure(path: Path, history: int, rows: list[int], rounds: int, threads: int) -> dict[tuple[str, int], float]:
    rng = np.random.default_rng(7)
    prompt = [int(t) for t in rng.integers(100, 20000, history)]
    tokens = [int(t) for t in rng.integers(100, 20000, max(rows))]
    models = {}
    try:
        for way in WAYS:
            m = load_model(path, BackendOptions(num_threads=threads, flash_attention=False))
            models[way] = m
            m.init_cache(num_ctx=history + 512, num_parallel=1, num_batch=512)
            for i in range(0, history, 512):
                m.compute(Batch.sequence(prompt[i:i + 512], start=i))
        times: dict[tuple[str, int], list[float]] = {(w, n): [] for w in WAYS for n in rows}
        for r in range(-1, rounds):  # round -1 builds the graphs, untimed
            for n in rows if r % 2 else rows[::-1]:
                for way in WAYS if r % 2 else WAYS[::-1]:
                    # a model keeps a few graphs and builds the others again: always under its way
                    with way_of(way):
                        t = min(step(models[way], tokens[:n], history) for _ in range(3))
                    if r >= 0:
                        times[(way, n)].append(t)
        return {k: statistics.median(v) for k, v in times.items()}
    finally:
        for m in models.values():
            m.close()


def answers(model: str, tasks: list[str], runs: int, threads: int) -> None:
    import bench_spec

    runners = {}
    for way in WAYS:
        runners[way] = bench_spec.load_runner(model, "new", threads, 1)
    print(f"\n### {bench_decode.MODELS[model][0]}: whole answers, drafts of up to 32, {runs} runs "
          f"(load average {os.getloadavg()[0]:.2f})\n")
    print(f"| task | {WAYS[0]}, tok/s | {WAYS[1]}, tok/s | pollama / GGML's | accepted/proposed (GGML's; "
          "pollama) | same text as no drafts (GGML's; pollama) |")
    print("|---|---:|---:|---:|---:|---|")
    try:
        for task in tasks:
            prompt = bench_spec.chat_prompt(model, bench_spec.TASKS[task])
            plain = bench_spec.generate(runners[WAYS[1]], prompt, 300, 0).text  # one row a step: either way
            got: dict[str, list] = {w: [] for w in WAYS}
            for r in range(runs):
                for way in WAYS if r % 2 else WAYS[::-1]:
                    with way_of(way):
                        got[way].append(bench_spec.generate(runners[way], prompt, 300, 32))
            tps = {w: statistics.median(g.tps for g in got[w]) for w in WAYS}
            ratio = statistics.median(b.tps / a.tps for a, b in zip(got[WAYS[0]], got[WAYS[1]]))
            last = [got[w][-1] for w in WAYS]
            same = "; ".join("yes" if g.text == plain else "no" for g in last)
            print(f"| {task} | {tps[WAYS[0]]:.1f} | {tps[WAYS[1]]:.1f} | {ratio:.3f} | "
                  + "; ".join(f"{g.accepted}/{g.draft_n}" for g in last) + f" | {same} |")
    finally:
        for r in runners.values():
            r.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2", help="comma list of: " + ",".join(bench_decode.MODELS))
    ap.add_argument("--history", default="400,1500", help="comma list of prompt lengths before the steps")
    ap.add_argument("--rows", default="1,2,4,8,16,17,32")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--answers", default="rewrite", help="bench_spec.py tasks answered both ways ('': none); "
                    "where the drafted texts part (the story), the drafts differ too")
    ap.add_argument("--answer-runs", type=int, default=4)
    ap.add_argument("--apart", action="store_true", help="the pollama way with the rows laid apart, "
                    "not our f16 kernels (where those do not run)")
    args = ap.parse_args()
    global APART
    APART = args.apart
    rows = sorted({int(n) for n in args.rows.split(",")} | {1})
    print(f"machine: {bench_decode.machine()}; {args.threads} threads; flash attention off; steps of n rows "
          f"rolled back, interleaved, fastest of 3, median of {args.rounds} rounds; load average "
          + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"pollama: {bench_decode.git_head(HERE.parent)}; the pollama way: "
          + ("rows laid apart" if APART else f"our f16 kernels ({f16_rows.variant() or 'not running here'})"))
    for model in args.models.split(","):
        label, path = bench_decode.MODELS[model][0], bench_decode.MODELS[model][1]()
        for history in (int(h) for h in args.history.split(",")):
            t = measure(path, history, rows, args.rounds, args.threads)
            one = t[(WAYS[0], 1)]
            print(f"\n### {label}, after {history} tokens (load average {os.getloadavg()[0]:.2f}; one row "
                  f"{one * 1e3:.2f} ms)\n")
            print(f"| rows | {WAYS[0]} | {WAYS[1]} | pollama / GGML's |")
            print("|---:|---:|---:|---:|")
            for n in rows:
                a, b = t[(WAYS[0], n)], t[(WAYS[1], n)]
                print(f"| {n} | {a / one:.2f} | {b / one:.2f} | {b / a:.3f} |")
        if args.answers:
            answers(model, args.answers.split(","), args.answer_runs, args.threads)


if __name__ == "__main__":
    main()
