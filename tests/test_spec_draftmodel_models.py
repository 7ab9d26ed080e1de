"""Draft models on real engines (issue 26): SmolLM2 drafting for itself gives the answer it gives
alone, token for token, on both engines; a draft model with another vocabulary is refused at load.

SmolLM2 as its own draft model agrees with itself almost always (but where a batch of several rows
rounds otherwise than one row, notes §C), so this checks the wiring: the second engine's KV
sequence kept in step with what the target accepted, its rollback, the verification. Whether a
draft model pays is bench/bench_draft_model.py's question (on this CPU: README).
"""

from __future__ import annotations

import pytest

from runner.api import InvalidModel, Message, Options, Request
from runner.spec.controller import StepCost
from tests.conftest import SMOLLM2, STORIES, load
from tests.test_spec_models import UTF8


def answer(r, prompt: str, depth: int):
    request = Request(messages=[Message("user", prompt)], cache_prompt=False,
                      options=Options().merged(dict(temperature=0.0, repeat_penalty=1.0, num_predict=60,
                                                    draft_num_predict=depth)))
    chunks = list(r.stream(request))
    return [(c.text, c.context) for c in chunks], chunks[-1].metrics


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["old", "new"])
def test_smollm2_drafting_for_itself(engine):
    r = load(SMOLLM2, engine, num_ctx=1024, draft=str(SMOLLM2))
    try:
        draft = r.speculation.draft
        assert draft is not None and draft.engine.name == engine and draft.token_cost == 1.0
        for prompt in (UTF8,):
            want, _ = answer(r, prompt, 0)
            got, m = answer(r, prompt, 8)
            assert got == want and m.draft_n == 0  # as slow as the model: never pays, never drafts
            r.speculation.cost, draft.token_cost = StepCost(((1, 1.0), (64, 1.0))), 0.0  # make it pay
            got, m = answer(r, prompt, 8)
            r.speculation.cost, draft.token_cost = StepCost(), 1.0
            assert got == want
            assert m.draft_n_accepted > 40 and m.draft_n_accepted >= 0.9 * m.draft_n
    finally:
        r.close()
    assert r.speculation.draft is None  # closed with the runner


def test_a_draft_model_with_another_vocabulary_is_refused():
    with pytest.raises(InvalidModel, match="another vocabulary.*512 tokens, the model has 49152"):
        load(SMOLLM2, "old", num_ctx=256, draft=str(STORIES))


def test_no_draft_model_while_speculation_is_off():
    import dataclasses

    import runner
    from runner import config

    cfg = dataclasses.replace(config.load({}), speculative=False)
    info = runner.resolve(str(SMOLLM2), cfg).info
    assert runner.load_options(info, Options().merged({"draft": str(STORIES)}), cfg).draft == ""
    on = dataclasses.replace(cfg, speculative=True)
    assert runner.load_options(info, Options().merged({"draft": str(STORIES)}), on).draft == str(STORIES.resolve())


def test_modelfile_draft_is_stored_shown_and_loaded(tmp_path):
    """``DRAFT`` (a local .gguf, or a store model) becomes the model's ``draft`` layer (Ollama's
    media type), ``show --modelfile`` prints it, and a load takes it as the draft model; the
    ``draft`` option names another."""
    import shutil

    import runner
    from cli.store_cmds import spec_from_modelfile
    from runner import config, store
    from runner.store.create import create
    from runner.store.layout import Layout
    from runner.store.modelfile import show

    cfg = config.load()  # the test's own HOME and OLLAMA_MODELS
    shutil.copy(STORIES, tmp_path / "little.gguf")
    (tmp_path / "Modelfile").write_text(f"FROM {STORIES}\nDRAFT ./little.gguf\nPARAMETER draft_num_predict 8\n")
    list(create(cfg, spec_from_modelfile("drafted", tmp_path / "Modelfile")))
    stored = store.lookup("drafted", cfg)
    assert any(layer["mediaType"] == "application/vnd.ollama.image.draft" for layer in stored.manifest["layers"])
    assert f"DRAFT {stored.layers['draft']}" in show(Layout(cfg.models), stored, "").modelfile
    info = runner.resolve("drafted", cfg).info
    assert info.draft == str(stored.layers["draft"])
    assert runner.load_options(info, Options(), cfg).draft == info.draft
    # DRAFT naming a store model shares its GGUF blob; the option names one for a load
    (tmp_path / "Modelfile2").write_text(f"FROM {STORIES}\nDRAFT drafted\n")
    list(create(cfg, spec_from_modelfile("drafted2", tmp_path / "Modelfile2")))
    assert store.lookup("drafted2", cfg).layers["draft"] == stored.path
    plain = runner.resolve(str(STORIES), cfg).info
    assert runner.load_options(plain, Options().merged({"draft": "drafted"}), cfg).draft == str(stored.path)
    r = runner.load(runner.resolve("drafted", cfg), Options().merged({"num_ctx": 128}), cfg)
    try:
        assert r.speculation.draft is not None
        out = list(r.stream(Request(prompt="Once upon a time", options=Options().merged(
            {"num_predict": 8, "temperature": 0, "draft_num_predict": 8}))))
        assert out[-1].done
    finally:
        r.close()
