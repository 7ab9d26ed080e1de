"""ctypes bindings to the GGML shared libraries that the llama-cpp-python wheel installs.

The libraries live in ``site-packages/llama_cpp/lib/`` (``libggml-base``, ``libggml-cpu``,
``libggml``), or where ``LLAMA_CPP_LIB_PATH`` says (as for llama-cpp-python itself). They are loaded with ``RTLD_GLOBAL`` so that a process which also imports
``llama_cpp`` (the old engine, the parity tests) shares one copy of GGML's global state. The
``llama_cpp`` package itself is *not* imported: we only locate its folder.

Every function bound here has ``argtypes`` and ``restype`` set, so a call with the wrong number
or kind of arguments raises ``ctypes.ArgumentError`` instead of corrupting memory. Opaque
pointers (contexts, tensors, graphs, backends, buffers, allocators) travel as ``int`` (``c_void_p``);
``None`` is NULL. Signatures follow ``ggml.h``, ``ggml-alloc.h``, ``ggml-backend.h``,
``ggml-cpu.h`` and ``gguf.h`` of the vendored llama.cpp (ggml 0.25.x).

GGML's own asserts (``GGML_ASSERT``) abort the process: shape checks that matter are done in
Python before the call (see ``runner.ml.ggml.backend``).
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import sys
import threading
from contextlib import contextmanager
from ctypes import (
    POINTER,
    Structure,
    c_bool,
    c_char,
    c_char_p,
    c_double,
    c_float,
    c_int,
    c_int8,
    c_int16,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path
from typing import Any, Callable, Iterator

from ...config import llama_cpp_lib_path

__all__ = ["LIB_DIR", "GGML_TYPE", "GGUF_TYPE", "ggml_init_params", "ggml_tensor", "gguf_init_params"]


# ------------------------------------------------------------------------------- library loading
def _lib_dir() -> Path:
    """The folder of the GGML libraries: ``LLAMA_CPP_LIB_PATH`` when set (a GPU build's
    libraries, say), read as llama-cpp-python reads it, so both engines load the same files
    (one copy of GGML's registry and state per process); else ``site-packages/llama_cpp/lib`` of
    the installed llama-cpp-python (located, not imported)."""
    override = llama_cpp_lib_path()
    if override is not None:
        return override
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("llama-cpp-python is not installed: the GGML libraries come from its wheel")
    return Path(list(spec.submodule_search_locations)[0]) / "lib"


def _lib_file(name: str) -> Path:
    """The file of library ``name`` in :data:`LIB_DIR` that llama.cpp's own libraries load.

    They name their GGML dependencies by SONAME (``libllama.so`` needs ``libggml.so.0``, found
    beside it), and a wheel stores ``libggml-cpu.so``, ``.so.0`` and ``.so.0.25.3`` as three
    copies of one file, not links. Loading ``libggml-cpu.so`` after llama.cpp had loaded
    ``libggml-cpu.so.0`` mapped a second GGML into the process (in whichever order the two
    engines' modules were imported): its own registry, its own buffer types (the old engine then
    did not know llama.cpp's repacked weights for what they were), its own tables. So on ELF
    systems the shortest versioned name (``libggml-cpu.so.0``: the SONAME) is loaded, where
    there is one; the dynamic loader then keeps one copy whichever side loads it first."""
    if sys.platform in ("darwin", "win32"):
        return LIB_DIR / f"{name}{'.dylib' if sys.platform == 'darwin' else '.dll'}"
    versioned = sorted(LIB_DIR.glob(f"{name}.so.*"), key=lambda p: (len(p.name), p.name))
    return versioned[0] if versioned else LIB_DIR / f"{name}.so"


def _load(name: str) -> ctypes.CDLL:
    path = _lib_file(name)
    if not path.exists():
        raise ImportError(f"GGML library not found: {path}")
    return ctypes.CDLL(str(path), mode=ctypes.RTLD_GLOBAL)


LIB_DIR = _lib_dir()
_base = _load("libggml-base")
_cpu = _load("libggml-cpu")
_ggml = _load("libggml")


def _bind(lib: ctypes.CDLL, name: str, restype: Any, argtypes: list[Any]) -> Callable[..., Any]:
    fn = getattr(lib, name)
    fn.restype = restype
    fn.argtypes = argtypes
    return fn


# ------------------------------------------------------------------------------------ constants
class GGML_TYPE:
    """``enum ggml_type`` (the values we use)."""

    F32 = 0
    F16 = 1
    Q4_0 = 2
    Q4_1 = 3
    Q5_0 = 6
    Q5_1 = 7
    Q8_0 = 8
    Q8_1 = 9
    Q2_K = 10
    Q3_K = 11
    Q4_K = 12
    Q5_K = 13
    Q6_K = 14
    Q8_K = 15
    IQ4_NL = 20
    I8 = 24
    I16 = 25
    I32 = 26
    I64 = 27
    F64 = 28
    BF16 = 30
    COUNT = 43


class GGUF_TYPE:
    """``enum gguf_type``."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


GGML_ROPE_TYPE_NORMAL = 0
GGML_ROPE_TYPE_NEOX = 2
GGML_PREC_F32 = 10
GGML_SORT_ORDER_DESC = 1  # enum ggml_sort_order: ASC, DESC
GGML_OP_POOL_AVG = 1  # enum ggml_op_pool: MAX, AVG
GGML_STATUS_SUCCESS = 0
GGML_DEFAULT_GRAPH_SIZE = 2048
GGML_BACKEND_BUFFER_USAGE_WEIGHTS = 1
GGML_BACKEND_BUFFER_USAGE_COMPUTE = 2


# -------------------------------------------------------------------------------------- structs
class ggml_init_params(Structure):
    _fields_ = [("mem_size", c_size_t), ("mem_buffer", c_void_p), ("no_alloc", c_bool)]


class ggml_tensor(Structure):
    """``struct ggml_tensor`` (GGML_MAX_DIMS 4, GGML_MAX_SRC 10, GGML_MAX_OP_PARAMS 64,
    GGML_MAX_NAME 64). Read-only use: shapes, strides, type, data pointer."""

    _fields_ = [
        ("type", c_int),
        ("buffer", c_void_p),
        ("ne", c_int64 * 4),
        ("nb", c_size_t * 4),
        ("op", c_int),
        ("op_params", c_int32 * 16),
        ("flags", c_int32),
        ("src", c_void_p * 10),
        ("view_src", c_void_p),
        ("view_offs", c_size_t),
        ("data", c_void_p),
        ("name", c_char * 64),
        ("extra", c_void_p),
        ("padding", c_char * 8),
    ]


class gguf_init_params(Structure):
    _fields_ = [("no_alloc", c_bool), ("ctx", POINTER(c_void_p))]


P = c_void_p  # opaque pointer
I64 = c_int64
F = c_float

# ------------------------------------------------------------------------------ ggml.h: context
ggml_init = _bind(_base, "ggml_init", P, [ggml_init_params])
ggml_free = _bind(_base, "ggml_free", None, [P])
ggml_tensor_overhead = _bind(_base, "ggml_tensor_overhead", c_size_t, [])
ggml_graph_overhead_custom = _bind(_base, "ggml_graph_overhead_custom", c_size_t, [c_size_t, c_bool])
ggml_type_size = _bind(_base, "ggml_type_size", c_size_t, [c_int])
ggml_blck_size = _bind(_base, "ggml_blck_size", I64, [c_int])
ggml_row_size = _bind(_base, "ggml_row_size", c_size_t, [c_int, I64])
ggml_type_name = _bind(_base, "ggml_type_name", c_char_p, [c_int])
ggml_is_quantized = _bind(_base, "ggml_is_quantized", c_bool, [c_int])
ggml_nbytes = _bind(_base, "ggml_nbytes", c_size_t, [P])
ggml_nelements = _bind(_base, "ggml_nelements", I64, [P])
ggml_is_contiguous = _bind(_base, "ggml_is_contiguous", c_bool, [P])
ggml_can_repeat = _bind(_base, "ggml_can_repeat", c_bool, [P, P])
ggml_are_same_shape = _bind(_base, "ggml_are_same_shape", c_bool, [P, P])
ggml_op_desc = _bind(_base, "ggml_op_desc", c_char_p, [P])
ggml_op_name = _bind(_base, "ggml_op_name", c_char_p, [c_int])


def op_id(name: str) -> int:
    """``enum ggml_op``'s value of the op GGML names ``name`` ("MUL_MAT", "CUSTOM")."""
    for op in range(256):  # GGML_OP_COUNT is ~90: an op this build has is found before
        if ggml_op_name(op) == name.encode():
            return op
    raise LookupError(f"this GGML build has no op {name}")

# ------------------------------------------------------------------------------ ggml.h: tensors
ggml_new_tensor = _bind(_base, "ggml_new_tensor", P, [P, c_int, c_int, POINTER(I64)])
ggml_new_tensor_1d = _bind(_base, "ggml_new_tensor_1d", P, [P, c_int, I64])
ggml_new_tensor_2d = _bind(_base, "ggml_new_tensor_2d", P, [P, c_int, I64, I64])
ggml_new_tensor_3d = _bind(_base, "ggml_new_tensor_3d", P, [P, c_int, I64, I64, I64])
ggml_new_tensor_4d = _bind(_base, "ggml_new_tensor_4d", P, [P, c_int, I64, I64, I64, I64])
ggml_set_name = _bind(_base, "ggml_set_name", P, [P, c_char_p])
ggml_get_name = _bind(_base, "ggml_get_name", c_char_p, [P])
ggml_set_input = _bind(_base, "ggml_set_input", None, [P])
ggml_set_output = _bind(_base, "ggml_set_output", None, [P])

# ---------------------------------------------------------------------------------- ggml.h: ops
ggml_dup = _bind(_base, "ggml_dup", P, [P, P])
ggml_add = _bind(_base, "ggml_add", P, [P, P, P])
ggml_mul = _bind(_base, "ggml_mul", P, [P, P, P])
ggml_scale = _bind(_base, "ggml_scale", P, [P, P, F])
ggml_rms_norm = _bind(_base, "ggml_rms_norm", P, [P, P, F])
ggml_norm = _bind(_base, "ggml_norm", P, [P, P, F])
ggml_pool_2d = _bind(_base, "ggml_pool_2d", P, [P, P, c_int, c_int, c_int, c_int, c_int, F, F])
ggml_silu = _bind(_base, "ggml_silu", P, [P, P])
ggml_swiglu_split = _bind(_base, "ggml_swiglu_split", P, [P, P, P])
ggml_gelu = _bind(_base, "ggml_gelu", P, [P, P])
ggml_geglu_split = _bind(_base, "ggml_geglu_split", P, [P, P, P])
ggml_tanh = _bind(_base, "ggml_tanh", P, [P, P])
ggml_mul_mat = _bind(_base, "ggml_mul_mat", P, [P, P, P])
ggml_prec_set_acc = _bind(_base, "ggml_prec_set_acc", c_bool, [P, c_int])
ggml_get_rows = _bind(_base, "ggml_get_rows", P, [P, P, P])
ggml_top_k = _bind(_base, "ggml_top_k", P, [P, P, c_int])
ggml_argsort = _bind(_base, "ggml_argsort", P, [P, P, c_int])
ggml_set_rows = _bind(_base, "ggml_set_rows", P, [P, P, P, P])
ggml_cpy = _bind(_base, "ggml_cpy", P, [P, P, P])
ggml_cast = _bind(_base, "ggml_cast", P, [P, P, c_int])
ggml_cont = _bind(_base, "ggml_cont", P, [P, P])
ggml_pad = _bind(_base, "ggml_pad", P, [P, P, c_int, c_int, c_int, c_int])
# (ctx, type, ne0..ne3, args, n_args, fun (a ggml_custom_op_t's address), n_tasks, userdata)
ggml_custom_4d = _bind(_base, "ggml_custom_4d", P, [P, c_int, I64, I64, I64, I64, POINTER(P), c_int, P, c_int, P])
GGML_N_TASKS_MAX = -1
ggml_cont_2d = _bind(_base, "ggml_cont_2d", P, [P, P, I64, I64])
ggml_cont_3d = _bind(_base, "ggml_cont_3d", P, [P, P, I64, I64, I64])
ggml_reshape_1d = _bind(_base, "ggml_reshape_1d", P, [P, P, I64])
ggml_reshape_2d = _bind(_base, "ggml_reshape_2d", P, [P, P, I64, I64])
ggml_reshape_3d = _bind(_base, "ggml_reshape_3d", P, [P, P, I64, I64, I64])
ggml_reshape_4d = _bind(_base, "ggml_reshape_4d", P, [P, P, I64, I64, I64, I64])
ggml_view_1d = _bind(_base, "ggml_view_1d", P, [P, P, I64, c_size_t])
ggml_view_2d = _bind(_base, "ggml_view_2d", P, [P, P, I64, I64, c_size_t, c_size_t])
ggml_view_3d = _bind(_base, "ggml_view_3d", P, [P, P, I64, I64, I64, c_size_t, c_size_t, c_size_t])
ggml_view_4d = _bind(
    _base, "ggml_view_4d", P, [P, P, I64, I64, I64, I64, c_size_t, c_size_t, c_size_t, c_size_t]
)
ggml_permute = _bind(_base, "ggml_permute", P, [P, P, c_int, c_int, c_int, c_int])
ggml_transpose = _bind(_base, "ggml_transpose", P, [P, P])
ggml_soft_max_ext = _bind(_base, "ggml_soft_max_ext", P, [P, P, P, F, F])
ggml_rope_ext = _bind(
    _base, "ggml_rope_ext", P, [P, P, P, P, c_int, c_int, c_int, F, F, F, F, F, F]
)
ggml_flash_attn_ext = _bind(_base, "ggml_flash_attn_ext", P, [P, P, P, P, P, F, F, F])

# -------------------------------------------------------------------------------- ggml.h: graph
ggml_new_graph_custom = _bind(_base, "ggml_new_graph_custom", P, [P, c_size_t, c_bool])
ggml_build_forward_expand = _bind(_base, "ggml_build_forward_expand", None, [P, P])
ggml_graph_n_nodes = _bind(_base, "ggml_graph_n_nodes", c_int, [P])
ggml_graph_node = _bind(_base, "ggml_graph_node", P, [P, c_int])

# ------------------------------------------------------------------------------- ggml-backend.h
ggml_backend_free = _bind(_base, "ggml_backend_free", None, [P])
ggml_backend_name = _bind(_base, "ggml_backend_name", c_char_p, [P])
ggml_backend_get_default_buffer_type = _bind(_base, "ggml_backend_get_default_buffer_type", P, [P])
ggml_backend_graph_compute = _bind(_base, "ggml_backend_graph_compute", c_int, [P, P])
ggml_backend_buft_name = _bind(_base, "ggml_backend_buft_name", c_char_p, [P])
ggml_backend_buffer_free = _bind(_base, "ggml_backend_buffer_free", None, [P])
ggml_backend_buffer_get_base = _bind(_base, "ggml_backend_buffer_get_base", P, [P])
ggml_backend_buffer_is_host = _bind(_base, "ggml_backend_buffer_is_host", c_bool, [P])
ggml_backend_buffer_get_type = _bind(_base, "ggml_backend_buffer_get_type", P, [P])
ggml_backend_buffer_get_size = _bind(_base, "ggml_backend_buffer_get_size", c_size_t, [P])
ggml_backend_buffer_clear = _bind(_base, "ggml_backend_buffer_clear", None, [P, c_uint8])
ggml_backend_buffer_set_usage = _bind(_base, "ggml_backend_buffer_set_usage", None, [P, c_int])
ggml_backend_tensor_set = _bind(_base, "ggml_backend_tensor_set", None, [P, P, c_size_t, c_size_t])
ggml_backend_tensor_get = _bind(_base, "ggml_backend_tensor_get", None, [P, P, c_size_t, c_size_t])
ggml_backend_tensor_alloc = _bind(_base, "ggml_backend_tensor_alloc", c_int, [P, P, P])
ggml_backend_cpu_buffer_from_ptr = _bind(_base, "ggml_backend_cpu_buffer_from_ptr", P, [P, c_size_t])

# --------------------------------------------------------------------------------- ggml-alloc.h
ggml_gallocr_new = _bind(_base, "ggml_gallocr_new", P, [P])
ggml_gallocr_free = _bind(_base, "ggml_gallocr_free", None, [P])
ggml_gallocr_reserve = _bind(_base, "ggml_gallocr_reserve", c_bool, [P, P])
ggml_gallocr_alloc_graph = _bind(_base, "ggml_gallocr_alloc_graph", c_bool, [P, P])
ggml_gallocr_get_buffer_size = _bind(_base, "ggml_gallocr_get_buffer_size", c_size_t, [P, c_int])
ggml_backend_alloc_ctx_tensors = _bind(_base, "ggml_backend_alloc_ctx_tensors", P, [P, P])
ggml_backend_alloc_ctx_tensors_from_buft = _bind(_base, "ggml_backend_alloc_ctx_tensors_from_buft", P, [P, P])
ggml_backend_buft_alloc_buffer = _bind(_base, "ggml_backend_buft_alloc_buffer", P, [P, c_size_t])
ggml_backend_buft_get_device = _bind(_base, "ggml_backend_buft_get_device", P, [P])
ggml_backend_dev_supports_op = _bind(_base, "ggml_backend_dev_supports_op", c_bool, [P, P])

# ------------------------------------------------------- ggml-backend.h: the device registry
# The registry (libggml) holds every backend this build has (CPU; CUDA, Metal, Vulkan, ... when
# compiled in) and their devices; a device's functions live in libggml-base.
GGML_BACKEND_DEVICE_TYPE_CPU = 0
GGML_BACKEND_DEVICE_TYPE_GPU = 1
GGML_BACKEND_DEVICE_TYPE_IGPU = 2
GGML_BACKEND_DEVICE_TYPE_ACCEL = 3
GGML_BACKEND_DEVICE_TYPE_META = 4
ggml_backend_dev_count = _bind(_ggml, "ggml_backend_dev_count", c_size_t, [])
ggml_backend_dev_get = _bind(_ggml, "ggml_backend_dev_get", P, [c_size_t])
ggml_backend_dev_name = _bind(_base, "ggml_backend_dev_name", c_char_p, [P])
ggml_backend_dev_description = _bind(_base, "ggml_backend_dev_description", c_char_p, [P])
ggml_backend_dev_memory = _bind(_base, "ggml_backend_dev_memory", None, [P, POINTER(c_size_t), POINTER(c_size_t)])
ggml_backend_dev_type = _bind(_base, "ggml_backend_dev_type", c_int, [P])
ggml_backend_dev_backend_reg = _bind(_base, "ggml_backend_dev_backend_reg", P, [P])
ggml_backend_reg_name = _bind(_base, "ggml_backend_reg_name", c_char_p, [P])
ggml_backend_get_device = _bind(_base, "ggml_backend_get_device", P, [P])

# ----------------------------------------------------------------------------------- ggml-cpu.h
ggml_backend_cpu_init = _bind(_cpu, "ggml_backend_cpu_init", P, [])
ggml_backend_cpu_set_n_threads = _bind(_cpu, "ggml_backend_cpu_set_n_threads", None, [P, c_int])
ggml_backend_cpu_set_use_ref = _bind(_cpu, "ggml_backend_cpu_set_use_ref", None, [P, c_bool])
ggml_cpu_has_avx2 = _bind(_cpu, "ggml_cpu_has_avx2", c_int, [])
ggml_cpu_init = _bind(_cpu, "ggml_cpu_init", None, [])


def cpu_function(name: str) -> int | None:
    """The address of ``libggml-cpu``'s exported C function ``name`` (kernels handed to our own
    C code: ``quantize_row_q8_1``, ``ggml_vec_dot_q4_1_q8_1``); None where this build has none."""
    try:
        return ctypes.cast(getattr(_cpu, name), ctypes.c_void_p).value
    except AttributeError:
        return None


def _cpu_repack_buffer_type() -> Callable[[], Any] | None:
    """``ggml_backend_cpu_repack_buffer_type()``: the buffer type whose tensors GGML stores in the
    interleaved layouts its fastest CPU matmul kernels read (what llama.cpp loads Q4_0/Q4_K/...
    weights into). A C++ function: only its mangled name is exported; None if this build has
    none."""
    try:
        fn = getattr(_cpu, "_Z35ggml_backend_cpu_repack_buffer_typev")
    except AttributeError:
        return None
    fn.restype, fn.argtypes = P, []
    return fn


ggml_backend_cpu_repack_buffer_type = _cpu_repack_buffer_type()

# --------------------------------------------------------------------------------------- gguf.h
gguf_init_from_file = _bind(_base, "gguf_init_from_file", P, [c_char_p, gguf_init_params])
gguf_free = _bind(_base, "gguf_free", None, [P])
gguf_get_version = _bind(_base, "gguf_get_version", c_uint32, [P])
gguf_get_alignment = _bind(_base, "gguf_get_alignment", c_size_t, [P])
gguf_get_data_offset = _bind(_base, "gguf_get_data_offset", c_size_t, [P])
gguf_get_n_kv = _bind(_base, "gguf_get_n_kv", I64, [P])
gguf_find_key = _bind(_base, "gguf_find_key", I64, [P, c_char_p])
gguf_get_key = _bind(_base, "gguf_get_key", c_char_p, [P, I64])
gguf_get_kv_type = _bind(_base, "gguf_get_kv_type", c_int, [P, I64])
gguf_get_arr_type = _bind(_base, "gguf_get_arr_type", c_int, [P, I64])
gguf_get_val_u8 = _bind(_base, "gguf_get_val_u8", c_uint8, [P, I64])
gguf_get_val_i8 = _bind(_base, "gguf_get_val_i8", c_int8, [P, I64])
gguf_get_val_u16 = _bind(_base, "gguf_get_val_u16", c_uint16, [P, I64])
gguf_get_val_i16 = _bind(_base, "gguf_get_val_i16", c_int16, [P, I64])
gguf_get_val_u32 = _bind(_base, "gguf_get_val_u32", c_uint32, [P, I64])
gguf_get_val_i32 = _bind(_base, "gguf_get_val_i32", c_int32, [P, I64])
gguf_get_val_f32 = _bind(_base, "gguf_get_val_f32", c_float, [P, I64])
gguf_get_val_u64 = _bind(_base, "gguf_get_val_u64", c_uint64, [P, I64])
gguf_get_val_i64 = _bind(_base, "gguf_get_val_i64", c_int64, [P, I64])
gguf_get_val_f64 = _bind(_base, "gguf_get_val_f64", c_double, [P, I64])
gguf_get_val_bool = _bind(_base, "gguf_get_val_bool", c_bool, [P, I64])
gguf_get_val_str = _bind(_base, "gguf_get_val_str", c_char_p, [P, I64])
gguf_get_arr_n = _bind(_base, "gguf_get_arr_n", c_size_t, [P, I64])
gguf_get_arr_data = _bind(_base, "gguf_get_arr_data", P, [P, I64])
gguf_get_arr_str = _bind(_base, "gguf_get_arr_str", c_char_p, [P, I64, c_size_t])
gguf_get_n_tensors = _bind(_base, "gguf_get_n_tensors", I64, [P])
gguf_find_tensor = _bind(_base, "gguf_find_tensor", I64, [P, c_char_p])
gguf_get_tensor_offset = _bind(_base, "gguf_get_tensor_offset", c_size_t, [P, I64])
gguf_get_tensor_name = _bind(_base, "gguf_get_tensor_name", c_char_p, [P, I64])
gguf_get_tensor_ne = _bind(_base, "gguf_get_tensor_ne", POINTER(I64), [P, I64])
gguf_get_tensor_type = _bind(_base, "gguf_get_tensor_type", c_int, [P, I64])
gguf_get_tensor_size = _bind(_base, "gguf_get_tensor_size", c_size_t, [P, I64])


# -------------------------------------------------------------------------------------- logging
# GGML writes its messages (gguf_init_from_file's reasons for refusing a file, backend chatter) to
# stderr unless told otherwise. Route them into Python logging, logger "ggml": errors as errors,
# the rest as debug. llama.cpp's llama_log_set points the same hook at its own callback, which
# logs too (logger "llama.cpp"), so whichever was set last, nothing reaches stderr directly.
GGML_LOG_LEVEL_ERROR = 4
GGML_LOG_LEVEL_CONT = 5
ggml_log_callback = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)
ggml_log_set = _bind(_base, "ggml_log_set", None, [ggml_log_callback, c_void_p])
ggml_log = logging.getLogger("ggml")
_log_state = threading.local()


def _on_ggml_log(level: int, text: bytes | None, _user: Any) -> None:
    if level == GGML_LOG_LEVEL_CONT:
        level = getattr(_log_state, "level", 1)
    _log_state.level = level
    message = (text or b"").decode("utf-8", errors="replace").rstrip("\n")
    if message:
        ggml_log.log(logging.ERROR if level == GGML_LOG_LEVEL_ERROR else logging.DEBUG, "%s", message)


_LOG_CALLBACK = ggml_log_callback(_on_ggml_log)  # kept alive for the process's lifetime
ggml_log_set(_LOG_CALLBACK, None)


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.errors: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            self.errors.append(record.getMessage())


@contextmanager
def captured_errors() -> Iterator[list[str]]:
    """Collect the error lines GGML logs meanwhile (for an exception's message) instead of
    showing them; they still reach the log with OLLAMA_DEBUG. The hook is set again first, in
    case llama.cpp took it."""
    ggml_log_set(_LOG_CALLBACK, None)
    handler = _Lines()
    old_propagate = ggml_log.propagate
    ggml_log.addHandler(handler)
    ggml_log.propagate = logging.getLogger().isEnabledFor(logging.DEBUG)
    try:
        yield handler.errors
    finally:
        ggml_log.removeHandler(handler)
        ggml_log.propagate = old_propagate


# --------------------------------------------------------------------------------- sanity check
def _check_layout() -> None:
    """The ctypes ``ggml_tensor`` must match the library's (``ggml_tensor_overhead`` is
    ``sizeof(ggml_object) + sizeof(ggml_tensor)``; ``ggml_object`` is 32 bytes on 64-bit)."""
    expected = ggml_tensor_overhead() - 32
    if ctypes.sizeof(ggml_tensor) != expected:
        raise ImportError(
            f"ggml_tensor layout mismatch: ctypes {ctypes.sizeof(ggml_tensor)} bytes, "
            f"library {expected} bytes (GGML built with other GGML_MAX_* values?)"
        )


_check_layout()
