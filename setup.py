"""The compiled parts (everything else is in pyproject.toml): the sampler's top pass in C,
runner/sample/best.c, the Q4_1 products of several rows, runner/ml/ggml/q4_1.c, and the f16
products of several rows, runner/ml/ggml/f16_rows.c, the products of several rows as lone rows,
runner/ml/ggml/lone_rows.c, and the eval callback that has llama.cpp run them,
runner/engines/llamacpp/graph_ops.c (why: their headers)."""

from setuptools import Extension, setup

PARTS_H = "runner/ml/ggml/kernel_parts.h"  # what our GGML kernels share

setup(ext_modules=[Extension("runner.sample._best", ["runner/sample/best.c"], extra_compile_args=["-O3"]),
                   Extension("runner.ml.ggml._q4_1", ["runner/ml/ggml/q4_1.c"], extra_compile_args=["-O3"],
                             depends=[PARTS_H]),
                   Extension("runner.ml.ggml._f16_rows", ["runner/ml/ggml/f16_rows.c"], extra_compile_args=["-O3"],
                             depends=[PARTS_H]),
                   Extension("runner.ml.ggml._lone_rows", ["runner/ml/ggml/lone_rows.c"], extra_compile_args=["-O3"],
                             depends=[PARTS_H]),
                   Extension("runner.engines.llamacpp._graph_ops", ["runner/engines/llamacpp/graph_ops.c"],
                             extra_compile_args=["-O3"])])
