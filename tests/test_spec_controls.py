"""The controls and metrics of speculative decoding (issue 26): POLLAMA_SPECULATIVE, the
``draft_num_predict`` option (request, Modelfile PARAMETER, ``-o``), ``--verbose``'s draft line,
and ``/v1`` ``timings``' draft counts."""

from __future__ import annotations

import dataclasses

import pytest

import runner
from cli.render import metrics_block
from runner import config
from runner.api import Chunk, InvalidRequest, Metrics, Options
from runner.ml import kernels
from runner.server.openai_api import timings
from runner.spec.controller import MAX_DRAFT, Speculation, StepCost
from runner.store.modelfile import parse
from tests.conftest import SMOLLM2, STORIES, TINYSTORIES
from tests.ggufcopy import with_file_type


@pytest.mark.parametrize("value,on", [("", True), ("on", True), ("1", True), ("off", False), ("OFF", False),
                                      ("0", False), ("false", False), ("no", False)])
def test_pollama_speculative(value, on):
    assert config.load({"POLLAMA_SPECULATIVE": value}).speculative is on


@pytest.mark.parametrize("value,on", [("", True), ("1", True), ("on", True), ("0", False), ("off", False),
                                      ("no", False)])
def test_pollama_ngram_pool(value, on):
    """The shared pool is on unless turned off: a guessed row's numbers are a lone row's, so the
    requests before, whose text the pool guesses from, change the speed of an answer, not its text
    (test_spec_models.py::test_a_repeated_request_is_drafted_from_the_first_answer)."""
    assert config.load({"POLLAMA_NGRAM_POOL": value}).ngram_pool is on
    spec = Speculation(pool=on)
    kinds = spec.begin([1, 2, 3], depth=16).drafter.kinds
    assert ("pool" in kinds) is on and (spec.pool is not None) is on


@pytest.mark.parametrize("value,on", [("", False), ("1", True), ("0", False)])
def test_pollama_batch_invariant(value, on):
    cfg = config.load({"POLLAMA_BATCH_INVARIANT": value})
    assert cfg.batch_invariant is on


@pytest.mark.parametrize("model,engine,invariant,row_kernels,table", [
    (TINYSTORIES, "old", False, True, "batched"),  # Q8_0: llamafile's tiles take several rows at once
    (TINYSTORIES, "new", False, True, "batched"),
    (TINYSTORIES, "new", True, True, "per-row"),  # the batch-invariant mode takes each row alone
    (STORIES, "new", False, True, "per-row"),  # no general.file_type: the dearer table
    (SMOLLM2, "old", False, True, "tiled"),  # Q4_1: our kernels in llama.cpp's graph
    (SMOLLM2, "old", False, False, "per-row"),  # POLLAMA_ROW_KERNELS=0: llama.cpp's one-row dot products
    (SMOLLM2, "new", False, True, "tiled"),  # Q4_1: our kernels, 4 rows by 4
    (SMOLLM2, "new", True, True, "tiled"),  # ... which give a row's numbers in any batch
    (SMOLLM2, "new", False, False, "per-row"),  # POLLAMA_ROW_KERNELS=0
])
def test_a_runner_costs_drafted_rows_by_how_its_weights_are_multiplied(model, engine, invariant, row_kernels, table):
    """bench/bench_rows.py: the rows of a step cost what the model's weight type's kernels make
    them cost, whatever the architecture (SmolLM2 requantized to Q4_K_M costs as gemma3 does)."""
    cfg = dataclasses.replace(config.load({}), new_engine=engine == "new", batch_invariant=invariant,
                              row_kernels=row_kernels, cache_ram=0, cache_disk=0)
    r = runner.load(runner.resolve(str(model), cfg), Options().merged({"num_ctx": 256}), cfg)
    try:
        assert r.engine == engine
        assert r.speculation.cost.name == table
    finally:
        r.close()


@pytest.mark.parametrize("engine,invariant,table", [("old", False, "lone"), ("new", False, "lone"),
                                                    ("new", True, "per-row")])
def test_a_q4_k_m_model_costs_its_drafted_rows_as_lone_rows(engine, invariant, table, tmp_path):
    """Both engines compute a verified draft's Q5_0, Q4_K, Q6_K, ... products as lone rows'
    (runner/ml/ggml/lone_rows.py): a Q4_K_M model's drafts are costed by that table (the
    batch-invariant mode: every row alone, the dearest)."""
    path = with_file_type(TINYSTORIES, tmp_path / "m.gguf", 15)  # its Q8_0 weights, called Q4_K_M
    cfg = dataclasses.replace(config.load({"POLLAMA_BATCH_INVARIANT": "1" if invariant else ""}),
                              new_engine=engine == "new", cache_ram=0, cache_disk=0)
    r = runner.load(runner.resolve(str(path), cfg), Options().merged({"num_ctx": 256}), cfg)
    try:
        assert r.engine == engine and r.speculation.cost.name == table
    finally:
        r.close()


@pytest.mark.parametrize("file_type,name,table", [(30, "IQ4_XS", "per-row"), (15, "Q4_K_M", "batched"),
                                                   (99, "unknown", "per-row")])
def test_the_file_type_names_the_quantization_and_picks_the_table(file_type, name, table, tmp_path):
    """``general.file_type`` is what ``pollama show`` calls the quantization, and what picks the
    cost table (IQ4_XS is tiled only from 8 rows, one dot product a row below: the dearer table)."""
    path = with_file_type(TINYSTORIES, tmp_path / "m.gguf", file_type)
    cfg = dataclasses.replace(config.load({}), cache_ram=0, cache_disk=0)
    model = runner.resolve(str(path), cfg)
    assert model.info.quantization == name
    assert StepCost.of(model.info.quantization, kernels.multiplies(ggml_batched=True, tiled=False)).name == table


def test_draft_num_predict_is_an_option():
    assert Options().draft_num_predict == MAX_DRAFT == 62  # on, as deep as the runner allows (bench/bench_spec.py)
    assert Options().merged({"draft_num_predict": 0}).draft_num_predict == 0
    assert Options().merged({"draft_num_predict": "4"}).draft_num_predict == 4  # -o draft_num_predict=4
    with pytest.raises(InvalidRequest):
        Options().merged({"draft_num_predict": 1.5})
    assert parse("FROM x\nPARAMETER draft_num_predict 8\n").parameters == {"draft_num_predict": 8}


def test_verbose_prints_drafts_when_there_were_some():
    m = Metrics(eval_count=40, eval_duration=10**9, draft_n=30, draft_n_accepted=24)
    assert "draft tokens:         24/30" in metrics_block(m, "old")
    assert "draft tokens" not in metrics_block(Metrics(eval_count=40, eval_duration=10**9), "old")


def test_v1_timings_carry_the_draft_counts_as_llama_server_does():
    done = Chunk(done=True, metrics=Metrics(eval_count=40, eval_duration=10**9, draft_n=30, draft_n_accepted=24))
    t = timings(done)
    assert (t["draft_n"], t["draft_n_accepted"]) == (30, 24)
    assert "draft_n" not in timings(Chunk(done=True, metrics=Metrics(eval_count=4, eval_duration=10**6)))


def test_draft_is_an_option_naming_a_model():
    assert Options().draft == ""
    assert Options().merged({"draft": "smollm2:135m"}).draft == "smollm2:135m"  # -o draft=smollm2:135m
    with pytest.raises(InvalidRequest):
        Options().merged({"draft": 3})
