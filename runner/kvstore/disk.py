"""The disk tier: saved sequence states as files, so conversations stay warm across restarts.

One file per page (:mod:`.ram`: a block of a state, or the partial block at its end),
``<POLLAMA_CACHE_DIR>/kv/<key>.page.kv``, named by the page's key (hex), so a page that two
conversations share is one file; one file per whole state (a sliding window's),
``<key>.kv``, named by the key of exactly its inputs (:meth:`runner.kvstore.key.Chain.key`)::

    b"PKVS" | u32 version | u32 header length | header (JSON) | state | CRC-32 of all before

The header holds the fingerprint root, the key, the parent's key (the inputs before the page; the
root for a whole state), the inputs' range and the inputs themselves (token ids; images as
``[sha256, index, count]``: a page's own, a whole state's all) and the state's length. A file is
trusted only whole: its size must match the header, the header's inputs must hash (after the
parent, or under the root) to the key it is named by, and at a restore the checksum must match.
A truncated, corrupted, foreign (another name, another key than its inputs give) or unreadable
file is removed, never restored. The checksum is for damage (a torn or flipped file), not for
forgery: a file's trust is its place in the user's own folder and its key, which its inputs
must hash to; a CRC-32 costs a fifth of a BLAKE2b-256 (10 against 43 ms for a 53 MB state here),
time a restore after a restart waits for and a write takes from a turn's decode. A state of another model or setting is never found: its keys
chain from another fingerprint.

Files are written whole under a temporary name and renamed into place (the model store's
:func:`runner.store.blobs.write_atomic`), so a reader, in this process or another server's on the
same folder, sees a file whole or not at all. A file holds a conversation's tokens: it is the
user's alone (0600, in a 0700 folder). Every path comes from the folder's own
:class:`runner.store.layout.Layout`, which proves it inside ``POLLAMA_CACHE_DIR``. Writes happen on
a thread of their own (:meth:`DiskStore.save_later`): the batch loop never waits on the disk.
What is pending is bounded (:data:`PENDING_LIMIT`); past it, a save is dropped, not waited for.
The writer also keeps out of a request's way: while a loop serves a prompt (a request admitted
and waiting for its first token, :meth:`DiskStore.hold`), it starts no file until :data:`HOLD`
seconds after the save was queued, and writes in the gaps between prompts and while tokens
decode: a backlog older than that is written at once, so a server that is never idle still
writes at the disk's pace.
A restored turn is mostly Python (joining pages, importing them), which a writer's work beside it
slowed by half (the interpreter's lock and the two cores are shared).

The files are indexed in memory like the RAM tier (a :class:`~.ram.RamStore` whose states are
file names), least recently used first by modification time, which a save or a restore renews
(one time for a whole chain; a scan puts the later pages of one time first, so a page is never
older than the ones after it): the bound (``POLLAMA_CACHE_DISK`` MiB) evicts the oldest files,
ends of chains first, and a page's file goes with those of the pages after it. Another server's
files are picked up when the folder changes (a rescan of the names not yet indexed); a file
another server removed ends a restore there (the pages before it still serve). Two servers may
write the same page (the same bytes, renamed into place whole) and evict each other's files: a
cache, never a corruption.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import struct
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..store.blobs import remove, write_atomic
from ..store.layout import Layout, OutsideStore
from .key import Chain, Page, chain, page_key
from .pages import Span
from .ram import Entry, Hit, RamStore, Ref

log = logging.getLogger(__name__)

MAGIC = b"PKVS"
VERSION = 3  # 1: whole states only; 2: a BLAKE2b-256 trailer
SUFFIX = ".kv"
PAGE_SUFFIX = ".page" + SUFFIX
_PREFIX = struct.Struct("<4sII")  # magic, version, header length
_CHECK = struct.Struct("<I")  # the CRC-32 trailer
PENDING_LIMIT = 512 << 20  # bytes of states waiting for the writer; saves beyond it are dropped
HOLD = 2.0  # seconds after a save is queued that it waits for the loops' prompts to pass at most
_holders: set[int] = set()  # the loads serving a prompt now (:meth:`DiskStore.hold`), process-wide
_calm = threading.Condition()
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
        self._pending: queue.Queue[tuple[Chain, Any, list[Any] | None, float] | None] = queue.Queue()
        self._pending_bytes = 0
        self._queued: dict[bytes, int] = {}  # page keys a queued save carries, and how many saves do
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
        """The files serving the longest prefix of ``chain_``'s inputs (the index only; read
        them with :meth:`read`)."""
        self.refresh()
        return self._index.lookup(chain_)

    def read(self, hit: Hit) -> tuple[Hit, list[bytearray]] | None:
        """The states in ``hit``'s files, each checked whole, as far as they read: a missing,
        damaged or foreign file ends them there (and is forgotten, with the pages after it; a
        damaged one removed). The hit they serve and the states; None when none read. Marks
        them used (their mtimes)."""
        states: list[bytearray] = []
        for entry in hit.entries:
            state = self._read(entry)
            if state is None:
                break
            states.append(state)
        if not states:
            return None
        served = Hit(hit.entries[: len(states)], min(hit.n, hit.entries[len(states) - 1].end))
        self._index.touch(served)
        self._renew(served.entries)
        return served, states

    def _read(self, entry: Entry) -> bytearray | None:
        name = entry.state
        try:
            with open(self._path(name), "rb") as fh:
                data = bytearray(fh.read())
            header, start = _parse(data, name)
            if (header["end"], header["start"], header["whole"]) != (entry.end, entry.start, entry.whole) or \
                    bytes.fromhex(header["key"]) != entry.key:
                raise Damaged("another state than indexed")
            end = len(data) - _CHECK.size
            if zlib.crc32(memoryview(data)[:end]) != _CHECK.unpack_from(data, end)[0]:
                raise Damaged("checksum mismatch")
        except FileNotFoundError:
            self._forget(entry, remove_file=False)  # another server evicted it
            return None
        except (OSError, ValueError, KeyError, TypeError, OutsideStore) as err:
            log.warning("prompt cache: ignoring %s (%s)", name, err)
            self._forget(entry, remove_file=True)
            return None
        del data[-_CHECK.size :]
        del data[:start]
        return data

    def _renew(self, entries: Sequence[Entry]) -> None:
        """Mark ``entries``' files used for the next scan (this one's or another server's): one
        time for all, which a scan orders later pages first."""
        now = time.time_ns()
        try:
            paths = self.layout.entries(("kv",), [entry.state for entry in entries])  # one check for all
        except OutsideStore:
            return
        for path in paths:
            try:
                os.utime(path, ns=(now, now), follow_symlinks=False)
            except OSError:
                pass  # gone meanwhile: the next read finds out

    def holds(self, chain_: Chain) -> bool:
        """Whether the state of exactly ``chain_``'s inputs is indexed, whole or every page."""
        return self._index.holds(chain_)

    def page(self, key: bytes) -> Entry | None:
        """The page indexed under ``key`` (its file written); None when not."""
        return self._index.page(key)

    def has_page(self, key: bytes) -> bool:
        """Whether the page filed under ``key`` is on disk or in a save queued for the writer
        (which writes saves in order: a later save may leave it out)."""
        with self._idle:
            if key in self._queued:
                return True
        return self._index.page(key) is not None

    def forget(self, refs: Sequence[Ref]) -> None:
        """Remove the files of ``refs`` (their state was refused by the engine), and of the
        pages after them."""
        for entry in self._index.drop(refs):
            self._remove(entry.state)

    def _forget(self, entry: Entry, remove_file: bool) -> None:
        for gone in self._index.drop([entry.ref]):
            if gone is not entry or remove_file:
                self._remove(gone.state)  # the pages after it are unreachable without it

    # ------------------------------------------------------------------------------ saves
    def save_later(self, chain_: Chain, state: Any) -> bool:
        """Queue ``state`` for the writer thread: the whole state of exactly ``chain_``'s inputs,
        or a list of the states of its pages (``chain_.pages()``). False when it was dropped (the
        tier is off, or too much is pending). Never blocks."""
        pages = state if isinstance(state, list) else None
        size = _pages_size(pages) if pages is not None else len(state)
        if self.limit <= 0 or chain_.n == 0 or RamStore.cost(chain_, size) > self.limit:
            return False
        with self._idle:
            if self._pending_bytes + size > PENDING_LIMIT:
                log.debug("prompt cache: %d bytes pending for the disk, dropping a save", self._pending_bytes)
                return False
            self._pending_bytes += size
            for key in _page_keys(chain_, pages):
                self._queued[key] = self._queued.get(key, 0) + 1
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_loop, name="prompt-cache-writer", daemon=True)
                self._writer.start()
        self._pending.put((chain_, state if pages is None else None, pages, time.monotonic() + HOLD))
        return True

    @staticmethod
    def hold(owner: object, serving: bool) -> None:
        """``owner`` (one load's store) is serving a prompt (True: a request waits for its first
        token) or no longer is (False). No disk writer of the process starts a file while any
        load is (the cores are the process's), for at most :data:`HOLD` seconds a save."""
        with _calm:
            if serving:
                _holders.add(id(owner))
            else:
                _holders.discard(id(owner))
                _calm.notify_all()

    @staticmethod
    def _wait_calm(deadline: float | None) -> None:
        """Wait until no load serves a prompt, or ``deadline`` (``time.monotonic``) passed."""
        if deadline is None:
            return
        with _calm:
            _calm.wait_for(lambda: not _holders, timeout=max(0.0, deadline - time.monotonic()))

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued save is on disk (or ``timeout`` seconds); True when none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._pending_bytes == 0, timeout)

    def _write_loop(self) -> None:
        _yield_to_decoding()
        while True:
            item = self._pending.get()
            assert item is not None
            chain_, state, pages, deadline = item  # HOLD seconds after it was queued, however long the queue
            try:
                if pages is None:
                    self.write(chain_, state, deadline)
                else:
                    self.write_pages(chain_, pages, deadline)
            except Exception as err:  # a full disk or a vanished folder costs a cache entry only
                log.warning("prompt cache: could not write a state of %d inputs (%s)", chain_.n, err)
            finally:
                with self._idle:
                    self._pending_bytes -= _pages_size(pages) if pages is not None else len(state)
                    for key in _page_keys(chain_, pages):
                        if self._queued[key] == 1:
                            del self._queued[key]
                        else:
                            self._queued[key] -= 1
                    self._idle.notify_all()

    def write(self, chain_: Chain, state: Any, calm: float | None = None) -> bool:
        """Write ``state``, the whole state of exactly ``chain_``'s inputs, now; False when it is
        too large for the bound. Evicts the least recently used files to stay within it.
        ``calm``: first wait until no load serves a prompt, at most until then (``time.monotonic``)."""
        entry = Entry.of_state(chain_, _name(chain_.key(), True), 0)
        header, size = _header(chain_.prefixes[0], entry, len(state), self.block)
        entry.nbytes += size
        if entry.nbytes > self.limit:
            return False
        if self._index.get(entry.key) is not None:
            return True
        self._wait_calm(calm)
        self._index.reserve(chain_, entry.nbytes)
        self._write_file(entry.state, header, state)
        with self._lock:
            self._scanned.add(entry.state)
            self._index.put(chain_, entry.state, size)
        return True

    def write_pages(self, chain_: Chain, parts: Sequence[Any], calm: float | None = None) -> int:
        """Write the pages of ``chain_``'s state not on disk yet (``parts[i]``: the state of
        ``chain_.pages()[i]``, or None where the caller found it on disk already: a None page
        that is gone meanwhile ends what is kept) and mark the others used; how many of its
        pages, from the first, are on disk afterwards (0: too large for the bound). Evicts the
        least recently used files to stay within it. ``calm``: before each file, wait until no
        load serves a prompt, at most until then (``time.monotonic``)."""
        root = chain_.prefixes[0]
        entries = [Entry.of_page(page, chain_.inputs[page.start : page.end], _name(page.key, False), 0)
                   for page in chain_.pages()]
        if sum(entry.nbytes for entry in entries) + _pages_size(parts) > self.limit:  # headers aside
            return 0
        written, items, cost = [], [], 0
        for entry, part in zip(entries, parts):
            if self._index.page(entry.key) is not None:
                items.append(None)
                continue
            if part is None:
                break  # evicted since the caller looked: the pages after it are unreachable
            if isinstance(part, Span):  # a page the RAM tier keeps in its group: its own state
                part = part.page_state()
            header, size = _header(root, entry, len(part), self.block)  # only the pages written
            cost += entry.nbytes + size  # what the put below counts for the pages written so far
            self._wait_calm(calm)
            self._index.reserve(chain_, cost)
            self._write_file(entry.state, header, part)
            written.append(entry.state)
            items.append((entry.state, size))
        with self._lock:
            self._scanned.update(written)
            kept = self._index.put_pages(chain_, items)
        for entry in entries[kept:]:  # after a page evicted meanwhile: unreachable
            if entry.state in written:
                self._remove(entry.state)
        self._renew(entries[:kept])
        return kept

    def _write_file(self, name: str, header: bytes, state: Any) -> None:
        prefix = _PREFIX.pack(MAGIC, VERSION, len(header))
        check = zlib.crc32(state, zlib.crc32(header, zlib.crc32(prefix)))
        folder = self._folder()
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(self.layout, folder / name, [prefix, header, state, _CHECK.pack(check)], mode=0o600)

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
                    entry = self._header_entry(path, name)
                    found.append((path.stat().st_mtime_ns, -entry.end, name, entry))
                except FileNotFoundError:
                    continue
                except (OSError, ValueError, KeyError, TypeError, OutsideStore) as err:
                    log.warning("prompt cache: ignoring %s (%s)", name, err)
                    self._remove(name)
            for *_, entry in sorted(found, key=lambda f: f[:3]):  # least recently used first, ends of chains first
                self._index.add(entry)

    def _header_entry(self, path: Path, name: str) -> Entry:
        """The index entry of the file at ``path``, from its header, checked against its name and
        size (the checksum waits for a restore)."""
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
        if size != _PREFIX.size + length + header["state_bytes"] + _CHECK.size:
            raise Damaged("truncated")
        root, key, block = bytes.fromhex(header["root"]), bytes.fromhex(header["key"]), int(header["block"])
        inputs = _inputs_of(header["inputs"])
        start, end = header["start"], header["end"]
        if header["whole"]:
            file_chain = chain(root, inputs, block)
            if file_chain.key() != key or (start, end) != (0, file_chain.n):
                raise Damaged("its inputs do not hash to its key")
            return Entry.of_state(file_chain, name, size)
        parent = bytes.fromhex(header["parent"])
        if not (isinstance(start, int) and isinstance(end, int) and start % block == 0
                and 0 < end - start == len(inputs) <= block and (start > 0 or parent == root)):
            raise Damaged("not a page")
        if page_key(parent, inputs, block) != key:
            raise Damaged("its inputs do not hash to its key")
        return Entry.of_page(Page(parent, key, start, end), inputs, name, size)

    # ---------------------------------------------------------------------------- removal
    def _dropped(self, entry: Entry) -> None:
        """The index let ``entry`` go (evicted, extended by a longer state, or after a page that
        went): its file goes too."""
        self._remove(entry.state)

    def _remove(self, name: str) -> None:
        try:
            remove(self.layout, self._path(name))
        except FileNotFoundError:
            pass
        except (OSError, OutsideStore) as err:
            log.warning("prompt cache: could not remove %s (%s)", name, err)
        self._scanned.discard(name)


def _name(key: bytes, whole: bool) -> str:
    """The file name of the state filed under ``key``: a whole state's or a page's."""
    return key.hex() + (SUFFIX if whole else PAGE_SUFFIX)


def _header(root: bytes, entry: Entry, state_bytes: int, block: int) -> tuple[bytes, int]:
    """The header of ``entry``'s file (its inputs, of a state of ``state_bytes`` bytes) and the
    file's size."""
    header = json.dumps({"root": root.hex(), "key": entry.key.hex(), "parent": entry.parent.hex(),
                         "whole": entry.whole, "start": entry.start, "end": entry.end, "block": block,
                         "state_bytes": state_bytes, "inputs": _inputs_json(entry.inputs)},
                        separators=(",", ":")).encode()
    return header, _PREFIX.size + len(header) + state_bytes + _CHECK.size


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
    if not isinstance(header, dict) or not isinstance(header["whole"], bool) or \
            name != _name(bytes.fromhex(header["key"]), header["whole"]):
        raise Damaged("named for another state")
    if not isinstance(header["end"], int) or not isinstance(header["state_bytes"], int) or header["state_bytes"] < 0:
        raise Damaged("bad header")
    if whole and len(data) != start + header["state_bytes"] + _CHECK.size:
        raise Damaged("truncated")
    return header, start


def _page_keys(chain_: Chain, pages: Sequence[Any] | None) -> list[bytes]:
    """The keys of the pages a save carries (not the ones it leaves out, None)."""
    if pages is None:
        return []
    return [page.key for page, part in zip(chain_.pages(), pages) if part is not None]


def _pages_size(pages: Sequence[Any]) -> int:
    """The bytes of the page states a save queues (None: a page on disk already)."""
    return sum(len(p) for p in pages if p is not None)


WRITER_NICE = 10  # the writer's niceness above the process's: a turn's decode comes first


def _yield_to_decoding() -> None:
    """Lower the calling thread's CPU priority (Linux: a thread is a task with its own nice
    value), so the writer's hashing and copying take the cores only when the decode leaves them
    free: on a 2-core machine a page write running beside a turn's decode slowed it ~30%. Where
    the system has no per-thread priority, nothing changes."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICE)
    except (AttributeError, OSError):
        pass

