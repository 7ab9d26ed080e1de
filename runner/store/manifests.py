"""Manifests: which blobs make a model, and the changes a user makes to the store (copy, delete).

A manifest is Docker's image manifest v2 as Ollama writes it: a config blob and layers, each
``{mediaType, digest, size}``. A copy is a new manifest naming the same blobs; a delete removes
the manifest, its emptied folders, then every blob it named that no other manifest names.

Concurrency: every change to the set of manifests (:func:`commit`, :func:`remove`, :func:`prune`)
runs under the store's lock (:meth:`Layout.locked`, a flock: threads and processes). A prune
decides from the manifests on disk which blobs nobody names; under the lock no manifest appears
between that decision and the removal, and a change that wrote its blobs before taking the lock
checks that they are still there (a prune may have taken one that no manifest named yet) and
writes them again. Readers take no lock: a manifest that vanishes under them is "not found".
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable, Iterator

from ..api import InvalidModel
from . import blobs
from .layout import Layout, OutsideStore, digest_hex
from .names import Name, name_from_parts

log = logging.getLogger(__name__)

MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_MEDIA_PREFIX = "application/vnd.ollama.image."
MODEL_MEDIA_TYPE = LAYER_MEDIA_PREFIX + "model"
PROJECTOR_MEDIA_TYPE = LAYER_MEDIA_PREFIX + "projector"  # a vision projector GGUF (clip)
DRAFT_MEDIA_TYPE = LAYER_MEDIA_PREFIX + "draft"  # a draft model GGUF (Modelfile DRAFT, as Ollama's)


def read(layout: Layout, name: Name) -> dict[str, Any] | None:
    """The manifest of ``name``, or None when there is none. Raises InvalidModel when unreadable."""
    path = layout.manifest(name)
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
    except FileNotFoundError:  # deleted since the check
        return None
    except (OSError, ValueError) as err:
        raise InvalidModel(f'model "{name}" has an unreadable manifest: {err}') from None
    if not isinstance(manifest, dict):
        raise InvalidModel(f'model "{name}" has an unreadable manifest')
    return manifest


def layers(manifest: dict[str, Any]) -> list[dict[str, Any]]:
    return [layer for layer in manifest.get("layers") or [] if isinstance(layer, dict)]


def digests(manifest: dict[str, Any]) -> set[str]:
    """The hex digests a manifest names (config and layers); malformed ones are skipped."""
    out = set()
    for item in [manifest.get("config")] + layers(manifest):
        hex_digest = digest_hex(item.get("digest", "")) if isinstance(item, dict) else None
        if hex_digest:
            out.add(hex_digest)
    return out


def names(layout: Layout) -> Iterator[tuple[Name, Path]]:
    """Every valid manifest name in the store with its file (others are skipped, as Ollama)."""
    root = layout.manifests
    if not root.is_dir():
        return
    for path in root.glob("*/*/*/*"):
        name = name_from_parts(layout.relative_manifest(path))
        if name is not None and path.is_file() and not path.is_symlink():
            yield name, path


def commit(layout: Layout, name: Name, manifest: dict[str, Any], *, raw: bytes | None = None,
           restore: Callable[[], object] | None = None) -> None:
    """Make ``manifest`` (stored as ``raw`` when given) the manifest of ``name``, then prune the
    blobs only its previous version used: all under the store's lock.

    Every blob the manifest names must be in the store. Blobs written before the lock was taken
    may have been pruned meanwhile by a concurrent delete (no manifest named them yet):
    ``restore()``, when given, writes them again; a blob still missing fails the change with
    InvalidModel, and nothing is written.
    """
    with layout.locked():
        commit_holding_lock(layout, name, manifest, raw=raw, restore=restore)


def commit_holding_lock(layout: Layout, name: Name, manifest: dict[str, Any], *, raw: bytes | None = None,
                        restore: Callable[[], object] | None = None) -> None:
    """:func:`commit` for a caller that holds :meth:`Layout.locked` already."""
    def missing() -> list[str]:
        return [h for h in sorted(digests(manifest)) if not layout.blob(f"sha256:{h}").is_file()]

    gone = missing()
    if gone and restore is not None:
        log.info("writing blobs again, pruned before %s named them: %s", name, ", ".join(gone))
        restore()
        gone = missing()
    if gone:
        raise InvalidModel(f'cannot write "{name}": its blob sha256-{gone[0]} is missing '
                           "(a model that shared it was deleted meanwhile?): try again")
    try:
        previous = read(layout, name)
    except InvalidModel:
        previous = None
    blobs.write_atomic(layout, layout.manifest(name), raw if raw is not None else json.dumps(manifest).encode())
    if previous is not None:  # a new version of the name: drop the old blobs nobody uses now
        _prune(layout, digests(previous))


def new_model_manifest(layout: Layout, model_digest: str, model_size: int) -> dict[str, Any]:
    """A one-layer manifest for an imported GGUF (its config blob is written here)."""
    config = json.dumps({"model_format": "gguf", "model_family": "", "file_type": ""}).encode()
    config_digest = blobs.write_blob(layout, config)
    return {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": len(config)},
        "layers": [{"mediaType": MODEL_MEDIA_TYPE, "digest": model_digest, "size": model_size}],
    }


def remove(layout: Layout, name: Name) -> dict[str, Any] | None:
    """Delete ``name``'s manifest and the blobs only it used (under the store's lock); returns
    the removed manifest (``{}`` when unreadable), or None when ``name`` has none."""
    path = layout.manifest(name)
    if not path.is_file():  # not found: the store is left as it is (no lock file made)
        return None
    with layout.locked():
        if not path.is_file():  # deleted meanwhile
            return None
        try:
            manifest = json.loads(path.read_text())
        except (OSError, ValueError):
            manifest = {}
        if not isinstance(manifest, dict):
            manifest = {}
        blobs.remove(layout, path)
        blobs.prune_empty_dirs(layout, path.parent, layout.manifests)
        _prune(layout, digests(manifest))
    return manifest


def in_use(layout: Layout) -> set[str]:
    """The hex digests every manifest in the store names."""
    used: set[str] = set()
    for _, other in names(layout):
        try:
            other_manifest = json.loads(other.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(other_manifest, dict):
            used |= digests(other_manifest)
    return used


def prune(layout: Layout, candidates: set[str]) -> None:
    """Remove the blobs among ``candidates`` (hex digests) that no manifest names any more
    (under the store's lock; not for a caller that holds it)."""
    with layout.locked():
        _prune(layout, candidates)


def _prune(layout: Layout, candidates: set[str]) -> None:
    for hex_digest in candidates - in_use(layout):
        try:
            blobs.remove(layout, layout.blob(f"sha256:{hex_digest}"))
        except OutsideStore:  # a blob path that is a link out of the store: leave it
            log.warning("not removing blob sha256-%s: it leads outside the store", hex_digest)
