"""The GGML CPU backend: tensors, compute graphs and buffers over ``bindings``.

- :class:`GGMLBackend` owns the CPU backend (``ggml_backend_cpu_init``, thread count), one graph
  allocator (``ggml_gallocr``) shared by every graph, and a lock: one graph computes at a time.
- :class:`GraphContext` is one compute graph (a ``no_alloc`` ggml context plus a ``cgraph``):
  ops record nodes, :meth:`GraphContext.compute` allocates the intermediates through the shared
  allocator, uploads the named inputs and runs. A built graph can be re-run with new input data
  (:meth:`GraphContext.set_input`), which is how decoding avoids rebuilding the graph per token.
- :class:`Storage` holds persistent tensors (KV cache) in their own backend buffer.
- :class:`GGMLTensor` is a handle (a ``ggml_tensor *``) plus the graph it records into (``None``
  for weights and storage; ``t.on(ctx)`` binds such a tensor to a graph so views of it can be
  taken there).

See ``runner.ml.backend`` for the contract (shapes in GGML order, ne0 first).
"""

from __future__ import annotations

import ctypes
import functools
import logging
import math
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from runner.ml.cpus import default_threads
from runner.ml.memory import available_memory
from runner.ml.backend import BackendOptions, CacheConfig

from . import bindings as g
from . import f16_rows, lone_rows, q4_1

log = logging.getLogger(__name__)

__all__ = ["GGMLBackend", "GGMLTensor", "GraphContext", "Storage", "dtype_id", "dtype_name", "repack_matrices"]

# ----------------------------------------------------------------------------------------- dtypes
_DTYPE_IDS: dict[str, int] = {
    "f32": g.GGML_TYPE.F32,
    "f16": g.GGML_TYPE.F16,
    "bf16": g.GGML_TYPE.BF16,
    "q4_0": g.GGML_TYPE.Q4_0,
    "q4_1": g.GGML_TYPE.Q4_1,
    "q5_0": g.GGML_TYPE.Q5_0,
    "q5_1": g.GGML_TYPE.Q5_1,
    "q8_0": g.GGML_TYPE.Q8_0,
    "q2_k": g.GGML_TYPE.Q2_K,
    "q3_k": g.GGML_TYPE.Q3_K,
    "q4_k": g.GGML_TYPE.Q4_K,
    "q5_k": g.GGML_TYPE.Q5_K,
    "q6_k": g.GGML_TYPE.Q6_K,
    "iq4_nl": g.GGML_TYPE.IQ4_NL,
    "i8": g.GGML_TYPE.I8,
    "i16": g.GGML_TYPE.I16,
    "i32": g.GGML_TYPE.I32,
    "i64": g.GGML_TYPE.I64,
}
_DTYPE_NAMES: dict[int, str] = {v: k for k, v in _DTYPE_IDS.items()}
_NUMPY_OF: dict[int, type] = {
    g.GGML_TYPE.F32: np.float32,
    g.GGML_TYPE.F16: np.float16,
    g.GGML_TYPE.I32: np.int32,
    g.GGML_TYPE.I64: np.int64,
    g.GGML_TYPE.I16: np.int16,
    g.GGML_TYPE.I8: np.int8,
}
_DTYPE_OF_NUMPY: dict[np.dtype, int] = {np.dtype(v): k for k, v in _NUMPY_OF.items()}


def dtype_id(name: str) -> int:
    """GGML type enum of ``name`` (``ValueError`` for an unknown name)."""
    try:
        return _DTYPE_IDS[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}") from None


def dtype_name(type_id: int) -> str:
    """Lower-case name of a GGML type enum (GGML's own name for types we do not list)."""
    name = _DTYPE_NAMES.get(type_id)
    if name is None:
        raw = g.ggml_type_name(type_id)
        name = raw.decode().lower() if raw else f"type{type_id}"
    return name


# ----------------------------------------------------------------------------------------- tensor
class GGMLTensor:
    """A ``ggml_tensor *`` and the graph (``ctx``) its ops record into (``None``: not in a graph)."""

    __slots__ = ("ptr", "ctx")

    def __init__(self, ptr: int, ctx: GraphContext | None) -> None:
        if not ptr:
            raise MemoryError("GGML returned a NULL tensor (graph context full?)")
        self.ptr = ptr
        self.ctx = ctx

    # --- metadata -------------------------------------------------------------------------------
    @property
    def _s(self) -> g.ggml_tensor:
        return g.ggml_tensor.from_address(self.ptr)

    @property
    def ne(self) -> tuple[int, int, int, int]:
        """All four dims ``(ne0, ne1, ne2, ne3)``."""
        return tuple(self._s.ne)  # type: ignore[return-value]

    @property
    def nb(self) -> tuple[int, int, int, int]:
        """All four strides in bytes."""
        return tuple(self._s.nb)  # type: ignore[return-value]

    @property
    def shape(self) -> tuple[int, ...]:
        ne = self.ne
        n = 4
        while n > 1 and ne[n - 1] == 1:
            n -= 1
        return ne[:n]

    @property
    def type_id(self) -> int:
        return self._s.type

    @property
    def dtype(self) -> str:
        return dtype_name(self._s.type)

    @property
    def name(self) -> str:
        return (g.ggml_get_name(self.ptr) or b"").decode()

    @property
    def nbytes(self) -> int:
        return g.ggml_nbytes(self.ptr)

    @property
    def data_ptr(self) -> int:
        """Address of the data (0 until allocated)."""
        return self._s.data or 0

    def dim(self, i: int) -> int:
        return self._s.ne[i]

    def stride(self, i: int) -> int:
        return self._s.nb[i]

    def is_contiguous(self) -> bool:
        return bool(g.ggml_is_contiguous(self.ptr))

    def __repr__(self) -> str:
        return f"GGMLTensor({self.name or hex(self.ptr)}, {self.dtype}, {list(self.shape)})"

    # --- graph binding --------------------------------------------------------------------------
    def on(self, ctx: GraphContext) -> GGMLTensor:
        """The same tensor, recording its ops into ``ctx`` (for views of weights/storage)."""
        return GGMLTensor(self.ptr, ctx)

    def _graph(self, *others: GGMLTensor | None) -> GraphContext:
        if self.ctx is not None:
            return self.ctx
        for o in others:
            if o is not None and o.ctx is not None:
                return o.ctx
        raise ValueError("op on tensors that belong to no graph: bind one with .on(ctx)")

    def _new(self, ptr: int, ctx: GraphContext) -> GGMLTensor:
        return GGMLTensor(ptr, ctx)

    # --- checks (GGML_ASSERT would abort the process; these raise instead) ------------------------
    def _check_broadcast(self, other: GGMLTensor, op: str) -> None:
        if not g.ggml_can_repeat(other.ptr, self.ptr):
            raise ValueError(f"{op}: {list(other.shape)} does not broadcast to {list(self.shape)}")

    # --- elementwise ----------------------------------------------------------------------------
    def add(self, other: GGMLTensor) -> GGMLTensor:
        self._check_broadcast(other, "add")
        c = self._graph(other)
        return GGMLTensor(g.ggml_add(c.ptr, self.ptr, other.ptr), c)

    def mul(self, other: GGMLTensor) -> GGMLTensor:
        self._check_broadcast(other, "mul")
        c = self._graph(other)
        return GGMLTensor(g.ggml_mul(c.ptr, self.ptr, other.ptr), c)

    __add__ = add
    __mul__ = mul

    def scale(self, s: float) -> GGMLTensor:
        c = self._graph()
        return GGMLTensor(g.ggml_scale(c.ptr, self.ptr, s), c)

    def silu(self) -> GGMLTensor:
        c = self._graph()
        return GGMLTensor(g.ggml_silu(c.ptr, self.ptr), c)

    def swiglu(self, up: GGMLTensor) -> GGMLTensor:
        if not g.ggml_are_same_shape(self.ptr, up.ptr):
            raise ValueError(f"swiglu: gate {list(self.shape)} and up {list(up.shape)} differ")
        c = self._graph(up)
        return GGMLTensor(g.ggml_swiglu_split(c.ptr, self.ptr, up.ptr), c)

    def gelu(self) -> GGMLTensor:
        c = self._graph()
        return GGMLTensor(g.ggml_gelu(c.ptr, self.ptr), c)

    def geglu(self, up: GGMLTensor) -> GGMLTensor:
        if not g.ggml_are_same_shape(self.ptr, up.ptr):
            raise ValueError(f"geglu: gate {list(self.shape)} and up {list(up.shape)} differ")
        c = self._graph(up)
        return GGMLTensor(g.ggml_geglu_split(c.ptr, self.ptr, up.ptr), c)

    def tanh(self) -> GGMLTensor:
        c = self._graph()
        return GGMLTensor(g.ggml_tanh(c.ptr, self.ptr), c)

    # --- normalisation, matmul, attention -------------------------------------------------------
    def rms_norm(self, eps: float) -> GGMLTensor:
        c = self._graph()
        return GGMLTensor(g.ggml_rms_norm(c.ptr, self.ptr, eps), c)

    def norm(self, eps: float) -> GGMLTensor:
        c = self._graph()
        return GGMLTensor(g.ggml_norm(c.ptr, self.ptr, eps), c)

    def avg_pool_2d(self, k: int) -> GGMLTensor:
        ne = self.ne
        if ne[0] % k or ne[1] % k:
            raise ValueError(f"avg_pool_2d: {list(self.shape)} does not divide by the kernel {k}")
        c = self._graph()
        return GGMLTensor(g.ggml_pool_2d(c.ptr, self.ptr, g.GGML_OP_POOL_AVG, k, k, k, k, 0.0, 0.0), c)

    def mulmat(self, b: GGMLTensor) -> GGMLTensor:
        return GGMLTensor(self._product(b)[0], self._graph(b))

    def mulmat_f32(self, b: GGMLTensor) -> GGMLTensor:
        """:meth:`mulmat` with f32 accumulation requested (``GGML_PREC_F32``), as llama.cpp does
        for ``K^T Q``."""
        ptr, ggml = self._product(b)
        if ggml:  # our kernels' ops sum in f32 (and their op params are theirs)
            g.ggml_prec_set_acc(ptr, g.GGML_PREC_F32)
        return GGMLTensor(ptr, self._graph(b))

    def _product(self, b: GGMLTensor) -> tuple[int, bool]:
        """``self`` times ``b`` recorded in the graph: (the result, whether GGML's mul_mat)."""
        a_ne, b_ne = self.ne, b.ne
        if a_ne[0] != b_ne[0] or b_ne[2] % a_ne[2] or b_ne[3] % a_ne[3]:
            raise ValueError(f"mulmat: {list(a_ne)} x {list(b_ne)} (ne0 must match, ne2/ne3 broadcast)")
        c = self._graph(b)
        if self.type_id == g.GGML_TYPE.Q4_1 and c.backend.options.row_kernels:
            ptr = q4_1.product(c, self, b)  # GGML's numbers, several rows at a time
            if ptr is not None:
                return ptr, False
        # llamafile's tiles take 2 rows or more and sum each row in one order, whatever the
        # number of rows; a row alone goes to GGML's one-row dot products, which sum in another
        # (``_TILED``). In a graph of decoded tokens (a sampled one with drafted ones) attention's
        # products, activations times activations (``self`` is in the graph, where weights are
        # not), are summed as a row alone is: by our f16 kernels, or with the rows laid apart,
        # the dearer way (bench_attention_rows.py). With that SmolLM2's drafted rows are its rows
        # alone, bit for bit (its Q4_1 products are our kernels', its Q8_0 ones llamafile's tiles,
        # whose sums on x86 come in the one-row dot product's order). The batch-invariant mode
        # lays every weight's rows apart
        if c.decoded and self.ctx is not None and b_ne[1] > 1:
            ptr = f16_rows.product(c, self, b)
            if ptr is not None:
                return ptr, False
        # the weights' products of decoded tokens, where GGML's batched kernels would sum a row
        # otherwise (Q5_0, Q4_K, Q6_K, ...), by GGML's one-row functions (lone_rows.py)
        if c.decoded and self.ctx is None and b_ne[1] > 1 and not c.backend.options.batch_invariant:
            ptr = lone_rows.product(c, self, b)
            if ptr is not None:
                return ptr, False
        apart = ((c.backend.options.batch_invariant and a_ne[2:] == (1, 1))
                 or (c.decoded and self.ctx is not None and b_ne[1] > 1))
        kind = _TILED.get(self.type_id) if apart else None
        if kind is not None and b.type_id == g.GGML_TYPE.F32:
            return g.ggml_mul_mat(c.ptr, self.ptr, _rows_apart(c, b, kind)), True
        if not apart and _pads(self, b):
            return _padded_product(c, self, b), False
        return g.ggml_mul_mat(c.ptr, self.ptr, b.ptr), True

    def softmax(self, mask: GGMLTensor | None, scale: float) -> GGMLTensor:
        c = self._graph(mask)
        return GGMLTensor(
            g.ggml_soft_max_ext(c.ptr, self.ptr, mask.ptr if mask is not None else None, scale, 0.0), c
        )

    def rope(
        self,
        positions: GGMLTensor,
        dims: int,
        base: float,
        *,
        neox: bool,
        scale: float = 1.0,
        factors: GGMLTensor | None = None,
        original_context: int = 0,
    ) -> GGMLTensor:
        c = self._graph(positions)
        mode = g.GGML_ROPE_TYPE_NEOX if neox else g.GGML_ROPE_TYPE_NORMAL
        return GGMLTensor(
            g.ggml_rope_ext(
                c.ptr,
                self.ptr,
                positions.ptr,
                factors.ptr if factors is not None else None,
                dims,
                mode,
                original_context,
                base,
                scale,
                0.0,  # ext_factor: no YaRN
                1.0,  # attn_factor
                32.0,  # beta_fast (YaRN only)
                1.0,  # beta_slow (YaRN only)
            ),
            c,
        )

    def flash_attention(
        self, k: GGMLTensor, v: GGMLTensor, mask: GGMLTensor | None, scale: float
    ) -> GGMLTensor:
        c = self._graph(k, v, mask)
        out = g.ggml_flash_attn_ext(
            c.ptr, self.ptr, k.ptr, v.ptr, mask.ptr if mask is not None else None, scale, 0.0, 0.0
        )
        g.ggml_prec_set_acc(out, g.GGML_PREC_F32)
        return GGMLTensor(out, c)

    # --- gather / scatter / copies --------------------------------------------------------------
    def rows(self, ids: GGMLTensor) -> GGMLTensor:
        c = self._graph(ids)
        return GGMLTensor(g.ggml_get_rows(c.ptr, self.ptr, ids.ptr), c)

    def top_k(self, k: int) -> GGMLTensor:
        """The indices (i32 ``[k, rows]``) of each row's ``k`` largest values, in no order."""
        c = self._graph()
        return GGMLTensor(g.ggml_top_k(c.ptr, self.ptr, k), c)

    def argsort_desc(self) -> GGMLTensor:
        """The indices (i32, this tensor's shape) that sort each row descending (ties in no
        particular order)."""
        c = self._graph()
        return GGMLTensor(g.ggml_argsort(c.ptr, self.ptr, g.GGML_SORT_ORDER_DESC), c)

    def set_rows(self, src: GGMLTensor, ids: GGMLTensor) -> GGMLTensor:
        c = self._graph(src, ids)
        return GGMLTensor(g.ggml_set_rows(c.ptr, self.ptr, src.ptr, ids.ptr), c)

    def copy(self, dst: GGMLTensor) -> GGMLTensor:
        c = self._graph(dst)
        return GGMLTensor(g.ggml_cpy(c.ptr, self.ptr, dst.ptr), c)

    def cast(self, dtype: str) -> GGMLTensor:
        c = self._graph()
        return GGMLTensor(g.ggml_cast(c.ptr, self.ptr, dtype_id(dtype)), c)

    def contiguous(self, *shape: int) -> GGMLTensor:
        c = self._graph()
        if not shape:
            return GGMLTensor(g.ggml_cont(c.ptr, self.ptr), c)
        if len(shape) == 2:
            return GGMLTensor(g.ggml_cont_2d(c.ptr, self.ptr, shape[0], shape[1]), c)
        if len(shape) == 3:
            return GGMLTensor(g.ggml_cont_3d(c.ptr, self.ptr, *shape), c)
        return GGMLTensor(g.ggml_cont(c.ptr, self.ptr), c).reshape(*shape)

    # --- views ----------------------------------------------------------------------------------
    def reshape(self, *shape: int) -> GGMLTensor:
        c = self._graph()
        n = len(shape)
        if math.prod(shape) != g.ggml_nelements(self.ptr) or not g.ggml_is_contiguous(self.ptr):
            raise ValueError(f"reshape {list(self.shape)} -> {list(shape)}: needs a contiguous tensor, same size")
        if n == 1:
            p = g.ggml_reshape_1d(c.ptr, self.ptr, shape[0])
        elif n == 2:
            p = g.ggml_reshape_2d(c.ptr, self.ptr, shape[0], shape[1])
        elif n == 3:
            p = g.ggml_reshape_3d(c.ptr, self.ptr, shape[0], shape[1], shape[2])
        elif n == 4:
            p = g.ggml_reshape_4d(c.ptr, self.ptr, *shape)
        else:
            raise ValueError(f"reshape to {n} dims")
        return GGMLTensor(p, c)

    def view(self, offset: int, shape: Sequence[int], strides: Sequence[int] = ()) -> GGMLTensor:
        c = self._graph()
        n = len(shape)
        if not strides:
            strides = self.nb[1:n]
        if len(strides) != n - 1:
            raise ValueError(f"view of {n} dims needs {n - 1} strides, got {len(strides)}")
        if n == 1:
            p = g.ggml_view_1d(c.ptr, self.ptr, shape[0], offset)
        elif n == 2:
            p = g.ggml_view_2d(c.ptr, self.ptr, shape[0], shape[1], strides[0], offset)
        elif n == 3:
            p = g.ggml_view_3d(c.ptr, self.ptr, *shape, *strides, offset)
        elif n == 4:
            p = g.ggml_view_4d(c.ptr, self.ptr, *shape, *strides, offset)
        else:
            raise ValueError(f"view of {n} dims")
        return GGMLTensor(p, c)

    def permute(self, *axes: int) -> GGMLTensor:
        c = self._graph()
        if len(axes) == 3:
            axes = (*axes, 3)
        return GGMLTensor(g.ggml_permute(c.ptr, self.ptr, *axes), c)

    def transpose(self) -> GGMLTensor:
        c = self._graph()
        return GGMLTensor(g.ggml_transpose(c.ptr, self.ptr), c)

    # --- data -----------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        s = self._s
        np_type = _NUMPY_OF.get(s.type)
        if np_type is None:
            raise ValueError(f"cannot read a {self.dtype} tensor as NumPy")
        if not g.ggml_is_contiguous(self.ptr):
            raise ValueError("numpy() of a non-contiguous tensor: make it contiguous first")
        if not s.data:
            raise RuntimeError(f"tensor {self!r} has no data (graph not computed?)")
        out = np.empty(tuple(reversed(self.shape)), dtype=np_type)
        g.ggml_backend_tensor_get(self.ptr, out.ctypes.data, 0, out.nbytes)
        return out.astype(np.float32) if np_type is np.float16 else out

    def host_floats(self) -> memoryview:
        """The computed f32 data where it lies, as a flat memoryview (no copy): the CPU backend's
        buffers are host memory. Valid while the graph's placement stands
        (:attr:`GraphContext.placement`) and until the next compute overwrites it."""
        s = self._s
        if s.type != g.GGML_TYPE.F32 or not g.ggml_is_contiguous(self.ptr):
            raise ValueError(f"host_floats of {self!r}: a contiguous f32 tensor only")
        if not s.data:
            raise RuntimeError(f"tensor {self!r} has no data (graph not computed?)")
        return memoryview((ctypes.c_float * (self.nbytes // 4)).from_address(s.data)).cast("B").cast("f")

    def reader(self, out: np.ndarray) -> Callable[[], None]:
        """:meth:`read_into` ``out`` as a call with its arguments fixed once (for an array that
        is read after every compute)."""
        if not out.flags.c_contiguous or out.nbytes != self.nbytes:
            raise ValueError(f"reader: {out.nbytes} bytes for a tensor of {self.nbytes}")
        return functools.partial(g.ggml_backend_tensor_get, self.ptr, out.ctypes.data, 0, out.nbytes)

    def read_into(self, out: np.ndarray) -> None:
        """Copy the computed data into ``out`` (contiguous, exactly this tensor's byte size):
        reading into a reused array, where :meth:`numpy` allocates a new one."""
        if not out.flags.c_contiguous or out.nbytes != self.nbytes:
            raise ValueError(f"read_into: {out.nbytes} bytes for a tensor of {self.nbytes}")
        g.ggml_backend_tensor_get(self.ptr, out.ctypes.data, 0, out.nbytes)

    def read_bytes(self, offset: int, out: np.ndarray) -> None:
        """See ``Tensor.read_bytes``."""
        self._check_range(offset, out, "read_bytes")
        g.ggml_backend_tensor_get(self.ptr, out.ctypes.data, offset, out.nbytes)

    def write_bytes(self, offset: int, data: np.ndarray) -> None:
        """See ``Tensor.write_bytes``."""
        self._check_range(offset, data, "write_bytes")
        g.ggml_backend_tensor_set(self.ptr, data.ctypes.data, offset, data.nbytes)

    def host_bytes(self) -> np.ndarray | None:
        """See ``Tensor.host_bytes``."""
        s = self._s
        if not s.data or not s.buffer or not g.ggml_is_contiguous(self.ptr) or \
                not g.ggml_backend_buffer_is_host(s.buffer):
            return None
        return np.frombuffer((ctypes.c_uint8 * self.nbytes).from_address(s.data), dtype=np.uint8)

    def _check_range(self, offset: int, arr: np.ndarray, what: str) -> None:
        # GGML asserts (aborts the process) on a range outside the tensor: refuse it here
        if not arr.flags.c_contiguous:
            raise ValueError(f"{what}: the array must be C-contiguous")
        if offset < 0 or offset + arr.nbytes > self.nbytes:
            raise ValueError(f"{what}: bytes [{offset}, {offset + arr.nbytes}) outside a tensor of {self.nbytes}")
        if not self.data_ptr:
            raise RuntimeError(f"{what}: tensor {self!r} has no data")

    def set_numpy(self, data: np.ndarray) -> None:
        """Overwrite an allocated, contiguous tensor's data (same byte size)."""
        data = np.ascontiguousarray(data)
        if data.nbytes != self.nbytes:
            raise ValueError(f"set_numpy: {data.nbytes} bytes for a tensor of {self.nbytes}")
        g.ggml_backend_tensor_set(self.ptr, data.ctypes.data, 0, data.nbytes)


# -------------------------------------------------------------------------------------- contexts
def _new_ggml_context(n_tensors: int, graph_nodes: int = 0) -> int:
    mem = g.ggml_tensor_overhead() * n_tensors
    if graph_nodes:
        mem += g.ggml_graph_overhead_custom(graph_nodes, False)
    ctx = g.ggml_init(g.ggml_init_params(mem, None, True))
    if not ctx:
        raise MemoryError("ggml_init failed")
    return ctx


@dataclass
class _Input:
    tensor: GGMLTensor
    data: np.ndarray  # the graph's own buffer: set_input copies into it, the upload reads it
    upload: Callable[[], None]


class GraphContext:
    """One compute graph. Not thread-safe: build and run it from one thread."""

    def __init__(self, backend: GGMLBackend, max_nodes: int, decoded: bool = False) -> None:
        self.backend = backend
        self.max_nodes = max_nodes
        self.decoded = decoded  # rows of decoded tokens, the same alone as together (Backend.new_context)
        # tensors of a graph: nodes + views + leafs; views are not graph nodes, so allow 2x
        self.ptr = _new_ggml_context(2 * max_nodes + 64, max_nodes)
        self.graph = g.ggml_new_graph_custom(self.ptr, max_nodes, False)
        self._inputs: dict[str, _Input] = {}
        self._outputs: set[int] = set()  # tensors already marked as outputs and expanded into the graph
        self.version = 0  # counts the graph's expansions: the allocator places a graph again when it grew
        self.placement = 0  # the allocator's placement its tensors have now (a new one: they moved)
        self.generation: int | None = None  # the allocator's buffer its tensors were placed in (None: never)
        self.q8_1_rows: dict[int, int] = {}  # activations' Q8_1 rows for the Q4_1 kernels, by tensor (q4_1.py)
        self.lone_failed = ctypes.c_int32(0)  # set where lone_rows.py's op lacked memory: raised after compute
        self._closed = False

    # --- inputs ---------------------------------------------------------------------------------
    def input(self, name: str, data: np.ndarray, dtype: str | None = None) -> GGMLTensor:
        existing = self._inputs.get(name)
        if existing is not None:
            return existing.tensor
        arr = np.asarray(data)
        type_id = dtype_id(dtype) if dtype is not None else _DTYPE_OF_NUMPY.get(arr.dtype)
        if type_id is None:
            raise ValueError(f"input {name!r}: unsupported NumPy dtype {arr.dtype}")
        arr = np.array(arr, dtype=_NUMPY_OF[type_id], order="C", copy=True)
        ne = list(reversed(arr.shape)) or [1]
        if len(ne) > 4:
            raise ValueError(f"input {name!r}: at most 4 dims, got {arr.shape}")
        ne_arr = (ctypes.c_int64 * len(ne))(*ne)
        t = GGMLTensor(g.ggml_new_tensor(self.ptr, type_id, len(ne), ne_arr), self)
        g.ggml_set_name(t.ptr, name.encode()[:63])
        g.ggml_set_input(t.ptr)
        # the upload's arguments are fixed once (reading an array's address costs microseconds)
        self._inputs[name] = _Input(t, arr, functools.partial(g.ggml_backend_tensor_set, t.ptr, arr.ctypes.data, 0,
                                                              arr.nbytes))
        return t

    def has_input(self, name: str) -> bool:
        return name in self._inputs

    def set_input(self, name: str, data: np.ndarray) -> None:
        if name not in self._inputs:
            raise KeyError(f"graph has no input {name!r}")
        self.set_inputs({name: np.asarray(data)})

    def set_inputs(self, values: dict[str, np.ndarray]) -> None:
        """:meth:`set_input` for each of ``values`` that is an input of this graph; the others
        are skipped (a cache offers inputs that not every graph reads). One call a batch: right
        after GGML has run, every Python call costs microseconds."""
        inputs = self._inputs
        for name, data in values.items():
            inp = inputs.get(name)
            if inp is not None:
                if data.shape != inp.data.shape:
                    raise ValueError(f"input {name!r}: shape {data.shape}, the graph was built for {inp.data.shape}")
                inp.data[...] = data

    def new_tensor(self, dtype: str, shape: Sequence[int]) -> GGMLTensor:
        """An uninitialised tensor allocated with the graph (scratch)."""
        ne = (ctypes.c_int64 * len(shape))(*shape)
        return GGMLTensor(g.ggml_new_tensor(self.ptr, dtype_id(dtype), len(shape), ne), self)

    # --- graph ----------------------------------------------------------------------------------
    def forward(self, *tensors: GGMLTensor) -> None:
        for t in tensors:
            g.ggml_build_forward_expand(self.graph, t.ptr)
        self.version += 1

    @property
    def n_nodes(self) -> int:
        return g.ggml_graph_n_nodes(self.graph)

    def compute(self, *outputs: GGMLTensor, started: threading.Event | None = None) -> None:
        """Run the graph up to ``outputs``. ``started`` is set once the inputs are uploaded: from
        then on :meth:`set_input` (for the next run) no longer affects this one."""
        for t in outputs:
            if t.ptr not in self._outputs:  # a graph computed again is complete already
                g.ggml_set_output(t.ptr)
                g.ggml_build_forward_expand(self.graph, t.ptr)
                self._outputs.add(t.ptr)
                self.version += 1
                if self.n_nodes >= self.max_nodes:
                    raise MemoryError(f"graph too large: {self.n_nodes} nodes (max {self.max_nodes})")
        self.backend._compute(self, started)

    def reserve(self, *outputs: GGMLTensor) -> int:
        """Size the shared allocator for this graph without running it; returns its bytes."""
        for t in outputs:
            g.ggml_set_output(t.ptr)
            g.ggml_build_forward_expand(self.graph, t.ptr)
        self.version += 1
        return self.backend._reserve(self)

    @property
    def stale(self) -> bool:
        """Its tensors were placed in a compute buffer the allocator has since replaced: their
        addresses point into freed memory, and GGML's allocator does not place them again, so
        the graph must be built anew (``Model.prepare`` does)."""
        return self.generation is not None and self.generation != self.backend.generation

    def _upload_inputs(self) -> None:
        for inp in self._inputs.values():
            inp.upload()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            g.ggml_free(self.ptr)
            self._inputs.clear()

    def __del__(self) -> None:  # contexts are cheap to leak but not free to keep
        try:
            self.close()
        except Exception:
            pass


@dataclass
class Storage:
    """Persistent tensors in one backend buffer (zero-filled)."""

    tensors: dict[str, GGMLTensor]
    ctx_ptr: int
    buffer: int
    nbytes: int
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            g.ggml_backend_buffer_free(self.buffer)
            g.ggml_free(self.ctx_ptr)


# ------------------------------------------------------------------------ batch-invariant products
# Weight types GGML's CPU backend multiplies by llamafile's tiles (tinyBLAS) when the right
# operand has 2 rows or more and is contiguous, and by its one-row dot products otherwise; each
# sums in its own order, so a row's result depends on how many rows came with it. The value:
# the type the dot products take the right operand in (GGML's ``vec_dot_type``).
_TILED = {g.GGML_TYPE.F32: g.GGML_TYPE.F32, g.GGML_TYPE.F16: g.GGML_TYPE.F16, g.GGML_TYPE.BF16: g.GGML_TYPE.BF16,
          g.GGML_TYPE.Q8_0: g.GGML_TYPE.Q8_0, g.GGML_TYPE.Q4_0: g.GGML_TYPE.Q8_0, g.GGML_TYPE.Q5_0: g.GGML_TYPE.Q8_0,
          g.GGML_TYPE.IQ4_NL: g.GGML_TYPE.Q8_0}
_ROW_GAP = 32  # elements (one block of any type) left between rows so that they are not contiguous
# the weight types llamafile's quantized tiles (tinyBLAS_Q0) multiply on x86 where not repacked
_TILED_Q0 = frozenset((g.GGML_TYPE.Q8_0, g.GGML_TYPE.Q4_0, g.GGML_TYPE.Q5_0, g.GGML_TYPE.IQ4_NL))
_TILE_ROWS = 4  # the activation rows a tile of them holds


def _pads(w: GGMLTensor, b: GGMLTensor) -> bool:
    """Whether ``w`` times ``b`` is recorded with ``b``'s rows padded to a whole number of tiles.

    llamafile's tiles take the activation rows 4 at a time, then the rows left over in a second
    pass over the whole weight matrix (its ``mnpack``): a 5-row step read SmolLM2's 30 MB
    output matrix twice, 3.4 ms against 2.1-2.2 ms at 4, 8 or 16 rows (perf), and the whole step
    cost more than one of 8 rows. Each sum is
    formed in the same order in every tile shape (``_product``), so zero rows added to make a
    whole tile change no number of the others. Weights only (not attention's products), not
    repacked ones (GGML's repacked kernels take rows otherwise), and more than one tile's rows."""
    n = b.ne[1]
    return (w.ctx is None and w.type_id in _TILED_Q0 and not lone_rows.repacked(w)
            and b.type_id == g.GGML_TYPE.F32 and n > _TILE_ROWS and n % _TILE_ROWS != 0
            and b.ne[2:] == (1, 1) and w.ne[2:] == (1, 1) and b.is_contiguous())


def _padded_product(c: GraphContext, w: GGMLTensor, b: GGMLTensor) -> int:
    """``w`` times ``b`` with ``b``'s rows padded with zero rows to a multiple of _TILE_ROWS
    (``_pads``): the product's first ``n`` columns, as a view."""
    n = b.ne[1]
    padded = g.ggml_pad(c.ptr, b.ptr, 0, -n % _TILE_ROWS, 0, 0)
    product = g.ggml_mul_mat(c.ptr, w.ptr, padded)
    row = g.ggml_tensor.from_address(product).nb[1]
    return g.ggml_view_2d(c.ptr, product, w.ne[1], n, row, 0)


def _rows_apart(c: GraphContext, b: GGMLTensor, kind: int) -> GGMLTensor:
    """``b`` ``[k, n, ...]`` as rows of ``kind`` (the dot products' type) that do not touch: GGML
    then takes every row to its one-row dot products, whatever ``n``, as it takes a row alone.
    The numbers are a lone row's: ``b`` is converted as the product would convert it."""
    k = b.ne[0]
    rows = g.ggml_pad(c.ptr, b.ptr, _ROW_GAP, 0, 0, 0)  # [k + gap, n, ...] f32
    if kind != b.type_id:
        rows = g.ggml_cast(c.ptr, rows, kind)
    row = g.ggml_row_size(kind, k + _ROW_GAP)
    ne1, ne2, ne3 = b.ne[1:]
    return g.ggml_view_4d(c.ptr, rows, k, ne1, ne2, ne3, row, row * ne1, row * ne1 * ne2, 0)


# --------------------------------------------------------------------------------------- repack
def repack_matrices(tensors: dict[str, GGMLTensor], names: Iterable[str]) -> Storage | None:
    """Move the weights ``names`` that GGML's CPU backend can repack (Q4_0, Q4_K, IQ4_NL, ...
    as the build and CPU allow) into its repack buffer, replacing them in ``tensors``; returns
    the storage that now holds them (None when none qualified). Only matrices that are used
    solely as the left operand of ``mulmat`` may be named: a repacked tensor cannot be read
    any other way (``rows``, views).

    This is what llama.cpp does when it loads a model: the repacked kernels are faster, and
    they quantize the activations in their own blocks, so matching llama.cpp's numbers needs
    the same layout."""
    make_buft = g.ggml_backend_cpu_repack_buffer_type
    if make_buft is None:
        return None
    buft = make_buft()
    if not buft:
        return None
    dev = g.ggml_backend_buft_get_device(buft)
    chosen = [n for n in names if n in tensors and _repackable(tensors[n], buft, dev)]
    if not chosen:
        return None
    ctx = _new_ggml_context(len(chosen) + 1)
    moved: dict[str, GGMLTensor] = {}
    for name in chosen:
        src = tensors[name]
        ne = (ctypes.c_int64 * 4)(*src.ne)
        t = GGMLTensor(g.ggml_new_tensor(ctx, src.type_id, 4, ne), None)
        g.ggml_set_name(t.ptr, name.encode()[:63])
        moved[name] = t
    buf = g.ggml_backend_alloc_ctx_tensors_from_buft(ctx, buft)
    if not buf:
        g.ggml_free(ctx)
        raise MemoryError(f"cannot allocate {len(chosen)} repacked weights")
    for name, t in moved.items():
        src = tensors[name]
        g.ggml_backend_tensor_set(t.ptr, src.data_ptr, 0, src.nbytes)  # repacks on the way in
        tensors[name] = t
    return Storage(moved, ctx, buf, g.ggml_backend_buffer_get_size(buf))


def _repackable(w: GGMLTensor, buft: int, dev: int) -> bool:
    """Whether the CPU device runs ``mulmat(w, x)`` with ``w`` in the repack buffer (llama.cpp's
    test: a dummy op whose weight sits in an empty buffer of that type)."""
    if w.dim(2) != 1 or w.dim(3) != 1:
        return False
    ctx = _new_ggml_context(4)
    dummy = g.ggml_backend_buft_alloc_buffer(buft, 0)
    try:
        ne = (ctypes.c_int64 * 2)(w.dim(0), w.dim(1))
        w2 = g.ggml_new_tensor(ctx, w.type_id, 2, ne)
        x = g.ggml_new_tensor_2d(ctx, g.GGML_TYPE.F32, w.dim(0), 512)
        op = g.ggml_mul_mat(ctx, w2, x)
        g.ggml_tensor.from_address(w2).buffer = dummy
        return bool(dummy) and bool(g.ggml_backend_dev_supports_op(dev, op))
    finally:
        if dummy:
            g.ggml_backend_buffer_free(dummy)
        g.ggml_free(ctx)


# --------------------------------------------------------------------------------------- backend
class GGMLBackend:
    """The GGML CPU backend (implements ``runner.ml.backend.Backend``)."""

    def __init__(self, options: BackendOptions | None = None) -> None:
        self.options = options or BackendOptions()
        self.num_threads = self.options.num_threads or default_threads()
        self.flash_attention = self.options.flash_attention
        self.ptr = g.ggml_backend_cpu_init()
        if not self.ptr:
            raise RuntimeError("ggml_backend_cpu_init failed")
        g.ggml_backend_cpu_set_n_threads(self.ptr, self.num_threads)
        g.ggml_backend_cpu_set_use_ref(self.ptr, self.options.batch_invariant)
        self.buft = g.ggml_backend_get_default_buffer_type(self.ptr)
        self.allocator = g.ggml_gallocr_new(self.buft)
        # the graph (and its node count) whose tensors hold addresses in the allocator's buffer
        # now: computing it again unchanged (a decode step reusing its graph) needs no new
        # allocation, as in llama.cpp's graph reuse
        self._allocated: tuple[GraphContext, int] | None = None  # (graph, its version) last placed
        self._placements = 0
        # counts the allocator's buffers: GGML's allocator places a graph's tensors once and keeps
        # their addresses, so a graph placed in a buffer since replaced (grown for a larger graph)
        # points into freed memory; it must be built again (GraphContext.stale)
        self.generation = 0
        self._lock = threading.Lock()
        self._closed = False
        log.debug("GGML CPU backend: %d threads, flash attention %s", self.num_threads, self.flash_attention)

    def set_threads(self, n: int) -> None:
        self.num_threads = n
        g.ggml_backend_cpu_set_n_threads(self.ptr, n)

    def new_context(self, decoded: bool = False, max_nodes: int | None = None) -> GraphContext:
        return GraphContext(self, max_nodes or self.options.max_graph_nodes, decoded)

    def new_storage(self, specs: Iterable[tuple[str, str, Sequence[int]]]) -> Storage:
        specs = list(specs)
        need = sum(g.ggml_row_size(dtype_id(dt), int(shape[0])) * int(np.prod(shape[1:])) for _, dt, shape in specs)
        avail = available_memory()
        if avail is not None and need > avail:
            raise MemoryError(f"need {need / 2**20:.0f} MiB, {avail / 2**20:.0f} MiB of memory available")
        ctx = _new_ggml_context(len(specs) + 1)
        tensors: dict[str, GGMLTensor] = {}
        for name, dtype, shape in specs:
            ne = (ctypes.c_int64 * len(shape))(*shape)
            t = GGMLTensor(g.ggml_new_tensor(ctx, dtype_id(dtype), len(shape), ne), None)
            g.ggml_set_name(t.ptr, name.encode()[:63])
            tensors[name] = t
        buf = g.ggml_backend_alloc_ctx_tensors(ctx, self.ptr)
        if not buf:
            g.ggml_free(ctx)
            total = sum(int(np.prod(s)) for _, _, s in specs)
            raise MemoryError(f"cannot allocate storage for {len(specs)} tensors ({total} elements)")
        g.ggml_backend_buffer_clear(buf, 0)
        return Storage(tensors, ctx, buf, g.ggml_backend_buffer_get_size(buf))

    def cache_config(self) -> CacheConfig:
        """Ollama's GGML cache layout: history padded to 256 cells; flash attention wants an
        f16 mask and V stored like K; without it the mask is f32 and V is stored transposed
        (``permuted_v``) so ``V^T softmax(K^T Q)`` needs no copy of V. A sliding window's cells
        go round the cache (``cells_in_order``, as llama.cpp's head moves on past each batch):
        a verified draft's rows then meet the window's cells in the order its tokens decoded
        alone would (gemma-3-270m's rewrite in test_spec_models parted past its window without;
        the decode rate at 1,345 positions read the same, within the machine's noise)."""
        in_order = True
        if self.flash_attention:
            return CacheConfig(cache_padding=256, mask_dtype="f16", permuted_v=False, cells_in_order=in_order)
        return CacheConfig(cache_padding=256, mask_dtype="f32", permuted_v=True, cells_in_order=in_order)

    @property
    def compute_buffer_size(self) -> int:
        """Bytes of the shared graph allocator's buffer."""
        return g.ggml_gallocr_get_buffer_size(self.allocator, 0)

    # --- running graphs -------------------------------------------------------------------------
    def _reserve(self, ctx: GraphContext) -> int:
        with self._lock:
            self._allocated = None  # the buffer may have grown: every graph is placed again
            size = self.compute_buffer_size
            if not g.ggml_gallocr_reserve(self.allocator, ctx.graph):
                raise MemoryError("cannot allocate the compute buffer for the worst-case graph")
            if self.compute_buffer_size != size:
                self.generation += 1
            return self.compute_buffer_size

    def _compute(self, ctx: GraphContext, started: threading.Event | None = None) -> None:
        with self._lock:
            placed = (ctx, ctx.version)  # (not ggml_graph_n_nodes: a ctypes call a token)
            if self._allocated != placed:
                if ctx.stale:
                    raise RuntimeError("a graph placed in a compute buffer since replaced: build it again")
                self._allocated = None
                size = self.compute_buffer_size
                if not g.ggml_gallocr_alloc_graph(self.allocator, ctx.graph):
                    raise MemoryError("cannot allocate the compute graph")
                if self.compute_buffer_size != size:  # a new, larger buffer: every other graph is stale
                    self.generation += 1
                ctx.generation = self.generation
                self._allocated = placed
                self._placements += 1
                ctx.placement = self._placements
            ctx._upload_inputs()
            if started is not None:
                started.set()
            status = g.ggml_backend_graph_compute(self.ptr, ctx.graph)
        if status != g.GGML_STATUS_SUCCESS:
            raise RuntimeError(f"ggml_backend_graph_compute failed with status {status}")
        if ctx.lone_failed.value:  # its numbers were not computed (lone_rows.py)
            ctx.lone_failed.value = 0
            raise MemoryError("no memory for the lone-row products' quantized rows")

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            g.ggml_gallocr_free(self.allocator)
            g.ggml_backend_free(self.ptr)
