"""Draft models (issue 26): a second model with the same vocabulary drafts, the target verifies.

On the batch-invariant fake engine (tests/fakeengine.py) the draft model is another fake model
(another salt: the same vocabulary, mostly the same choices), so its guesses are often right and
sometimes wrong: the answers must equal those without drafts in every case of
test_spec_loop.py, inline and pipelined, through context shifts (the draft model's own context
starts over). Real models: SmolLM2 drafting for itself (test_spec_draftmodel_models.py).
"""

from __future__ import annotations

import pytest

from runner.api import InvalidModel
from runner.spec.controller import Speculation, StepCost
from runner.loop.draftmodel import DraftModel, ModelDrafter, vocabulary_mismatch
from tests.fakeengine import FakeEngine
from tests.test_spec_loop import CASES, CODE, EOG, UTF8, once


def drafting(token_cost: float = 0.0, eager: bool = True, num_ctx: int = 256) -> Speculation:
    draft = DraftModel(FakeEngine(num_ctx, salt=1), num_ctx, 64, token_cost, p_min=0.0)
    return Speculation(cost=StepCost(((1, 1.0), (64, 1.0))) if eager else None, draft=draft)


@pytest.mark.parametrize("eager", [True, False], ids=["eager", "default"])
@pytest.mark.parametrize("name,prompt,opts", CASES, ids=[c[0] for c in CASES])
def test_a_draft_model_changes_nothing(name, prompt, opts, eager):
    want = once(Speculation(enabled=False), prompt, **opts)
    got = once(drafting(eager=eager), prompt, **opts)
    assert got[:2] == want[:2]


def test_its_guesses_are_taken_and_refused():
    drafted = accepted = 0
    for _, prompt, opts in CASES:
        m = once(drafting(), prompt, **opts)[2]
        drafted, accepted = drafted + m.draft_n, accepted + m.draft_n_accepted
    assert accepted > 200 and drafted - accepted > 20


@pytest.mark.parametrize("pipeline", [False, True], ids=["inline", "pipelined"])
def test_context_shifts(pipeline):
    for prompt in (CODE[-50:], UTF8[:40]):
        for opts in (dict(num_predict=200), dict(num_predict=150, temperature=0.9, seed=11)):
            want = once(Speculation(enabled=False), prompt, 64, pipeline, **opts)
            got = once(drafting(num_ctx=64), prompt, 64, pipeline, **opts)
            assert got[:2] == want[:2]
            assert got[2].draft_n_accepted > (50 if "seed" not in opts else 0)


def test_the_draft_kv_follows_what_the_target_accepted():
    """After each guess the draft model's KV sequence holds the history and the guess's tokens
    but the last; the next guess keeps what the target accepted and drops the rest."""
    engine = FakeEngine(256, salt=1)
    model = DraftModel(engine, 256, 64, 0.0, p_min=0.0)
    prompt = engine.tokenize(EOG)
    drafter = model.drafter(0, prompt)
    assert isinstance(drafter, ModelDrafter)
    generated = engine.tokenize(" the")
    guess = drafter.propose(generated, 6)
    assert len(guess) == 6
    assert drafter.propose(generated, 6) == guess  # asked again: the same, nothing decoded
    held = prompt + generated + guess[:-1]
    assert model.held[0] == held and sorted(engine.kv.seq(0)) == list(range(len(held)))
    wrong = (guess[2] + 1) % engine.n_vocab or 1
    generated += guess[:2] + [wrong]  # two accepted, then the target's own token
    drafter.propose(generated, 4)
    assert model.held[0][: len(prompt) + len(generated) - 1] == prompt + generated[:-1]
    assert wrong in model.held[0] and sorted(engine.kv.seq(0)) == list(range(len(model.held[0])))


def test_a_token_cost_makes_short_drafts_not_pay():
    """A draft model as slow as the target never pays (every guess doubles the work)."""
    m = once(drafting(token_cost=1.0, eager=False), CODE, num_predict=80)[2]
    assert m.draft_n == 0


def test_no_draft_model_guesses_for_a_prompt_with_an_image():
    from runner.loop.slots import ImageInput

    model = DraftModel(FakeEngine(), 256, 64, 0.0)
    image = ImageInput("ab" * 32, 0, 1)
    assert model.drafter(0, [5, 6, image, 7]) is None
    assert Speculation(draft=model).begin([5, 6, image, 7], 8).depth == 0


def test_another_vocabulary_is_refused():
    class Other(FakeEngine):
        def piece(self, token: int) -> bytes:
            return b"x" if token == 7 else super().piece(token)

    assert vocabulary_mismatch(FakeEngine(), FakeEngine(salt=3)) is None
    assert "token 7" in vocabulary_mismatch(FakeEngine(), Other())
    other = Other()
    with pytest.raises(InvalidModel, match="another vocabulary"):
        DraftModel.checked(FakeEngine(), other, 256, 64, 0.1, "other")
    assert other.closed


def test_the_draft_model_is_closed_with_the_runner():
    from tests.test_spec_loop import Run

    speculation = drafting()
    run = Run(speculation)
    engine = speculation.draft.engine
    run.close()
    assert engine.closed and speculation.draft is None
