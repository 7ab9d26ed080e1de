"""Load-time decisions both engines share, made before either of them allocates anything: the
checks that keep a bad GGUF from crashing an engine (:mod:`.ggufcheck`) and the options and memory
plan of a load (:mod:`.plan`).

It sits above the new engine's packages and reads facts from below: the GGUF header
(:mod:`runner.model.ggufmeta`, which the tokenizer reads too), the machine's cores and free
memory (:mod:`runner.ml.cpus`, :mod:`runner.ml.memory`, which the GGML backend checks too).

(Named ``loading``, not ``load``: ``runner.load`` is the face's function that loads a model.)
"""
