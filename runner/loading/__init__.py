"""Load-time decisions both engines share, made before either of them allocates anything: the
GGUF header and the checks that keep a bad file from crashing an engine, the options and memory
plan of a load, and how many threads it uses.

(Named ``loading``, not ``load``: ``runner.load`` is the face's function that loads a model.)
"""
