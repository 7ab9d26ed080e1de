"""The old engine: llama.cpp through llama-cpp-python's low-level API (Ollama's ``llamarunner``)."""
