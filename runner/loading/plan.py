"""Load-time decisions both engines share, made before either of them allocates anything.

- :func:`load_options`: the :class:`LoadOptions` a load uses (context, batch, threads,
  slots, KV cache type, flash attention), resolved once for both engines and the scheduler;
- :func:`kv_cache_type`: ``OLLAMA_KV_CACHE_TYPE`` as the engines can honour it (the one place
  that falls back to f16);
- :func:`reservation` and :func:`check_memory`: what the KV cache and the compute buffers will
  take, refused up front (one line, in milliseconds) when the machine cannot give it, instead of
  an engine allocating gigabytes layer by layer until ``bad_alloc``. Host memory only: what a
  GPU holds is :mod:`.gpu`'s to fit.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from dataclasses import dataclass

from .. import config as _config
from ..model import ggufmeta
from ..api import LoadError, ModelInfo, Options
from ..ml.cpus import default_threads
from ..kvcache.cells import cache_geometry
from ..ml.memory import available_memory
from ..model.sliding import SlidingWindow

log = logging.getLogger(__name__)

MAX_CTX = 1 << 20  # num_ctx above this is clamped: no model is trained longer
THREADS_PER_CPU = 4  # num_thread is clamped to this many per CPU
KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
_KV_BLOCK = {"f16": (1, 2), "q8_0": (32, 34), "q4_0": (32, 18)}  # elements and bytes per block
CELL_PADDING = 256  # both engines round the cache up to a multiple of this
MEMORY_MARGIN = 0.9  # refuse when the reservation needs more than this share of what is available
GiB = 2**30


@dataclass(frozen=True)
class LoadOptions:
    """Everything a load is made with, after defaults, clamps and fallbacks: two loads with equal
    values are interchangeable (the server's scheduler reuses a runner whose value matches)."""

    num_ctx: int  # tokens per sequence
    num_batch: int  # tokens one sequence adds to a batch at most
    num_thread: int
    num_parallel: int  # slots
    kv_cache_type: str  # one of KV_CACHE_TYPES, as the engines can honour it
    flash_attention: bool
    use_mmap: bool
    multi_user: bool  # OLLAMA_MULTIUSER_CACHE: slots shared by several users
    pipeline: bool = False  # POLLAMA_PIPELINE: decode on a compute thread, the next batch built meanwhile
    draft: str = ""  # the draft model's GGUF path (runner.loop.draftmodel); "": none
    num_gpu: int = -1  # layers to offload (old engine, GPU build): -1 as many as fit, 0 none (runner.loading.gpu)
    main_gpu: int = 0  # the GPU a model that fits on one goes to (runner.loading.gpu)
    batch_invariant: bool = False  # POLLAMA_BATCH_INVARIANT: rows computed as alone (new engine)
    row_kernels: bool = True  # POLLAMA_ROW_KERNELS: our Q4_1 kernels for several rows

    def serves(self, want: LoadOptions) -> bool:
        """Whether a runner loaded with these options serves a request that wants ``want``:
        equal options, where a ``num_gpu`` of -1 (as many as fit: the default) takes whatever
        the loaded runner has, as Ollama's scheduler does (``needsReload``)."""
        if want.num_gpu == -1:
            want = dataclasses.replace(want, num_gpu=self.num_gpu)
        return self == want


def load_options(info: ModelInfo, options: Options, cfg: _config.Config,
                         num_parallel: int | None = None) -> LoadOptions:
    """The load options for ``info``: ``num_ctx`` 0 is the configured default, at most the model's
    trained context and 2^20, at least 4; ``num_batch`` at most ``num_ctx``; ``num_thread`` 0 is
    one per usable core, at most 4 per CPU; ``num_parallel`` None is ``OLLAMA_NUM_PARALLEL``; the
    KV cache type as :func:`kv_cache_type` resolves it; the draft model is the ``draft`` option's
    (a store name or a .gguf path), else the Modelfile's ``DRAFT``, none while speculation is off
    (``POLLAMA_SPECULATIVE=off``). Raises LoadError for a KV type that does not fit the model,
    ModelNotFound for a draft model that is not there."""
    num_ctx = min(options.num_ctx or cfg.context_length, MAX_CTX)
    if info.context_length > 0:
        num_ctx = min(num_ctx, info.context_length)
    num_ctx = max(num_ctx, 4)
    num_batch = max(1, min(options.num_batch, num_ctx))
    num_thread = options.num_thread if options.num_thread > 0 else default_threads()
    num_thread = min(num_thread, THREADS_PER_CPU * (os.cpu_count() or 1))
    return LoadOptions(
        num_ctx=num_ctx,
        num_batch=num_batch,
        num_thread=num_thread,
        num_parallel=max(1, num_parallel if num_parallel is not None else cfg.num_parallel),
        kv_cache_type=kv_cache_type(info, cfg),
        flash_attention=bool(cfg.flash_attention),
        use_mmap=True if options.use_mmap is None else options.use_mmap,
        multi_user=cfg.multiuser_cache,
        pipeline=cfg.pipeline,
        num_gpu=options.num_gpu if options.num_gpu >= 0 else -1,
        main_gpu=options.main_gpu,
        draft=draft_path(info, options, cfg),
        batch_invariant=cfg.batch_invariant,
        row_kernels=cfg.row_kernels,
    )


def draft_path(info: ModelInfo, options: Options, cfg: _config.Config) -> str:
    """The draft model's GGUF for a load of ``info`` with ``options`` ("" : none)."""
    if not cfg.speculative:
        return ""
    if options.draft:
        from .. import store

        return str(store.lookup(options.draft, cfg, from_network=True).path)
    return info.draft or ""


# ------------------------------------------------------------------------------------ the model
@dataclass(frozen=True)
class Attention:
    """What sizes the KV cache: per layer the K/V head count, and the head sizes."""

    kv_heads: tuple[int, ...]  # per layer (0: a layer without attention)
    n_head: int  # the most query heads of any layer
    key_size: int
    value_size: int
    window: SlidingWindow | None = None  # local layers keep only a window of each sequence

    @classmethod
    def of(cls, info: ModelInfo) -> Attention:
        arch = info.architecture
        meta = info.metadata
        n_layer = int(meta.get(f"{arch}.block_count", 0) or 0)

        def per_layer(key: str, default: list[int]) -> list[int]:
            if f"{arch}.{key}" in meta:
                return [int(meta[f"{arch}.{key}"])] * n_layer
            values = ggufmeta.read_array(info.path, f"{arch}.{key}")
            return [int(v) for v in values] if values else default

        heads = per_layer("attention.head_count", [0] * n_layer)
        kv_heads = per_layer("attention.head_count_kv", heads)
        n_head = max(heads, default=0)
        default = info.embedding_length // n_head if n_head else 0
        key = int(meta.get(f"{arch}.attention.key_length", default) or 0)
        value = int(meta.get(f"{arch}.attention.value_length", default) or 0)
        pattern = None
        if f"{arch}.attention.sliding_window" in meta:
            pattern = ggufmeta.read_array(info.path, f"{arch}.attention.sliding_window_pattern")
        window = SlidingWindow.of(arch, meta, pattern)
        return cls(tuple(kv_heads), n_head, key, value, window)


# ------------------------------------------------------------------------------------- KV cache
def kv_cache_type(info: ModelInfo, cfg: _config.Config) -> str:
    """The KV cache type to use. ``f16`` by default; ``q8_0``/``q4_0`` need flash attention
    (without it: a warning and f16, as Ollama does) and heads whose sizes are multiples of the
    type's 32-element block (otherwise LoadError, as llama.cpp refuses; GGML would abort)."""
    wanted = cfg.kv_cache_type
    if wanted not in KV_CACHE_TYPES:
        _warn_once(f"unsupported OLLAMA_KV_CACHE_TYPE={wanted[:32]} (use one of {', '.join(KV_CACHE_TYPES)}); using f16")
        return "f16"
    if wanted == "f16":
        return wanted
    if not cfg.flash_attention:
        _warn_once(f"OLLAMA_KV_CACHE_TYPE={wanted} needs flash attention (OLLAMA_FLASH_ATTENTION=1); using f16")
        return "f16"
    att = Attention.of(info)
    block = _KV_BLOCK[wanted][0]
    for size in (att.key_size, att.value_size):
        if size % block:
            raise LoadError(f"OLLAMA_KV_CACHE_TYPE={wanted} does not fit {info.name}: its attention heads have "
                            f"{size} features, not a multiple of {wanted}'s block of {block} (use f16)")
    return wanted


@functools.lru_cache(maxsize=8)  # the server resolves load options per request: warn once
def _warn_once(message: str) -> None:
    log.warning("%s", message)


# --------------------------------------------------------------------------------------- memory
@dataclass(frozen=True)
class Reservation:
    """What a load allocates besides the (memory-mapped) weights, in bytes."""

    cells: int
    kv: int  # K and V of every layer
    compute: int  # the worst-case graph: attention scores (or the flash-attention mask) dominate
    kv_layers: tuple[int, ...] = ()  # kv, layer by layer (what offloading a layer moves to its device)

    @property
    def total(self) -> int:
        return self.kv + self.compute


def _pad(n: int, to: int = CELL_PADDING) -> int:
    return -(-n // to) * to


def reservation(info: ModelInfo, num_ctx: int, num_parallel: int, num_batch: int, kv_type: str,
                flash_attention: bool, engine: str) -> Reservation:
    """The KV cache (``num_ctx`` x ``num_parallel`` cells, padded to 256) and the compute buffer
    of the largest batch (``num_batch`` tokens attending to a full context). The old engine gives
    each sequence its own stream of ``num_ctx`` cells; the new engine attends over all of them.

    Sliding-window layers (gemma3's local ones) hold fewer cells: the new engine's window cache
    keeps ``memory`` cells per sequence plus one batch (``runner.kvcache.cells.cache_geometry``),
    llama.cpp's ``window + n_ubatch`` per stream (its ``swa_full`` off)."""
    att = Attention.of(info)
    cells = _pad(num_ctx * num_parallel)
    local_cells = cells
    if att.window is not None:
        if engine == "old":
            local_cells = num_parallel * min(_pad(num_ctx), _pad(att.window.size + num_batch))
        else:
            local_cells = cache_geometry(num_parallel, num_ctx, num_batch, padding=CELL_PADDING,
                                         swa_window=att.window.cache_window).size
    elems, nbytes = _KV_BLOCK[kv_type]
    kv_layers = []
    for layer, h in enumerate(att.kv_heads):
        per_cell = h * (-(-att.key_size // elems) + -(-att.value_size // elems)) * nbytes
        local = att.window is not None and layer < len(att.window.local) and att.window.local[layer]
        kv_layers.append(per_cell * (local_cells if local else cells))
    kv = sum(kv_layers)
    seen = _pad(num_ctx) if engine == "old" else cells  # cells one batch attends to
    if flash_attention:
        compute = seen * num_batch * 2  # the f16 mask; the kernel keeps no scores
    else:
        compute = seen * num_batch * (att.n_head * 4 + 4)  # f32 scores per head, and the mask
    return Reservation(cells, kv, compute, tuple(kv_layers))


def check_memory(info: ModelInfo, plan: Reservation, num_ctx: int, num_parallel: int, offloaded: int = 0) -> None:
    """LoadError (one line) when ``plan`` needs more host memory than 90% of what this process
    can get. ``offloaded``: the bytes of the KV cache that live on GPUs instead
    (:attr:`runner.loading.gpu.Placement.kv_offloaded`); the devices' own memory is the
    placement's to check, layer by layer, before it offloads any."""
    available = available_memory()
    host = plan.total - offloaded
    if available is None or host <= available * MEMORY_MARGIN:
        return
    raise LoadError(
        f"{info.name} with num_ctx {num_ctx} x {num_parallel} parallel needs {host / GiB:.1f} GiB "
        f"(KV cache {(plan.kv - offloaded) / GiB:.1f} GiB, compute {plan.compute / GiB:.1f} GiB), more than "
        f"{MEMORY_MARGIN:.0%} of the {available / GiB:.1f} GiB of memory available: "
        f"lower num_ctx or OLLAMA_NUM_PARALLEL"
    )
