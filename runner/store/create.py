"""Create a model in the store: ``pollama create NAME -f Modelfile``, ``POST /api/create``, ``/save``.

The request is Ollama's (``api.CreateRequest``): the weights come from ``files`` ({file name:
blob digest}, uploaded first with ``POST /api/blobs/:digest``), or from ``from`` (a model of the
store, the built-in default model, or a ``.gguf`` path), or — for the CLI — from a local ``.gguf``
file (``from_file``), which is copied into the store. Every GGUF is checked (a valid header)
before it becomes a model layer. Then, as Ollama does:

- ``template``, ``system``: replace the base model's layer of that kind;
- ``parameters``: merged over the base model's (a name given wins);
- ``messages``: replace the base model's when given (a JSON list of ``{role, content}``);
- ``license``: one layer per text, added to the base model's;
- a projector GGUF (``general.architecture = clip``: a Modelfile's second ``FROM``, or a second
  file in ``files``) becomes the ``projector`` layer, replacing the base model's;
- a draft model (Modelfile ``DRAFT``: a local GGUF or a store model; Ollama's ``draft_files``)
  becomes the ``draft`` layer (Ollama's ``application/vnd.ollama.image.draft``), replacing the
  base model's;
- ``adapters`` and ``quantize`` are refused (pollama applies no LoRA and does not quantize);
- a remote model (``from`` an ``http(s)://`` URL, Ollama's ``remote_host``, or pollama's
  ``remote_hosts`` for replicas; ``parameters.upstream_model`` names the model upstream) has no
  weights: its upstream is asked what it serves (:mod:`runner.remote.discover`) and its config
  blob records it as Ollama records a cloud model. A model made from a remote model is remote too.
  A TEMPLATE is refused for them: the upstream applies its own.

Statuses: ``parsing GGUF`` / ``using existing layer sha256:…`` / ``creating new layer sha256:…``,
``writing manifest``, ``success``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from .. import config as _config
from ..model import ggufmeta
from ..remote.discover import discover
from ..remote.upstream import RemoteModel, RemoteSpec, is_url
from ..api import Cancelled, InvalidModel, InvalidRequest, ModelNotFound, Options, PollamaError, coerce_option
from . import blobs, manifests
from .layout import Layout, OutsideStore, digest_hex
from .manifests import (CONFIG_MEDIA_TYPE, DRAFT_MEDIA_TYPE, LAYER_MEDIA_PREFIX, MANIFEST_MEDIA_TYPE,
                        MODEL_MEDIA_TYPE, PROJECTOR_MEDIA_TYPE)
from .progress import Progress

log = logging.getLogger(__name__)

TEMPLATE = LAYER_MEDIA_PREFIX + "template"
SYSTEM = LAYER_MEDIA_PREFIX + "system"
PARAMS = LAYER_MEDIA_PREFIX + "params"
MESSAGES = LAYER_MEDIA_PREFIX + "messages"
LICENSE = LAYER_MEDIA_PREFIX + "license"
ROLES = ("system", "user", "assistant", "tool")


@dataclass
class CreateSpec:
    model: str
    from_: str = ""
    files: dict[str, str] = field(default_factory=dict)  # file name -> sha256 digest
    adapters: dict[str, str] = field(default_factory=dict)
    template: str | None = None
    system: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    messages: list[dict[str, Any]] = field(default_factory=list)
    license: str | list[str] | None = None
    quantize: str = ""
    from_file: Path | None = None  # the CLI's local .gguf (never set from a request)
    projector_file: Path | None = None  # the CLI's local projector .gguf (a second FROM)
    remote: RemoteSpec | None = None  # a remote model: its upstream URLs (FROM http(s)://...)
    draft_files: dict[str, str] = field(default_factory=dict)  # Ollama's: the draft GGUF's name -> digest
    draft_file: Path | None = None  # the CLI's local draft .gguf (DRAFT)
    draft_from: str = ""  # the CLI's DRAFT naming a store model

    def check(self) -> None:
        """Refuse a request that cannot work, before anything is written (InvalidRequest)."""
        from . import _store_name

        _store_name(self.model, "model")
        if self.remote is not None:
            if self.from_ or self.files or self.from_file or self.projector_file:
                raise InvalidRequest("a remote model is made from upstream URLs only: its FROM lines must all "
                                     "be http(s):// URLs")
            self.remote.upstreams()  # a bad URL is refused now
            if self.template:
                raise InvalidRequest("TEMPLATE cannot be set on a remote model: its upstream applies its own")
        if self.quantize:
            raise InvalidRequest(f'quantize "{self.quantize}" is not supported: pollama creates '
                                 "models from GGUF files as they are (quantize with llama.cpp's llama-quantize)")
        if self.adapters:
            raise InvalidRequest("adapters are not supported: pollama does not apply LoRA adapters")
        if not (self.from_ or self.files or self.from_file or self.remote):
            raise InvalidRequest("neither 'from' or 'files' was specified")
        ggufs = [n for n in self.files if n.lower().endswith(".gguf")] or list(self.files)
        if len(ggufs) > 2:
            raise InvalidRequest("only one GGUF file per model is supported (and one vision projector)")
        if len(self.draft_files) > 1:
            raise InvalidRequest("a model has at most one draft model file")
        for name, digest in {**self.files, **self.draft_files}.items():
            if digest_hex(digest) is None:
                raise InvalidRequest(f'invalid digest "{digest}" for file "{name}"')
        self.parameters = checked_parameters(self.parameters)
        self.messages = checked_messages(self.messages)
        for text in self.licenses():
            if not isinstance(text, str):
                raise InvalidRequest("license must be a string or a list of strings")

    def licenses(self) -> list[Any]:
        if self.license is None or self.license == "":
            return []
        return list(self.license) if isinstance(self.license, list) else [self.license]


def remote_spec(from_: str, remote_host: str | None, remote_hosts: list[str] | None,
                parameters: dict[str, Any]) -> RemoteSpec | None:
    """A create request's remote model, if it makes one: ``from`` a URL, Ollama's ``remote_host``
    (then ``from`` is the model's name upstream), or ``remote_hosts`` (replicas). Takes
    ``upstream_model`` out of ``parameters``. None for a local model."""
    model = parameters.pop("upstream_model", None) if isinstance(parameters, dict) else None
    if model is not None and not isinstance(model, str):
        raise InvalidRequest("parameter upstream_model must be a string")
    urls = list(remote_hosts or [])
    if remote_host:
        urls.insert(0, remote_host)
        model = model or from_
    elif from_ and is_url(from_):
        urls.insert(0, from_)
    if not urls:
        if model:
            raise InvalidRequest("parameter upstream_model is for remote models (FROM http(s)://...)")
        return None
    if not all(isinstance(u, str) for u in urls):
        raise InvalidRequest("remote_hosts must be a list of URLs")
    return RemoteSpec(urls, model or "")


def checked_parameters(values: dict[str, Any]) -> dict[str, Any]:
    """Parameters with known names and the right types (InvalidRequest otherwise)."""
    if not isinstance(values, dict):
        raise InvalidRequest("parameters must be an object")
    known = set(Options.names())
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name not in known:
            raise InvalidRequest(f"unknown parameter '{name}'")
        if value is not None:
            out[name] = coerce_option(name, value)
    return out


def checked_messages(values: list[Any]) -> list[dict[str, str]]:
    out = []
    for item in values:
        if not isinstance(item, dict) or not isinstance(item.get("content", ""), str):
            raise InvalidRequest("messages must be a list of {role, content}")
        role = item.get("role")
        if role not in ROLES:
            raise InvalidRequest(f'message role must be one of "system", "user", or "assistant", not {role!r}')
        out.append({"role": role, "content": item.get("content") or ""})
    return out


# ------------------------------------------------------------------------------------ create
def _layer(layout: Layout, media: str, data: bytes) -> tuple[dict[str, Any], Progress]:
    exists = layout.blob("sha256:" + hashlib.sha256(data).hexdigest()).is_file()
    digest = blobs.write_blob(layout, data)
    status = f"{'using existing' if exists else 'creating new'} layer {digest}"
    return {"mediaType": media, "digest": digest, "size": len(data)}, Progress(status)


def _gguf_layer(layout: Layout, blob: Path, digest: str) -> dict[str, Any]:
    try:
        ggufmeta.read_gguf_header(blob)
    except PollamaError as err:
        raise InvalidModel(f"supplied file was not in GGUF format: {err}") from None
    return {"mediaType": MODEL_MEDIA_TYPE, "digest": digest, "size": blob.stat().st_size}


def _is_projector(blob: Path) -> bool:
    try:
        return ggufmeta.read_gguf_header(blob).architecture == "clip"
    except PollamaError as err:
        raise InvalidModel(f"supplied file was not in GGUF format: {err}") from None


def _uploaded_layers(layout: Layout, spec: CreateSpec) -> list[dict[str, Any]]:
    """``files``: one model GGUF, and at most one projector GGUF (told apart by their headers)."""
    ggufs = [(n, d) for n, d in spec.files.items() if n.lower().endswith(".gguf")] or list(spec.files.items())
    model: list[dict[str, Any]] = []
    projector: list[dict[str, Any]] = []
    for name, digest in ggufs:
        blob = layout.blob(digest)
        if not blob.is_file():
            raise InvalidRequest(f'file "{name}" was not uploaded: no blob {digest} (POST /api/blobs/{digest} first)')
        layer = _gguf_layer(layout, blob, f"sha256:{digest_hex(digest)}")
        if _is_projector(blob):
            projector.append(dict(layer, mediaType=PROJECTOR_MEDIA_TYPE))
        else:
            model.append(layer)
    if len(model) != 1 or len(projector) > 1:
        raise InvalidRequest("only one GGUF file per model is supported (and one vision projector)")
    return model + projector


def _projector_layer(layout: Layout, path: Path, imported: list[Path]) -> dict[str, Any]:
    """A local projector file, checked (a clip GGUF) and copied into the store."""
    from . import check_projector

    check_projector(path)
    digest, size = blobs.import_gguf(layout, path)
    imported.append(path)
    return {"mediaType": PROJECTOR_MEDIA_TYPE, "digest": digest, "size": size}


def _draft_layer(cfg: _config.Config, layout: Layout, spec: CreateSpec,
                 imported: list[Path]) -> Iterator[Progress]:
    """The draft model's layer (None: the request names none): an uploaded file, a local file
    (copied into the store), or a store model (its GGUF blob, shared)."""
    from . import lookup

    if not (spec.draft_files or spec.draft_file or spec.draft_from):
        return None
    yield Progress("parsing GGUF")
    if spec.draft_files:
        name, digest = next(iter(spec.draft_files.items()))
        blob = layout.blob(digest)
        if not blob.is_file():
            raise InvalidRequest(f'file "{name}" was not uploaded: no blob {digest} (POST /api/blobs/{digest} first)')
        path, layer = blob, _gguf_layer(layout, blob, f"sha256:{digest_hex(digest)}")
    elif spec.draft_file is not None:
        path = spec.draft_file
        ggufmeta.read_gguf_header(path)
        digest, size = blobs.import_gguf(layout, path)
        imported.append(path)
        layer = {"digest": digest, "size": size}
    else:
        try:
            stored = lookup(spec.draft_from, cfg, from_network=True)
        except ModelNotFound:
            raise ModelNotFound(f'draft model "{spec.draft_from}" not found (pull it first)') from None
        path = stored.path
        if stored.manifest is None:  # the default model or a .gguf path: imported
            digest, size = blobs.import_gguf(layout, stored.path)
            imported.append(stored.path)
            layer = {"digest": digest, "size": size}
        else:
            layer = next(dict(x) for x in manifests.layers(stored.manifest) if x.get("mediaType") == MODEL_MEDIA_TYPE)
    if _is_projector(path):
        raise InvalidRequest("DRAFT names a vision projector: a draft model is a language model")
    return dict(layer, mediaType=DRAFT_MEDIA_TYPE)


def _base_layers(cfg: _config.Config, layout: Layout, spec: CreateSpec, imported: list[Path]) -> Iterator[Progress]:
    """The base model's layers (model first): from files, a local file, or ``from``. The files
    copied into the store are added to ``imported``."""
    from . import looks_like_path, lookup

    if spec.files:
        yield Progress("parsing GGUF")
        return _uploaded_layers(layout, spec)
    if spec.from_file is not None:
        yield Progress("parsing GGUF")
        if ggufmeta.read_gguf_header(spec.from_file).architecture == "clip":
            raise InvalidRequest(f"{spec.from_file} is a vision projector: the first FROM names the model")
        digest, size = blobs.import_gguf(layout, spec.from_file)
        imported.append(spec.from_file)
        return [{"mediaType": MODEL_MEDIA_TYPE, "digest": digest, "size": size}]
    try:
        stored = lookup(spec.from_, cfg, from_network=True)
    except ModelNotFound:
        hint = "" if looks_like_path(spec.from_) else " (pull it first)"
        raise ModelNotFound(f'base model "{spec.from_}" not found{hint}') from None
    if stored.manifest is None:  # the default model or a .gguf path: imported (copied)
        yield Progress("parsing GGUF")
        digest, size = blobs.import_gguf(layout, stored.path)
        imported.append(stored.path)
        return [{"mediaType": MODEL_MEDIA_TYPE, "digest": digest, "size": size}]
    layers = [dict(layer) for layer in manifests.layers(stored.manifest)]
    for layer in layers:
        yield Progress(f"using existing layer {layer.get('digest')}")
    return layers


def _base_remote(cfg: _config.Config, spec: CreateSpec) -> RemoteModel | None:
    """The remote model ``spec.from_`` is, when it is a remote store model."""
    from . import lookup

    if not spec.from_ or spec.files or spec.from_file:
        return None
    try:
        return lookup(spec.from_, cfg, from_network=True).remote
    except PollamaError:
        return None


def _read_json_layer(layout: Layout, layers: list[dict[str, Any]], media: str) -> Any:
    for layer in layers:
        if layer.get("mediaType") == media:
            try:
                return json.loads(layout.blob(str(layer.get("digest", ""))).read_text())
            except (OSError, ValueError, OutsideStore):
                return None
    return None


def _without(layers: list[dict[str, Any]], media: str) -> list[dict[str, Any]]:
    return [layer for layer in layers if layer.get("mediaType") != media]


def create(cfg: _config.Config, spec: CreateSpec, *, cancel: threading.Event | None = None) -> Iterator[Progress]:
    """Create ``spec.model``, yielding progress. Raises InvalidRequest/InvalidModel/ModelNotFound."""
    from . import _store_name

    spec.check()
    name = _store_name(spec.model, "model")
    layout = Layout(cfg.models)
    imported: list[Path] = []  # local files copied in, and blobs written, before the manifest
    written: list[bytes] = []  # names them: a concurrent delete may prune them meanwhile
    remote: RemoteModel | None = None
    if spec.remote is not None:
        yield Progress("asking the upstream which model it serves")
        remote, notes = discover(spec.remote, cfg)
        for note in notes:
            yield Progress(note)
        yield Progress(f"remote model {remote.model} ({remote.api} API, {len(remote.upstreams)} "
                       f"replica{'s' if len(remote.upstreams) > 1 else ''})")
        layers: list[dict[str, Any]] = []
    else:
        layers = yield from _base_layers(cfg, layout, spec, imported)
        remote = _base_remote(cfg, spec)
        if remote is not None and spec.template:
            raise InvalidRequest("TEMPLATE cannot be set on a remote model: its upstream applies its own")
    if spec.projector_file is not None:
        yield Progress("parsing GGUF")
        layers = _without(layers, PROJECTOR_MEDIA_TYPE) + [_projector_layer(layout, spec.projector_file, imported)]
    draft = yield from _draft_layer(cfg, layout, spec, imported)
    if draft is not None:
        layers = _without(layers, DRAFT_MEDIA_TYPE) + [draft]
    if cancel is not None and cancel.is_set():
        raise Cancelled("the create was cancelled")
    new: list[Progress] = []

    def put(media: str, data: bytes, replace: bool = True) -> None:
        nonlocal layers
        if replace:
            layers = _without(layers, media)
        layer, progress = _layer(layout, media, data)
        written.append(data)
        layers.append(layer)
        new.append(progress)

    if spec.template:
        put(TEMPLATE, spec.template.encode())
    if spec.system:
        put(SYSTEM, spec.system.encode())
    for text in spec.licenses():
        if text:
            put(LICENSE, text.encode(), replace=False)
    params = dict(_read_json_layer(layout, layers, PARAMS) or {})
    if spec.parameters:
        params.update(spec.parameters)
        put(PARAMS, json.dumps(params).encode())
    if spec.messages:
        put(MESSAGES, json.dumps(spec.messages).encode())
    yield from new
    fields: dict[str, Any] = {"model_format": "gguf", "model_family": "", "file_type": ""}
    if remote is not None:  # as Ollama records a cloud model
        fields = {"model_format": "", "model_family": "", "file_type": "", **remote.config()}
    config = json.dumps(fields).encode()
    config_digest = blobs.write_blob(layout, config)
    written.append(config)
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config)},
        "layers": layers,
    }
    yield Progress("writing manifest")

    def restore() -> None:
        for data in written:
            blobs.write_blob(layout, data)
        for path in imported:
            blobs.import_gguf(layout, path)

    manifests.commit(layout, name, manifest, restore=restore)  # prunes the previous version's blobs
    log.info("created %s", name)
    yield Progress("success")
