"""GPU check (issue 27): GPU offload on this machine's llama.cpp build, end to end.

    LLAMA_CPP_LIB_PATH=/path/to/a/cuda/build/lib python bench/gpu_check.py [--model PATH.gguf]

(or with a GPU build of llama-cpp-python installed; README § GPU). A real ``pollama serve`` (the
old engine) answers SmolLM2 with ``num_gpu`` 0, -1 and 10, each a greedy 128-token answer; for
each it prints the devices the runner used, ``/api/ps``'s ``size`` and ``size_vram``,
``pollama ps``'s PROCESSOR column, decode tokens/s and whether the text equals the CPU's. Then
the new engine, in this process: its notice and the device its backend runs on.

Exits 1 when something is wrong: a crash or an HTTP error, a CPU build that claims a GPU, a GPU
build where ``num_gpu`` -1 offloads nothing or ``num_gpu`` 0 offloads something, a new engine
that claims offload or runs elsewhere than on the CPU. On a CPU build everything reads CPU and
it exits 0. A minute on a GPU machine; a few on a loaded 2-core one.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import httpx  # noqa: E402

import runner  # noqa: E402  (before llama_cpp: runner/native.py)
import llama_cpp as L  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Options, Request  # noqa: E402
from runner.loading import gpu  # noqa: E402
from runner.ml.ggml import bindings as g  # noqa: E402
from runner.ml.ggml.devices import devices  # noqa: E402
from serverproc import ServerProcess  # noqa: E402

MODEL = "smollm2:135m"  # or the model --model's GGUF is created as (GPU_MODEL)
GPU_MODEL = "gpu-check:latest"
SOURCE: str | None = None  # --model: a GGUF file (a machine the default model cannot reach)
PROMPT = "Write a short story about a lighthouse keeper."
GiB = 2**30
failures: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        failures.append(what)
        print(f"  FAIL: {what}")


def processor(server: ServerProcess) -> str:
    out = subprocess.run([sys.executable, "-c", "from cli.main import app; app()", "ps"], env=server.env, cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    header, *rows = out.stdout.splitlines() or [""]
    start = header.find("PROCESSOR")
    row = next((r for r in rows if r.startswith(MODEL)), "")
    return row[start:].split("  ")[0].strip() if start >= 0 and row else f"(no row: {out.stderr.strip()})"


def old_engine(gpu_build: bool) -> None:
    """num_gpu -1 first: a later -1 would be served by whatever runner is loaded (Ollama's rule)."""
    rows, texts = [], {}
    server = ServerProcess({"OLLAMA_NEW_ENGINE": "0", "OLLAMA_KEEP_ALIVE": "5m"})
    if SOURCE:
        modelfile = Path(server.env["HOME"]) / "Modelfile"
        modelfile.write_text(f"FROM {SOURCE}\n")
        made = subprocess.run([sys.executable, "-c", "from cli.main import app; app()", "create", MODEL, "-f",
                               str(modelfile)], env=server.env, cwd=ROOT, capture_output=True, text=True, timeout=600)
        check(made.returncode == 0, f"create {MODEL} from {SOURCE}: {made.stderr.strip()[-300:]}")
    with server:
        try:
            for num_gpu in (-1, 0, 10):
                body = {"model": MODEL, "prompt": PROMPT, "stream": False,
                        "options": {"num_gpu": num_gpu, "temperature": 0, "num_predict": 128, "seed": 1}}
                r = httpx.post(server.url + "/api/generate", json=body, timeout=300)
                check(r.status_code == 200, f"num_gpu {num_gpu}: HTTP {r.status_code} {r.text[:200]}")
                if r.status_code != 200:
                    continue
                answer = r.json()
                (entry,) = [m for m in httpx.get(server.url + "/api/ps").json()["models"] if m["name"] == MODEL]
                rate = answer["eval_count"] / (answer["eval_duration"] / 1e9) if answer["eval_duration"] else 0.0
                texts[num_gpu] = answer["response"]
                shown = processor(server)
                rows.append((num_gpu, entry, shown, rate))
                if num_gpu == 0 or not gpu_build:
                    check(entry["size_vram"] == 0 and shown == "100% CPU" and entry["devices"] == "CPU",
                          f"num_gpu {num_gpu} should run on the CPU: {entry['devices']}, {shown}")
                elif num_gpu == -1:
                    check(entry["size_vram"] > 0 and "GPU" in shown, f"num_gpu -1 offloaded nothing: {shown}")
                else:  # 10 layers, or all of a smaller model's (stories260K has 6)
                    total = re.search(r"/(\d+) layers", entry["devices"])
                    wanted = min(10, int(total.group(1))) if total else 10
                    check(f" {wanted}/" in entry["devices"] and "GPU" in shown,
                          f"num_gpu 10 should offload {wanted} layers: {entry['devices']}, {shown}")
        except Exception as err:  # a crash of the check itself: say it, with the server's log
            check(False, f"{type(err).__name__}: {err}")
        if failures:  # with the stacks of its threads if it still runs (a load stuck in a driver)
            alive = server.proc is not None and server.proc.poll() is None
            server.dump_stacks()
            print(f"\nserver {'still running' if alive else f'ended with {server.proc.returncode}'}; "
                  "its log (tail):\n" + "\n".join(server.log().splitlines()[-60:]))
    print("\n| num_gpu | devices | size | size_vram | PROCESSOR | decode tok/s | greedy text = num_gpu 0's |")
    print("|---:|---|---:|---:|---|---:|---|")
    cpu_text = texts.get(0, "")
    for num_gpu, entry, shown, rate in rows:
        text = texts[num_gpu]
        same = "yes" if text == cpu_text else f"no (from character {_first_difference(text, cpu_text)})"
        print(f"| {num_gpu} | {entry['devices']} | {entry['size'] / GiB:.2f} GiB | "
              f"{entry['size_vram'] / GiB:.2f} GiB | {shown} | {rate:.1f} | {same} |")


def _first_difference(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def new_engine(gpu_build: bool) -> None:
    cfg = dataclasses.replace(config.load({}), new_engine=True, cache_ram=0, cache_disk=0)
    loaded = runner.load(runner.resolve(SOURCE or MODEL, cfg), Options(num_ctx=2048, num_gpu=-1), cfg)
    try:
        options = Options(temperature=0, num_predict=16)
        text = "".join(c.text for c in loaded.stream(Request(prompt=PROMPT, options=options)))
        device = g.ggml_backend_get_device(loaded.model_engine.model.backend.ptr)
        name = (g.ggml_backend_dev_name(device) or b"").decode()
        print(f"\nnew engine: engine={loaded.engine}, devices: {loaded.offload.devices}; backend device {name}; "
              f"{len(text)} characters answered")
        check(loaded.engine == "new" and loaded.offload.vram == 0 and name == "CPU" and bool(text),
              "the new engine should run on the CPU and answer")
        note = gpu.cpu_only_note(devices())
        check(bool(note) == gpu_build and loaded.offload.devices == ("CPU" + (f" ({note})" if note else "")),
              f"the new engine's notice: {loaded.offload.devices!r}")
    finally:
        loaded.close()


def main() -> int:
    global MODEL, SOURCE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a GGUF file to check with instead of SmolLM2 (created as gpu-check)")
    a = ap.parse_args()
    if a.model:
        MODEL, SOURCE = GPU_MODEL, str(Path(a.model).resolve())
    t0 = time.monotonic()
    gpu_build = bool(L.llama_supports_gpu_offload())
    print(f"llama-cpp-python {L.__version__}, libraries from {g.LIB_DIR} "
          f"(LLAMA_CPP_LIB_PATH={os.environ.get('LLAMA_CPP_LIB_PATH', 'unset')}); "
          f"llama_supports_gpu_offload: {gpu_build}")
    for d in devices():
        print(f"  {d.kind:5} {d.label()} [{d.backend}] {d.free / GiB:.1f} of {d.total / GiB:.1f} GiB free")
    check(gpu_build == bool(gpu.offload_devices(devices())), "llama.cpp and GGML's registry disagree about GPUs")
    old_engine(gpu_build)
    try:
        new_engine(gpu_build)
    except Exception as err:
        check(False, f"new engine: {type(err).__name__}: {err}")
    print(f"\n{'FAILED: ' + '; '.join(failures) if failures else 'ok'} ({time.monotonic() - t0:.0f} s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
