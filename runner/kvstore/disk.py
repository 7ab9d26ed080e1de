"""The disk tier: saved sequence states as files, so conversations stay warm across restarts.

One file per state, ``<POLLAMA_CACHE_DIR>/kv/<key>.kv``, named by the key of exactly its inputs
(:meth:`runner.kvstore.key.Chain.key`, hex)::

    b"PKVS" | u32 version | u32 header length | header (JSON) | state | BLAKE2b-256 of all before

The header holds the fingerprint root the chain starts from, the key, the inputs (token ids;
images as ``[sha256, index, count]``) and the state's length. A file is trusted only whole: its
size must match the header, the header's inputs must hash (under its root) to the key it is
named by, and at a restore the checksum must match. A truncated, corrupted, foreign (another
name, another root than the key says) or unreadable file is removed, never restored. A state
of another model or setting is never found: its key chains from another fingerprint.

Files are written whole under a temporary name and renamed into place (the model store's
:func:`runner.store.blobs.write_atomic`), so a reader, in this process or another server's on the
same folder, sees a file whole or not at all. A file holds a conversation's tokens: it is the
user's alone (0600, in a 0700 folder). Every path comes from the folder's own
:class:`runner.store.layout.Layout`, which proves it inside ``POLLAMA_CACHE_DIR``. Writes happen on
a thread of their own (:meth:`DiskStore.save_later`): the batch loop never waits on the disk.
What is pending is bounded (:data:`PENDING_LIMIT`); past it, a save is dropped, not waited for.

The files are indexed in memory like the RAM tier (a :class:`~.ram.RamStore` whose states are
file names), least recently used first by modification time, which a restore renews: the bound
(``POLLAMA_CACHE_DISK`` MiB) evicts the oldest files. Another server's files are picked up when
the folder changes (a rescan of the names not yet indexed); a file another server removed is a
miss. Two servers may evict each other's files: a cache, never a corruption.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..store.blobs import remove, write_atomic
from ..store.layout import Layout, OutsideStore
from .key import DIGEST, Chain, chain
from .ram import Entry, Hit, RamStore

log = logging.getLogger(__name__)

MAGIC = b"PKVS"
VERSION = 1
SUFFIX = ".kv"
_PREFIX = struct.Struct("<4sII")  # magic, version, header length
PENDING_LIMIT = 512 << 20  # bytes of states waiting for the writer; saves beyond it are dropped
MAX_HEADER = 64 << 20  # a header larger than this is damage, not a long prompt


@dataclass(frozen=True)
class ImageRef:
    """An image position as a file names it (what :mod:`.key` hashes: its digest, index, count)."""

    digest: str
    index: int
    count: int


def _inputs_json(inputs: Sequence[Any]) -> list[Any]:
    return [x if isinstance(x, int) else [x.digest, x.index, x.count] for x in inputs]


def _inputs_of(items: list[Any]) -> tuple[Any, ...]:
    out: list[Any] = []
    for x in items:
        if isinstance(x, int) and not isinstance(x, bool):
            out.append(x)
        elif (isinstance(x, list) and len(x) == 3 and isinstance(x[0], str) and len(x[0]) == 64
              and isinstance(x[1], int) and isinstance(x[2], int)):
            bytes.fromhex(x[0])  # ValueError when not hex
            out.append(ImageRef(x[0], x[1], x[2]))
        else:
            raise ValueError("bad input")
    return tuple(out)


class Damaged(ValueError):
    """A cache file that must not be restored (and is removed)."""


class DiskStore:
    """The disk tier (see the module doc): ``root`` the cache folder, ``limit`` bytes (0: off)."""

    def __init__(self, root: Path, limit: int, block: int) -> None:
        self.layout = Layout(Path(root), "prompt cache")
        self.limit = max(0, int(limit))
        self.block = block
        self._index = RamStore(self.limit, dropped=self._dropped)
        self._scanned: set[str] = set()  # file names seen by a scan or written here
        self._folder_mtime = -1
        self._lock = threading.Lock()  # scans and index changes
        self._pending: queue.Queue[tuple[Chain, Any] | None] = queue.Queue()
        self._pending_bytes = 0
        self._idle = threading.Condition()
        self._writer: threading.Thread | None = None

    # ------------------------------------------------------------------------------ paths
    def _folder(self) -> Path:
        return self.layout.inside("kv")

    def _path(self, name: str) -> Path:
        return self.layout.inside("kv", name)

    @property
    def used(self) -> int:
        """Bytes of the files indexed here (within :attr:`limit`)."""
        return self._index.used

    def __len__(self) -> int:
        return len(self._index)

    # ----------------------------------------------------------------------------- lookup
    def lookup(self, chain_: Chain) -> Hit | None:
        """The file sharing the longest prefix with ``chain_``'s inputs (the index only; read it
        with :meth:`read`)."""
        self.refresh()
        return self._index.lookup(chain_)

    def read(self, entry: Entry) -> bytearray | None:
        """The state in ``entry``'s file, checked whole; None (and the file removed) when it is
        missing, damaged or not the state the index says. Marks it used (its mtime)."""
        name = entry.state
        try:
            path = self._path(name)
            with open(path, "rb") as fh:
                data = bytearray(fh.read())
            header, start = _parse(data, name)
            if header["n"] != entry.n or bytes.fromhex(header["key"]) != entry.key:
                raise Damaged("another state than indexed")
            if hashlib.blake2b(memoryview(data)[:-DIGEST], digest_size=DIGEST).digest() != bytes(data[-DIGEST:]):
                raise Damaged("checksum mismatch")
            os.utime(path)  # most recently used, for this process's index and the next scan's
            self._index.get(entry.key)
        except FileNotFoundError:
            self._forget(entry.key, remove_file=False)  # another server evicted it
            return None
        except (OSError, ValueError, KeyError, TypeError, OutsideStore) as err:
            log.warning("prompt cache: ignoring %s (%s)", name, err)
            self._forget(entry.key, remove_file=True)
            return None
        del data[-DIGEST:]
        del data[:start]
        return data

    def holds(self, key: bytes) -> bool:
        return self._index.get(key) is not None

    def forget(self, key: bytes) -> None:
        """Remove the file of ``key`` (its state was refused by the engine)."""
        self._forget(key, remove_file=True)

    def _forget(self, key: bytes, remove_file: bool) -> None:
        entry = self._index.take(key)
        if entry is not None and remove_file:
            self._remove(entry.state)

    # ------------------------------------------------------------------------------ saves
    def save_later(self, chain_: Chain, state: Any) -> bool:
        """Queue ``state`` (of exactly ``chain_``'s inputs) for the writer thread; False when it
        was dropped (the tier is off, or too much is pending). Never blocks."""
        size = len(state)
        if self.limit <= 0 or chain_.n == 0 or RamStore.cost(chain_, size) > self.limit:
            return False
        with self._idle:
            if self._pending_bytes + size > PENDING_LIMIT:
                log.debug("prompt cache: %d bytes pending for the disk, dropping a save", self._pending_bytes)
                return False
            self._pending_bytes += size
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_loop, name="prompt-cache-writer", daemon=True)
                self._writer.start()
        self._pending.put((chain_, state))
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued save is on disk (or ``timeout`` seconds); True when none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending_bytes == 0, timeout)

    def _write_loop(self) -> None:
        while True:
            item = self._pending.get()
            assert item is not None
            chain_, state = item
            try:
                self.write(chain_, state)
            except Exception as err:  # a full disk or a vanished folder costs a cache entry only
                log.warning("prompt cache: could not write a state of %d inputs (%s)", chain_.n, err)
            finally:
                with self._idle:
                    self._pending_bytes -= len(state)
                    self._idle.notify_all()

    def write(self, chain_: Chain, state: Any) -> bool:
        """Write ``state`` (of exactly ``chain_``'s inputs) now; False when it is too large for
        the bound. Evicts the least recently used files to stay within it."""
        key = chain_.key()
        name = key.hex() + SUFFIX
        header = json.dumps({"root": chain_.prefixes[0].hex(), "key": key.hex(), "n": chain_.n,
                             "block": chain_.block, "state_bytes": len(state),
                             "inputs": _inputs_json(chain_.inputs)}, separators=(",", ":")).encode()
        prefix = _PREFIX.pack(MAGIC, VERSION, len(header))
        size = len(prefix) + len(header) + len(state) + DIGEST
        if self._index.cost(chain_, size) > self.limit:
            return False
        if self._index.get(key) is not None:
            return True
        digest = hashlib.blake2b(prefix, digest_size=DIGEST)
        digest.update(header)
        digest.update(state)
        folder = self._folder()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(self.layout, self._path(name), [prefix, header, state, digest.digest()], mode=0o600)
        with self._lock:
            self._scanned.add(name)
            self._index.put(chain_, name, size)
        return True

    # ------------------------------------------------------------------------------ scans
    def refresh(self) -> None:
        """Index the files not indexed yet (at the first lookup, and when the folder changed:
        another server wrote). Damaged ones are removed."""
        try:
            folder = self._folder()
            mtime = folder.stat().st_mtime_ns
        except (FileNotFoundError, OutsideStore):
            return
        with self._lock:
            if mtime == self._folder_mtime:
                return
            self._folder_mtime = mtime
            found = []
            for name in os.listdir(folder):
                if not name.endswith(SUFFIX) or name in self._scanned or name.startswith("."):
                    continue
                self._scanned.add(name)
                try:
                    path = self._path(name)
                    found.append((path.stat().st_mtime_ns, name, self._header_chain(path, name)))
                except FileNotFoundError:
                    continue
                except (OSError, ValueError, KeyError, TypeError, OutsideStore) as err:
                    log.warning("prompt cache: ignoring %s (%s)", name, err)
                    self._remove(name)
            for _, name, (file_chain, size) in sorted(found):  # oldest first: least recently used
                self._index.put(file_chain, name, size)

    def _header_chain(self, path: Path, name: str) -> tuple[Chain, int]:
        """The chain and size of the file at ``path``, from its header, checked against its name
        and size (the checksum waits for a restore)."""
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(_PREFIX.size)
            if len(head) < _PREFIX.size:
                raise Damaged("truncated")
            magic, version, length = _PREFIX.unpack(head)
            if magic != MAGIC or version != VERSION or length > MAX_HEADER:
                raise Damaged("not a prompt cache file of this version")
            header_bytes = fh.read(length)
        header, _ = _parse(head + header_bytes, name, whole=False)
        if size != _PREFIX.size + length + header["state_bytes"] + DIGEST:
            raise Damaged("truncated")
        file_chain = chain(bytes.fromhex(header["root"]), _inputs_of(header["inputs"]), int(header["block"]))
        if file_chain.key() != bytes.fromhex(header["key"]) or file_chain.n != header["n"]:
            raise Damaged("its inputs do not hash to its key")
        return file_chain, size

    # ---------------------------------------------------------------------------- removal
    def _dropped(self, entry: Entry) -> None:
        """The index let ``entry`` go (evicted, or a longer state extends it): its file goes too."""
        self._remove(entry.state)

    def _remove(self, name: str) -> None:
        try:
            remove(self.layout, self._path(name))
        except (OSError, OutsideStore) as err:
            log.warning("prompt cache: could not remove %s (%s)", name, err)
        self._scanned.discard(name)


def _parse(data: bytes | bytearray, name: str, whole: bool = True) -> tuple[dict, int]:
    """The header of a cache file (``data``: the file, or with ``whole`` False its prefix and
    header only) and where its state starts. Raises :class:`Damaged`."""
    if len(data) < _PREFIX.size:
        raise Damaged("truncated")
    magic, version, length = _PREFIX.unpack_from(data)
    if magic != MAGIC or version != VERSION or length > MAX_HEADER:
        raise Damaged("not a prompt cache file of this version")
    start = _PREFIX.size + length
    if len(data) < start:
        raise Damaged("truncated")
    header = json.loads(bytes(data[_PREFIX.size:start]))
    if not isinstance(header, dict) or name != f"{header['key']}{SUFFIX}":
        raise Damaged("named for another state")
    if not isinstance(header["n"], int) or not isinstance(header["state_bytes"], int) or header["state_bytes"] < 0:
        raise Damaged("bad header")
    if whole and len(data) != start + header["state_bytes"] + DIGEST:
        raise Damaged("truncated")
    return header, start
