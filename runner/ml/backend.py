"""The tensor layer's contract (Ollama's ``ml/backend.go``): Backend, Context, Tensor.

Models are written against these protocols; ``runner.ml.ggml`` implements them over GGML.

Conventions (GGML's, as in Ollama):

- **Shapes are in GGML order**, fastest-varying dimension first: ``ne0, ne1, ne2, ne3``. A batch
  of hidden states is ``[n_embd, n_tokens]``; a weight of a linear layer ``y = W x`` with
  ``W: n_out x n_in`` is stored ``[n_in, n_out]``. Seen from NumPy (row-major) a tensor
  ``[ne0, ne1]`` is an array of shape ``(ne1, ne0)``.
- **Strides are in bytes** (``nb0..nb3``); quantized types have a row stride but no element stride.
- **dtypes** are lower-case GGML type names: ``"f32"``, ``"f16"``, ``"q4_0"``, ``"q4_1"``,
  ``"q8_0"``, ``"q4_k"``, ``"q6_k"``, ``"i32"``, ...
- A **Context** is one compute graph: ops on tensors *record* nodes; nothing is computed until
  :meth:`Context.compute`. Weights and KV-cache storage live outside any graph (in backend
  buffers) and can be used by every graph. An op takes the graph of its first operand that
  belongs to one (``weight.mulmat(x)`` records into ``x``'s graph).
- Errors: a shape mismatch detected in Python raises ``ValueError``; running out of memory when
  allocating a graph or storage raises ``MemoryError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Protocol, Sequence

import numpy as np

__all__ = ["Backend", "BackendOptions", "CacheConfig", "Context", "Tensor"]


@dataclass(frozen=True)
class BackendOptions:
    """How the backend runs.

    - ``num_threads``: compute threads (``None``: the number of physical cores we can use);
    - ``flash_attention``: use the fused attention kernel (f16 K/V, f16 mask) instead of
      ``softmax(K^T Q) V`` in separate ops;
    - ``max_graph_nodes``: capacity of one compute graph;
    - ``batch_invariant``: compute each row of a batch as it would be computed alone, whatever
      else the batch holds (GGML's reference kernels: flash attention neither split across
      threads for one row nor tiled for many, no fused ops; matrix products by one-row dot
      products for every row count: no llamafile tiles, no repacked weights), so drafted rows
      verified in a batch give the answer decoding alone gives (``POLLAMA_BATCH_INVARIANT``;
      with flash attention). Slower: a decode at 2,000 cells ~8%, a prompt ~30%
      (2 threads), ~50% where the tiles took most weights.
    - ``row_kernels``: multiply Q4_1 weights by several rows at a time with our kernels
      (``runner/ml/ggml/q4_1.c``), which give GGML's one-row numbers bit for bit (checked at
      first use); off: GGML's own one-row dot products for every row (benchmarks compare).
    """

    num_threads: int | None = None
    flash_attention: bool = True
    max_graph_nodes: int = 8192
    batch_invariant: bool = False
    row_kernels: bool = True


@dataclass(frozen=True)
class CacheConfig:
    """Backend-specific layout of the cache (Go's ``ml.CacheConfig``).

    - ``cache_padding``: the history range handed to attention is rounded (start down, end up) to
      a multiple of this, and the cache size is rounded up to it (GGML: 256; default 1).
    - ``mask_dtype``: dtype of the mask tensor, ``"f32"`` or ``"f16"`` (flash attention wants f16).
    - ``permuted_v``: store V transposed, ``[n_cells, v_head_dim, kv_heads]``, so the non-FA
      attention matmul needs no ``cont`` of V.
    - ``cells_in_order``: a sliding window's only sequence takes the free cells after its newest
      one, round the cache (a ring), not the lowest free ones: each position then lands in the
      same cell whatever batches brought it, and attention meets the window's cells in the same
      order for a lone row and a batch's (the GGML backend's, as llama.cpp's cache: its head).
    """

    cache_padding: int = 1
    mask_dtype: Literal["f32", "f16"] = "f32"
    permuted_v: bool = False
    cells_in_order: bool = False

    def __post_init__(self) -> None:
        if self.cache_padding < 1:
            raise ValueError(f"cache_padding must be >= 1, got {self.cache_padding}")
        if self.mask_dtype not in ("f32", "f16"):
            raise ValueError(f"mask_dtype must be 'f32' or 'f16', got {self.mask_dtype!r}")


class Tensor(Protocol):
    """A node of a compute graph, a weight, or a view of cache storage."""

    @property
    def shape(self) -> tuple[int, ...]:
        """``(ne0, ..., ne{n-1})``; trailing dimensions of size 1 are dropped (at least one)."""
        ...

    @property
    def dtype(self) -> str:
        """GGML type name, e.g. ``"f32"``, ``"q4_1"``."""
        ...

    def dim(self, i: int) -> int:
        """``ne[i]`` for ``0 <= i < 4`` (1 past the tensor's rank)."""
        ...

    def stride(self, i: int) -> int:
        """``nb[i]`` in bytes for ``0 <= i < 4``."""
        ...

    def on(self, ctx: Context) -> Tensor:
        """The same tensor, recording its ops into ``ctx``: how a weight or a cache storage
        tensor (which belong to no graph) is viewed inside one (``storage.on(ctx).view(...)``)."""
        ...

    # --- elementwise ------------------------------------------------------------------------
    def add(self, other: Tensor) -> Tensor:
        """``self + other``; ``other`` broadcasts (its dims must divide ``self``'s)."""
        ...

    def mul(self, other: Tensor) -> Tensor:
        """``self * other`` elementwise, with the same broadcasting as :meth:`add`."""
        ...

    def scale(self, s: float) -> Tensor:
        """``self * s``."""
        ...

    def silu(self) -> Tensor:
        """``x * sigmoid(x)``."""
        ...

    def swiglu(self, up: Tensor) -> Tensor:
        """``silu(self) * up`` in one kernel (shapes equal)."""
        ...

    def gelu(self) -> Tensor:
        """GELU, tanh approximation: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``."""
        ...

    def geglu(self, up: Tensor) -> Tensor:
        """``gelu(self) * up`` in one kernel (shapes equal)."""
        ...

    def tanh(self) -> Tensor:
        """``tanh(x)`` elementwise."""
        ...

    # --- normalisation, matmul, attention ----------------------------------------------------
    def rms_norm(self, eps: float) -> Tensor:
        """``x / sqrt(mean(x^2) + eps)`` along ``ne0`` (no weight: multiply it yourself)."""
        ...

    def norm(self, eps: float) -> Tensor:
        """``(x - mean(x)) / sqrt(var(x) + eps)`` along ``ne0`` (LayerNorm without its weight
        and bias: apply them yourself)."""
        ...

    def avg_pool_2d(self, k: int) -> Tensor:
        """Average over non-overlapping ``k x k`` windows of ``ne0 x ne1`` (both must divide by
        ``k``): ``[w, h, c, n]`` -> ``[w / k, h / k, c, n]``, f32."""
        ...

    def mulmat(self, b: Tensor) -> Tensor:
        """GGML ``mul_mat(self, b)``: ``self [k, n, ...]``, ``b [k, m, ...]`` -> ``[n, m, ...]``
        (every row of ``b`` dotted with every row of ``self``; ``y = W x`` is
        ``W.mulmat(x)``). ``self`` may be quantized; ``ne2``/``ne3`` of ``self`` broadcast over
        ``b``'s (grouped-query attention). The result is f32."""
        ...

    def mulmat_f32(self, b: Tensor) -> Tensor:
        """:meth:`mulmat` asking for f32 accumulation (attention scores ``K^T Q``)."""
        ...

    def softmax(self, mask: Tensor | None, scale: float) -> Tensor:
        """``softmax(self * scale + mask)`` along ``ne0``; ``mask [ne0, >=ne1]`` f32/f16 with
        0 / -inf, broadcast over ``ne2``/``ne3``."""
        ...

    def rope(
        self,
        positions: Tensor,
        dims: int,
        base: float,
        *,
        neox: bool,
        scale: float = 1.0,
        factors: Tensor | None = None,
    ) -> Tensor:
        """Rotary position embedding of ``self [head_dim, n_heads, n_tokens]`` at ``positions``
        (i32 ``[n_tokens]``): the first ``dims`` features of each head rotate by
        ``pos * scale * base^(-2i/dims)`` (divided by ``factors[i]`` when given). ``neox``:
        rotate pairs ``(i, i + dims/2)`` (GPT-NeoX / Qwen) instead of ``(2i, 2i+1)`` (LLaMA)."""
        ...

    def flash_attention(self, k: Tensor, v: Tensor, mask: Tensor | None, scale: float) -> Tensor:
        """Fused ``softmax(scale * K^T Q + mask) V`` with ``self = Q [d, n_tokens, n_heads]``,
        ``k [d, n_kv, n_kv_heads]``, ``v [d_v, n_kv, n_kv_heads]`` (f16), ``mask [n_kv,
        n_tokens]`` f16. The result is ``[d_v, n_heads, n_tokens]`` (already permuted back)."""
        ...

    # --- gather / scatter / copies ------------------------------------------------------------
    def rows(self, ids: Tensor) -> Tensor:
        """Gather rows (``ne1``) of ``self`` at ``ids`` (i32 ``[n]``): ``[ne0, n]`` in f32
        (dequantizes quantized rows)."""
        ...

    def set_rows(self, src: Tensor, ids: Tensor) -> Tensor:
        """Scatter: row ``ids[i]`` of ``self`` (storage) := row i of ``src`` (converted to
        ``self``'s dtype). Returns the op node, which must be :meth:`Context.forward`-ed."""
        ...

    def copy(self, dst: Tensor) -> Tensor:
        """Copy ``self`` into ``dst`` (same number of elements; converts dtype). Returns the op
        node (a view of ``dst``), which must be :meth:`Context.forward`-ed or used."""
        ...

    def cast(self, dtype: str) -> Tensor:
        """A new tensor of the same shape in ``dtype``."""
        ...

    def contiguous(self, *shape: int) -> Tensor:
        """A contiguous copy (optionally reshaped to ``shape``, same number of elements)."""
        ...

    # --- views ---------------------------------------------------------------------------------
    def reshape(self, *shape: int) -> Tensor:
        """Same data, new shape (``self`` must be contiguous; element count unchanged)."""
        ...

    def view(self, offset: int, shape: Sequence[int], strides: Sequence[int] = ()) -> Tensor:
        """A view of ``shape`` starting ``offset`` bytes into ``self``; ``strides`` are
        ``nb1..`` in bytes (default: ``self``'s)."""
        ...

    def permute(self, *axes: int) -> Tensor:
        """GGML permute: source dim ``i`` becomes dim ``axes[i]`` (4 axes)."""
        ...

    def transpose(self) -> Tensor:
        """Swap ``ne0`` and ``ne1`` (a view)."""
        ...

    # --- data ----------------------------------------------------------------------------------
    def numpy(self) -> np.ndarray:
        """Copy the data out after :meth:`Context.compute`: a NumPy array of shape
        ``reversed(shape)`` (f32 and f16 as float32, integers as themselves)."""
        ...

    def read_bytes(self, offset: int, out: np.ndarray) -> None:
        """Copy ``out.nbytes`` raw bytes of an allocated tensor (a weight, cache storage), from
        ``offset`` bytes into its data, into ``out`` (C-contiguous): the data as stored,
        quantized blocks included. ``ValueError`` when the range is not inside the tensor."""
        ...

    def write_bytes(self, offset: int, data: np.ndarray) -> None:
        """Overwrite ``data.nbytes`` raw bytes of an allocated tensor from ``offset`` bytes into
        its data with ``data`` (C-contiguous), as :meth:`read_bytes` reads them. No graph may be
        computing on the tensor meanwhile. ``ValueError`` when the range is not inside it."""
        ...

    def host_bytes(self) -> np.ndarray | None:
        """An allocated, contiguous tensor's raw bytes where they lie, as a writable uint8 array
        (no copy), when its buffer is plain host memory (the CPU backend's cache storage); None
        otherwise (a device's memory, a repacked weight): then :meth:`read_bytes` and
        :meth:`write_bytes` copy. Valid while the tensor lives; written only as
        :meth:`write_bytes` may be (no graph computing on it)."""
        ...


class Context(Protocol):
    """One compute graph and the memory for its intermediate tensors."""

    def input(self, name: str, data: np.ndarray, dtype: str | None = None) -> Tensor:
        """A graph input named ``name`` holding ``data`` (shape ``reversed(ne)``; dtype from the
        array unless given: int32 -> ``"i32"``, float32 -> ``"f32"``, float16 -> ``"f16"``).
        The data is uploaded at :meth:`compute`. Asking again for the same name returns the
        same tensor (layers share their inputs)."""
        ...

    def set_input(self, name: str, data: np.ndarray) -> None:
        """Replace the data of input ``name`` for the next :meth:`compute` (same shape and
        dtype: ``ValueError`` otherwise). This is how a built graph is run again."""
        ...

    def forward(self, *tensors: Tensor) -> None:
        """Add ``tensors`` (and what they depend on) to the graph without reading them."""
        ...

    def compute(self, *outputs: Tensor) -> None:
        """Add ``outputs`` to the graph, allocate it, upload the inputs and run it. Afterwards
        ``outputs[i].numpy()`` reads the results. May be called again (after
        :meth:`set_input`) to re-run the same graph."""
        ...

    def close(self) -> None:
        """Free the graph's memory; its tensors must not be used afterwards."""
        ...


class Backend(Protocol):
    """A device that holds weights and runs graphs."""

    def new_context(self, decoded: bool = False) -> Context:
        """A fresh, empty compute graph. ``decoded``: its batch's rows are decoded tokens
        (a sampled one, alone or with drafted ones to verify), and each row's numbers are to be
        the same whether it comes alone or with others, where that costs little (GGML:
        attention's products of several rows are summed as one row's, by our f16 kernels; the
        weights' are left to their kernels, of which Q4_1's, ours, and Q8_0's give a row in a
        batch its lone numbers), so that drafted rows verified together give, bit for bit, what
        decoding them one at a time gives (issue 26)."""
        ...

    def new_storage(self, specs: Sequence[tuple[str, str, Sequence[int]]]) -> Any:
        """Persistent tensors (e.g. KV cache): ``specs`` are ``(name, dtype, shape)``; returns a
        storage object with ``tensors`` (name -> :class:`Tensor`, zero-filled) and ``close()``.
        Raises ``MemoryError`` when the buffer cannot be allocated."""
        ...

    def cache_config(self) -> CacheConfig:
        """The KV cache layout this backend wants."""
        ...

    def close(self) -> None:
        """Free the backend (its contexts and storage must be closed first)."""
        ...
