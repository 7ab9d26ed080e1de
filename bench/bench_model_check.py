"""What checking a GGUF before loading costs: `runner.model_info` is the header read plus the rules
of runner/loading/ggufcheck.py (the vocabulary is read once more, for duplicate tokens). Prints a Markdown
table of medians of interleaved runs.

    python bench/bench_model_check.py --runs 20
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's runner, not an installed one

from runner.loading import ggufcheck  # noqa: E402
from runner.model import ggufmeta  # noqa: E402
from runner.store import default_model_path  # noqa: E402

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "models"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    models = [default_model_path(), SHARED / "stories260K.gguf", SHARED / "TinyStories-656K-Q8_0.gguf"]
    times: dict[str, dict[str, list[float]]] = {m.name: {"header": [], "check": []} for m in models}
    for _ in range(args.runs):
        for model in models:  # interleaved
            t0 = time.perf_counter()
            header = ggufmeta.read_gguf_header(model)
            t1 = time.perf_counter()
            ggufcheck.check_model(header, model)
            t2 = time.perf_counter()
            times[model.name]["header"].append((t1 - t0) * 1e3)
            times[model.name]["check"].append((t2 - t1) * 1e3)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}; "
          f"median of {args.runs} runs; load average {os.getloadavg()[0]:.2f}\n")
    print("| model | header read (ms) | rules (ms) | total (ms) |")
    print("|---|---:|---:|---:|")
    for name, t in times.items():
        h, c = statistics.median(t["header"]), statistics.median(t["check"])
        print(f"| {name} | {h:.1f} | {c:.1f} | {h + c:.1f} |")


if __name__ == "__main__":
    main()
