"""The draft controller replayed over recorded answers: what its decisions would gain, costed by
measured step costs, free of the noise of texts that part (issue 26).

    python bench/bench_spec_replay.py [--models smollm2,smollm2-q4_k_m,smollm2-q8_0,gemma3]
                                      [--penalties 1,1.1] [--rounds 4] [--tables per-row,batched]
                                      [--priors 0.85,0.9]

bench_spec.py measures real decoding, but its drafted answers part from the undrafted ones at
near-ties (batched rows round differently), so two controllers compared there are compared on
different texts, and one that drafts deeper may win or lose by the text it happened to get. Here
each model answers bench_spec.py's four tasks and five more (greedy, no drafts, 300 tokens, new
engine) once; then :class:`runner.spec.controller.Speculation` is run over each answer as the
runner runs it (propose after each emitted token, verify against the recorded continuation, the
accepted tokens plus the target's own emitted), once per cost table the controller could hold
(``--tables``: the names in ``ROW_COSTS``) and each acceptance prior (``--priors``: what a kind of
guess is assumed to score before its first draft: a number for every kind, or ``drafter``, each
kind where prompt lookup starts it, :data:`runner.spec.ngram.PRIORS`), and every step is costed by the model's own step costs
measured by bench_rows.py (new engine, every size from 1 to 33 rows). Printed per model and
repeat penalty: each task's speed-up (undrafted steps over drafted cost) and accepted/proposed
tokens, their geometric mean and minimum, per table and prior; ``*`` marks what the runner picks
for the model (:meth:`runner.spec.controller.StepCost.of`, the drafter's priors).

The replay assumes a verified row gives the token the undrafted decode gave (true bit for bit in
``POLLAMA_BATCH_INVARIANT`` mode, and up to near-ties otherwise) and a fixed cost per step size
(the Python around a step is in the measured cost; a draft's lookup, ~µs, is not).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from runner.spec.controller import ROW_COSTS, Speculation, StepCost  # noqa: E402

import bench_decode  # noqa: E402
import bench_rows  # noqa: E402
import bench_spec  # noqa: E402

MORE_TASKS = {
    "haiku": "Write a haiku about autumn rain.",
    "email": "Write a short email to a colleague asking to move our meeting from Tuesday to Thursday.",
    "list": "List ten fruits and one fact about each.",
    "summary": "Summarize this document in three sentences.\n\n" + bench_spec.DOCUMENT,
    "fix": "Find the bug in this code and output the corrected code.\n\n```python\n"
           + bench_spec.CODE.replace("+=", "-=", 1) + "```",
}
TOKENS = 300
DEPTH = 32


@dataclasses.dataclass
class Answer:
    task: str
    prompt: list[int]
    tokens: list[int]


def record(model: str, penalty: float) -> list[Answer]:
    """The model's greedy answers to every task, without drafts, as token ids."""
    bench_spec.PENALTY["repeat_penalty"] = penalty
    r = bench_spec.load_runner(model, "new", 2, 1)
    try:
        answers = []
        for task, text in {**bench_spec.TASKS, **MORE_TASKS}.items():
            prompt = bench_spec.chat_prompt(model, text)
            gen = bench_spec.generate(r, prompt, TOKENS, 0)
            answers.append(Answer(task, r.tokenize(prompt, True, True), r.tokenize(gen.text, False, False)))
        return answers
    finally:
        r.close()


def replay(answer: Answer, table: StepCost, prior: float | None, cost: StepCost) -> tuple[float, int, int]:
    """(speed-up, accepted, proposed) of the controller with ``table`` and ``prior`` over ``answer``."""
    spec = Speculation(cost=table, prior=prior)
    seq = spec.begin(answer.prompt, DEPTH)
    truth = answer.tokens
    emitted = truth[:1]  # the prompt's decode samples the first token
    spent, accepted, proposed = 0.0, 0, 0
    while len(emitted) < len(truth):
        guess = spec.propose(seq, emitted, limit=min(DEPTH, len(truth) - len(emitted) - 1), others=0)
        right = 0
        while right < len(guess) and guess[right] == truth[len(emitted) + right]:
            right += 1
        spent += cost(1 + len(guess))
        if guess:
            spec.verified(seq, len(emitted), len(guess), right)
        accepted, proposed = accepted + right, proposed + len(guess)
        emitted = truth[:len(emitted) + right + 1]
    return ((len(truth) - 1) * cost(1) / spent if spent else 1.0), accepted, proposed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,smollm2-q4_k_m,smollm2-q8_0,gemma3",
                    help="comma list of: " + ",".join(bench_decode.MODELS))
    ap.add_argument("--penalties", default="1,1.1",
                    help="repeat penalties to record with (1: pollama's and Ollama's default; 1.1: Ollama's before v0.33)")
    ap.add_argument("--rounds", type=int, default=4, help="rounds of bench_rows.py's measure (default 4)")
    ap.add_argument("--tables", default=",".join(ROW_COSTS))
    ap.add_argument("--priors", default="drafter",
                    help="acceptance priors to compare: numbers, every kind starting there, or 'drafter', each kind "
                         "where prompt lookup starts it (runner.spec.ngram.PRIORS, pollama's; the default)")
    args = ap.parse_args()
    tables = args.tables.split(",")
    priors = [None if p == "drafter" else float(p) for p in args.priors.split(",")]
    print(f"machine: {bench_decode.machine()}; 2 threads; greedy answers of {TOKENS} tokens at most, new engine; "
          f"draft_num_predict {DEPTH}; step costs measured after a 400-token prompt, median of {args.rounds} "
          "rounds; load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()))
    print(f"pollama: {bench_decode.git_head(HERE.parent)}")
    for model in args.models.split(","):
        label, path = bench_decode.MODELS[model][0], bench_decode.MODELS[model][1]()
        info, its_table, t = bench_rows.measure(path, "new", list(range(1, 34)), args.rounds, 400, 2)
        cost = StepCost(tuple((n, t[n] / t[1]) for n in t), name="measured")  # linear between the sizes
        picked = its_table.name
        for penalty in map(float, args.penalties.split(",")):
            answers = record(model, penalty)
            print(f"\n### {label}, repeat penalty {penalty:g} (16 rows cost {cost(16):.2f}, 32 rows {cost(32):.2f} "
                  f"single ones; load average {os.getloadavg()[0]:.2f})\n")
            print("| table, prior | " + " | ".join(f"{a.task} ({len(a.tokens)})" for a in answers)
                  + " | geomean | min |")
            print("|---|" + "---:|" * (len(answers) + 2))
            for name in tables:
                table = StepCost(*ROW_COSTS[name], name)
                for prior in priors:
                    runs = [replay(a, table, prior, cost) for a in answers]
                    gains = [g for g, _, _ in runs]
                    mark = " *" if name == picked and prior is None else ""
                    called = "drafter's" if prior is None else f"{prior:g}"
                    print(f"| {name}, {called}{mark} | " + " | ".join(f"{g:.2f}× ({a}/{p})" for g, a, p in runs)
                          + f" | {statistics.geometric_mean(gains):.3f}× | {min(gains):.2f}× |")


if __name__ == "__main__":
    main()
