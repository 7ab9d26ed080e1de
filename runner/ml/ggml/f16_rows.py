"""f16 rows (the KV cache) times several rows of activations, each product GGML's for a row alone.

A verified draft's rows (issue 26) must give the logits the same tokens give decoded one at a
time. GGML multiplies attention's K^T Q and V by the scores with llamafile's tiles for 2 rows or
more and with ``ggml_vec_dot_f16`` for one, and the two sum in different orders. ``f16_rows.c``
(its header says how) computes ``ggml_vec_dot_f16``'s sums for several cache rows and several
activation rows at a time, so a drafted step's attention costs about what the tiles cost and
each row's numbers are still a lone row's.

:func:`product` records such a product in a graph as two ops (GGML's own cast of the rows to
f16, as mul_mat converts them, then the product), or returns None where it does not apply: the
extension is not built, the CPU has no AVX2/FMA/F16C, no variant gave the library's numbers in
the check, or the operands are not an f16 matrix and f32 rows. The check runs once per process,
the first time a product is asked for: each variant against the loaded ``libggml-cpu``'s own
``ggml_vec_dot_f16`` on random rows, bit for bit (the library is built for AVX-512 or AVX2, and
the two sum in different trees). The old engine has llama.cpp compute its drafted rows' attention
with the same kernels, through an eval callback (:mod:`runner.engines.llamacpp.attention`).
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING

from . import bindings as g

if TYPE_CHECKING:
    from .backend import GGMLTensor, GraphContext

log = logging.getLogger(__name__)


@functools.cache
def kernels() -> tuple[int, str] | None:
    """(product op, variant) where this build and CPU give GGML's numbers; None (logged once)
    where they do not."""
    try:
        from . import _f16_rows  # type: ignore[attr-defined]
    except ImportError:
        log.info("f16 row kernels: not built; attention rows laid apart")
        return None
    vec_dot = g.cpu_function("ggml_vec_dot_f16")
    if not vec_dot:
        log.info("f16 row kernels: this GGML build exports no ggml_vec_dot_f16; attention rows laid apart")
        return None
    g.ggml_cpu_init()
    t = g.ggml_tensor
    _f16_rows.setup(t.ne.offset, t.nb.offset, t.src.offset, t.data.offset)
    for name in _f16_rows.variants():
        if _f16_rows.check(vec_dot, name) == 0 and _f16_rows.use(name):
            log.debug("f16 row kernels: %s", name)
            return _f16_rows.product_op(), name
    log.info("f16 row kernels: none gives GGML's numbers on this CPU and build; attention rows laid apart")
    return None


def product(c: GraphContext, a: GGMLTensor, b: GGMLTensor) -> int | None:
    """``a`` (f16 ``[k, m, a2, a3]``, rows of any stride) times ``b`` (f32 ``[k, n, n2, n3]``)
    as ``ggml_mul_mat`` gives each of ``b``'s rows alone, ``[m, n, n2, n3]`` f32, recorded in
    ``c``; None where the kernels do not apply (above)."""
    (k, m, a2, a3), (bk, n, n2, n3) = a.ne, b.ne
    if (a.type_id != g.GGML_TYPE.F16 or b.type_id != g.GGML_TYPE.F32 or k != bk or n2 % a2 or n3 % a3
            or a.nb[0] != 2):
        return None
    ops = kernels()
    if ops is None:
        return None
    rows = g.ggml_cast(c.ptr, b.ptr, g.GGML_TYPE.F16)  # contiguous, rounded as mul_mat rounds them
    args = (g.P * 2)(a.ptr, rows)
    return g.ggml_custom_4d(c.ptr, g.GGML_TYPE.F32, m, n, n2, n3, args, 2, ops[0], g.GGML_N_TASKS_MAX, None)


def variant() -> str:
    """Which kernels this process multiplies f16 rows with: "avx512", "avx2", or "" (GGML's)."""
    ops = kernels()
    return ops[1] if ops else ""


__all__ = ["kernels", "product", "variant"]
