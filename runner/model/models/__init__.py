"""The architectures of the new engine: which class loads which ``general.architecture``, and
:func:`load`.

Public API::

    from runner.ml.backend import BackendOptions
    from runner.model.models import Batch, load

    model = load("SmolLM2-135M-Instruct.Q4_1.gguf", BackendOptions(num_threads=2))
    model.init_cache(num_ctx=4096, num_parallel=1, num_batch=512)   # + worst-case reservation
    logits = model.compute(Batch(tokens=[1, 2, 3], positions=[0, 1, 2], sequences=[0, 0, 0],
                                 outputs=[2]))                        # (1, n_vocab) float32
    model.cache.remove(seq=0, begin=1, end=2)                         # context shift (re-RoPE)
    model.close()

Each architecture is one file here (``llama.py``, ``qwen2.py``, ``qwen3.py``, ``gemma3.py``)
written against :mod:`runner.model.model` (the :class:`Model` base, batches) and
:mod:`runner.model.nn` (shared layers). Adding one is a file and a line in :data:`ARCHITECTURES`.
"""

from __future__ import annotations

import os

from runner.ml.backend import BackendOptions
from runner.ml.ggml.backend import GGMLBackend
from runner.model.gguf_weights import GGUFError, GGUFFile
from runner.model.model import Batch, BatchInputs, Model, ModelLoadError

from .gemma3 import Gemma3
from .llama import Llama
from .qwen2 import Qwen2
from .qwen3 import Qwen3

__all__ = ["ARCHITECTURES", "Batch", "BatchInputs", "Model", "ModelLoadError", "load", "supported_architectures"]

#: ``general.architecture`` -> the class that loads it
ARCHITECTURES: dict[str, type[Model]] = {
    "llama": Llama,
    "qwen2": Qwen2,
    "qwen3": Qwen3,
    "gemma3": Gemma3,
}


def supported_architectures() -> list[str]:
    return sorted(ARCHITECTURES)


def load(path: str | os.PathLike[str], options: BackendOptions | None = None) -> Model:
    """Open the GGUF at ``path``, map its weights, and build the model of its architecture.

    Raises :class:`ModelLoadError` (unsupported architecture, missing tensor, bad file)."""
    try:
        gguf = GGUFFile.open(path)
    except GGUFError as e:
        raise ModelLoadError(str(e)) from e
    cls = ARCHITECTURES.get(gguf.arch)
    if cls is None:
        gguf.close()
        raise ModelLoadError(
            f"unsupported architecture {gguf.arch!r} for the new engine "
            f"(supported: {', '.join(supported_architectures())})"
        )
    weights = gguf.load_weights()
    try:
        if not (options and options.batch_invariant):  # repacked kernels take rows 4 at a time
            weights.repack_matrices()  # llama.cpp's layout for the fast CPU kernels (and its numbers)
    except MemoryError as e:
        weights.close()
        gguf.close()
        raise ModelLoadError(f"{path}: {e}") from e
    backend = GGMLBackend(options)
    try:
        return cls(gguf, weights, backend)
    except (GGUFError, KeyError, ValueError) as e:
        weights.close()
        backend.close()
        gguf.close()
        raise ModelLoadError(f"{path}: {e}") from e
