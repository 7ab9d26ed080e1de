"""``runner.resolve(name) -> ResolvedModel`` and ``runner.load(model, options) -> Runner``.

Every generation takes one path: :func:`resolve` (the model a name points to:
:mod:`runner.loading.resolve`) → :func:`runner.prepare.prepare` (the request's options, Modelfile
defaults, template and capability checks) → :func:`load` (or the server's scheduler, which keeps
runners loaded) → ``Runner.stream`` / ``Runner.submit``.

``OLLAMA_NEW_ENGINE`` picks the engine. The new engine (our model code over GGML) runs the
architectures and vocabularies it implements; any other model, or a set flag while the new
engine cannot load it, gets one notice line (logged as a warning) and the old engine.
"""

from __future__ import annotations

from .native import load_cxx_runtime

load_cxx_runtime()  # first: the C++ runtime before llama.cpp's and GGML's libraries (runner/native.py)

import functools
import logging
import time

from . import config as _config
from .loading import gpu
from .loading import plan as loadplan
from .api import (
    Chunk,
    DoneReason,
    InvalidModel,
    InvalidRequest,
    LoadError,
    Message,
    Metrics,
    ModelInfo,
    ModelNotFound,
    Offload,
    Options,
    PollamaError,
    PromptTooLong,
    Request,
    Runner,
    ServerBusy,
)
from .kvstore.key import Fingerprint
from .kvstore.store import PromptStore, Tiers, tiers
from .loading.plan import LoadOptions, load_options
from .loading.resolve import ResolvedModel, model_info, resolve
from .loop.engine import Engine
from .loop.pipeline import InlineDecoder, ThreadDecoder
from .loop.runner import BatchRunner
from .spec.controller import Speculation, StepCost
from .loop.draftmodel import DraftModel

__all__ = [
    "Chunk", "DoneReason", "InvalidModel", "InvalidRequest", "LoadError", "LoadOptions", "Message", "Metrics",
    "ModelInfo", "ModelNotFound", "Options", "PollamaError", "PromptTooLong", "Request", "ResolvedModel", "Runner",
    "ServerBusy", "load", "load_options", "model_info", "placement", "prompt_tiers", "resolve",
]

log = logging.getLogger(__name__)


def load(model: ResolvedModel, options: Options | None = None, cfg: _config.Config | None = None,
         num_parallel: int | None = None, *, plan: LoadOptions | None = None) -> Runner:
    """Start a runner for ``model`` (from :func:`resolve`) with the load-time part of ``options``
    (from :func:`runner.prepare.options`; defaults when None), or with ``plan`` when the caller
    resolved the load options already (the server's scheduler compares them between loads).

    Everything that can refuse a load (the file's rules, the KV cache type, the memory the cache
    needs) is decided here, once for both engines, before either allocates. The runner's
    ``load_duration`` says how long it took; reporting it is the caller's.
    """
    t0 = time.perf_counter_ns()
    cfg = cfg or _config.load()
    info = model.info
    if model.remote is not None:  # nothing to load: a runner that forwards to the upstream
        from .remote.runner import RemoteRunner

        remote = RemoteRunner(info, model.remote, cfg)
        remote.load_duration = time.perf_counter_ns() - t0
        return remote
    if plan is None:
        plan = load_options(info, options if options is not None else Options(), cfg, num_parallel)
    draft_info = resolve(plan.draft, cfg).info if plan.draft else None
    engine, need, placement = _engine(info, plan, cfg)
    draft: DraftModel | None = None
    draft_bytes = 0
    if draft_info is not None:
        try:
            draft_engine, draft_need, _ = _engine(draft_info, plan, cfg)
            # decoding is memory-bound: a token of the draft model costs about its share of the bytes
            draft = DraftModel.checked(engine, draft_engine, plan.num_ctx, plan.num_batch,
                                       draft_info.size / max(info.size, 1), plan.draft)
        except BaseException:
            engine.close()
            raise
        draft_bytes = draft_engine.memory_size or draft_need.total
    decoder = ThreadDecoder(f"compute:{info.name}") if plan.pipeline else InlineDecoder()
    runner = BatchRunner(engine, template=model.template, num_ctx=plan.num_ctx, num_parallel=plan.num_parallel,
                         num_batch=plan.num_batch, multi_user=plan.multi_user, decoder=decoder,
                         store=_prompt_store(engine, info, plan, cfg),
                         speculation=Speculation(enabled=cfg.speculative,
                                                 cost=StepCost.of(info.quantization, engine.multiplies),
                                                 draft=draft, pool=cfg.ngram_pool))
    runner.memory_size = (runner.memory_size or need.total) + draft_bytes  # the new engine knows its own
    runner.offload = placement.offload()
    runner.load_duration = time.perf_counter_ns() - t0
    runner.start()
    return runner


def placement(model: ResolvedModel, options: Options | None = None, cfg: _config.Config | None = None) -> Offload:
    """Where :func:`load` would put ``model``'s layers with ``options`` now, without loading it
    (``pollama show``). Raises what a load's placement raises (InvalidRequest: a ``main_gpu``
    that names no GPU)."""
    if model.remote is not None:
        return Offload(devices="remote")
    cfg = cfg or _config.load()
    plan = load_options(model.info, options if options is not None else Options(), cfg)
    return _decide(model.info, plan, cfg)[2].offload()


def _decide(info: ModelInfo, plan: LoadOptions, cfg: _config.Config) -> tuple[str, loadplan.Reservation, gpu.Placement]:
    """The engine, the memory it reserves and where its layers go."""
    name = "new" if cfg.new_engine and _new_engine_runs(info) else "old"
    need = loadplan.reservation(info, plan.num_ctx, plan.num_parallel, plan.num_batch, plan.kv_cache_type,
                                plan.flash_attention, name)
    return name, need, _placement(name, info, plan, need, cfg)


def _placement(engine: str, info: ModelInfo, plan: LoadOptions, need: loadplan.Reservation,
               cfg: _config.Config) -> gpu.Placement:
    """Where the layers of this load go (:mod:`runner.loading.gpu`). The old engine offloads to
    the GPUs llama.cpp can use; the new engine runs on GGML's CPU backend, and says so once
    where GGML's registry lists GPUs."""
    if engine == "new":
        from .ml.ggml.devices import devices

        note = gpu.cpu_only_note(devices())
        if note:
            _say_once(note)
        return gpu.Placement(note=note)
    from .engines.llamacpp.offload import offload_devices

    gpus = offload_devices()
    if not gpus:  # a CPU build: nothing to place, main_gpu not looked at
        return gpu.CPU
    placement = gpu.place(gpus, gpu.layer_costs(info, need), plan.num_gpu, plan.main_gpu, cfg.gpu_overhead)
    log.info("%s: %s", info.name, placement.describe())
    return placement


@functools.lru_cache(maxsize=1)  # once a process: every load would say the same
def _say_once(note: str) -> None:
    log.warning("%s", note)


def _engine(info: ModelInfo, plan: LoadOptions, cfg: _config.Config) -> tuple[Engine, loadplan.Reservation, gpu.Placement]:
    """The engine for ``info`` (the new one where ``OLLAMA_NEW_ENGINE`` asks and it runs the
    model) placed as :func:`_decide` says, after the memory it needs is found to be there."""
    name, need, placement = _decide(info, plan, cfg)
    loadplan.check_memory(info, need, plan.num_ctx, plan.num_parallel, offloaded=placement.kv_offloaded)
    if name == "new":
        from .engines.ggml import GGMLEngine

        return GGMLEngine(info, plan), need, placement
    from .engines.llamacpp.engine import LlamaEngine

    return LlamaEngine(info, plan, placement), need, placement


def _prompt_store(engine: Engine, info: ModelInfo, plan: LoadOptions, cfg: _config.Config) -> PromptStore | None:
    """The prompt store for this load (issue 25: ``OLLAMA_CACHE_RAM``, ``POLLAMA_CACHE_DIR``,
    ``POLLAMA_CACHE_DISK``) over the process's tiers; None when both are off or the engine
    cannot export its KV state."""
    shared = prompt_tiers(cfg)
    if not shared.on or not engine.kv.state_layout:
        return None
    fingerprint = Fingerprint.of(engine.name, engine.kv.state_layout, info, plan)
    return PromptStore(fingerprint, shared, pager=engine.kv)  # the engine's KV operations cut and join pages


def prompt_tiers(cfg: _config.Config) -> Tiers:
    """The process's prompt store tiers under ``cfg``'s settings (what ``/api/ps`` reports)."""
    return tiers(cfg.cache_ram_bytes, cfg.cache_dir, cfg.cache_disk_bytes)


def _new_engine_runs(info: ModelInfo) -> bool:
    """Whether the new engine implements ``info``'s architecture and tokenizer (one notice when not)."""
    from .model.tokenizer import refusal
    from .engines.ggml import supports
    from .engines.ggml.vision import supports as supports_images

    if not supports(info.architecture):
        log.warning("the new engine does not support architecture %r yet; using the old engine", info.architecture)
        return False
    why = refusal(info.metadata)
    if why is not None:
        log.warning("the new engine cannot tokenize this model (%s); using the old engine", why)
        return False
    if info.projector is not None and not supports_images(info.architecture, info.projector):
        log.warning("the new engine does not take this model's images yet; using the old engine")
        return False
    return True
