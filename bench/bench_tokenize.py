"""Tokenizer speed, new engine vs old: prints a Markdown table for bench/README.md.

The old engine tokenizes with llama.cpp (``llama_tokenize`` through llama-cpp-python, as
``runner/engines/llamacpp/engine.py`` does); the new engine with our own ``runner.model.tokenizer``.
Both run on the same prompts, interleaved (old, new, new, old, ...), with the runners' defaults
(``add_special=True, parse_special=True``), and every run checks that the two token lists are
equal: a speed-up that changes a token is a bug, and the script exits 1.

Prompts are built here, deterministically, at each size (UTF-8 bytes):

- prose: English reference text (the stdlib's ``pydoc_data`` topics), paragraphs shuffled
- code: the stdlib's own ``.py`` sources, concatenated
- unicode: mixed scripts (CJK, Cyrillic, Arabic, Devanagari, Thai, Hangul, emoji with ZWJ,
  combining marks, rare planes) between Latin words and digits
- base64: random bytes, base64 in 76-column lines (pasted data: long letter/digit words)
- and the pathological inputs for BPE merges and regex pre-tokenization, one character repeated:
  letters (``aaaa``), spaces, digits (``1111``), newlines

    python bench/bench_tokenize.py [--sizes 100K,1M,10M] [--kinds prose,code,...]
                                   [--models smollm2,stories260K,gemma3] [--runs 3]
    python bench/bench_tokenize.py --load [--models ...] [--runs 5]
    python bench/bench_tokenize.py --profile prose --sizes 1M --models stories260K
    python bench/bench_tokenize.py --end-to-end --sizes 10M

``--load`` times loading each model's vocabulary instead: ``load_tokenizer`` (ours: the GGUF
header, the tables) against llama.cpp's vocab-only model load, interleaved, median wall seconds.
gemma3 (gemma-3-270m: a 262,144-token SPM vocabulary with 6,414 special tokens) is assembled on
first use by ``shared/models/fetch-gemma3.sh``.

``--end-to-end`` sends the prose prompt through ``runner.load`` (each engine, SmolLM2, num_ctx 512)
as ``generate`` and as the last of three ``chat`` messages, truncate on, num_predict 1, no prompt
cache, and times the request's preparation (template, truncation, tokenizing: wall seconds), how
often the prompt was tokenized, and the whole request (the rest is evaluating 512 tokens).
"""

from __future__ import annotations

import argparse
import base64
import cProfile
import ctypes
import dataclasses
import os
import platform
import pstats
import random
import statistics
import subprocess
import sys
import sysconfig
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama_cpp  # noqa: E402

from runner.engines.llamacpp.engine import llama_tokenize  # noqa: E402
from runner.model import load_tokenizer  # noqa: E402
from runner.store import default_model_path  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"


def _gemma3() -> Path:
    script = SHARED / "models" / "fetch-gemma3.sh"
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True)
    return Path(done.stdout.strip().splitlines()[-1])


MODELS: dict[str, Callable[[], Path]] = {
    "smollm2": default_model_path,  # BPE (gpt2 vocabulary, smollm pre-tokenizer)
    "stories260K": lambda: SHARED / "models" / "stories260K.gguf",  # SPM (llama vocabulary)
    "gemma3": _gemma3,  # SPM, 262,144 tokens, 6,414 of them special
}
SIZES = {"100K": 100_000, "1M": 1_000_000, "10M": 10_000_000}


# ------------------------------------------------------------------------------ the prompts
def _prose_source() -> list[str]:
    from pydoc_data.topics import topics  # the Python reference manual as plain text

    return [p.strip() for text in topics.values() for p in text.split("\n\n") if p.strip()]


def _code_source() -> list[str]:
    lib = Path(sysconfig.get_paths()["stdlib"])
    return [p.read_text(encoding="utf-8", errors="replace") for p in sorted(lib.glob("*.py"))]


def _unicode_source(rng: random.Random) -> list[str]:
    phrases = [
        "нещо на Български език", "Привет, как дела?", "我想在apple工作1314151天～", "こんにちは世界、元気ですか",
        "한국어 문장입니다", "العربية لغة جميلة", "हिन्दी में लिखा गया", "ภาษาไทยสวยงาม", "ក្រុមហ៊ុន",
        "Ελληνικά γράμματα", "עברית כתובה", "Ünïcödé àccénts ß ç ñ", "🦙🦙 llamas 😀 👨‍👩‍👧 🏳️‍🌈 🧑‍💻",
        "e\u0301 a\u0300\u0316 \u200b\u200d\ufeff", "½²³Ⅻ ٣٤٥ 1,234.56", "\u3000\xa0\u2028 tabs\tand\r\n",
        "\U00031350 \U0001d400\U0001d401 \ue000 \U000f0000",
    ]
    blocks = [(0x4E00, 0x9FFF), (0x0400, 0x04FF), (0x0600, 0x06FF), (0x3040, 0x30FF), (0xAC00, 0xD7A3),
              (0x1F300, 0x1F6FF), (0x0900, 0x097F), (0x0E00, 0x0E7F)]
    out = []
    for _ in range(2000):
        lo, hi = rng.choice(blocks)
        noise = "".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12)))
        out.append(f"{rng.choice(phrases)} word{rng.randint(0, 999)} {noise}. ")
    return out


def _fill(pieces: list[str], size: int, rng: random.Random, sep: str) -> str:
    """Shuffled ``pieces`` joined by ``sep``, repeated until ``size`` UTF-8 bytes, cut to size."""
    parts: list[str] = []
    total = 0
    while total < size:
        batch = pieces[:]
        rng.shuffle(batch)
        for piece in batch:
            parts.append(piece)
            total += len(piece.encode("utf-8")) + len(sep)
            if total >= size:
                break
    return _cut(sep.join(parts), size)


def _cut(text: str, size: int) -> str:
    return text.encode("utf-8")[:size].decode("utf-8", errors="ignore")


def build_prompt(kind: str, size: int) -> str:
    rng = random.Random(f"{kind}-{size}")
    if kind == "prose":
        return _fill(_prose_source(), size, rng, "\n\n")
    if kind == "code":
        return _fill(_code_source(), size, rng, "\n\n")
    if kind == "unicode":
        return _fill(_unicode_source(rng), size, rng, "")
    if kind == "base64":
        raw = base64.encodebytes(rng.randbytes(size * 3 // 4 + 3)).decode("ascii")
        return raw[:size]
    if kind in RUNS:
        return RUNS[kind] * size
    raise SystemExit(f"unknown kind {kind!r}")


RUNS = {"letters": "a", "spaces": " ", "digits": "1", "newlines": "\n"}
KINDS = ["prose", "code", "unicode", "base64", *RUNS]


# ------------------------------------------------------------------------ the two tokenizers
class OldTokenizer:
    """llama.cpp's tokenizer exactly as the old engine calls it (vocab-only model)."""

    _log_cb = llama_cpp.llama_log_callback(lambda level, text, user_data: None)

    def __init__(self, path: Path) -> None:
        llama_cpp.llama_log_set(self._log_cb, ctypes.c_void_p())
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self._model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
        if not self._model:
            raise SystemExit(f"llama.cpp cannot load {path}")
        self._vocab = llama_cpp.llama_model_get_vocab(self._model)

    def encode(self, text: str) -> list[int]:  # what the old engine's tokenize() calls
        return llama_tokenize(self._vocab, text, True, True)

    def close(self) -> None:
        llama_cpp.llama_model_free(self._model)


def timed(fn: Callable[[str], list[int]], text: str) -> tuple[float, list[int]]:
    """CPU seconds of this process (both tokenizers run on the calling thread): steadier than
    wall time on a shared machine."""
    t0 = time.process_time()
    ids = fn(text)
    return time.process_time() - t0, ids


def timed_new(path: Path, text: str) -> tuple[float, list[int]]:
    """Our tokenizer as the new engine calls it (runner/engines/ggml/engine.py tokenize()). A fresh
    one each run (loading not timed): its word cache starts empty, as after a model loads."""
    tok = load_tokenizer(path)
    return timed(lambda t: tok.encode(t, add_special=True, parse_special=True), text)


# ------------------------------------------------------------------------------ load time
def load_times(models: list[str], runs: int) -> None:
    print("| model | tokens | old: llama.cpp vocab-only load (s) | new: load_tokenizer (s) | new / old |")
    print("|---|---:|---:|---:|---:|")
    for model in models:
        path = MODELS[model]()
        times: dict[str, list[float]] = {"old": [], "new": []}
        n_vocab = 0
        for run in range(runs):
            for label in (["old", "new"] if run % 2 == 0 else ["new", "old"]):
                t0 = time.perf_counter()
                if label == "old":
                    old = OldTokenizer(path)
                    n_vocab = int(llama_cpp.llama_vocab_n_tokens(old._vocab))
                else:
                    load_tokenizer(path)
                times[label].append(time.perf_counter() - t0)
                if label == "old":
                    old.close()
        t_old, t_new = statistics.median(times["old"]), statistics.median(times["new"])
        print(f"| {model} | {n_vocab} | {t_old:.3f} | {t_new:.3f} | {t_new / t_old:.2f}× |", flush=True)


# ------------------------------------------------------------------------------ end to end
def end_to_end(sizes: list[str]) -> None:
    import runner
    from runner import config
    from runner.api import Message, Options, Request

    print("| engine | request | size | prepare (s) | tokenize calls | whole request (s) | prompt tokens kept |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for engine in ("old", "new"):
        cfg = dataclasses.replace(config.load(), new_engine=engine == "new")
        model = runner.load(runner.resolve(None, cfg), Options(num_ctx=512), cfg, num_parallel=1)
        calls = 0
        tokenize = model.tokenize

        def counted(*args: object, **kwargs: object) -> list[int]:
            nonlocal calls
            calls += 1
            return tokenize(*args, **kwargs)  # type: ignore[arg-type]

        model.tokenize = counted  # type: ignore[method-assign]
        try:
            for size in sizes:
                text = build_prompt("prose", SIZES[size])
                opts = Options(num_ctx=512, num_predict=1)
                requests = {
                    "generate": (model.generate, Request(prompt=text, options=opts, cache_prompt=False)),
                    "chat": (model.chat, Request(messages=[Message("user", "Hi"), Message("assistant", "Hello!"),
                                                           Message("user", text)], options=opts, cache_prompt=False)),
                }
                for name, (send, request) in requests.items():
                    calls = 0
                    t0 = time.perf_counter()
                    stream = send(request)  # prepares (and tokenizes) before it returns
                    t1 = time.perf_counter()
                    chunks = list(stream)
                    t2 = time.perf_counter()
                    kept = chunks[-1].metrics.prompt_eval_count + chunks[-1].metrics.prompt_cached_count
                    print(f"| {engine} | {name} | {size} | {t1 - t0:.2f} | {calls} | {t2 - t0:.2f} | {kept} |",
                          flush=True)
        finally:
            model.close()


# ------------------------------------------------------------------------------------- main
def machine() -> str:
    load = os.getloadavg()
    return (f"machine: {platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}, "
            f"llama-cpp-python {llama_cpp.__version__}; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(SIZES), help="comma-separated, of " + ",".join(SIZES))
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated, of " + ",".join(KINDS))
    ap.add_argument("--models", default=",".join(MODELS), help="comma-separated, of " + ",".join(MODELS))
    ap.add_argument("--runs", type=int, default=3, help="runs per tokenizer (median reported)")
    ap.add_argument("--old-limit", type=float, default=60.0, metavar="S",
                    help="when llama.cpp takes longer than S on a prompt, skip it at larger sizes of that kind")
    ap.add_argument("--profile", metavar="KIND", help="cProfile the new tokenizer on KIND instead")
    ap.add_argument("--end-to-end", action="store_true", help="time prose prompts through both runners instead")
    ap.add_argument("--load", action="store_true", help="time loading the vocabularies instead")
    args = ap.parse_args()
    sizes = [s for s in args.sizes.split(",") if s]
    kinds = [k for k in args.kinds.split(",") if k]
    models = [m for m in args.models.split(",") if m]
    for name, table in (("size", SIZES), ("model", MODELS)):
        for item in (sizes if name == "size" else models):
            if item not in table:
                raise SystemExit(f"unknown {name} {item!r}")

    if args.load:
        print(machine())
        print(f"median wall seconds of {args.runs} interleaved loads\n")
        load_times(models, args.runs)
        return 0
    if args.end_to_end:
        print(machine())
        end_to_end(sizes)
        return 0
    if args.profile:
        for model in models:
            for size in sizes:
                tok = load_tokenizer(MODELS[model]())
                text = build_prompt(args.profile, SIZES[size])
                print(f"## {model}, {args.profile} {size}")
                prof = cProfile.Profile()
                prof.runcall(tok.encode, text, True, True)
                pstats.Stats(prof).sort_stats("cumulative").print_stats(14)
        return 0

    print(machine())
    print(f"median CPU seconds of {args.runs} interleaved runs; add_special and parse_special on, "
          "as both runners call it\n")
    print("| model | prompt | size | tokens | old (s) | new (s) | old MB/s | new MB/s | new / old | equal |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|:---:|")
    all_equal = True
    for model in models:
        path = MODELS[model]()
        old = OldTokenizer(path)
        for kind in kinds:
            old_too_slow = False
            for size in sizes:
                text = build_prompt(kind, SIZES[size])
                mb = len(text.encode("utf-8")) / 1e6
                times: dict[str, list[float]] = {"old": [], "new": []}
                equal = True
                for run in range(args.runs):
                    order = ["old", "new"] if run % 2 == 0 else ["new", "old"]
                    ids: dict[str, list[int]] = {}
                    for label in order:
                        if label == "old" and old_too_slow:
                            continue
                        seconds, ids[label] = timed(old.encode, text) if label == "old" else timed_new(path, text)
                        times[label].append(seconds)
                        if label == "old" and seconds > args.old_limit:
                            old_too_slow = True  # quadratic there: one run is enough, none larger
                    if "old" in ids:
                        equal = equal and ids["old"] == ids["new"]
                    n_tokens = len(ids["new"])
                    del ids
                t_new = statistics.median(times["new"])
                all_equal = all_equal and equal
                if times["old"]:
                    t_old = statistics.median(times["old"])
                    old_cols = f"{t_old:.3f} | {t_new:.3f} | {mb / t_old:.2f} | {mb / t_new:.2f} | {t_new / t_old:.2f}×"
                    verdict = "yes" if equal else "NO"
                else:
                    old_cols = f"(skipped) | {t_new:.3f} | — | {mb / t_new:.2f} | —"
                    verdict = "n/a"
                print(f"| {model} | {kind} | {size} | {n_tokens} | {old_cols} | {verdict} |", flush=True)
    print(f"\nload average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not all_equal:
        print("token lists differ: the new tokenizer is wrong", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
