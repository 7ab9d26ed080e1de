"""The compiled parts (everything else is in pyproject.toml): the sampler's top pass in C,
runner/sample/best.c, and the Q4_1 products of several rows, runner/ml/ggml/q4_1.c (why: their
headers)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("runner.sample._best", ["runner/sample/best.c"], extra_compile_args=["-O3"]),
                   Extension("runner.ml.ggml._q4_1", ["runner/ml/ggml/q4_1.c"], extra_compile_args=["-O3"])])
