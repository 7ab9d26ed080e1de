"""Model listings for the API: tags, show and ps entries (store changes live in runner.store)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from runner import config as _config
from runner import ggufmeta, prompt, store, templatefeatures
from runner.api import ModelInfo, PollamaError

from .http import iso
from .scheduler import LoadedModel, Scheduler

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


def capabilities(info: ModelInfo) -> list[str]:
    """Ollama's list: what the model's template supports (runner.templatefeatures)."""
    return templatefeatures.capabilities(info)


def kv_bytes(info: ModelInfo, num_ctx: int, num_parallel: int) -> int:
    """f16 K and V for every layer and every cell (what the runner allocates besides weights)."""
    arch = info.architecture
    meta = info.metadata
    try:
        layers = int(meta.get(f"{arch}.block_count", 0))
        embd = int(meta.get(f"{arch}.embedding_length", 0))
        heads = int(meta.get(f"{arch}.attention.head_count", 0)) or 1
        heads_kv = int(meta.get(f"{arch}.attention.head_count_kv", heads)) or heads
        head_k = int(meta.get(f"{arch}.attention.key_length", embd // heads))
        head_v = int(meta.get(f"{arch}.attention.value_length", embd // heads))
    except (TypeError, ValueError):
        return 0
    return layers * num_ctx * num_parallel * heads_kv * (head_k + head_v) * 2


# -------------------------------------------------------------------------------------- lists
def all_models(cfg: _config.Config) -> list[store.StoredModel]:
    """The built-in default model, then the store's models (newest first)."""
    found: list[store.StoredModel] = []
    try:
        found.append(store.resolve(None, cfg))
    except PollamaError:
        pass
    found.extend(store.list_models(cfg))
    return found


def tag_entry(scheduler: Scheduler, stored: store.StoredModel) -> dict[str, Any] | None:
    try:
        info = scheduler.model_info(stored)
    except PollamaError:
        return None
    return {
        "name": stored.name,
        "model": stored.name,
        "modified_at": iso(stored.modified),
        "size": stored.size,
        "digest": store.digest(stored),
        "details": details(info),
        "capabilities": capabilities(info),
    }


def ps_entry(model: LoadedModel) -> dict[str, Any]:
    runner = model.runner
    info = runner.info
    size = model.stored.size + kv_bytes(info, runner.num_ctx, runner.num_parallel)
    return {
        "name": model.name,
        "model": model.name,
        "size": size,
        "digest": store.digest(model.stored),
        "details": details(info),
        "expires_at": iso(model.expires_at) if model.expires_at else "0001-01-01T00:00:00Z",
        "size_vram": 0,
        "context_length": runner.num_ctx,
        "engine": runner.engine,  # beyond Ollama: "old" (llama.cpp) or "new" (our GGML code)
    }


def show(scheduler: Scheduler, stored: store.StoredModel, verbose: bool) -> dict[str, Any]:
    info = scheduler.model_info(stored)
    header = ggufmeta.read_gguf_header(stored.path)
    model_info: dict[str, Any] = dict(header.metadata)
    for key in header.array_lengths:  # arrays are not read (Ollama sends null unless verbose)
        model_info[key] = None
    if "general.parameter_count" not in model_info and info.parameter_count:
        model_info["general.parameter_count"] = info.parameter_count
    layers = stored.layers
    license_text = _read(layers.get("license")) or str(info.metadata.get("general.license") or "")
    system = _read(layers.get("system"))
    params = _read(layers.get("params"))
    chosen = prompt.model_template(info)
    template = chosen.source if chosen.kind in ("go", "jinja") else chosen.show() if chosen.kind == "builtin" else ""
    out: dict[str, Any] = {
        "license": license_text,
        "modelfile": _modelfile(stored, template if chosen.kind in ("go", "jinja") else "", system, params),
        "parameters": _parameters_text(params),
        "template": template,
        "details": details(info),
        "model_info": _jsonable(model_info),
        "capabilities": capabilities(info),
        "modified_at": iso(stored.modified),
    }
    if system:
        out["system"] = system
    return out


def _read(path: Path | None) -> str:
    if path is None:
        return ""
    try:
        return path.read_text()
    except OSError:
        return ""


def _parameters_text(params_json: str) -> str:
    if not params_json:
        return ""
    try:
        params = json.loads(params_json)
    except ValueError:
        return ""
    lines = []
    for name, value in (params or {}).items():
        for item in value if isinstance(value, list) else [value]:
            lines.append(f"{name:<30} {json.dumps(item) if isinstance(item, str) else item}")
    return "\n".join(lines)


def _modelfile(stored: store.StoredModel, template: str, system: str, params_json: str) -> str:
    lines = [
        '# Modelfile generated by "pollama show"',
        "# To build a new Modelfile based on this, replace FROM with:",
        f"# FROM {stored.name}",
        "",
        f"FROM {stored.path}",
    ]
    if template:
        lines.append(f'TEMPLATE """{template}"""')
    if system:
        lines.append(f'SYSTEM """{system}"""')
    for line in _parameters_text(params_json).splitlines():
        name, _, value = line.partition(" ")
        lines.append(f"PARAMETER {name} {value.strip()}")
    return "\n".join(lines) + "\n"


def _jsonable(values: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in values.items():
        if isinstance(value, float) and value != value:
            value = None
        elif isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        out[key] = value
    return out
