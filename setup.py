"""The one compiled part (everything else is in pyproject.toml): the sampler's top pass in C,
runner/sample/best.c (why: its header)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("runner.sample._best", ["runner/sample/best.c"], extra_compile_args=["-O3"])])
