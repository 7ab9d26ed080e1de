"""Where one decode step's time goes in the runner, outside GGML's kernels.

    python bench/profile_decode.py [--model smollm2|gemma3|PATH] [--engine old|new]
                                   [--tokens 256] [--threads 2] [--greedy] [--cprofile]

Loads the runner in this process and generates ``--tokens`` tokens from a short raw prompt
(pollama's default sampling unless ``--greedy``), consuming the stream on the main thread as
the CLI does. The batch loop's steps are timed with ``time.perf_counter_ns`` by wrapping the
runner's own methods on the instance (nothing in ``runner/`` changes), and a table of
microseconds per decoded token is printed:

- loop: the loop thread's time between two batches (lock, admission, cancellation checks);
- batch build: taking each sequence's inputs into the batch (``_fill``, engine batch add);
- decode: the engine's forward call; for the new engine split into cache bookkeeping + graph
  inputs, graph build (amortised), GGML compute, logits readout, and the Python around them;
  for the old engine ``llama_decode`` is one C call (llama.cpp's own bookkeeping inside);
- sample: logits access + sampler (penalties, top_k, draw) + accept;
- token: per-token text handling (EOS check, piece lookup, stop sequences, UTF-8 hold-back)
  and, inside it, ``flush`` (decoding held bytes, building the chunk, putting it on the queue);
- hand-off: from the chunk's ``put`` on the loop thread to the consumer's ``get`` returning.

With ``--cprofile`` the loop thread also runs under cProfile and the top functions are
printed (cProfile inflates Python-heavy steps; use the table for the numbers).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import os
import pstats
import queue
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_decode import MODELS, STORY  # noqa: E402

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Options, Request  # noqa: E402
from runner.loop.output import Output  # noqa: E402

_now = time.perf_counter_ns


class Timers:
    """Nanoseconds per label per batch (batch 0, the prompt's, is left out of the averages)."""

    def __init__(self) -> None:
        self.batch = -1
        self.ns: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))

    def add(self, label: str, ns: int) -> None:
        self.ns[label][self.batch] += ns

    def wrap(self, obj: object, name: str, label: str, starts_batch: bool = False) -> None:
        """Time ``obj.name`` under ``label`` (an instance attribute shadows the method)."""
        inner = getattr(obj, name)

        def timed(*args, **kwargs):
            if starts_batch:
                self.batch += 1
            t0 = _now()
            try:
                return inner(*args, **kwargs)
            finally:
                self.add(label, _now() - t0)

        setattr(obj, name, timed)

    def per_batch_us(self, label: str) -> float:
        """Mean microseconds per decode batch (batches 1..), 0 when never called."""
        n = max(self.batch, 1)
        return sum(v for b, v in self.ns[label].items() if b >= 1) / n / 1e3


class StampedQueue(queue.SimpleQueue):
    """A sequence's output queue that records when each item was put."""

    def __init__(self) -> None:
        super().__init__()
        self.lags: list[int] = []

    def put(self, item, block=True, timeout=None):  # noqa: D401
        super().put((item, _now()), block, timeout)

    def get(self, block=True, timeout=None):
        item, t_put = super().get(block, timeout)
        self.lags.append(_now() - t_put)
        return item


class Collected:
    """Push-style output: the loop thread appends each chunk itself (no consumer thread)."""

    def __init__(self) -> None:
        import threading

        self.items: list = []
        self.done = threading.Event()
        self.lags: list[int] = []

    def put(self, item) -> None:
        self.items.append(item)
        if isinstance(item, BaseException) or item.done:
            self.done.set()


def locate(model: str) -> str:
    return str(MODELS[model][1]()) if model in MODELS else model


def profile(model: str, engine: str, tokens: int, threads: int, greedy: bool, use_cprofile: bool,
            push: bool = False) -> None:
    cfg = dataclasses.replace(config.load(), new_engine=(engine == "new"))
    r = runner.load(runner.resolve(locate(model), cfg), Options(num_thread=threads, num_ctx=2048, num_batch=512), cfg)
    assert r.engine == engine, r.engine
    opts = Options(num_predict=tokens, seed=42, num_thread=threads)
    if greedy:
        opts.temperature = 0.0

    def generate(n: int, stamped: StampedQueue | Collected | None = None):
        req = Request(prompt=STORY, raw=True, cache_prompt=False, options=dataclasses.replace(opts, num_predict=n))
        seq = r._prepare(req, chat=False)
        if isinstance(stamped, Collected):
            seq.output.sink = stamped
            r._enqueue(seq)
            stamped.done.wait()
            return stamped.items[-1]
        if stamped is not None:
            seq.output.sink = stamped
        final = None
        for chunk in r._stream(seq):
            if chunk.done:
                final = chunk
        return final

    generate(16)  # warm-up
    t = Timers()
    eng = r.model_engine
    t.wrap(r, "_build_batch", "batch build")  # includes the engine's prepare (timed apart too)
    t.wrap(eng, "sample", "sample")
    t.wrap(r, "_on_token", "token")
    flush_inner = Output.flush

    def flush(self, final=False):  # the Output class's flush, for every sequence
        t0 = _now()
        try:
            return flush_inner(self, final)
        finally:
            t.add("flush", _now() - t0)

    Output.flush = flush
    fields = ("prepare_ns", "build_ns", "compute_ns", "read_ns")

    def split(name: str) -> None:
        """Time the engine's ``name`` step, and for the new engine the Model.stats it adds."""
        inner = getattr(eng, name)

        def timed(*args):
            before = dataclasses.replace(eng.model.stats) if engine == "new" else None
            t0 = _now()
            try:
                inner(*args)
            finally:
                t.add(name, _now() - t0)
                if before is not None:
                    for f in fields:
                        t.add(f, getattr(eng.model.stats, f) - getattr(before, f))

        setattr(eng, name, timed)

    split("decode")  # the forward call: GGML compute and the logits readout
    split("prepare")  # cache bookkeeping, graph inputs and graph builds happen here
    if use_cprofile:  # the loop thread runs under the profiler, one batch at a time
        prof = cProfile.Profile()
        inner = r._process_batch

        def profiled():
            prof.enable()
            try:
                inner()
            finally:
                prof.disable()

        r._process_batch = profiled
    else:
        prof = None
    t.wrap(r, "_process_batch", "batch", starts_batch=True)

    out = Collected() if push else StampedQueue()
    t_start = _now()
    final = generate(tokens + 1, out)
    wall = _now() - t_start
    m = final.metrics
    n = m.eval_count - 1  # single-token decodes after the prompt's batch
    per_token = m.eval_duration / max(n, 1) / 1e3
    batches = t.batch  # decode batches after the prompt's
    us = t.per_batch_us
    rows: list[tuple[str, float]] = []
    if engine == "new":
        ggml = us("compute_ns")
        rows += [("decode: GGML compute", ggml),
                 ("cache bookkeeping + graph inputs (Model.prepare/execute)", us("prepare_ns")),
                 ("graph build (amortised)", us("build_ns")),
                 ("decode: logits readout", us("read_ns")),
                 ("decode: Python around execute()", us("decode") - us("compute_ns") - us("read_ns"))]
        prepare_rest = us("prepare") - us("prepare_ns") - us("build_ns")
        rows += [("engine prepare: Python around Model.prepare", prepare_rest)]
    else:
        ggml = us("decode")
        rows += [("decode: llama_decode (GGML compute + llama.cpp's bookkeeping)", ggml),
                 ("engine prepare", us("prepare"))]
    parts = us("batch build") + us("decode") + us("sample") + us("token")
    rows += [("batch build (rows, slot order, batch add)", us("batch build") - us("prepare")),
             ("sample (logits access, sampler, accept)", us("sample")),
             ("token: EOS, piece, stops, UTF-8 hold-back", us("token") - us("flush")),
             ("token: flush (decode bytes, chunk, queue put)", us("flush")),
             ("rest of the batch step (round robin, slot inputs)", us("batch") - parts)]
    period = per_token
    rows.append(("loop between batches (lock, admission, GIL waits)", period - us("batch")))
    lags = sorted(out.lags)
    print(f"model {Path(locate(model)).name}, {engine} engine, {threads} threads, "
          f"{'greedy' if greedy else 'default sampling (temp 0.8, top_k 40, top_p 0.9, repeat 1.1)'}; "
          f"{'chunks collected on the loop thread (no consumer)' if push else 'consumer thread iterating'}; "
          f"{n} decodes; load average {os.getloadavg()[0]:.2f}")
    print(f"per decoded token: {period:.0f} us ({1e6 / period:.1f} tok/s); outside GGML compute: "
          f"{period - ggml:.0f} us ({(period - ggml) / period:.1%}); wall {wall / 1e9:.2f} s for {batches} batches\n")
    print("| step | us/token | share |")
    print("|---|---:|---:|")
    for name, us in rows:
        print(f"| {name} | {us:.1f} | {us / period:.1%} |")
    print(f"| **total (eval_duration / decodes)** | **{period:.1f}** | 100% |")
    if lags:
        print(f"\nhand-off put -> consumer get (not on the loop's path, but it competes for the GIL and cores): "
              f"median {statistics.median(lags) / 1e3:.0f} us, p90 {lags[int(len(lags) * 0.9)] / 1e3:.0f} us, "
              f"{len(lags)} chunks")
    if prof is not None:
        print("\ncProfile of the loop thread (top 25 by own time):")
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    r.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2", help="smollm2, gemma3 or a .gguf path")
    ap.add_argument("--engine", default="new", choices=("old", "new"))
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--greedy", action="store_true")
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--push", action="store_true",
                    help="no consumer thread: the loop thread appends the chunks (what a hand-off costs)")
    args = ap.parse_args()
    profile(args.model, args.engine, args.tokens, args.threads, args.greedy, args.cprofile, args.push)


if __name__ == "__main__":
    main()
