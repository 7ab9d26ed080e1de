"""Does a draft model pay on this CPU? Prints a Markdown table.

SmolLM2-135M is the only model at hand with a same-vocabulary partner, itself: as its own draft
model it agrees with itself on almost every token, the best acceptance a draft model can have,
at a cost per guessed token equal to a target decode. Three ways, greedy, on a grounded prompt
(rewrite a short code file with one rename) and an open-ended one, per engine:

- none: no speculation (``draft_num_predict`` 0);
- lookup: prompt lookup (``draft_num_predict`` 8, the default controller);
- draft model: SmolLM2 drafting for itself (``draft_num_predict`` 8), the controller made to
  draft at every step (left alone, it never drafts with a draft model this slow).

    nice python bench/bench_draft_model.py [--tokens 100] [--engines old,new]
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Message, Options, Request  # noqa: E402
from runner.spec.controller import StepCost  # noqa: E402
from runner.store import default_model_path  # noqa: E402

CODE = "".join(f"def f{i}(x, y):\n    total = x + y * {i}\n    return total\n\n" for i in range(6))
PROMPTS = {"rewrite": "Rewrite this code, renaming total to result. Output only the code.\n\n" + CODE,
           "story": "Write a story about a lighthouse keeper."}


def run(r, prompt: str, depth: int, tokens: int):
    request = Request(messages=[Message("user", prompt)], cache_prompt=False, options=Options().merged(
        dict(temperature=0.0, repeat_penalty=1.0, num_predict=tokens, draft_num_predict=depth)))
    chunks = list(r.stream(request))
    m = chunks[-1].metrics
    return "".join(c.text for c in chunks), m.eval_count / (m.eval_duration / 1e9), m.draft_n, m.draft_n_accepted


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--engines", default="old,new")
    args = ap.parse_args()
    model = str(default_model_path())
    print("| engine | prompt | way | decode tok/s | vs none | accepted/drafted | same text |")
    print("|---|---|---|---|---|---|---|")
    for engine in args.engines.split(","):
        cfg = dataclasses.replace(config.load({}), new_engine=engine == "new", cache_ram=0, cache_disk=0)
        resolved = runner.resolve(model, cfg)
        plain = runner.load(resolved, Options().merged({"num_ctx": 1024}), cfg)
        drafted = runner.load(resolved, Options().merged({"num_ctx": 1024, "draft": model}), cfg)
        drafted.speculation.cost, drafted.speculation.draft.token_cost = StepCost(((1, 1.0), (64, 1.0))), 0.0
        try:
            for name, prompt in PROMPTS.items():
                run(plain, prompt, 0, 8)  # warm up
                base, base_rate, _, _ = run(plain, prompt, 0, args.tokens)
                rows = [("none", base, base_rate, 0, 0), ("lookup", *run(plain, prompt, 8, args.tokens)),
                        ("draft model", *run(drafted, prompt, 8, args.tokens))]
                for way, text, rate, n, accepted in rows:
                    print(f"| {engine} | {name} | {way} | {rate:.1f} | {rate / base_rate:.2f}x | {accepted}/{n} "
                          f"| {'yes' if text == base else 'NO'} |", flush=True)
        finally:
            plain.close()
            drafted.close()


if __name__ == "__main__":
    main()
