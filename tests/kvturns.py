"""What the prompt store's tests do to a model: evaluate tokens on an engine, continue greedily,
and run a greedy chat turn on a runner (tests/test_kvstore_*.py)."""

from __future__ import annotations

import numpy as np

from runner.api import Options, Request

NUM_BATCH = 64  # tokens per decode when a test evaluates a prompt on an engine


def evaluate(engine, tokens: list[int], pos: int, seq: int) -> np.ndarray:
    """Decode ``tokens`` into ``seq`` from ``pos``, ``NUM_BATCH`` a batch; the last token's logits."""
    row = -1
    for i in range(0, len(tokens), NUM_BATCH):
        engine.batch_begin()
        row = engine.batch_add(tokens[i : i + NUM_BATCH], pos + i, seq)
        engine.prepare()
        engine.decode()
    return engine.logits(row).copy()


def greedy(engine, logits: np.ndarray, pos: int, seq: int, steps: int) -> tuple[list[int], list[np.ndarray]]:
    """``steps`` greedy tokens after ``logits``, each fed back at ``pos``, ``pos + 1``, ...; the
    tokens and the logits each of them produced."""
    tokens, rows = [], []
    for k in range(steps):
        token = int(np.argmax(logits))
        logits = evaluate(engine, [token], pos + k, seq)
        tokens.append(token)
        rows.append(logits)
    return tokens, rows


def turn(r, messages, num_predict: int = 12):
    """(text, metrics, logprobs) of a greedy chat turn on runner ``r``; logprobs as plain tuples
    (token, logprob, top 4), so two turns compare bit for bit."""
    options = Options().merged(dict(temperature=0.0, repeat_penalty=1.0, num_predict=num_predict))
    request = Request(messages=messages, options=options, logprobs=True, top_logprobs=4)
    text, logprobs, final = [], [], None
    for chunk in r.stream(request):
        text.append(chunk.text)
        logprobs.extend(chunk.logprobs or [])
        if chunk.done:
            final = chunk
    return "".join(text), final.metrics, [(lp.token, lp.logprob, [(t.token, t.logprob) for t in lp.top_logprobs])
                                          for lp in logprobs]
