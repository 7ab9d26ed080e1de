"""How long rendering a chat prompt takes: SmolLM2's own template (from its GGUF, Jinja) through
``runner.template.prompt.render``, Ollama's ChatML Go template (``chatml.gotmpl``, as a Modelfile TEMPLATE
would carry it) and llama.cpp's built-in ``chatml``, for a short and a long conversation, beside
the time llama.cpp takes to tokenize the same prompt (what every request does next). Prints a
Markdown table; each figure is the median of --runs timings of --reps renders (or tokenizations).

    python bench/bench_template.py [--runs 15] [--reps 200]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import runner  # noqa: E402
from runner import config, store  # noqa: E402
from runner.template import prompt  # noqa: E402
from runner.api import ChatTemplate, Message, Options  # noqa: E402

# Ollama's template/chatml.gotmpl
GO_CHATML = ("{{- range .Messages }}<|im_start|>{{ .Role }}\n{{ .Content }}<|im_end|>\n"
             "{{ end }}<|im_start|>assistant\n")


def conversation(turns: int) -> list[Message]:
    messages = [Message("system", "You are a helpful assistant who answers briefly.")]
    for k in range(turns):
        messages.append(Message("user", f"Question number {k}: what is {k} times {k + 1}? Explain the steps."))
        messages.append(Message("assistant", f"{k} times {k + 1} is {k * (k + 1)}. Multiply, then check."))
    messages.append(Message("user", "Thanks, one more: what is 12 times 13?"))
    return messages


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--reps", type=int, default=200)
    args = ap.parse_args()
    info = runner.model_info(store.lookup(None, config.load()))
    template = info.chat_template
    assert template, "the default model has no chat template"
    kinds = {"render": ChatTemplate("jinja", template, "GGUF"), "go": ChatTemplate("go", GO_CHATML, "Modelfile"),
             "builtin": ChatTemplate("builtin", "chatml", "llama.cpp")}
    cases = {"3 messages": conversation(1)[:3], "41 messages": conversation(20)}
    cfg = config.load()
    r = runner.load(runner.resolve(None, cfg), Options(num_thread=1), cfg)
    texts = {name: prompt.render(kinds["render"], messages) for name, messages in cases.items()}
    for name, messages in cases.items():  # the three give one prompt (parsed once: cached)
        assert prompt.render(kinds["go"], messages) == prompt.render(kinds["builtin"], messages) == texts[name]
    timings: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.runs):  # interleaved
        for name, messages in cases.items():
            for kind, chosen in kinds.items():
                t0 = time.perf_counter()
                for _ in range(args.reps):
                    prompt.render(chosen, messages, bos_token="<|im_start|>", eos_token="<|im_end|>")
                timings.setdefault((name, kind), []).append((time.perf_counter() - t0) / args.reps)
            t0 = time.perf_counter()
            for _ in range(args.reps):
                r.tokenize(texts[name])
            timings.setdefault((name, "tokenize"), []).append((time.perf_counter() - t0) / args.reps)
    r.close()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, CPython {platform.python_version()}; "
          f"template of {info.name}; median of {args.runs} runs of {args.reps} renders; "
          f"load average {os.getloadavg()[0]:.2f}")
    print()
    print("| conversation | Jinja, the GGUF's (µs) | Go, chatml.gotmpl (µs) | llama.cpp built-in chatml (µs) "
          "| tokenize, old engine (µs) |")
    print("|---|---:|---:|---:|---:|")
    for name in cases:
        jinja, go, builtin, tokenize = (statistics.median(timings[name, k])
                                        for k in ("render", "go", "builtin", "tokenize"))
        print(f"| {name} | {1e6 * jinja:.1f} | {1e6 * go:.1f} | {1e6 * builtin:.1f} | {1e6 * tokenize:.1f} |")


if __name__ == "__main__":
    main()
