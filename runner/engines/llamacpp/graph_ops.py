"""Our kernels in llama.cpp's graph: Q4_1 products of several rows, and a verified draft's
rows computed as lone rows (issue 26).

The old engine cannot change the graph llama.cpp builds, but llama.cpp offers an eval callback
(``llama_context_params.cb_eval``), called about each node before it is computed. Ours
(``graph_ops.c``, its header says how) has three kinds of node computed by our kernels instead,
on GGML's threads, and puts each node back after:

- **Q4_1 weights times several rows** (prompts, drafted steps): GGML multiplies them one weight
  row and activation row at a time; :mod:`runner.ml.ggml.q4_1`'s kernels give the same numbers
  several rows at a time (``POLLAMA_ROW_KERNELS=0`` leaves them to GGML, as on the new engine).
- **Attention in a batch of decoded tokens** (a sampled token and its drafted ones): llama.cpp
  multiplies a batch's K·Q and V products with llamafile's tiles and a lone row's with
  ``ggml_vec_dot_f16``, which sum in different orders, so a drafted token's logits differed in
  their last bits from the same token decoded alone, and at a near-tie the greedy text parted
  from the answer without guesses. :mod:`runner.ml.ggml.f16_rows`'s kernels sum each row as a
  lone row's. With flash attention there are no such products, and a quantized KV cache has no
  f16 ones.
- **The weight products of a batch of decoded tokens** whose batched kernels sum a row
  otherwise than a lone one (:data:`runner.ml.ggml.lone_rows.TYPES`: gemma-3-270m's Q5_0, Q4_K
  and Q6_K, not Q4_1 or Q8_0): :mod:`runner.ml.ggml.lone_rows` computes each row with GGML's own
  one-row functions. So, without flash attention, a verified draft's logits are its tokens'
  decoded alone on such a model too, at the price of its rows' arithmetic (``bench_rows.py``).

Our Q4_1 and f16 kernels are checked bit for bit against the loaded library's own dot products
before they are used (their modules; the lone-row op calls the library's own functions); where one does not apply (not built, another CPU), that kind of node
stays llama.cpp's. A llama.cpp built with a GPU backend gets no callback at all: its GPU computes
offloaded layers, and large products of the CPU's layers too, and has no custom ops; such a build
was proven on real hardware without it (README § GPU), and the callback has not been run on one.
(The callback also takes only nodes whose numbers and operands are in host memory.)
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import llama_cpp as L

from ...ml.ggml import bindings as g
from ...ml.ggml import f16_rows, lone_rows, q4_1

log = logging.getLogger(__name__)


class GraphOps:
    """The eval callback's state for one llama.cpp context."""

    def __init__(self, module: Any, state: int, q4_1: bool, lone: bool) -> None:
        self._module, self._state = module, state
        self.q4_1 = q4_1  # whether our kernels take Q4_1 products
        self.lone = lone  # whether decoded batches' weight products are lone rows' (lone_rows.py)
        self._decoded = ctypes.c_int32.from_address(state)
        # the callback as llama-cpp-python's field type, kept alive with the state
        self.callback = L.ggml_backend_sched_eval_callback(module.callback())

    @classmethod
    def create(cls, *, row_kernels: bool, attention: bool, lone: bool) -> GraphOps | None:
        """A state taking Q4_1 products (``row_kernels``), decoded batches' attention
        (``attention``) and their other weight products (``lone``) where our kernels run here;
        None where none does, or on a GPU build."""
        if L.llama_supports_gpu_offload():
            log.info("llama.cpp graph ops: a GPU build; llama.cpp's own kernels")
            return None
        try:
            from . import _graph_ops  # type: ignore[attr-defined]
        except ImportError:
            log.info("llama.cpp graph ops: not built; llama.cpp's own kernels")
            return None
        q4_1_op = f16_op = 0
        if row_kernels and q4_1.kernels() is not None:
            from ...ml.ggml import _q4_1  # type: ignore[attr-defined]  # built: kernels() said so

            q4_1_op = _q4_1.mul_mat_op()
        to_f16 = g.cpu_function("ggml_cpu_fp32_to_fp16")
        if attention and f16_rows.kernels() is not None and to_f16:
            from ...ml.ggml import _f16_rows  # type: ignore[attr-defined]

            f16_op = _f16_rows.f32_rows_op(to_f16)
        lone_ops = (0, 0, 0, 0, 0, 0)
        if lone and (o := lone_rows.ops()) is not None:
            repacked = lone_rows.repacked_buffer_type()
            buffer_type = ctypes.cast(g.ggml_backend_buffer_get_type, ctypes.c_void_p).value
            lone_ops = (o.plain, o.repacked if repacked else 0, o.plain_types, o.repacked_types, buffer_type,
                        repacked)
        if not q4_1_op and not f16_op and not lone_ops[0]:
            return None
        t = g.ggml_tensor
        fields = ("type", "buffer", "ne", "nb", "op", "op_params", "src", "data", "name")
        is_host = ctypes.cast(g.ggml_backend_buffer_is_host, ctypes.c_void_p).value
        state = _graph_ops.new(tuple(getattr(t, f).offset for f in fields), (g.op_id("MUL_MAT"), g.op_id("CUSTOM")),
                               is_host, q4_1_op, f16_op, lone_ops)
        return cls(_graph_ops, state, bool(q4_1_op), bool(lone_ops[0]))

    def hook(self, cparams: Any) -> None:
        """Install the callback in a context's parameters (before ``llama_init_from_model``)."""
        cparams.cb_eval = self.callback
        cparams.cb_eval_user_data = self._state

    def decoding(self, decoded: bool) -> None:
        """Before each ``llama_decode``: whether its batch is one sequence's decoded tokens, a
        sampled one and its drafted ones, every row an output (and False after)."""
        self._decoded.value = int(decoded)

    def failed(self) -> bool:
        """After every ``llama_decode``: whether a kernel could not get its memory, so the
        decode's numbers are not to be read (cleared by asking). It also gives llama.cpp back a
        node that a compute stopped early left ours."""
        return self._module.failed(self._state)

    @property
    def taken(self) -> tuple[int, int, int]:
        """(Q4_1 products, attention products, lone-row products) our kernels computed so far
        (for tests)."""
        return self._module.taken(self._state)

    def close(self) -> None:
        """After the context is freed."""
        if self._state:
            self._module.free(self._state)
            self._state = 0


__all__ = ["GraphOps"]
