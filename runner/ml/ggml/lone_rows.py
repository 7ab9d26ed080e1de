"""A weight matrix times several rows, each row computed as GGML computes a row alone.

A verified draft's rows (issue 26) must give the logits its tokens give decoded one at a time.
For 2 rows or more GGML's CPU backend multiplies most weight types with batched kernels
(llamafile's tiles, the tiled K-quants from 8 rows, repacked weights 4 rows at a time), which sum
in another order than its one-row dot products, so at a near-tie a greedy answer with guesses
could part from the one without (gemma-3-270m's Q5_0, Q4_K and Q6_K weights). ``lone_rows.c``
(its header says how) has a batch computed by the library's own one-row functions, looked up in
the loaded ``libggml-cpu``: each row's numbers are the lone row's by construction, and the
weights are still read once for all the rows; the rows' arithmetic is no longer shared. Q5_0,
the type most of gemma-3-270m's products are, is the exception on x86: our tiles share each
weight block's unpacking among 4 rows and form every sum in ``ggml_vec_dot_q5_0_q8_0``'s order,
checked against it bit for bit once per process (:func:`q5_0_variant`).

:data:`TYPES` are the weight types this applies to. Q4_1's rows are our own kernels'
(:mod:`.q4_1`, exact in any batch and faster), Q8_0's llamafile tiles sum in the one-row order on
x86 (measured), and Q5_1 has no batched kernel: those stay as they are. Repacked weights are
taken in the layouts GGML picks on x86 (:data:`X86_LAYOUTS`); on other CPUs it picks others,
which stay GGML's batched kernels.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import platform
from typing import TYPE_CHECKING, NamedTuple

from . import bindings as g

if TYPE_CHECKING:
    from .backend import GGMLTensor, GraphContext

log = logging.getLogger(__name__)

#: the weight types whose batched products GGML sums otherwise than a lone row's: llamafile's
#: tiles (F32, F16, BF16, Q4_0, Q5_0, IQ4_NL) and the tiled K-quants and i-quants (from 8 rows)
TYPES = frozenset({"F32", "F16", "BF16", "Q4_0", "Q5_0", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                   "IQ4_XS", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "IQ1_S", "IQ1_M"})
#: GGML's repacked layouts on x86 (repack.cpp picks 8 weight rows interleaved for each there):
#: weight type -> (the type a row is quantized to, the layout's one-row function)
X86_LAYOUTS = {"Q4_0": ("Q8_0", "ggml_gemv_q4_0_8x8_q8_0"), "IQ4_NL": ("Q8_0", "ggml_gemv_iq4_nl_8x8_q8_0"),
               "MXFP4": ("Q8_0", "ggml_gemv_mxfp4_8x8_q8_0"), "Q4_K": ("Q8_K", "ggml_gemv_q4_K_8x8_q8_K"),
               "Q2_K": ("Q8_K", "ggml_gemv_q2_K_8x8_q8_K")}


class Ops(NamedTuple):
    """The ops (``ggml_custom_op_t`` addresses; the C header's contract) and which weights each
    takes, as bit masks of ``enum ggml_type`` values."""

    plain: int  # weights in plain rows
    repacked: int  # weights in GGML's repacked layouts
    plain_types: int  # :data:`TYPES`
    repacked_types: int  # the layouts set up: :data:`X86_LAYOUTS` on x86, none elsewhere


@functools.cache
def _type_ids() -> dict[str, int]:
    """``enum ggml_type`` values by the names this GGML gives them (upper case)."""
    return {(g.ggml_type_name(t) or b"").decode().upper(): t for t in range(g.GGML_TYPE.COUNT)}


def _mask(names) -> int:
    ids = _type_ids()
    return sum(1 << ids[name] for name in names if name in ids)


@functools.cache
def ops() -> Ops | None:
    """The ops, or None (logged once) where the extension is not built or the library lacks
    the functions."""
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
    ids, layouts = _type_ids(), []
    if platform.machine().lower() in ("x86_64", "amd64"):
        for weights, (rows, name) in X86_LAYOUTS.items():
            gemv = g.cpu_function(name)
            if gemv and weights in ids and rows in ids:
                layouts.append((ids[weights], ids[rows], gemv))
    _lone_rows.setup(t.type.offset, t.ne.offset, t.nb.offset, t.src.offset, t.data.offset, traits, row_size,
                     layouts)
    _use_q5_0_tiles(_lone_rows)
    repacked = {name for name, t in ids.items() if any(t == layout[0] for layout in layouts)}
    return Ops(_lone_rows.plain_op(), _lone_rows.repacked_op(), _mask(TYPES), _mask(repacked))


def _use_q5_0_tiles(ext) -> None:
    """Have the plain op take Q5_0 weights to our tiles (4 x 4 rows at a time) where a variant
    gives the library's ``ggml_vec_dot_q5_0_q8_0`` numbers bit for bit, else to that function."""
    vec_dot, variants = g.cpu_function("ggml_vec_dot_q5_0_q8_0"), ext.q5_0_variants()
    for name in variants if vec_dot else ():
        if ext.check_q5_0(vec_dot, name) == 0 and ext.use_q5_0(name):
            log.debug("lone-row products: Q5_0 by the %s tiles", name)
            return
    why = "none gives GGML's numbers on this CPU and build" if variants and vec_dot else "none for this CPU"
    log.info("lone-row products: Q5_0 tiles: %s; GGML's one-row function", why)


def q5_0_variant() -> str:
    """Which tiles the plain op multiplies Q5_0 weights with: "avx512-vnni", "avx2", or ""
    (GGML's one-row function, or no op)."""
    if ops() is None:
        return ""
    from . import _lone_rows  # type: ignore[attr-defined]

    return _lone_rows.q5_0_variant()


@functools.cache
def repacked_buffer_type() -> int:
    """The buffer type of GGML's repacked weights (0: none in this build): what tells a repacked
    weight from a plain one, for both engines."""
    make = g.ggml_backend_cpu_repack_buffer_type
    return (make() or 0) if make is not None else 0


def repacked(w: GGMLTensor) -> bool:
    """Whether ``w`` lives in GGML's repacked layout (its buffer is the repack buffer type's)."""
    buffer = g.ggml_tensor.from_address(w.ptr).buffer
    kind = repacked_buffer_type()
    return bool(buffer) and kind != 0 and g.ggml_backend_buffer_get_type(buffer) == kind


def product(c: GraphContext, w: GGMLTensor, b: GGMLTensor) -> int | None:
    """Weights ``w`` (``[k, m]``) times ``b`` (f32 ``[k, n]``, n > 1) recorded in ``c`` with each
    row's numbers GGML's for it alone, ``[m, n]`` f32; None where the op does not apply: ``w``'s
    type is not one of :data:`TYPES` (or repacked in a layout not set up),
    the operands are not plain 2D, or the extension is not built. A thread that cannot get
    memory for the quantized rows sets ``c.lone_failed`` (the backend raises after the compute)."""
    (k, m, w2, w3), (bk, n, b2, b3) = w.ne, b.ne
    if (n < 2 or (w2, w3, b2, b3) != (1, 1, 1, 1) or k != bk or b.type_id != g.GGML_TYPE.F32 or b.nb[0] != 4
            or (o := ops()) is None):
        return None
    if repacked(w):
        op = o.repacked if o.repacked_types >> w.type_id & 1 and m % 8 == 0 else 0
    else:
        op = o.plain if o.plain_types >> w.type_id & 1 else 0
    if not op:
        return None
    args = (g.P * 2)(w.ptr, b.ptr)
    return g.ggml_custom_4d(c.ptr, g.GGML_TYPE.F32, m, n, 1, 1, args, 2, op, g.GGML_N_TASKS_MAX,
                            ctypes.addressof(c.lone_failed))


__all__ = ["TYPES", "X86_LAYOUTS", "Ops", "ops", "product", "q5_0_variant", "repacked", "repacked_buffer_type"]
