"""The two engines the batch loop can hold, each an :class:`~runner.loop.engine.Engine`: the
*old* engine, llama.cpp (:mod:`.llamacpp`, Ollama's ``llamarunner``), and the *new* engine, our
model code over GGML (:mod:`.ggml`, Ollama's ``ollamarunner``). ``runner.load`` is the
one place that picks one by those words (``OLLAMA_NEW_ENGINE``).
"""
