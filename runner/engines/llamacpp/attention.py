"""A verified draft's attention in llama.cpp, summed as lone rows' (issue 26).

llama.cpp multiplies a batch's attention (``K^T Q`` and V by the scores, f16 cache rows times
several activation rows) with llamafile's tiles, and one row's with ``ggml_vec_dot_f16``: the two
sum in different orders, so a drafted token's logits differ in their last bits from the same
token decoded alone, and at a near-tie the greedy text parts from the answer without guesses.
The old engine cannot change llama.cpp's graph, but llama.cpp offers an eval callback
(``llama_context_params.cb_eval``): for a batch of decoded tokens (a sampled one and its
guesses: every row an output), :class:`LoneRowAttention` has it overwrite those two products,
once computed, with the lone rows' numbers, from the new engine's f16 kernels
(:mod:`runner.ml.ggml.f16_rows`, checked bit for bit against the loaded library's own
``ggml_vec_dot_f16``). The nodes after read the new numbers; other batches are not touched.

With flash attention there are no such products (and the kernel splits a lone row's cells across
threads from 512 cells on, which this cannot mirror); weights whose products round a row in a
batch otherwise than alone (repacked Q4_K, llamafile's Q4_0 tiles, ...) still can, as the README
says. Where the kernels do not apply (not built, another CPU), nothing is hooked.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import llama_cpp as L

from ...ml.ggml import bindings as g
from ...ml.ggml import f16_rows

log = logging.getLogger(__name__)


class LoneRowAttention:
    """The eval callback's state for one llama.cpp context."""

    def __init__(self, state: int, module: Any) -> None:
        self._state, self._module = state, module
        self._active = ctypes.c_int32.from_address(state)
        # the callback as llama-cpp-python's field type, kept alive with the state
        self.callback = L.ggml_backend_sched_eval_callback(module.attention_callback())

    @classmethod
    def create(cls) -> LoneRowAttention | None:
        """A state, or None where the f16 kernels do not apply here (logged by :mod:`f16_rows`)."""
        if f16_rows.kernels() is None:
            return None
        to_f16 = g.cpu_function("ggml_cpu_fp32_to_fp16")
        if not to_f16:
            log.info("lone-row attention: this GGML build exports no ggml_cpu_fp32_to_fp16")
            return None
        from ...ml.ggml import _f16_rows  # type: ignore[attr-defined]  # built: kernels() said so

        t = g.ggml_tensor
        state = _f16_rows.attention_new(to_f16, g.op_id("CUSTOM"), t.type.offset, t.op.offset, t.op_params.offset,
                                        t.name.offset)
        return cls(state, _f16_rows)

    def hook(self, cparams: Any) -> None:
        """Install the callback in a context's parameters (before ``llama_init_from_model``)."""
        cparams.cb_eval = self.callback
        cparams.cb_eval_user_data = self._state

    def decoding(self, decoded: bool) -> None:
        """Before each ``llama_decode``: whether its batch is all decoded tokens (and False after)."""
        self._active.value = int(decoded)

    def failed(self) -> bool:
        """After a ``llama_decode``: whether a product could not be computed (out of memory), so
        its logits are not to be read. Cleared by asking."""
        return self._module.attention_failed(self._state)

    @property
    def redone(self) -> int:
        """Products overwritten so far (for tests)."""
        return self._module.attention_redone(self._state)

    def close(self) -> None:
        """After the context is freed."""
        if self._state:
            self._module.attention_free(self._state)
            self._state = 0


__all__ = ["LoneRowAttention"]
