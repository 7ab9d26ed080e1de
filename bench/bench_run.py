"""What `pollama run` feels like, measured: prints Markdown tables for bench/README.md.

(a) A 6-turn chat on SmolLM2 reaching ~1500 tokens of history: per turn, prompt tokens evaluated
    and time to first token, with the slot cache on vs off (same messages, same answers).
(b) Prompt and decode tokens/s of our runner (old and new engine) vs llama-cpp-python's `Llama`
    class, same model, threads, context and batch.
(c) Aggregate decode tokens/s of 4 concurrent streams vs 1, per engine.
"-ggml" rows: an engine with POLLAMA_ROW_KERNELS=0 (GGML's one-row Q4_1 products).

Every figure is the median of --runs runs; in (b) and (c) the runners' runs are interleaved, each
in a fresh process. Run it on a quiet machine:
    python bench/bench_run.py [--runs 3] [--threads N]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import dataclasses
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Message, Options, Request  # noqa: E402
from runner.store import default_model_path  # noqa: E402

USER_TURNS = [
    "I am planning a vegetable garden in a small backyard that gets about six hours of sun. "
    "The soil is clay and drains slowly after rain. I would like to grow tomatoes, beans, lettuce "
    "and some herbs like basil and parsley. Where should I start, and what should I do first?",
    "Thanks. The clay is my biggest worry. I read that raised beds help, but I am not sure how deep "
    "they should be, what to fill them with, or whether wood treated against rot is safe for food.",
    "Let's say I build two beds, each four feet by eight feet. How would you arrange the tomatoes, "
    "beans and lettuce so that the tall plants do not shade the short ones during the afternoon?",
    "How often should I water in the middle of summer? We sometimes go a week or two without rain "
    "and the afternoons get quite hot. I also wonder whether a drip line is worth the money.",
    "Some of my tomato leaves last year had yellow patches with brown spots that spread upward from "
    "the bottom of the plant. What could that have been, and how do I prevent it this season?",
    "Finally, can you summarise everything we discussed as a short checklist I can print out and "
    "pin to the shed door, in the order I should do things through the season?",
]
ANSWER_TOKENS = 200
LONG_TEXT = (
    "The history of the printing press begins long before Gutenberg. Carved wooden blocks were used "
    "to print patterns on cloth and later pages of text, and movable type made of ceramic and then "
    "metal appeared in East Asia centuries before it reached Europe. "
) * 12


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def load(engine: str, threads: int, num_ctx: int = 4096, parallel: int = 1, cache: bool = True):
    """``engine``: "old", "new", or either with "-ggml" (POLLAMA_ROW_KERNELS=0: GGML's one-row
    products for the Q4_1 weights, as llama.cpp itself multiplies them)."""
    cfg = dataclasses.replace(config.load({}), new_engine=engine.startswith("new"),
                              row_kernels=not engine.endswith("-ggml"))
    opts = Options(num_ctx=num_ctx, num_thread=threads)
    r = runner.load(runner.resolve(None, cfg), opts, cfg, num_parallel=parallel)
    assert r.engine == engine.split("-")[0]
    return r


def timed(stream):
    """(time to first text ns, total ns, final chunk, text)."""
    t0 = time.perf_counter_ns()
    first = None
    text = []
    final = None
    for chunk in stream:
        if chunk.text and first is None:
            first = time.perf_counter_ns() - t0
        text.append(chunk.text)
        if chunk.done:
            final = chunk
    total = time.perf_counter_ns() - t0
    return (first if first is not None else total), total, final, "".join(text)


# ---------------------------------------------------------------------------------- (a) turns
def conversation(threads: int, runs: int):
    """Replay the chat as the REPL does, answer by answer; turn 1 is always cold."""
    r = load("old", threads)
    opts = Options(temperature=0, num_predict=ANSWER_TOKENS, num_thread=threads)
    stats = {(mode, turn): ([], []) for mode in ("on", "off") for turn in range(len(USER_TURNS))}
    history_tokens = 0
    for _ in range(runs):
        for mode in ("off", "on"):
            history: list[Message] = []
            for turn, user in enumerate(USER_TURNS):
                history.append(Message("user", user))
                request = Request(messages=list(history), cache_prompt=(mode == "on" and turn > 0), options=opts)
                ttft, _, final, answer = timed(r.stream(request))
                history.append(Message("assistant", answer))
                stats[(mode, turn)][0].append(final.metrics.prompt_eval_count)
                stats[(mode, turn)][1].append(ttft)
            history_tokens = len(r.tokenize(r.render_chat(history)))
    r.close()
    rows = []
    for turn in range(len(USER_TURNS)):
        (e_off, t_off), (e_on, t_on) = stats[("off", turn)], stats[("on", turn)]
        rows.append((turn + 1, median(e_off), median(e_on), median(t_off) / 1e6, median(t_on) / 1e6))
    return rows, history_tokens


# ------------------------------------------------------------------------- (b) throughput
def our_speed(engine: str, threads: int, prompt_tokens: list[int], n_gen: int, runs: int):
    r = load(engine, threads, num_ctx=2048)
    pp, tg = [], []
    text = r.detokenize(prompt_tokens)
    for _ in range(runs + 1):
        # no drafted tokens (issue 26): this is the one-token-a-step rate the `Llama` class has
        opts = Options(temperature=0, repeat_penalty=1.0, num_predict=n_gen, draft_num_predict=0)
        _, total1, f1, _ = timed(r.stream(Request(prompt=text, raw=True, cache_prompt=False,
                                                    options=dataclasses.replace(opts, num_predict=1))))
        _, total, f, _ = timed(r.stream(Request(prompt=text, raw=True, cache_prompt=False, options=opts)))
        n = f.metrics.eval_count
        pp.append(f1.metrics.prompt_eval_count / (total1 / 1e9))
        tg.append((n - 1) / ((total - total1) / 1e9))
    r.close()
    return median(pp[1:]), median(tg[1:]), n


def llama_class_speed(threads: int, prompt_tokens: list[int], n_gen: int, runs: int):
    from llama_cpp import Llama

    llm = Llama(str(default_model_path()), n_ctx=2048, n_batch=512, n_threads=threads, n_threads_batch=threads,
                verbose=False)
    pp, tg = [], []
    for _ in range(runs + 1):
        def complete(max_tokens):
            llm.reset()
            t0 = time.perf_counter_ns()
            out = llm.create_completion(prompt_tokens, max_tokens=max_tokens, temperature=0.0, repeat_penalty=1.0)
            return time.perf_counter_ns() - t0, out["usage"]["completion_tokens"]
        t1, _ = complete(1)
        t, n = complete(n_gen)
        pp.append(len(prompt_tokens) / (t1 / 1e9))
        tg.append((n - 1) / ((t - t1) / 1e9))
    return median(pp[1:]), median(tg[1:]), n


# ---------------------------------------------------------------------------- (c) streams
def streams(engine: str, threads: int, n_streams: int, n_gen: int, runs: int) -> float:
    r = load(engine, threads, num_ctx=1024, parallel=4)
    prompts = ["Once upon a time in a small village", "The history of the printing press",
               "Here is a recipe for bread:", "The planets of the solar system are"]
    rates = []
    for _ in range(runs + 1):  # the first builds the graphs: not counted
        counts = [0] * n_streams

        def work(i):
            _, _, f, _ = timed(r.stream(Request(prompt=prompts[i], raw=True, cache_prompt=False,
                                                  options=Options(temperature=0, num_predict=n_gen,
                                                                  draft_num_predict=0))))
            counts[i] = f.metrics.eval_count

        t0 = time.perf_counter()
        threads_ = [threading.Thread(target=work, args=(i,)) for i in range(n_streams)]
        for t in threads_:
            t.start()
        for t in threads_:
            t.join()
        rates.append(sum(counts) / (time.perf_counter() - t0))
    r.close()
    return median(rates[1:])


def isolated(fn, *args):
    """Run ``fn(*args)`` in a fresh spawned process and return its result."""
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(fn, *args).result()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=min(os.cpu_count() or 2, 8))
    ap.add_argument("--skip", default="", help="comma list of parts to skip: turns,speed,streams")
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, {platform.python_implementation()} "
          f"{platform.python_version()}, {args.threads} threads; model SmolLM2-135M-Instruct Q4_1; "
          f"median of {args.runs} runs; load average {os.getloadavg()[0]:.2f}\n")

    if "turns" not in skip:
        rows, history_tokens = isolated(conversation, args.threads, args.runs)
        print(f"(a) 6-turn chat ({history_tokens} tokens of history at the end, {ANSWER_TOKENS}-token answers): "
              "prompt tokens evaluated and time to first token\n")
        print("| turn | evaluated, cache off | evaluated, cache on | TTFT off (ms) | TTFT on (ms) | on / off |")
        print("|---:|---:|---:|---:|---:|---:|")
        for turn, e_off, e_on, t_off, t_on in rows:
            print(f"| {turn} | {e_off:.0f} | {e_on:.0f} | {t_off:.1f} | {t_on:.1f} | {t_on / t_off:.3f} |")
        print()

    if "speed" not in skip:
        r = load("old", args.threads, num_ctx=2048)
        prompt = r.tokenize(LONG_TEXT, add_special=False)[:500]
        r.close()
        n_gen = 128
        # each measurement in a fresh process: a runner or Llama left alive skews the next one
        jobs = {
            "llama-cpp-python `Llama` class": (llama_class_speed, (args.threads, prompt, n_gen, args.runs)),
            "pollama, old engine (llama.cpp)": (our_speed, ("old", args.threads, prompt, n_gen, args.runs)),
            "pollama, old engine, POLLAMA_ROW_KERNELS=0": (our_speed, ("old-ggml", args.threads, prompt, n_gen,
                                                                       args.runs)),
            "pollama, new engine (our GGML graph)": (our_speed, ("new", args.threads, prompt, n_gen, args.runs)),
            "pollama, new engine, POLLAMA_ROW_KERNELS=0": (our_speed, ("new-ggml", args.threads, prompt, n_gen,
                                                                       args.runs)),
        }
        # rounds interleaved across the runners (a fresh process each), medians over the rounds: a
        # shared machine's load then weighs on every runner alike
        rounds: dict[str, list] = {name: [] for name in jobs}
        for _ in range(args.runs):
            for name, (fn, fn_args) in jobs.items():
                rounds[name].append(isolated(fn, *fn_args[:-1], 1))
        results = {name: (median([r[0] for r in rs]), median([r[1] for r in rs]), rs[-1][2])
                   for name, rs in rounds.items()}
        base_pp, base_tg, _ = results["llama-cpp-python `Llama` class"]
        old_pp, old_tg, _ = results["pollama, old engine (llama.cpp)"]
        print(f"(b) prompt ({len(prompt)} tokens) and decode ({n_gen} tokens) speed, same model and settings\n")
        print("| runner | prompt tok/s | decode tok/s | decode vs `Llama` | decode vs old engine |")
        print("|---|---:|---:|---:|---:|")
        for name, (pp, tg, n) in results.items():
            print(f"| {name} | {pp:.1f} | {tg:.1f} | {tg / base_tg:.2f}× | {tg / old_tg:.2f}× |")
        print()

    if "streams" not in skip:
        print("(c) aggregate decode tok/s, concurrent streams in one runner (num_parallel 4, 96 tokens each)\n")
        print("| engine | 1 stream | 4 streams | 4 / 1 |")
        print("|---|---:|---:|---:|")
        engines = ("old", "old-ggml", "new", "new-ggml")
        rates: dict[tuple[str, int], list[float]] = {(e, n): [] for e in engines for n in (1, 4)}
        for _ in range(args.runs):  # interleaved, as (b)
            for engine in engines:
                for n in (1, 4):
                    rates[(engine, n)].append(isolated(streams, engine, args.threads, n, 96, 1))
        for engine in engines:
            one, four = median(rates[(engine, 1)]), median(rates[(engine, 4)])
            print(f"| {engine} | {one:.1f} | {four:.1f} | {four / one:.2f}× |")
        print()


if __name__ == "__main__":
    main()
