"""``runner.load(model, options) -> Runner``: resolve the model, pick the engine, start its loop.

``OLLAMA_NEW_ENGINE`` picks the engine. The new engine (our model code over GGML) runs the
architectures and vocabularies it implements; any other model, or a set flag while the new
engine cannot load it, gets one notice line (logged as a warning) and the old engine.
"""

from __future__ import annotations

import copy
import logging
import time

from . import config as _config
from . import store
from .loading import ggufcheck
from .model import ggufmeta
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
    Options,
    PollamaError,
    PromptTooLong,
    Request,
    Runner,
    ServerBusy,
)
from .loading.plan import LoadOptions, checked_options, resolve_load_options
from .loop.engine import Engine
from .loop.pipeline import InlineDecoder, ThreadDecoder
from .loop.runner import BatchRunner
from .template.prompt import model_template

__all__ = [
    "Chunk", "DoneReason", "InvalidModel", "InvalidRequest", "LoadError", "LoadOptions", "Message", "Metrics",
    "ModelInfo", "ModelNotFound", "Options", "PollamaError", "PromptTooLong", "Request", "Runner",
    "ServerBusy", "checked_options", "load", "load_resolved", "model_info", "model_template",
    "resolve_load_options",
]

log = logging.getLogger(__name__)

_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}


def model_info(stored: store.StoredModel, projector: str | None = None) -> ModelInfo:
    """Read what a GGUF says about itself (fast: arrays are skipped) and check that the engines can
    load it (``runner.loading.ggufcheck``). Raises InvalidModel with one line. The vision projector is
    ``projector`` (``--mmproj``) or the store entry's ``projector`` layer."""
    header = ggufmeta.read_gguf_header(stored.path)
    ggufcheck.check_model(header, stored.path)
    if projector is not None:
        projector = str(store.check_projector(projector))
    elif "projector" in stored.layers:
        projector = str(stored.layers["projector"])
    return ModelInfo(
        name=stored.name,
        path=str(stored.path),
        architecture=header.architecture,
        size=stored.size,
        context_length=int(header.arch_value("context_length", 0) or 0),
        embedding_length=int(header.arch_value("embedding_length", 0) or 0),
        parameter_count=0,  # not in every GGUF; general.size_label says it when present
        quantization=_FILE_TYPES.get(int(header.get("general.file_type", -1)), "unknown"),
        chat_template=header.get("tokenizer.chat_template"),
        metadata=dict(header.metadata),
        store_template=store.model_defaults(stored).template,
        projector=projector,
    )


def load(model: str | None = None, options: Options | None = None, cfg: _config.Config | None = None,
         num_parallel: int | None = None, projector: str | None = None) -> Runner:
    """Load ``model`` (a store name, a .gguf path, or None for the default) and start its runner;
    ``projector``: a vision projector GGUF for it (``--mmproj``).

    Everything that can refuse a load (the file's rules, the options' ranges, the KV cache type,
    the memory the cache needs) is decided here, once for both engines, before either allocates.
    """
    t0 = time.perf_counter_ns()
    cfg = cfg or _config.load()
    options = checked_options(copy.deepcopy(options) if options is not None else Options())
    stored = store.resolve(model, cfg)
    info = model_info(stored, projector)
    plan = resolve_load_options(info, options, cfg, num_parallel)
    return load_resolved(info, plan, cfg, t0)


def load_resolved(info: ModelInfo, plan: LoadOptions, cfg: _config.Config, t0: int | None = None) -> Runner:
    """:func:`load` for a model already resolved (``info``) with its load options resolved
    (``plan``, from :func:`resolve_load_options`): the server resolves both once per request."""
    t0 = t0 if t0 is not None else time.perf_counter_ns()
    name = "new" if cfg.new_engine and _new_engine_runs(info) else "old"
    need = loadplan.reservation(info, plan.num_ctx, plan.num_parallel, plan.num_batch, plan.kv_cache_type,
                                plan.flash_attention, name)
    loadplan.check_memory(info, need, plan.num_ctx, plan.num_parallel)
    engine: Engine
    if name == "new":
        from .engines.ggml import GGMLEngine

        engine = GGMLEngine(info, plan)
    else:
        from .engines.llamacpp.engine import LlamaEngine

        engine = LlamaEngine(info, plan)
    decoder = ThreadDecoder(f"compute:{info.name}") if plan.pipeline else InlineDecoder()
    runner = BatchRunner(engine, num_ctx=plan.num_ctx, num_parallel=plan.num_parallel, num_batch=plan.num_batch,
                         multi_user=plan.multi_user, decoder=decoder)
    runner.memory_size = runner.memory_size or need.total  # the new engine knows what it allocated
    runner.load_duration = time.perf_counter_ns() - t0
    runner.start()
    return runner


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
