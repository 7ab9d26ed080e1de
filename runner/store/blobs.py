"""Blobs: content-addressed files named by their sha256, written atomically.

A blob is written to a temporary file in ``blobs/`` while its digest is computed, then renamed
into place, so a blob that exists is always whole. Every writer has a temporary file of its own
(:meth:`Layout.temporary`), so concurrent writers of one blob (two uploads, an upload and an
import) each finish, and the last rename leaves the same bytes. Importing a file makes a copy
(never a hard link: a blob must not change when its source does), and only a GGUF file with a
valid header is ever imported.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator

from ..model import ggufmeta
from ..api import InvalidRequest
from .layout import Layout, digest_hex

_CHUNK = 1 << 20

_digests: dict[tuple[str, int, int], str] = {}
_digest_locks: dict[tuple[str, int, int], threading.Lock] = {}
_digests_lock = threading.Lock()


def file_digest(path: Path) -> str:
    """The hex sha256 of a file, computed once per (path, size, mtime); callers that ask at the
    same time wait for the one computation. Blocking: call it off an event loop."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    with _digests_lock:
        if key in _digests:
            return _digests[key]
        lock = _digest_locks.setdefault(key, threading.Lock())
    with lock:
        with _digests_lock:
            if key in _digests:
                return _digests[key]
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(_CHUNK), b""):
                h.update(block)
        digest = h.hexdigest()
        with _digests_lock:
            _digests[key] = digest
            _digest_locks.pop(key, None)
        return digest


def create_temporary(layout: Layout, folder: Path, kind: str) -> tuple[int, Path]:
    """A new, empty temporary file of this writer's own in ``folder`` (made if missing): its
    open descriptor (write-only) and its path (:meth:`Layout.temporary`)."""
    for attempt in range(8):
        tmp = layout.temporary(folder, kind)
        try:
            tmp.parent.mkdir(parents=True, exist_ok=True)
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(tmp, flags, 0o600), tmp
        except (FileExistsError, FileNotFoundError):
            # the name was taken, or a delete pruned the emptied folder while it was made: again
            if attempt == 7:
                raise
    raise AssertionError("unreachable")


def write_atomic(layout: Layout, path: Path, data: bytes | Iterable[bytes | bytearray | memoryview],
                 mode: int = 0o644) -> None:
    """Replace ``path`` (a store path) with ``data`` (bytes, or pieces written in turn), all or
    nothing: readers see the old file or the whole new one, never a part. ``mode``: the file's
    permissions (the prompt store's files, which hold conversations, are the user's alone)."""
    path = layout.recheck(path)
    fd, tmp = create_temporary(layout, path.parent, "tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            for piece in [data] if isinstance(data, bytes) else data:
                fh.write(piece)
        os.chmod(tmp, mode)
        os.replace(tmp, layout.recheck(path))
    except BaseException:
        _unlink_quietly(tmp)
        raise


def write_blob(layout: Layout, data: bytes) -> str:
    """Store ``data`` as a blob; returns its ``sha256:<hex>`` digest."""
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blob = layout.blob(digest)
    if not blob.is_file():
        write_atomic(layout, blob, data)
    return digest


def _copy_hashing(src: BinaryIO, dst: BinaryIO) -> str:
    h = hashlib.sha256()
    for block in iter(lambda: src.read(_CHUNK), b""):
        h.update(block)
        dst.write(block)
    return h.hexdigest()


def import_gguf(layout: Layout, source: Path) -> tuple[str, int]:
    """Copy a GGUF file into the store as a blob: (``sha256:<hex>`` digest, size).

    The file must be a GGUF with a valid header (raises InvalidModel otherwise); nothing else is
    ever imported. The copy is hashed as it is written and renamed into place once whole; an
    existing blob with the same digest is kept.
    """
    ggufmeta.read_gguf_header(source)
    fd, tmp = create_temporary(layout, layout.blobs, "import")
    try:
        with open(source, "rb") as src, os.fdopen(fd, "wb") as dst:
            hex_digest = _copy_hashing(src, dst)
            size = dst.tell()
        digest = f"sha256:{hex_digest}"
        blob = layout.blob(digest)
        if blob.is_file():
            _unlink_quietly(tmp)
        else:
            os.chmod(tmp, 0o644)
            os.replace(tmp, blob)
        return digest, size
    except BaseException:
        _unlink_quietly(tmp)
        raise


def has_blob(layout: Layout, digest: str) -> bool:
    """Whether the blob ``digest`` is in the store (raises OutsideStore for a bad digest)."""
    return layout.blob(digest).is_file()


@contextmanager
def exclusive_partial(layout: Layout, digest: str) -> Iterator[Path]:
    """``digest``'s partial file (``blobs/sha256-<hex>-partial``), held with an exclusive flock:
    one writer per blob across threads and processes. A waiter must check afterwards whether
    the blob arrived meanwhile. The holder may delete the file (a failed pull does): a waiter
    then locks the file that is there once it gets its turn, never the deleted one."""
    partial = layout.recheck(layout.partial(digest))
    partial.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(partial, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            held, there = os.fstat(fd), os.stat(partial)
        except FileNotFoundError:  # deleted while we waited: lock the next one
            os.close(fd)
            continue
        except BaseException:
            os.close(fd)
            raise
        if (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino):
            break
        os.close(fd)
    try:
        yield partial
    finally:
        if layout.blob(digest).is_file():  # the blob is whole: no partial file is needed
            _unlink_quietly(partial)
        os.close(fd)


def promote(layout: Layout, partial: Path, digest: str) -> None:
    """Rename a verified partial file into place as the blob ``digest`` (atomic)."""
    os.chmod(partial, 0o644)
    os.replace(layout.recheck(partial), layout.recheck(layout.blob(digest)))


class Upload:
    """A blob sent by a client (``POST /api/blobs/:digest``): written to a temporary file of its
    own while hashed, renamed into place only when its sha256 is ``digest``. Several uploads of
    one blob may run at once: each finishes on its own (the renames are atomic and leave the same
    bytes). ``open``, ``write``..., ``finish``, and always ``close`` (which removes the
    temporary file of an upload cut short: it is not resumed). Blocking: call from a worker thread.
    """

    def __init__(self, layout: Layout, digest: str) -> None:
        self.layout = layout
        self.blob = layout.blob(digest)  # OutsideStore (400) for anything but sha256:<64 hex>
        self.digest = f"sha256:{digest_hex(digest)}"
        self._hash = hashlib.sha256()
        self._file: BinaryIO | None = None
        self._tmp: Path | None = None

    def open(self) -> None:
        fd, self._tmp = create_temporary(self.layout, self.layout.blobs, "upload")
        self._file = os.fdopen(fd, "wb")

    def write(self, data: bytes) -> None:
        assert self._file is not None
        self._file.write(data)
        self._hash.update(data)

    def finish(self) -> None:
        """Verify the digest and put the blob in place (InvalidRequest on a mismatch)."""
        assert self._file is not None and self._tmp is not None
        self._file.close()
        got = f"sha256:{self._hash.hexdigest()}"
        if got != self.digest:
            raise InvalidRequest(f'digest mismatch, expected "{self.digest}", got "{got}"')
        if not self.blob.is_file():
            os.chmod(self._tmp, 0o644)
            os.replace(self.layout.recheck(self._tmp), self.layout.recheck(self.blob))
            self._tmp = None

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()
        if self._tmp is not None:
            remove(self.layout, self._tmp)
            self._tmp = None


def remove(layout: Layout, path: Path) -> None:
    """Remove one file of the store (re-checked against the store's root)."""
    path = layout.recheck(path)
    path.unlink(missing_ok=True)


def prune_empty_dirs(layout: Layout, start: Path, stop: Path) -> None:
    """Remove ``start`` and its parents while they are empty, up to (not including) ``stop``."""
    stop, current = layout.recheck(stop), layout.recheck(start)
    while current != stop and stop in current.parents:
        try:
            current.rmdir()
        except OSError:
            return
        current = current.parent


def _unlink_quietly(path: Path) -> None:
    try:
        path.unlink()
    except OSError:
        pass
