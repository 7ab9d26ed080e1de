"""A weight matrix times several rows, each row computed as GGML computes a row alone.

A verified draft's rows (issue 26) must give the logits its tokens give decoded one at a time.
For 2 rows or more GGML's CPU backend multiplies most weight types with batched kernels
(llamafile's tiles, the tiled K-quants from 8 rows, repacked weights 4 rows at a time), which sum
in another order than its one-row dot products, so at a near-tie a greedy answer with guesses
could part from the one without (gemma-3-270m's Q5_0, Q4_K and Q6_K weights). ``lone_rows.c``
(its header says how) has a batch computed by the library's own one-row functions, looked up in
the loaded ``libggml-cpu``: each row's numbers are the lone row's by construction, and the
weights are still read once for all the rows; the rows' arithmetic is no longer shared.

:data:`TYPES` are the weight types this applies to. Q4_1's rows are our own kernels'
(:mod:`.q4_1`, exact in any batch and faster), Q8_0's llamafile tiles sum in the one-row order on
x86 (measured), and Q5_1 has no batched kernel: those stay as they are. Of the repacked
layouts, GGML's Q4_K one for AVX2 (8 rows interleaved) is taken; other repacked weights are not.
"""

from __future__ import annotations

import ctypes
import functools
import logging
from typing import TYPE_CHECKING

from . import bindings as g

if TYPE_CHECKING:
    from .backend import GGMLTensor, GraphContext

log = logging.getLogger(__name__)

#: the weight types whose batched products GGML sums otherwise than a lone row's: llamafile's
#: tiles (F32, F16, BF16, Q4_0, Q5_0, IQ4_NL) and the tiled K-quants and i-quants (from 8 rows)
TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q5_0", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                   "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"})


@functools.cache
def ops() -> tuple[int, int] | None:
    """(plain weights' op, repacked Q4_K's op or 0): ``ggml_custom_op_t`` addresses (the C
    header's contract); None (logged once) where the extension is not built or the library
    lacks the functions."""
    try:
        from . import _lone_rows  # type: ignore[attr-defined]
    except ImportError:
        log.info("lone-row products: not built; GGML's batched products")
        return None
    traits = g.cpu_function("ggml_get_type_traits_cpu")
    if not traits:
        log.info("lone-row products: this GGML has no ggml_get_type_traits_cpu; GGML's batched products")
        return None
    g.ggml_cpu_init()  # GGML's fp16 tables, which its dot products read
    t = g.ggml_tensor
    row_size = ctypes.cast(g.ggml_row_size, ctypes.c_void_p).value
    _lone_rows.setup(t.type.offset, t.ne.offset, t.nb.offset, t.src.offset, t.data.offset, traits, row_size,
                     g.cpu_function("ggml_gemv_q4_K_8x8_q8_K") or 0)
    return _lone_rows.plain_op(), _lone_rows.q4_K_8x8_op()


@functools.cache
def _repacked_type() -> int:
    """The buffer type of GGML's repacked weights (0: none in this build)."""
    make = g.ggml_backend_cpu_repack_buffer_type
    return (make() or 0) if make is not None else 0


def repacked(w: GGMLTensor) -> bool:
    """Whether ``w`` lives in GGML's repacked layout (its buffer is the repack buffer type's)."""
    buffer = g.ggml_tensor.from_address(w.ptr).buffer
    return bool(buffer) and _repacked_type() != 0 and g.ggml_backend_buffer_get_type(buffer) == _repacked_type()


def product(c: GraphContext, w: GGMLTensor, b: GGMLTensor) -> int | None:
    """Weights ``w`` (``[k, m]``) times ``b`` (f32 ``[k, n]``, n > 1) recorded in ``c`` with each
    row's numbers GGML's for it alone, ``[m, n]`` f32; None where the op does not apply: ``w``'s
    type is not one of :data:`TYPES` (or repacked otherwise than GGML's Q4_K layout for AVX2),
    the operands are not plain 2D, or the extension is not built. A thread that cannot get
    memory for the quantized rows sets ``c.lone_failed`` (the backend raises after the compute)."""
    (k, m, w2, w3), (bk, n, b2, b3) = w.ne, b.ne
    if (n < 2 or (w2, w3, b2, b3) != (1, 1, 1, 1) or k != bk or b.type_id != g.GGML_TYPE.F32 or b.nb[0] != 4
            or (ops_ := ops()) is None):
        return None
    plain, q4_K = ops_
    if repacked(w):
        op = q4_K if w.type_id == g.GGML_TYPE.Q4_K and m % 8 == 0 and k % 256 == 0 else 0
    else:
        op = plain if (g.ggml_type_name(w.type_id) or b"").decode().upper() in TYPES else 0
    if not op:
        return None
    args = (g.P * 2)(w.ptr, b.ptr)
    return g.ggml_custom_4d(c.ptr, g.GGML_TYPE.F32, m, n, 1, 1, args, 2, op, g.GGML_N_TASKS_MAX,
                            ctypes.addressof(c.lone_failed))


def type_mask() -> int:
    """:data:`TYPES` as a bit mask of ``enum ggml_type`` values (bit ``t`` set: type ``t``), by
    the names this GGML gives its types."""
    return sum(1 << t for t in range(g.GGML_TYPE.COUNT) if (g.ggml_type_name(t) or b"").decode().upper() in TYPES)


__all__ = ["TYPES", "ops", "product", "repacked", "type_mask"]
