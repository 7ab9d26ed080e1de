"""How the CPU kernels multiply a model's weights by several rows of activations at once, by GGUF
file type (``general.file_type``, :attr:`runner.api.ModelInfo.quantization`).

This is what a step of several rows costs (``bench/bench_rows.py`` measures it), and so what the
draft controller's cost tables are keyed by (:data:`runner.spec.controller.ROW_COSTS`). Each
engine says how it multiplies (:attr:`runner.loop.engine.Engine.multiplies`), from these facts:

- :data:`BATCHED`: GGML's own batched kernels, which read each weight once for all rows:
  repacked where the CPU allows (Q4_0, Q4_K, IQ4_NL on AVX2; more types on others), llamafile's
  tiles (Q8_0, Q5_0, Q4_0, F16, BF16, F32), or tiled from 8 rows (the K-quants). A mixed file
  (Q4_K_M: Q4_K, Q6_K, and Q5_0 where rows are too short for K-quants) is all of these.
- :data:`LONE`: GGML's batched kernels for a prompt, but a batch of decoded tokens (a verified
  draft) multiplied by GGML's one-row functions, row by row, the weights read once
  (``runner/ml/ggml/lone_rows.c``, both engines): each row's numbers are then its own alone, and
  a row costs its arithmetic, but for Q5_0's, which our tiles share among 4 rows in the one-row
  order. Every batched type but Q8_0, whose tiles sum in the one-row order.
- :data:`TILED`: our kernels for Q4_1 (``runner/ml/ggml/q4_1.c``, the new engine's), 4 weight
  rows by 4 activation rows at a time (8 on AVX-512), with GGML's one-row numbers.
- :data:`PER_ROW`: everything else, GGML's one-row dot products once per weight row and batch
  row (Q4_1 and Q5_1 in llama.cpp; every type but Q4_1 in the new engine's batch-invariant mode,
  where our kernels, exact for a row in any batch, still run): rows cost nearly as much as steps
  of their own. A type not named costs so, the dearer guess.
"""

from __future__ import annotations

from typing import Mapping

BATCHED = "batched"
LONE = "lone"
TILED = "tiled"
PER_ROW = "per-row"

#: the file types GGML's CPU kernels multiply for several rows at once (above)
GGML_BATCHED_TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q8_0", "Q5_0", "Q2_K", "Q3_K_S", "Q3_K_M",
                                "Q3_K_L", "Q4_K_S", "Q4_K_M", "Q5_K_S", "Q5_K_M", "Q6_K"})
#: the file types whose products, mostly, :mod:`runner.ml.ggml.lone_rows` takes in decoded batches
LONE_TYPES = GGML_BATCHED_TYPES - {"Q8_0"}
#: the file types our own kernels take (the new engine, where they run: ``runner.ml.ggml.q4_1``)
TILED_TYPES = frozenset({"Q4_1"})


def multiplies(ggml_batched: bool, tiled: bool, lone: bool = False) -> dict[str, str]:
    """How an engine multiplies several rows, by file type: ``ggml_batched``, GGML's batched
    kernels run (not in the new engine's batch-invariant mode); ``tiled``, our Q4_1 kernels do;
    ``lone``, decoded batches go to GGML's one-row functions where the batched kernels would sum
    a row otherwise. Types not in the result: :data:`PER_ROW`."""
    kinds = {t: BATCHED for t in GGML_BATCHED_TYPES} if ggml_batched else {}
    if ggml_batched and lone:
        kinds.update({t: LONE for t in LONE_TYPES})
    if tiled:
        kinds.update({t: TILED for t in TILED_TYPES})
    return kinds


def kind_of(file_type: str, kinds: Mapping[str, str]) -> str:
    """How ``kinds`` (:func:`multiplies`) multiplies a model of ``file_type`` (any case)."""
    return kinds.get(file_type.upper(), PER_ROW)
