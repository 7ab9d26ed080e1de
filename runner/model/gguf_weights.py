"""Open a GGUF file: metadata (hyperparameters) and weights, mmap-ed into a GGML backend buffer.

Parsing goes through GGML's own ``gguf_init_from_file`` (C, so the 49k-token vocabulary of
SmolLM2 costs milliseconds, not the second that a pure-Python reader needs). The weights are not
read at all: the file is mapped read-only, the mapping is wrapped as a CPU backend buffer
(``ggml_backend_cpu_buffer_from_ptr``) and every tensor points into it, in its stored type
(F32/F16/Q4_0/Q4_1/Q8_0/K-quants). Pages come in from the page cache on first use, as with
llama.cpp's mmap.

    f = GGUFFile.open(path)            # metadata only
    f.arch, f.get("llama.block_count") # -> "llama", 30
    w = f.load_weights()               # -> Weights: name -> GGMLTensor (no copy)
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from runner.ml.ggml import bindings as g
from runner.ml.ggml.backend import GGMLTensor, Storage, dtype_name, repack_matrices

log = logging.getLogger(__name__)

__all__ = ["GGUFError", "GGUFFile", "TensorInfo", "Weights"]


class GGUFError(ValueError):
    """The file is not a readable GGUF, or lacks something the model needs."""


_SCALAR_GETTERS = {
    g.GGUF_TYPE.UINT8: g.gguf_get_val_u8,
    g.GGUF_TYPE.INT8: g.gguf_get_val_i8,
    g.GGUF_TYPE.UINT16: g.gguf_get_val_u16,
    g.GGUF_TYPE.INT16: g.gguf_get_val_i16,
    g.GGUF_TYPE.UINT32: g.gguf_get_val_u32,
    g.GGUF_TYPE.INT32: g.gguf_get_val_i32,
    g.GGUF_TYPE.FLOAT32: g.gguf_get_val_f32,
    g.GGUF_TYPE.UINT64: g.gguf_get_val_u64,
    g.GGUF_TYPE.INT64: g.gguf_get_val_i64,
    g.GGUF_TYPE.FLOAT64: g.gguf_get_val_f64,
    g.GGUF_TYPE.BOOL: g.gguf_get_val_bool,
}
_ARRAY_NUMPY = {
    g.GGUF_TYPE.UINT8: np.uint8,
    g.GGUF_TYPE.INT8: np.int8,
    g.GGUF_TYPE.UINT16: np.uint16,
    g.GGUF_TYPE.INT16: np.int16,
    g.GGUF_TYPE.UINT32: np.uint32,
    g.GGUF_TYPE.INT32: np.int32,
    g.GGUF_TYPE.FLOAT32: np.float32,
    g.GGUF_TYPE.UINT64: np.uint64,
    g.GGUF_TYPE.INT64: np.int64,
    g.GGUF_TYPE.FLOAT64: np.float64,
    g.GGUF_TYPE.BOOL: np.bool_,
}


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as stored: GGML shape (ne0 first), type name, byte offset in the file, size."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    type_id: int
    offset: int
    nbytes: int


class GGUFFile:
    """The metadata and tensor directory of one GGUF file (weights not loaded)."""

    def __init__(self, path: str | os.PathLike[str], ctx: int) -> None:
        self.path = Path(path)
        self._ctx = ctx
        self._cache: dict[str, Any] = {}
        self.data_offset = g.gguf_get_data_offset(ctx)
        self.tensors: dict[str, TensorInfo] = {}
        for i in range(g.gguf_get_n_tensors(ctx)):
            name = g.gguf_get_tensor_name(ctx, i).decode()
            ne_ptr = g.gguf_get_tensor_ne(ctx, i)
            ne = [ne_ptr[d] for d in range(4)]
            n = 4
            while n > 1 and ne[n - 1] == 1:
                n -= 1
            type_id = g.gguf_get_tensor_type(ctx, i)
            self.tensors[name] = TensorInfo(
                name=name,
                shape=tuple(ne[:n]),
                dtype=dtype_name(type_id),
                type_id=type_id,
                offset=self.data_offset + g.gguf_get_tensor_offset(ctx, i),
                nbytes=g.gguf_get_tensor_size(ctx, i),
            )

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> GGUFFile:
        """Parse ``path``'s header. Raises :class:`GGUFError` if it is not a GGUF file."""
        p = Path(path)
        if not p.is_file():
            raise GGUFError(f"no such model file: {p}")
        params = g.gguf_init_params(True, None)
        with g.captured_errors() as errors:
            ctx = g.gguf_init_from_file(os.fsencode(p), params)
        if not ctx:
            reasons = [e.split(": ", 1)[-1] for e in errors if "failed to" not in e]
            raise GGUFError(f"not a valid GGUF file: {p}" + (f" ({reasons[0]})" if reasons else ""))
        return cls(p, ctx)

    def close(self) -> None:
        if self._ctx:
            g.gguf_free(self._ctx)
            self._ctx = 0

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # --- metadata -------------------------------------------------------------------------------
    @property
    def arch(self) -> str:
        """``general.architecture`` (e.g. ``"llama"``, ``"qwen2"``)."""
        arch = self.get("general.architecture")
        if not isinstance(arch, str):
            raise GGUFError(f"{self.path}: missing general.architecture")
        return arch

    def keys(self) -> list[str]:
        return [g.gguf_get_key(self._ctx, i).decode() for i in range(g.gguf_get_n_kv(self._ctx))]

    def __contains__(self, key: str) -> bool:
        return g.gguf_find_key(self._ctx, key.encode()) >= 0

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key``: int/float/bool/str for scalars, a NumPy array for numeric
        arrays, a ``list[str]`` for string arrays; ``default`` when absent."""
        if key in self._cache:
            return self._cache[key]
        kid = g.gguf_find_key(self._ctx, key.encode())
        if kid < 0:
            return default
        kind = g.gguf_get_kv_type(self._ctx, kid)
        value: Any
        if kind == g.GGUF_TYPE.STRING:
            value = g.gguf_get_val_str(self._ctx, kid).decode("utf-8", errors="replace")
        elif kind == g.GGUF_TYPE.ARRAY:
            value = self._array(kid)
        else:
            value = _SCALAR_GETTERS[kind](self._ctx, kid)
        self._cache[key] = value
        return value

    def _array(self, kid: int) -> Any:
        n = g.gguf_get_arr_n(self._ctx, kid)
        kind = g.gguf_get_arr_type(self._ctx, kid)
        if kind == g.GGUF_TYPE.STRING:
            get = g.gguf_get_arr_str
            return [get(self._ctx, kid, i).decode("utf-8", errors="replace") for i in range(n)]
        np_type = _ARRAY_NUMPY.get(kind)
        if np_type is None:
            raise GGUFError(f"unsupported GGUF array type {kind}")
        if n == 0:
            return np.zeros(0, dtype=np_type)
        ptr = g.gguf_get_arr_data(self._ctx, kid)
        nbytes = n * np.dtype(np_type).itemsize
        raw = ctypes.string_at(ptr, nbytes)
        return np.frombuffer(raw, dtype=np_type).copy()

    def arch_get(self, key: str, default: Any = None) -> Any:
        """``get(f"{arch}.{key}")``."""
        return self.get(f"{self.arch}.{key}", default)

    # --- weights --------------------------------------------------------------------------------
    def load_weights(self) -> Weights:
        """Map the file and make every tensor a GGML tensor pointing into the mapping."""
        return Weights.load(self)


@dataclass
class Weights:
    """The model's tensors, name -> :class:`GGMLTensor` (not in any graph), backed by the mmap."""

    tensors: dict[str, GGMLTensor]
    nbytes: int
    _mm: mmap.mmap | None = field(default=None, repr=False)
    _view: np.ndarray | None = field(default=None, repr=False)
    _ctx: int = 0
    _buffer: int = 0
    _repacked: Storage | None = field(default=None, repr=False)

    @classmethod
    def load(cls, f: GGUFFile) -> Weights:
        with open(f.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            mm = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            mm.madvise(mmap.MADV_WILLNEED)
        except (AttributeError, OSError):  # pragma: no cover - not Linux
            pass
        view = np.frombuffer(mm, dtype=np.uint8)
        base = view.ctypes.data
        buffer = g.ggml_backend_cpu_buffer_from_ptr(base, size)
        if not buffer:
            raise MemoryError(f"cannot wrap {f.path} as a backend buffer")
        g.ggml_backend_buffer_set_usage(buffer, g.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        mem = g.ggml_tensor_overhead() * (len(f.tensors) + 1)
        ctx = g.ggml_init(g.ggml_init_params(mem, None, True))
        tensors: dict[str, GGMLTensor] = {}
        total = 0
        for info in f.tensors.values():
            if info.offset + info.nbytes > size:
                raise GGUFError(f"{f.path}: tensor {info.name} lies past the end of the file (truncated?)")
            ne = (ctypes.c_int64 * len(info.shape))(*info.shape)
            t = GGMLTensor(g.ggml_new_tensor(ctx, info.type_id, len(info.shape), ne), None)
            g.ggml_set_name(t.ptr, info.name.encode()[:63])
            status = g.ggml_backend_tensor_alloc(buffer, t.ptr, base + info.offset)
            if status != g.GGML_STATUS_SUCCESS:
                raise GGUFError(f"{f.path}: cannot place tensor {info.name} (status {status})")
            tensors[info.name] = t
            total += info.nbytes
        log.debug("mapped %d tensors (%.1f MiB) from %s", len(tensors), total / 2**20, f.path)
        return cls(tensors, total, mm, view, ctx, buffer)

    def repack_matrices(self) -> int:
        """Let GGML repack the matrices it has faster CPU kernels for (as llama.cpp does at
        load): every 2-D weight except ``token_embd.weight``, which ``rows()`` reads (and which
        a tied output matrix shares). Returns the bytes copied; the mapping keeps serving the
        rest."""
        names = [n for n, t in self.tensors.items() if n.endswith(".weight") and n != "token_embd.weight"
                 and t.dim(1) > 1 and t.dim(2) == 1]
        self._repacked = repack_matrices(self.tensors, names)
        return self._repacked.nbytes if self._repacked is not None else 0

    def get(self, name: str) -> GGMLTensor | None:
        return self.tensors.get(name)

    def __getitem__(self, name: str) -> GGMLTensor:
        t = self.tensors.get(name)
        if t is None:
            raise GGUFError(f"missing tensor {name}")
        return t

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def close(self) -> None:
        """Release the buffers and the mapping (the tensors become invalid)."""
        if self._repacked is not None:
            self._repacked.close()
            self._repacked = None
        if self._buffer:
            g.ggml_backend_buffer_free(self._buffer)
            self._buffer = 0
        if self._ctx:
            g.ggml_free(self._ctx)
            self._ctx = 0
        self.tensors = {}
        self._view = None
        if self._mm is not None:
            try:
                self._mm.close()
            except BufferError:  # a NumPy view is still alive somewhere; the GC will unmap it
                pass
            self._mm = None
