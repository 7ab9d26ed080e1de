"""Draft models: a second, smaller model with the target's vocabulary guesses the next tokens.

:class:`DraftModel` holds the draft model's engine (:class:`runner.loop.engine.Engine`, its own
KV cache with one sequence per target slot) and what each of its KV sequences holds.
:class:`ModelDrafter` is the :class:`~runner.spec.drafter.Drafter` of one target sequence: before
each guess it brings its KV sequence to the target's history (the prompt and the tokens the
target emitted), keeping the longest common prefix and removing the rest (its own rejected
guesses, ``kv.seq_rm``), then decodes greedily one token at a time. The target verifies every
guess (:mod:`runner.spec.verify`), so a draft model changes speed, never output.

A guess stops early where the draft model is unsure (its top probability below :data:`P_MIN`, as
llama.cpp's ``--draft-p-min``) or at an end-of-generation token. A prompt with an image gets no
draft model guesses (the draft model has no projector): such a sequence does not draft.

Everything runs on the loop thread, synchronously, while the target does not decode.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from ..api import InvalidModel
from ..spec.controller import PRIOR
from .engine import Engine

#: a guess stops before a token the draft model gives less than this probability
P_MIN = 0.75


def vocabulary_mismatch(target: Engine, draft: Engine) -> str | None:
    """Why ``draft`` cannot draft for ``target`` (its token ids spell other text, or mean the end
    of generation elsewhere), or None when the two vocabularies are the same."""
    if draft.n_vocab != target.n_vocab:
        return f"{draft.n_vocab} tokens, the model has {target.n_vocab}"
    for token in range(target.n_vocab):
        if draft.piece(token) != target.piece(token) or draft.is_eog(token) != target.is_eog(token):
            return f"token {token} is {draft.piece(token)!r} there, {target.piece(token)!r} in the model"
    return None


class DraftModel:
    """A loaded draft model shared by the target's slots (KV sequence ``i`` drafts for slot ``i``)."""

    def __init__(self, engine: Engine, num_ctx: int, num_batch: int, token_cost: float,
                 p_min: float = P_MIN) -> None:
        """``engine``: the draft model's, loaded with ``num_ctx`` tokens per sequence, as many
        sequences as the target has slots; ``token_cost``: the time it takes to decode one token
        relative to the target's one-row decode (what :class:`runner.spec.controller.Speculation`
        weighs a guess's length with); ``p_min``: a guess stops before a token the draft model
        gives less probability."""
        self.engine = engine
        self.p_min = p_min
        self.num_ctx = num_ctx
        self.num_batch = num_batch
        self.token_cost = token_cost
        self.held: dict[int, list[int]] = {}  # KV sequence -> the tokens at its positions 0..

    @classmethod
    def checked(cls, target: Engine, engine: Engine, num_ctx: int, num_batch: int, token_cost: float,
                name: str) -> DraftModel:
        """A draft model for ``target``; raises InvalidModel (after closing ``engine``) when the
        vocabularies differ."""
        why = vocabulary_mismatch(target, engine)
        if why is not None:
            engine.close()
            raise InvalidModel(f"the draft model {name} has another vocabulary than the model ({why}): "
                               "a draft model must share the model's tokens")
        return cls(engine, num_ctx, num_batch, token_cost)

    def drafter(self, seq_id: int, prompt: Sequence[Any]) -> ModelDrafter | None:
        """The drafter of the target sequence in slot ``seq_id`` with ``prompt`` (its inputs);
        None when the prompt holds an image."""
        if not all(isinstance(t, int) for t in prompt):
            return None
        return ModelDrafter(self, seq_id, [int(t) for t in prompt])

    def close(self) -> None:
        self.engine.close()


class ModelDrafter:
    """A :class:`runner.spec.drafter.Drafter` over a :class:`DraftModel`; see the module's doc."""

    kinds = ("model",)
    kind = "model"
    priors = {"model": PRIOR}

    def __init__(self, model: DraftModel, seq_id: int, prompt: list[int]) -> None:
        self.model, self.seq_id, self.prompt = model, seq_id, prompt
        self._start = 0  # history tokens before this are not in the draft context (a long one)
        self._last: tuple[tuple[int, int], list[int]] | None = None  # (len(generated), limit), guess

    def propose(self, generated: Sequence[int], limit: int) -> list[int]:
        if limit <= 0 or not generated:
            return []
        key = (len(generated), limit)
        if self._last is not None and self._last[0] == key:
            return list(self._last[1])  # asked again before the decode: the same guess
        limit = min(limit, self.model.num_ctx // 4)
        history = self.prompt + [int(t) for t in generated]
        if len(history) - self._start + limit > self.model.num_ctx:
            self._start = len(history) - self.model.num_ctx // 2  # start the context over, half full
        guess = self._guess(history[self._start:], limit)
        self._last = (key, guess)
        return list(guess)

    def _guess(self, context: list[int], limit: int) -> list[int]:
        """Bring the KV sequence to ``context`` (its last token not decoded yet) and decode up to
        ``limit`` tokens after it."""
        model, engine, seq = self.model, self.model.engine, self.seq_id
        held = model.held.get(seq, [])
        keep = 0
        for a, b in zip(held, context[:-1]):
            if a != b:
                break
            keep += 1
        engine.kv.seq_rm(seq, keep, None)
        held = held[:keep]
        model.held[seq] = held
        guess: list[int] = []
        pending = context[keep:]
        while True:
            row = -1
            for at in range(0, len(pending), model.num_batch):
                chunk = pending[at : at + model.num_batch]
                engine.batch_begin()
                row = engine.batch_add(chunk, len(held), seq, 1)
                engine.prepare()
                engine.decode()
                held.extend(chunk)
            token, p = _choice(engine.logits(row))
            if p < model.p_min:
                break
            guess.append(token)
            if len(guess) >= limit or engine.is_eog(token):
                break
            pending = [token]
        return guess


def _choice(logits: np.ndarray) -> tuple[int, float]:
    """The most likely token and its probability."""
    token = int(np.argmax(logits))
    total = float(np.sum(np.exp(logits.astype(np.float64) - float(logits[token]))))
    return token, 1.0 / total if math.isfinite(total) else 0.0
