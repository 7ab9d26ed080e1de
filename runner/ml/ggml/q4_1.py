"""Q4_1 weights times several rows at once, with GGML's one-row numbers.

GGML's CPU backend multiplies Q4_1 weights one (weight row, activation row) pair at a time,
so a batch of n rows costs about n single rows (``bench/bench_rows.py``: SmolLM2-135M Q4_1, 16
rows 7.6x one). ``q4_1.c`` (its header says how) computes the same sums, in the same order,
holding 4 weight rows and 4 activation rows at a time (8 activation rows on AVX-512): prompts
and drafted rows (issue 26) cost less, and every number is still the one GGML gives a row alone,
which llama.cpp gives too.

:func:`product` records such a product in a graph as two ops (quantize the rows to Q8_1 as
GGML's mul_mat would, then multiply), or returns None where GGML's own ``mul_mat`` is used:
the extension is not built, the CPU lacks AVX2/FMA/F16C, the activations are not plain f32
rows, one row (GGML's dot products read the weights once for it too), or the check failed.
The check runs once per process, the first time a product is asked for: every tile shape
against GGML's own ``ggml_vec_dot_q4_1_q8_1`` on random blocks, bit for bit.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from . import bindings as g

if TYPE_CHECKING:
    from .backend import GraphContext

log = logging.getLogger(__name__)

#: fewer activation rows than this go to GGML's own mul_mat
MIN_ROWS = 2
_Q8_1_BLOCK = 36  # bytes of one block_q8_1: 32 int8, fp16 scale and fp16 scaled sum


@functools.cache
def kernels() -> tuple[int, int, str] | None:
    """(quantize op, product op, variant) where this build and CPU give GGML's numbers; None
    (logged once) where they do not."""
    try:
        from . import _q4_1  # type: ignore[attr-defined]
    except ImportError:
        log.info("Q4_1 row kernels: not built; GGML's one-row products")
        return None
    quantize, vec_dot = g.cpu_function("quantize_row_q8_1"), g.cpu_function("ggml_vec_dot_q4_1_q8_1")
    if not quantize or not vec_dot or not _q4_1.variant():
        log.info("Q4_1 row kernels: this CPU or GGML build has none; GGML's one-row products")
        return None
    g.ggml_cpu_init()  # GGML's fp16 tables, which its dot product reads
    t = g.ggml_tensor
    _q4_1.setup(t.ne.offset, t.nb.offset, t.src.offset, t.data.offset, quantize)
    differ = _q4_1.check(vec_dot)
    if differ:
        log.warning("Q4_1 row kernels: %d of GGML's products differ on this CPU; GGML's one-row products", differ)
        return None
    log.debug("Q4_1 row kernels: %s", _q4_1.variant())
    return _q4_1.quantize_op(), _q4_1.product_op(), _q4_1.variant()


def product(c: GraphContext, w, b) -> int | None:
    """``w`` (Q4_1 ``[k, m]``) times ``b`` (f32 ``[k, n]``) as ``ggml_mul_mat`` gives it,
    ``[m, n]`` f32, recorded in ``c`` by our kernels; None where they do not apply (above).
    ``b``'s Q8_1 rows are made once per graph however many weights multiply them (q, k and v;
    gate and up)."""
    (k, m, w2, w3), (bk, n, b2, b3) = w.ne, b.ne
    if (w.type_id != g.GGML_TYPE.Q4_1 or b.type_id != g.GGML_TYPE.F32 or n < MIN_ROWS
            or (w2, w3, b2, b3) != (1, 1, 1, 1) or k != bk or k % 32 or not w.is_contiguous()
            or b.nb[0] != 4 or b.nb[1] < 4 * k):
        return None
    ops = kernels()
    if ops is None:
        return None
    quantize_op, product_op, _ = ops
    rows = c.q8_1_rows.get(b.ptr)
    if rows is None:
        args = (g.P * 1)(b.ptr)
        rows = g.ggml_custom_4d(c.ptr, g.GGML_TYPE.I8, n * (k // 32) * _Q8_1_BLOCK, 1, 1, 1, args, 1,
                                quantize_op, g.GGML_N_TASKS_MAX, None)
        c.q8_1_rows[b.ptr] = rows
    args = (g.P * 2)(w.ptr, rows)
    return g.ggml_custom_4d(c.ptr, g.GGML_TYPE.F32, m, n, 1, 1, args, 2, product_op, g.GGML_N_TASKS_MAX, None)


def variant() -> str:
    """Which kernels this process multiplies Q4_1 rows with: "avx512-vnni", "avx2", or "" (GGML's)."""
    ops = kernels()
    return ops[2] if ops else ""


__all__ = ["MIN_ROWS", "kernels", "product", "variant"]
