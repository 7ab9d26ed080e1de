"""Model listings for the API: tags, show and ps entries (store changes live in runner.store)."""

from __future__ import annotations

import logging
from typing import Any

from runner import config as _config
from runner.model import ggufmeta
from runner import ResolvedModel, store
from runner.store import modelfile
from runner.api import ModelInfo, PollamaError

from .http import iso
from .scheduler import LoadedModel

log = logging.getLogger(__name__)

_BYTES_PER_WEIGHT = {
    "F32": 4.0, "F16": 2.0, "BF16": 2.0, "Q8_0": 34 / 32, "Q4_0": 18 / 32, "Q4_1": 20 / 32,
    "Q5_0": 22 / 32, "Q5_1": 24 / 32, "Q2_K": 0.33, "Q3_K_S": 0.43, "Q3_K_M": 0.49, "Q3_K_L": 0.53,
    "Q4_K_S": 0.57, "Q4_K_M": 0.61, "Q5_K_S": 0.69, "Q5_K_M": 0.71, "Q6_K": 0.82,
}


# ------------------------------------------------------------------------------------ details
def human_number(n: float) -> str:
    """Ollama's format.HumanNumber: 135M, 1.2B, 260K."""
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value >= 100 or value == int(value) else f"{value:.1f}{unit}"
    return str(int(n))


def parameter_size(info: ModelInfo) -> str:
    label = info.metadata.get("general.size_label")
    if label:
        return str(label)
    if info.parameter_count:
        return human_number(info.parameter_count)
    per_weight = _BYTES_PER_WEIGHT.get(info.quantization)
    return human_number(info.size / per_weight) if per_weight else "unknown"


def details(info: ModelInfo) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.architecture,
        "families": [info.architecture],
        "parameter_size": parameter_size(info),
        "quantization_level": info.quantization,
    }


def capabilities(model: ResolvedModel) -> list[str]:
    """Ollama's list: what the model's template supports (runner.template.features), or what
    a remote model's upstream said."""
    return model.capabilities


def remote_fields(stored: store.StoredModel) -> dict[str, Any]:
    """Ollama's ``remote_model`` and ``remote_host`` of a remote model (pollama adds
    ``remote_hosts``, its replicas); nothing for a local one."""
    if stored.remote is None:
        return {}
    return {"remote_model": stored.remote.model, "remote_host": stored.remote.upstreams[0].url,
            "remote_hosts": stored.remote.hosts}


# -------------------------------------------------------------------------------------- lists
def all_models(cfg: _config.Config) -> list[store.StoredModel]:
    """The built-in default model, then the store's models (newest first)."""
    found: list[store.StoredModel] = []
    try:
        found.append(store.lookup(None, cfg))
    except PollamaError:
        pass
    found.extend(store.list_models(cfg))
    return found


def tag_entry(stored: store.StoredModel) -> dict[str, Any] | None:
    try:
        model = ResolvedModel.of(stored)
    except PollamaError:
        return None
    return {
        "name": stored.name,
        "model": stored.name,
        "modified_at": iso(stored.modified),
        "size": stored.size,
        "digest": store.digest(stored),
        "details": details(model.info),
        "capabilities": capabilities(model),
        **remote_fields(stored),
    }


def ps_entry(model: LoadedModel) -> dict[str, Any]:
    runner = model.runner
    info = runner.info
    size = model.stored.size + runner.memory_size  # weights + what the runner allocated besides
    return {
        "name": model.name,
        "model": model.name,
        "size": size,
        "digest": store.digest(model.stored),
        "details": details(info),
        "expires_at": iso(model.expires_at) if model.expires_at else "0001-01-01T00:00:00Z",
        "size_vram": runner.offload.size_vram(size),  # bytes on GPUs (runner.loading.gpu's estimate)
        "context_length": runner.num_ctx,
        "engine": runner.engine,  # beyond Ollama: "old" (llama.cpp), "new" (our GGML code) or "remote"
        "devices": runner.offload.devices,  # beyond Ollama: "CPU", "CUDA0 (NVIDIA H200) 31/31 layers"
        **remote_fields(model.stored),
    }


def show(cfg: _config.Config, model: ResolvedModel, verbose: bool) -> dict[str, Any]:
    stored, info = model.stored, model.info
    if stored.remote is not None:
        return _show_remote(cfg, model)
    header = ggufmeta.read_gguf_header(stored.path)
    model_info: dict[str, Any] = dict(header.metadata)
    for key in header.array_lengths:  # arrays are not read (Ollama sends null unless verbose)
        model_info[key] = None
    if "general.parameter_count" not in model_info and info.parameter_count:
        model_info["general.parameter_count"] = info.parameter_count
    chosen = model.template
    shown = modelfile.show(store.Layout(cfg.models), stored,
                           chosen.source if chosen.kind in ("go", "jinja") else "",
                           str(info.metadata.get("general.license") or ""))
    out: dict[str, Any] = {
        "license": shown.license,
        "modelfile": shown.modelfile,
        "parameters": shown.parameters,
        "template": shown.template or (chosen.show() if chosen.kind == "builtin" else ""),
        "details": details(info),
        "model_info": _jsonable(model_info),
        "capabilities": capabilities(model),
        "modified_at": iso(stored.modified),
    }
    if info.projector:  # Ollama's projector_info: the projector GGUF's own metadata
        projector = ggufmeta.read_gguf_header(info.projector)
        out["projector_info"] = _jsonable({**projector.metadata, **{k: None for k in projector.array_lengths}})
    if shown.system:
        out["system"] = shown.system
    if shown.messages:
        out["messages"] = shown.messages
    return out


def _show_remote(cfg: _config.Config, model: ResolvedModel) -> dict[str, Any]:
    """``/api/show`` of a remote model, as Ollama shows a cloud model: its Modelfile, details,
    capabilities and ``remote_model``/``remote_host``; ``model_info`` what its upstream said."""
    stored, info = model.stored, model.info
    shown = modelfile.show(store.Layout(cfg.models), stored, "")
    model_info: dict[str, Any] = {"general.architecture": info.architecture}
    if info.context_length:
        model_info[f"{info.architecture}.context_length"] = info.context_length
    if info.embedding_length:
        model_info[f"{info.architecture}.embedding_length"] = info.embedding_length
    out: dict[str, Any] = {
        "license": shown.license, "modelfile": shown.modelfile, "parameters": shown.parameters,
        "template": "", "details": details(info), "model_info": model_info,
        "capabilities": capabilities(model), "modified_at": iso(stored.modified), **remote_fields(stored),
    }
    if shown.system:
        out["system"] = shown.system
    if shown.messages:
        out["messages"] = shown.messages
    return out


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        if isinstance(value, float) and value != value:
            value = None
        elif isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        out[key] = value
    return out
