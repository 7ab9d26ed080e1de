"""Pull throughput: a model pulled from a local registry vs `cp` of the same file; prints a table.

The registry is tests/registry.py (a real HTTP server on 127.0.0.1, blobs through a 307
redirect, as registry.ollama.ai answers). Each run, in interleaved order, into a fresh store:

- pull:       runner.store.pull (HTTP download, sha256 as the bytes arrive, verify, rename, manifest)
- pull (API): the same through `pollama serve`'s POST /api/pull, streamed NDJSON progress
- cp:         `cp` of the file (the floor: the disk's copy speed)
- cp+sha256:  `cp`, then `sha256sum` of the copy (what a pull must do at least)

Medians over --runs; MB is 10^6 bytes. The default file is the default model (SmolLM2, 98 MB).

    python bench/bench_pull.py [--runs 5] [--file PATH] [--no-server]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402

from registry import LocalRegistry  # noqa: E402
from runner import config, store  # noqa: E402
from runner.store.pull import pull  # noqa: E402
from serverproc import ServerProcess  # noqa: E402


def timed_pull(name: str) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-pull-") as tmp:
        cfg = config.load({"OLLAMA_MODELS": tmp})
        t0 = time.perf_counter()
        events = list(pull(cfg, name, insecure=True))
        elapsed = time.perf_counter() - t0
        assert events[-1].status == "success"
        return elapsed


def timed_api_pull(server: ServerProcess, name: str) -> float:
    for manifest in server.models.glob("manifests/*/*/*/*"):
        model = "/".join(manifest.relative_to(server.models / "manifests").parts[:3]) + ":" + manifest.name
        httpx.request("DELETE", server.url + "/api/delete", json={"model": model}).raise_for_status()
    t0 = time.perf_counter()
    with httpx.stream("POST", server.url + "/api/pull", json={"model": name, "insecure": True},
                      timeout=600) as resp:
        last = b""
        for line in resp.iter_lines():
            last = line
    elapsed = time.perf_counter() - t0
    assert '"success"' in str(last), last
    return elapsed


def timed_cp(path: Path, hash_it: bool) -> float:
    with tempfile.TemporaryDirectory(prefix="bench-cp-") as tmp:
        dest = Path(tmp) / "copy"
        t0 = time.perf_counter()
        subprocess.run(["cp", str(path), str(dest)], check=True)
        if hash_it:
            subprocess.run(["sha256sum", str(dest)], check=True, capture_output=True)
        return time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--file", type=Path, default=None, help="GGUF to serve (default: the default model)")
    parser.add_argument("--no-server", action="store_true", help="skip the /api/pull column")
    args = parser.parse_args()
    path = args.file or store.default_model_path()
    size = path.stat().st_size

    registry = LocalRegistry().start()
    registry.add_model("library", "bench", "latest", path, from_disk=True)
    name = registry.name("library", "bench", "latest")
    load_before = os.getloadavg()[0]
    server = None if args.no_server else ServerProcess().start()
    times: dict[str, list[float]] = {"pull": [], "pull (API)": [], "cp": [], "cp+sha256": []}
    try:
        timed_pull(name)  # warm the page cache for every method alike
        for _ in range(args.runs):
            times["pull"].append(timed_pull(name))
            if server is not None:
                times["pull (API)"].append(timed_api_pull(server, name))
            times["cp"].append(timed_cp(path, hash_it=False))
            times["cp+sha256"].append(timed_cp(path, hash_it=True))
    finally:
        registry.stop()
        if server is not None:
            server.stop()

    print(f"file: {path.name}, {size / 1e6:.1f} MB; {args.runs} runs, interleaved; medians")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
          f"{platform.python_version()}; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after\n")
    print("| method | seconds | MB/s | vs cp |")
    print("|---|---:|---:|---:|")
    cp = statistics.median(times["cp"])
    for method, values in times.items():
        if not values:
            continue
        median = statistics.median(values)
        print(f"| {method} | {median:.3f} | {size / 1e6 / median:.0f} | {median / cp:.1f}x |")


if __name__ == "__main__":
    main()
