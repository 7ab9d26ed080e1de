"""Speculative decoding (issue 26): decode speed with prompt-lookup drafts against none, on both
engines, beside llama-server's n-gram modes on the same prompts.

    python bench/bench_spec.py [--runs 3] [--models smollm2,gemma3] [--tokens 300] [--depth 16] [--fa on]
        [--pool off] [--invariant on] [--repeat-penalty 1]

Tasks, greedy, ``--tokens`` generated (the issue's):
  rewrite  a 41-line Python file (bench/data/account.py.txt) with one name changed (input-grounded: the answer repeats it)
  quote    answer a question by quoting a document (input-grounded)
  story    an open-ended story (nothing to look up)
  explain  an open-ended explanation (nothing to look up; its phrases recur often enough for short
           keys to guess, mostly wrongly)

For each model and engine: decode tok/s (``eval_count / eval_duration``) with ``draft_num_predict
= --depth`` and with 0, their ratio, drafted tokens accepted/proposed, and whether the text is the
same. With drafts, the first request of a prompt and the repeated ones are reported apart: from
the second on, an n-gram pool a model's requests share (pollama's by default, ``--pool off``
turns it off; llama-server's ``ngram-mod``) holds the first answer, and drafts it whole (up to
where the second answer parts from the first: llama-server's may, as its batched rows round
differently from single ones; pollama's guessed rows are computed as lone ones). ``--fa on`` runs
both pollama and llama-server with flash attention (default: off in both, pollama's default;
llama-server's own default, auto, would turn it on). llama-server (built from the pinned sdist,
as bench_decode.py builds llama-bench) runs the same prompt text through ``/completion`` with ``--spec-type none``,
``ngram-simple`` and ``ngram-mod`` (their defaults), its ``timings.predicted_per_second``. Then 4
parallel streams in one runner (num_parallel 4): aggregate tok/s with and without drafts.

Both pollama and llama-server get pollama's repeat penalty: none by default (1.0, Ollama's since
v0.33 and llama-server's); ``--repeat-penalty 1.1`` gives both Ollama's old one (over 64 tokens).
It decides whether SmolLM2 copies: penalised, it rewords what it should repeat.

Runs are interleaved (no drafts, drafts, no drafts, ...) and medians reported; the load average is
printed: on this 2-core machine, repeat a run whose load average is above ~0.5.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Options, Request  # noqa: E402

import bench_decode  # noqa: E402

CODE = (HERE / "data" / "account.py.txt").read_text()  # tests/test_spec_models.py reads it too

DOCUMENT = """The town of Millbrook sits where the Arden river bends east toward the sea. It was founded in 1742 by a group of millers who used the fast water to turn their wheels, and for a century the town lived on flour, timber and wool.

The old stone bridge was built in 1811 after the wooden one was carried away by a spring flood. It has five arches, each a little wider than the one before, and the townspeople say that the middle arch was left unfinished for a year because the mason refused to work until he was paid.

In 1868 the railway reached Millbrook, and with it came a station, two hotels and a brass band that still plays on the first Sunday of every month. The mills closed one by one after the First World War, and the last of them became a museum in 1974.

Today Millbrook is known for its autumn fair, its library, which holds the letters of the founding families, and the walking path that follows the river from the bridge to the old lighthouse at the estuary."""

TASKS = {
    "rewrite": "Rewrite this Python code, renaming balance to funds everywhere. Output only the code.\n\n"
               "```python\n" + CODE + "```",
    "quote": "Read the document and answer by quoting it word for word: what does it say about the old "
             "stone bridge and about the railway? Quote both paragraphs exactly.\n\n" + DOCUMENT,
    "story": "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "explain": "Explain in detail how a bicycle works, part by part.",
}
GROUNDED = ("rewrite", "quote")


def chat_prompt(model: str, user: str) -> str:
    """The model's own chat format around one user turn (raw text, so llama-server gets the same)."""
    if model.startswith("smollm2"):
        return (f"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
                f"<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
    return f"<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def load_avg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


@dataclasses.dataclass
class Gen:
    text: str
    tokens: int
    tps: float
    draft_n: int
    accepted: int


def generate(r, prompt: str, tokens: int, depth: int) -> Gen:
    options = Options().merged({"temperature": 0, "num_predict": tokens, "draft_num_predict": depth, **PENALTY})
    parts, final = [], None
    # each run evaluates its prompt whole: a prompt served from the slot re-evaluates only its last
    # token, alone, whose logits then differ in their last bits from the prompt batch's (another
    # kernel for a batch of ~150 rows), so drafts and no drafts are compared from equal starts
    for chunk in r.stream(Request(prompt=prompt, raw=True, options=options, cache_prompt=False)):
        parts.append(chunk.text)
        if chunk.done:
            final = chunk
    m = final.metrics
    return Gen("".join(parts), m.eval_count, m.eval_count / (m.eval_duration / 1e9), m.draft_n, m.draft_n_accepted)


FLASH = False  # --fa on: flash attention in pollama and llama-server alike (else off in both)
POOL = True  # --pool: pollama's shared n-gram pool (POLLAMA_NGRAM_POOL, on by default)
INVARIANT = False  # --invariant on: the new engine's batch-invariant kernels (POLLAMA_BATCH_INVARIANT)


def load_runner(model: str, engine: str, threads: int, num_parallel: int):
    cfg = dataclasses.replace(config.load({}), new_engine=engine == "new", cache_ram=0, cache_disk=0,
                              flash_attention=FLASH, ngram_pool=POOL, batch_invariant=INVARIANT)
    path = str(bench_decode.MODELS[model][1]())
    r = runner.load(runner.resolve(path, cfg), Options().merged({"num_ctx": 4096, "num_thread": threads}),
                    cfg, num_parallel=num_parallel)
    if r.engine != engine:
        raise SystemExit(f"asked for the {engine} engine, got {r.engine}")
    return r


@dataclasses.dataclass
class Row:
    model: str
    engine: str
    task: str
    off: list[Gen]
    on: list[Gen]

    @property
    def same(self) -> str:
        """"yes" when every run's text is the first run's without drafts, else where the first
        text that differs parts from it (characters)."""
        return same_text([g.text for g in self.off + self.on])


def same_text(texts: list[str]) -> str:
    base = texts[0]
    parts = [next((i for i, (x, y) in enumerate(zip(base, t)) if x != y), min(len(base), len(t)))
             for t in texts if t != base]
    return "yes" if not parts else f"parts at char {min(parts)} of {len(base)}"


def pollama_rows(model: str, engine: str, prompts: dict[str, str], runs: int, tokens: int, depth: int,
                 threads: int) -> list[Row]:
    r = load_runner(model, engine, threads, 1)
    try:
        rows = []
        for task, prompt in prompts.items():
            generate(r, prompt, 8, 0)  # the prompt into the slot: runs then measure decode alone
            row = Row(model, engine, task, [], [])
            for _ in range(runs):
                row.off.append(generate(r, prompt, tokens, 0))
                row.on.append(generate(r, prompt, tokens, depth))
            rows.append(row)
        return rows
    finally:
        r.close()


def streams(model: str, engine: str, prompt: str, runs: int, tokens: int, depth: int, threads: int,
            n: int = 4) -> tuple[list[float], list[float], str]:
    """Aggregate tok/s of ``n`` concurrent streams, without and with drafts, and how many texts
    the streams gave each way. Concurrent streams' texts differ without drafts too: a stream's
    decoded row shares a batch with another's prompt when the arrivals fall so, and is then
    computed as a prompt's row is (llamafile's tiles), which rounds differently than alone."""
    r = load_runner(model, engine, threads, n)
    texts: dict[int, list[str]] = {0: [], depth: []}
    try:
        def once(d: int) -> float:
            out: list[Gen] = [None] * n  # type: ignore[list-item]

            def one(i: int) -> None:
                out[i] = generate(r, prompt, tokens, d)

            threads_ = [threading.Thread(target=one, args=(i,)) for i in range(n)]
            t0 = time.perf_counter()
            for t in threads_:
                t.start()
            for t in threads_:
                t.join()
            wall = time.perf_counter() - t0
            texts[d].extend(g.text for g in out)
            return sum(g.tokens for g in out) / wall

        once(0)
        off, on = [], []
        for _ in range(runs):
            off.append(once(0))
            on.append(once(depth))
        plain, drafted = set(texts[0]), set(texts[depth])
        return off, on, (f"{len(plain)} / {len(drafted)}, {len(drafted & plain)} of them the same"
                         + (f"; {same_text(texts[0] + texts[depth])}" if len(plain | drafted) > 1 else ""))
    finally:
        r.close()


#: the repeat penalty of both pollama's and llama-server's requests (``--repeat-penalty``): by
#: default pollama's, none (1.0, Ollama's since v0.33 and llama-server's), over pollama's 64
#: tokens; ``--repeat-penalty 1.1`` gives both the penalty Ollama applied before
PENALTY = {"repeat_penalty": Options().repeat_penalty, "repeat_last_n": Options().repeat_last_n}


def server_generate(srv: bench_decode.LlamaServer, prompt: str, tokens: int) -> Gen:
    reply = srv.post("/completion", {"prompt": prompt, "n_predict": tokens, "temperature": 0, "top_k": 1, **PENALTY,
                                     "cache_prompt": True, "stream": False})
    t = reply["timings"]
    return Gen(reply["content"], int(t["predicted_n"]), float(t["predicted_per_second"]),
               int(t.get("draft_n", 0)), int(t.get("draft_n_accepted", 0)))


SPEC_TYPES = ("none", "ngram-simple", "ngram-mod")


def server_rows(binary: Path, model: str, prompts: dict[str, str], runs: int, tokens: int,
                threads: int) -> dict[tuple[str, str], list[Gen]]:
    """(task, spec type) -> runs; the three servers are started one after another per run round."""
    path = bench_decode.MODELS[model][1]()
    out: dict[tuple[str, str], list[Gen]] = {}
    for spec in SPEC_TYPES:
        srv = bench_decode.LlamaServer(binary, ["-m", str(path), "-np", "1", "-c", "4096", "-t", str(threads),
                                                "-tb", str(threads), "--spec-type", spec, "--cache-ram", "0",
                                                "-fa", "on" if FLASH else "off"])
        try:
            for task, prompt in prompts.items():
                server_generate(srv, prompt, 8)
                out[(task, spec)] = [server_generate(srv, prompt, tokens) for _ in range(runs)]
        finally:
            srv.close()
    return out


def acc(gens: list[Gen]) -> str:
    n, a = sum(g.draft_n for g in gens), sum(g.accepted for g in gens)
    return f"{a}/{n}" if n else "–"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--models", default="smollm2,gemma3", help="comma list of: " + ",".join(bench_decode.MODELS))
    ap.add_argument("--engines", default="old,new")
    ap.add_argument("--tasks", default=",".join(TASKS))
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--depth", type=int, default=Options().draft_num_predict,
                    help="draft_num_predict of the drafting rows (default: pollama's)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--no-server", action="store_true", help="skip llama-server")
    ap.add_argument("--no-streams", action="store_true", help="skip the 4-stream rows")
    ap.add_argument("--pool", choices=("off", "on"), default="on" if config.load({}).ngram_pool else "off",
                    help="pollama's shared n-gram pool (POLLAMA_NGRAM_POOL; default: pollama's, on)")
    ap.add_argument("--invariant", choices=("off", "on"), default="off",
                    help="the new engine's batch-invariant kernels (POLLAMA_BATCH_INVARIANT; default off)")
    ap.add_argument("--repeat-penalty", type=float, default=Options().repeat_penalty,
                    help="repeat penalty of both pollama's and llama-server's requests (default pollama's, 1: "
                         "none, as Ollama's since v0.33 and llama-server's; 1.1 is Ollama's before)")
    ap.add_argument("--fa", choices=("off", "on"), default="off",
                    help="flash attention in both pollama and llama-server (default off, pollama's default)")
    a = ap.parse_args()
    global FLASH, POOL, INVARIANT
    FLASH, POOL, INVARIANT = a.fa == "on", a.pool == "on", a.invariant == "on"
    PENALTY["repeat_penalty"] = a.repeat_penalty
    models = a.models.split(",")
    engines = a.engines.split(",")
    tasks = a.tasks.split(",")

    print(f"machine: {bench_decode.machine()}; {a.threads} threads; greedy, {a.tokens} tokens; "
          f"draft_num_predict {a.depth} vs 0; flash attention {a.fa} (both); n-gram pool {a.pool}; "
          f"batch-invariant {a.invariant}; repeat penalty {a.repeat_penalty:g} over {PENALTY['repeat_last_n']} tokens (both); "
          f"median of {a.runs} interleaved runs; "
          f"load average {load_avg()}")
    print(f"pollama: {bench_decode.git_head(HERE.parent)}\n")
    binary = None if a.no_server else bench_decode.llama_cpp_tool("llama-server")

    for model in models:
        prompts = {t: chat_prompt(model, TASKS[t]) for t in tasks}
        rows = [row for engine in engines
                for row in pollama_rows(model, engine, prompts, a.runs, a.tokens, a.depth, a.threads)]
        server = server_rows(binary, model, prompts, a.runs, a.tokens, a.threads) if binary else {}
        label = bench_decode.MODELS[model][0]
        print(f"### {label}: one stream (load average {load_avg()})\n")
        print("| task | engine | tok/s, no drafts | drafts, first request | first / none | drafts, repeated | "
              "repeated / none | accepted/proposed (first; repeated) | same text as no drafts |")
        print("|---|---|---:|---:|---:|---:|---:|---:|---|")
        for row in rows:
            off, first, again = med([g.tps for g in row.off]), row.on[0].tps, med([g.tps for g in row.on[1:]])
            print(f"| {row.task} | {row.engine} | {off:.1f} | {first:.1f} | {first / off:.2f}× | {again:.1f} | "
                  f"{again / off:.2f}× | {acc(row.on[:1])}; {acc(row.on[1:])} | {row.same} |")
        if server:
            print("\n| task | llama-server | tok/s, first request | vs none | repeated | vs none | "
                  "accepted/proposed (first; repeated) |")
            print("|---|---|---:|---:|---:|---:|---:|")
            for task in tasks:
                base = med([g.tps for g in server[(task, "none")]])
                for spec in SPEC_TYPES:
                    gens = server[(task, spec)]
                    first, again = gens[0].tps, med([g.tps for g in gens[1:]])
                    print(f"| {task} | {spec} | {first:.1f} | {first / base:.2f}× | {again:.1f} | {again / base:.2f}× | "
                          f"{acc(gens[:1])}; {acc(gens[1:])} |")
        if not a.no_streams:
            print(f"\n4 streams, one runner (num_parallel 4), task rewrite (load average {load_avg()})\n")
            print("| engine | aggregate tok/s, no drafts | drafts | drafts / none | distinct texts, no drafts / drafts |")
            print("|---|---:|---:|---:|---|")
            for engine in engines:
                off, on, same = streams(model, engine, prompts[tasks[0]], a.runs, a.tokens, a.depth, a.threads)
                print(f"| {engine} | {med(off):.1f} | {med(on):.1f} | {med(on) / med(off):.2f}× | {same} |")
        print()


if __name__ == "__main__":
    main()
