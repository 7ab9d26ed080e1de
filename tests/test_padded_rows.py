"""Activation rows padded to whole tiles for llamafile's quantized tiles (runner/ml/ggml/backend.py,
``_pads``): a step of 4k + 1..3 rows is multiplied as 4k + 4, so that the rows left over do not
cost another pass over the weights (bench/bench_rows.py: SmolLM2's 5-row step read its 30 MB
output matrix twice). The padding must change no number: every logit of every row is the same
bits with the rows padded as without. That those are also llama.cpp's numbers: test_ggml_models.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from runner.ml.backend import BackendOptions
from runner.ml.ggml import backend
from runner.model.models import Batch
from runner.model.models import load as load_model
from tests.conftest import SMOLLM2
from tests.test_spec_models import gemma3_path  # noqa: F401  (the fixture)

PADS = backend._pads


def _logits(path: Path, pad: bool, sizes: list[int], decode: bool, monkeypatch) -> tuple[list[np.ndarray], int]:
    """A model's logits for steps of each of ``sizes`` rows after a 300-token prompt (every row's
    logits), each rolled back after; and how many products were padded."""
    padded = []

    def counting(w, b):
        yes = PADS(w, b) and pad
        padded.append(yes)
        return yes

    monkeypatch.setattr(backend, "_pads", counting)
    rng = np.random.default_rng(5)
    prompt = [int(t) for t in rng.integers(100, 20000, 300)]
    model = load_model(path, BackendOptions(num_threads=2))
    try:
        model.init_cache(num_ctx=1024, num_parallel=1, num_batch=512)
        model.compute(Batch.sequence(prompt))
        out = []
        for n in sizes:
            step = [int(t) for t in rng.integers(100, 20000, n)]
            out.append(model.compute(Batch.sequence(step, start=300, all_logits=True, decode=decode)).copy())
            model.cache.remove(0, 300, None)
        return out, sum(padded)
    finally:
        model.close()


def test_smollm2_s_drafted_steps_are_the_same_bits_padded(monkeypatch):
    """SmolLM2-135M: its output matrix (the tied Q8_0 embeddings) is llamafile's; steps of 5, 6,
    7, 9 and 17 decoded rows pad it (one product each), and no logit moves; 4 and 8 rows need no
    padding."""
    ours, n_padded = _logits(SMOLLM2, True, [5, 6, 7, 9, 17, 4, 8], True, monkeypatch)
    plain, none = _logits(SMOLLM2, False, [5, 6, 7, 9, 17, 4, 8], True, monkeypatch)
    assert n_padded == 5 and none == 0
    for a, b in zip(ours, plain):
        assert np.array_equal(a, b)


@pytest.mark.slow
def test_gemma3_s_steps_and_prompt_rows_are_the_same_bits_padded(gemma3_path, monkeypatch):  # noqa: F811
    """gemma-3-270m Q4_K_M: its Q5_0 and Q8_0 matrices are llamafile's (its Q4_K ones are
    repacked, and stay as they were); decoded steps of 5 and 13 rows and a 7-row piece of prompt
    pad them, and no logit moves."""
    ours, n_padded = _logits(gemma3_path, True, [5, 13], True, monkeypatch)
    plain, _ = _logits(gemma3_path, False, [5, 13], True, monkeypatch)
    prompt_ours, prompt_padded = _logits(gemma3_path, True, [7], False, monkeypatch)
    prompt_plain, _ = _logits(gemma3_path, False, [7], False, monkeypatch)
    assert n_padded > 2 and prompt_padded > 0
    for a, b in zip(ours + prompt_ours, plain + prompt_plain):
        assert np.array_equal(a, b)
