"""Pull a model from a registry into the store: ``pollama pull`` and ``POST /api/pull``.

The statuses are Ollama's: ``pulling manifest``; per layer ``pulling <12 hex>`` with
``digest``/``total``/``completed``; ``verifying sha256 digest``; ``writing manifest``; ``success``.

How a blob arrives (:func:`_download`):

- a blob already in the store is not fetched again (blobs are shared between models);
- bytes go to ``blobs/sha256-<hex>-partial``, hashed as they are written; a partial file left by
  a dropped connection is continued with a Range request (its bytes hashed first), so a failed
  pull resumes where it stopped;
- one download per blob at a time, across threads and processes (an exclusive ``flock`` on the
  partial file): a second pull of the same blob waits, then finds it in place;
- ``verifying sha256 digest``: each partial file whose sha256 is its digest is renamed into
  place (atomic); one that differs is deleted and the pull fails, naming the digest;
- the manifest is written last, atomically, as the registry sent it, so a model is listed only
  once all its blobs are whole.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx

from .. import config as _config
from ..api import Cancelled, InvalidRequest, ModelNotFound, PollamaError
from . import blobs, manifests
from .layout import Layout, digest_hex
from .names import InvalidName, Name, parse_name
from .progress import Progress, layer_status
from .registry import Registry, RegistryError, Remote, reason

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_REPORT_EVERY = 0.1  # seconds between progress reports of one layer


class DigestMismatch(PollamaError):
    status = 400


@dataclass
class _Layer:
    digest: str  # sha256:<hex>
    size: int


def _layers(manifest: dict[str, Any]) -> list[_Layer]:
    """The blobs a manifest needs (layers, then config), each once; bad digests refused."""
    items = list(manifests.layers(manifest))
    config = manifest.get("config")
    if isinstance(config, dict) and config.get("digest"):
        items.append(config)
    out: list[_Layer] = []
    seen: set[str] = set()
    for item in items:
        digest = str(item.get("digest", ""))
        hex_digest = digest_hex(digest)
        size = item.get("size")
        if hex_digest is None or not isinstance(size, int) or size < 0:
            raise RegistryError(f"pull model manifest: bad layer {digest!r} (size {size!r})")
        if hex_digest not in seen:
            seen.add(hex_digest)
            out.append(_Layer(f"sha256:{hex_digest}", size))
    return out


def parse_pull_name(text: str) -> Name:
    if not text:
        raise InvalidRequest("model is required")
    try:
        return parse_name(text)
    except InvalidName:
        raise InvalidRequest(f'invalid model name "{text}"') from None


def pull(cfg: _config.Config, text: str, *, insecure: bool = False,
         cancel: threading.Event | None = None) -> Iterator[Progress]:
    """Pull ``text`` (``[host[:port]/][namespace/]model[:tag]``) into the store, yielding progress.

    Raises (from the iterator) ModelNotFound for an unknown model or tag, RegistryError for a
    network failure (the partial file is kept), DigestMismatch (the blob is deleted), Cancelled
    when ``cancel`` is set.
    """
    name = parse_pull_name(text)
    remote = Remote.of(text, name, insecure)
    layout = Layout(cfg.models)
    cancel = cancel or threading.Event()
    yield Progress("pulling manifest")
    with Registry(remote) as registry:
        try:
            manifest, raw = registry.manifest()
        except ModelNotFound as err:
            raise ModelNotFound(f"pull model manifest: {err}") from None
        except RegistryError as err:
            message = str(err)
            raise RegistryError(message if message.startswith("pull model manifest") else
                                f"pull model manifest: {message}") from None
        layers = _layers(manifest)
        hashes: dict[str, str | None] = {}
        for layer in layers:
            hashes[layer.digest] = yield from _download(layout, registry, layer, cancel)
    yield Progress("verifying sha256 digest")
    for layer in layers:
        _verify(layout, layer, hashes[layer.digest])
    yield Progress("writing manifest")
    try:
        previous = manifests.read(layout, name)
    except PollamaError:
        previous = None
    blobs.write_atomic(layout, layout.manifest(name), raw)
    if previous is not None:  # a new version of the tag: drop the old blobs nobody uses (as Ollama)
        manifests.prune(layout, manifests.digests(previous))
    log.info("pulled %s", name)
    yield Progress("success")


def _hash_file(path: Path, limit: int) -> tuple["hashlib._Hash", int]:
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as fh:
        while done < limit:
            block = fh.read(min(_CHUNK, limit - done))
            if not block:
                break
            h.update(block)
            done += len(block)
    return h, done


def _download(layout: Layout, registry: Registry, layer: _Layer,
              cancel: threading.Event) -> Iterator[Progress]:
    """Fetch one blob into its partial file; returns its hex sha256 (None: already in place)."""
    status = layer_status("pulling", layer.digest)
    blob = layout.blob(layer.digest)
    if blob.is_file():
        yield Progress(status, layer.digest, layer.size, layer.size)
        return None
    yield Progress(status, layer.digest, layer.size, 0)
    with blobs.exclusive_partial(layout, layer.digest) as partial:
        if blob.is_file():  # another pull finished it while we waited
            yield Progress(status, layer.digest, layer.size, layer.size)
            return None
        have = partial.stat().st_size
        if have > layer.size:
            have = 0
        h, have = _hash_file(partial, have)
        if have:
            log.info("resuming %s at %d of %d bytes", layer.digest, have, layer.size)
            yield Progress(status, layer.digest, layer.size, have)
        if have < layer.size or layer.size == 0:
            h, have = yield from _fetch(registry, layer, partial, h, have, cancel, status)
        return h.hexdigest()


def _fetch(registry: Registry, layer: _Layer, partial: Path, h: "hashlib._Hash", have: int,
           cancel: threading.Event, status: str) -> Iterator[Progress]:
    last = time.monotonic()
    try:
        with registry.blob(layer.digest, have) as resp, open(partial, "r+b") as out:
            if resp.status_code != 206 or have == 0:  # the whole blob comes: start over
                if have:
                    log.info("the registry ignored the range for %s: starting over", layer.digest)
                h, have = hashlib.sha256(), 0
                if resp.status_code == 416:
                    raise RegistryError(f"{layer.digest}: the registry refused the range")
            out.seek(have)
            out.truncate()
            for block in resp.iter_bytes():
                if cancel.is_set():
                    raise Cancelled("the pull was cancelled")
                out.write(block)
                h.update(block)
                have += len(block)
                if have > layer.size:
                    raise _mismatch(layer, "more bytes than the manifest says")
                now = time.monotonic()
                if now - last >= _REPORT_EVERY:
                    last = now
                    yield Progress(status, layer.digest, layer.size, have)
    except httpx.HTTPError as err:
        raise RegistryError(f"download {layer.digest}: {reason(err)} "
                            f"({have} of {layer.size} bytes kept, pull again to resume)") from None
    except ModelNotFound:
        raise ModelNotFound(f"pull {layer.digest}: file does not exist") from None
    if have != layer.size:
        raise RegistryError(f"download {layer.digest}: the connection ended at {have} of "
                            f"{layer.size} bytes (kept; pull again to resume)")
    yield Progress(status, layer.digest, layer.size, have)
    return h, have


def _mismatch(layer: _Layer, why: str) -> DigestMismatch:
    return DigestMismatch(f"digest mismatch, file must be downloaded again: {layer.digest} ({why})")


def _verify(layout: Layout, layer: _Layer, hex_digest: str | None) -> None:
    """Rename a downloaded partial file into place when its sha256 is its digest; else delete it."""
    blob = layout.blob(layer.digest)
    if blob.is_file():
        return
    with blobs.exclusive_partial(layout, layer.digest) as partial:
        if blob.is_file():
            return
        if hex_digest is None or partial.stat().st_size != layer.size:
            h, _ = _hash_file(partial, layer.size + 1)
            hex_digest = h.hexdigest()
        if f"sha256:{hex_digest}" != layer.digest:
            blobs.remove(layout, partial)
            raise _mismatch(layer, f"the registry sent sha256:{hex_digest[:12]}…")
        blobs.promote(layout, partial, layer.digest)


__all__ = ["DigestMismatch", "pull", "parse_pull_name"]
