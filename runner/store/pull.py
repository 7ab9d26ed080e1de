"""Pull a model from a registry into the store: ``pollama pull`` and ``POST /api/pull``.

The statuses are Ollama's: ``pulling manifest``; per layer ``pulling <12 hex>`` with
``digest``/``total``/``completed``; ``verifying sha256 digest``; ``writing manifest``; ``success``.

How a blob arrives (:func:`_download`):

- the manifest must be a valid one (:func:`_layers`: ``schemaVersion`` 2, a config and at least
  one layer, each with a ``sha256`` digest and a size that is a non-negative integer), read to at
  most 4 MiB (the registry's rules: :mod:`.registry`);
- a blob already in the store is not fetched again (blobs are shared between models);
- bytes go to ``blobs/sha256-<hex>-partial``, hashed as they are written, never more than the
  manifest's size of them; a partial file left by a dropped connection is continued with a Range
  request (its bytes hashed first), so a failed pull resumes where it stopped;
- nothing of a failed download stays but a partial file that may still be a prefix of the blob
  (some bytes, fewer than its size): an empty one, one the registry overfilled, or one whose
  sha256 differs is deleted (:func:`_keep_or_delete`); a whole one whose sha256 matched stays
  for the next pull when a later blob fails;
- one download per blob at a time, across threads and processes (an exclusive ``flock`` on the
  partial file): a second pull of the same blob waits, then finds it in place;
- ``verifying sha256 digest``: each partial file whose sha256 is its digest is renamed into
  place (atomic); one that differs is deleted and the pull fails, naming the digest (a download
  is checked as soon as it ends, so a wrong one fails the pull before the next blob);
- the manifest is written last, atomically, as the registry sent it, so a model is listed only
  once all its blobs are whole.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from .. import config as _config
from ..api import InvalidRequest, ModelNotFound, PollamaError
from . import blobs, manifests
from .layout import Layout, digest_hex
from .names import InvalidName, Name, parse_name
from .progress import Progress, layer_status
from .registry import Registry, RegistryError, Remote

log = logging.getLogger(__name__)

_CHUNK = 1 << 20
_REPORT_EVERY = 0.1  # seconds between progress reports of one layer


class DigestMismatch(PollamaError):
    status = 400


@dataclass
class _Layer:
    digest: str  # sha256:<hex>
    size: int


_MAX_SIZE = (1 << 63) - 1  # a blob's size is an int64, as in Ollama


def _show(value: Any) -> str:
    """A value from the manifest, for a message: its repr, one line of at most 40 characters."""
    try:
        text = repr(value[:40] if isinstance(value, str) else value)
    except RecursionError:
        text = type(value).__name__
    return text if len(text) <= 40 else text[:39] + "…"


def _entry(item: Any, what: str) -> _Layer:
    """A config or layer entry: ``{mediaType, digest: sha256:<64 hex>, size: int >= 0}``."""
    if not isinstance(item, dict):
        raise RegistryError(f"pull model manifest: bad {what} {_show(item)}")
    digest, size, media = item.get("digest"), item.get("size"), item.get("mediaType", "")
    hex_digest = digest_hex(digest) if isinstance(digest, str) else None
    if (hex_digest is None or not isinstance(size, int) or isinstance(size, bool)
            or not 0 <= size <= _MAX_SIZE or not isinstance(media, str)):
        raise RegistryError(f"pull model manifest: bad {what} {_show(digest)} (size {_show(size)})")
    return _Layer(f"sha256:{hex_digest}", size)


def _layers(manifest: dict[str, Any]) -> list[_Layer]:
    """The blobs a valid manifest needs (layers, then config), each once. Raises RegistryError
    (``pull model manifest: ...``) for anything but Docker's manifest v2: ``schemaVersion`` 2, a
    ``config`` entry and a non-empty ``layers`` list of entries, each entry a ``sha256`` digest
    with a size that is a non-negative integer (and a mediaType string, if any)."""
    if manifest.get("schemaVersion") != 2 or isinstance(manifest.get("schemaVersion"), bool):
        raise RegistryError(f"pull model manifest: schemaVersion {_show(manifest.get('schemaVersion'))}, not 2")
    items = manifest.get("layers")
    if not isinstance(items, list) or not items:
        raise RegistryError("pull model manifest: the registry sent no layers")
    if "config" not in manifest:
        raise RegistryError("pull model manifest: the registry sent no config")
    entries = [_entry(item, "layer") for item in items] + [_entry(manifest["config"], "config")]
    out: list[_Layer] = []
    seen: set[str] = set()
    for entry in entries:
        if entry.digest not in seen:
            seen.add(entry.digest)
            out.append(entry)
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
    network failure, a stall or an invalid manifest (a partial file that may be a prefix of its
    blob is kept), DigestMismatch (the partial file is deleted), Cancelled when ``cancel`` is set
    (at once: the registry's connection is closed).
    """
    name = parse_pull_name(text)
    remote = Remote.of(text, name, insecure)
    layout = Layout(cfg.models)
    yield Progress("pulling manifest")
    with Registry(remote, stall=cfg.pull_stall_timeout, cancel=cancel) as registry:
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
            hashes[layer.digest] = yield from _download(layout, registry, layer)
    yield Progress("verifying sha256 digest")
    for layer in layers:
        _verify(layout, layer, hashes[layer.digest])
    _check_remote(cfg, layout, name, manifest, layers)
    yield Progress("writing manifest")
    # under the store's lock, as copy and delete: a delete meanwhile cannot prune what the
    # manifest names, and the old version's blobs nobody uses go (as Ollama)
    manifests.commit(layout, name, manifest, raw=raw)
    log.info("pulled %s", name)
    yield Progress("success")


def _check_remote(cfg: _config.Config, layout: Layout, name: Name, manifest: dict[str, Any],
                  layers: list[_Layer]) -> None:
    """A pulled model that forwards prompts to an upstream (a remote model) may name only hosts
    in ``OLLAMA_REMOTES`` (none by default): else pulling a model could send a user's prompts
    anywhere. Refused (InvalidRequest) before its manifest is written; its blobs are pruned."""
    from . import remote_of

    found = remote_of(layout, name, manifest)
    why = found[1].refusal(cfg.remotes) if found is not None else None
    if why is None:
        return
    manifests.prune(layout, {h for h in (digest_hex(layer.digest) for layer in layers) if h})
    raise InvalidRequest(f"pull {name}: {why}")


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


def _download(layout: Layout, registry: Registry, layer: _Layer) -> Iterator[Progress]:
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
            try:
                h, have = yield from _fetch(registry, layer, partial, h, have, status)
            except BaseException as err:  # a failure, a cancel, or the caller closing the pull
                _keep_or_delete(layout, partial, layer, err)
                raise
        if f"sha256:{h.hexdigest()}" != layer.digest:
            blobs.remove(layout, partial)
            raise _mismatch(layer, f"the registry sent sha256:{h.hexdigest()[:12]}…")
        yield Progress(status, layer.digest, layer.size, have)
        return h.hexdigest()


def _keep_or_delete(layout: Layout, partial: Path, layer: _Layer, err: BaseException) -> None:
    """After a download that failed: keep the partial file only when it may be a prefix of the
    blob, to resume from (some bytes, fewer than the size, and not refused for its bytes)."""
    try:
        size = partial.stat().st_size
    except OSError:
        return
    if isinstance(err, DigestMismatch) or size == 0 or size >= layer.size:
        blobs.remove(layout, partial)
    else:
        log.info("keeping %d of %d bytes of %s for the next pull", size, layer.size, layer.digest)


_RANGE = re.compile(r"^\s*bytes\s+(\d+)-")


def _fetch(registry: Registry, layer: _Layer, partial: Path, h: "hashlib._Hash", have: int,
           status: str) -> Iterator[Progress]:
    last = time.monotonic()
    try:
        with registry.blob(layer.digest, have) as resp, open(partial, "r+b") as out:
            resumed = resp.status_code == 206 and have > 0
            if resumed:
                match = _RANGE.match(resp.headers.get("content-range", ""))
                if match is None or int(match.group(1)) != have:
                    raise RegistryError(f"the registry answered another range than bytes={have}-")
            else:  # the whole blob comes: start over
                if have:
                    log.info("the registry ignored the range for %s: starting over", layer.digest)
                if resp.status_code == 416:
                    raise RegistryError("the registry refused the range")
                h, have = hashlib.sha256(), 0
            expected = layer.size - have
            announced = registry.length(resp)
            if announced is not None and announced > expected:
                raise _mismatch(layer, f"the registry announces {announced} bytes, the manifest "
                                       f"{'leaves ' if resumed else 'says '}{expected}")
            out.seek(have)
            out.truncate()
            for block in registry.body(resp, expected):
                if have + len(block) > layer.size:
                    raise _mismatch(layer, "more bytes than the manifest says")
                out.write(block)
                h.update(block)
                have += len(block)
                now = time.monotonic()
                if now - last >= _REPORT_EVERY:
                    last = now
                    yield Progress(status, layer.digest, layer.size, have)
    except ModelNotFound:
        raise ModelNotFound(f"pull {layer.digest}: file does not exist") from None
    except DigestMismatch:
        raise
    except RegistryError as err:
        kept = (f" ({have} of {layer.size} bytes kept, pull again to resume)"
                if 0 < have < layer.size else "")
        raise RegistryError(f"download {layer.digest}: {err}{kept}") from None
    if have != layer.size:
        kept = " (kept; pull again to resume)" if have else ""
        raise RegistryError(f"download {layer.digest}: the connection ended at {have} of "
                            f"{layer.size} bytes{kept}")
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
