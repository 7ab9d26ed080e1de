"""How often the default model (SmolLM2-135M) writes a well-formed tool call, with and without
pollama's grammar. SmolLM2's own template has no tools, so it is given Qwen2.5's tool template
(tests/data/templates/qwen2.5.jinja) as the request's template. Fifty fixed prompts, each asking
for one of five tools, greedy decoding; three ways to run each:

- parse only (Ollama's way): tools in the prompt, the reply parsed, nothing constrained;
- auto (pollama's default): the same, but a call the model starts, anywhere in its answer, is
  constrained from its tag on (lazy grammar);
- required: the whole answer constrained to a call of one of the tools (``tool_choice``).

A call is well formed when it parses, names one of the tools, and its arguments have the
tool's required keys with the schema's types; a reply with no ``<tool_call>`` tag is a text
answer; anything else is a broken call (malformed, or cut off by ``--num-predict``). Prints a
Markdown table; each reply's start goes to stderr.

With ``--shots`` each conversation starts with two earlier exchanges in which the assistant
says a sentence, then calls a tool (weather, then add) and answers from the result: SmolLM2 then
writes text before its calls, which is where the lazy grammar of *auto* has to start mid-answer.

    python bench/bench_tools.py [--engine old|new] [--prompts 50] [--shots]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Message, Options, Request, Tool, ToolChoice  # noqa: E402
from runner.template.prompt import request_template  # noqa: E402


def _obj(props: dict, required: list[str]) -> dict:
    return {"type": "object", "properties": props, "required": required}


TOOLS = [
    Tool("get_weather", "Get the current weather in a city",
         _obj({"city": {"type": "string"}}, ["city"])),
    Tool("add", "Add two numbers", _obj({"a": {"type": "number"}, "b": {"type": "number"}}, ["a", "b"])),
    Tool("search_web", "Search the web", _obj({"query": {"type": "string"}}, ["query"])),
    Tool("send_email", "Send an email",
         _obj({"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}}, ["to", "subject"])),
    Tool("convert_currency", "Convert an amount of money",
         _obj({"amount": {"type": "number"}, "from": {"type": "string"}, "to": {"type": "string"}},
              ["amount", "from", "to"])),
]

CITIES = ["Paris", "Tokyo", "London", "Berlin", "Madrid", "Rome", "Cairo", "Lima", "Oslo", "Seoul"]
PROMPTS = (
    [f"What is the weather in {c}?" for c in CITIES]
    + [f"What is {a} plus {b}?" for a, b in [(2, 3), (17, 25), (100, 1), (7, 8), (42, 58), (3.5, 1.5), (9, 10),
                                             (123, 456), (0, 5), (11, 11)]]
    + [f"Search the web for {q}." for q in ["python tutorials", "the tallest mountain", "cheap flights to Rome",
                                            "news about AI", "how to bake bread", "the best laptop",
                                            "jazz concerts tonight", "the population of Peru", "electric cars",
                                            "chess openings"]]
    + [f"Send an email to {who} about {what}." for who, what in [
        ("bob@example.com", "the meeting"), ("alice@example.com", "lunch"), ("team@example.com", "the release"),
        ("mom@example.com", "Sunday dinner"), ("hr@example.com", "my vacation"), ("joe@example.com", "the invoice"),
        ("ann@example.com", "the party"), ("dev@example.com", "the bug"), ("boss@example.com", "my report"),
        ("sam@example.com", "the tickets")]]
    + [f"Convert {n} {a} to {b}." for n, a, b in [(100, "USD", "EUR"), (50, "EUR", "GBP"), (1000, "JPY", "USD"),
                                                (20, "GBP", "USD"), (75, "CHF", "EUR"), (10, "USD", "JPY"),
                                                (300, "CAD", "USD"), (5, "EUR", "USD"), (42, "AUD", "NZD"),
                                                (900, "SEK", "NOK")]]
)

SHOTS = [
    Message("user", "What is the weather in Rome?"),
    Message("assistant", 'Sure, let me check the weather in Rome.\n<tool_call>\n{"name": "get_weather", '
                         '"arguments": {"city": "Rome"}}\n</tool_call>'),
    Message("tool", "20 degrees", tool_name="get_weather"),
    Message("assistant", "It is 20 degrees in Rome."),
    Message("user", "What is 2 plus 2?"),
    Message("assistant", 'Sure, let me add them.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}'
                         "\n</tool_call>"),
    Message("tool", "4", tool_name="add"),
    Message("assistant", "2 plus 2 is 4."),
]

_TYPES = {"string": str, "number": (int, float), "integer": int, "boolean": bool}


def well_formed(calls, text: str) -> bool:
    if len(calls) != 1:
        return False
    tool = next((t for t in TOOLS if t.name == calls[0].name), None)
    if tool is None:
        return False
    args = calls[0].arguments
    props = tool.parameters["properties"]
    if any(key not in args for key in tool.parameters["required"]):
        return False
    return all(key in props and isinstance(value, _TYPES[props[key]["type"]]) and not isinstance(value, bool)
               for key, value in args.items())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", choices=["old", "new"], default="old")
    ap.add_argument("--prompts", type=int, default=len(PROMPTS))
    ap.add_argument("--num-predict", type=int, default=60)
    ap.add_argument("--shots", action="store_true", help="start each chat with two exchanges that call tools")
    ap.add_argument("--threads", type=int, default=1,
                    help="GGML threads (1: an oversubscribed machine slows two threads down far more)")
    args = ap.parse_args()
    template = (ROOT / "tests" / "data" / "templates" / "qwen2.5.jinja").read_text()
    cfg = dataclasses.replace(config.load(), new_engine=args.engine == "new")
    r = runner.load(runner.resolve(None, cfg), Options(num_ctx=2048, num_thread=args.threads), cfg)
    modes = [("parse only (Ollama)", ToolChoice(), False), ("auto, lazy grammar", ToolChoice(), True),
             ("required, grammar", ToolChoice("required"), True)]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; model {Path(r.info.path).name}, "
          f"{args.engine} engine; Qwen2.5 tool template; {args.prompts} prompts"
          f"{' after two tool-calling exchanges' if args.shots else ''}, greedy, "
          f"num_predict {args.num_predict}; load average {os.getloadavg()[0]:.2f}\n")
    print("| mode | well-formed calls | text answers | broken calls | tokens/reply |")
    print("|---|---:|---:|---:|---:|")
    try:
        for label, choice, grammar in modes:
            good = text_only = broken = tokens = 0
            for prompt in PROMPTS[: args.prompts]:
                history = SHOTS if args.shots else []
                req = Request(messages=[*history, Message("user", prompt)], chat_template=request_template(template), tools=TOOLS, tool_choice=choice,
                              tool_grammar=grammar, options=Options(temperature=0, num_predict=args.num_predict))
                calls, texts = [], []
                for chunk in r.stream(req):
                    calls.extend(chunk.tool_calls or [])
                    texts.append(chunk.text)
                    if chunk.done:
                        tokens += chunk.metrics.eval_count
                text = "".join(texts)
                print(f"  {label}: {prompt!r}: {len(calls)} call(s), {text[:40]!r}", file=sys.stderr, flush=True)
                if well_formed(calls, text):
                    good += 1
                elif not calls and "<tool_call>" not in text:
                    text_only += 1  # no call attempted
                else:
                    broken += 1
            n = args.prompts
            print(f"| {label} | {good}/{n} ({100 * good / n:.0f}%) | {text_only} | {broken} | {tokens / n:.1f} |",
                  flush=True)
    finally:
        r.close()


if __name__ == "__main__":
    main()
