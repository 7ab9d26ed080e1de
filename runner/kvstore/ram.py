"""The RAM tier: saved sequence states in host memory, as pages, bounded in bytes, least recently
used out.

**Pages.** A state the engine cuts (:mod:`.pages`) is kept as the states of its pages: one per
block of :data:`~.key.BLOCK` inputs, filed under that block's chain hash, then one for the partial
block at its end, under the tail key (:meth:`~.key.Chain.pages`). A page's key names every input
before it, so two states that share ``k`` blocks share ``k`` pages: a system prompt or a tool list
is kept, and counted, once. A prompt is served by walking its chain as far as pages are held, then
taking the page under the last one that shares the most inputs with it (a block or a tail, counted
exactly); those pages joined are the state of their inputs, and the caller cuts it back to what the
prompt shares. Saving a state keeps only the pages not held yet (and marks the others used).

A page is reachable only through its parent, so removing a page removes everything after it (its
descendants: unreachable without it). Every put and use marks a chain's pages used from its last
page to its first, so a parent is always more recently used than its children, and the least
recently used entry, the one evicted, is the end of a chain.

**Whole states.** A state the engine does not cut (a sliding window's: its window layers hold only
the last cells; an engine without a pager) is one *whole* entry, filed under the key of exactly its
inputs and indexed under each of its block prefixes: a prompt's candidates are the whole entries
under the deepest block prefix it shares with any (one not under it differs within that block, so
it shares less), and the one sharing the most inputs wins, counted exactly. A lookup returns the
longer of the two kinds' matches.

**Groups.** A page may be a :class:`~.pages.Span` of the state one save cut for all its new pages
(:mod:`.pages`): its bytes are counted with that group's, once, from when the first of the group's
pages is kept until the last is gone (the group's memory is freed only then).

Saving a state drops the whole entries and tail pages it extends (a prefix of its inputs under the
same fingerprint: it serves them too), as llama-server's ``--cache-ram`` does. The bound
(``OLLAMA_CACHE_RAM`` MiB, :data:`runner.config.DEFAULT_CACHE_RAM`) counts each entry's state bytes
plus its keys, inputs and a fixed overhead; a state larger than the whole bound is not kept.
Thread-safe: one lock around every operation.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from .key import DIGEST, Chain, Page
from .pages import Span

ENTRY_OVERHEAD = 256  # bytes counted per entry besides its state, keys and inputs
INPUT_BYTES = 8  # counted per input held (a reference; small ints are shared)

Ref = tuple[bytes, bool]  # an entry's key and whether it is a whole state (a page may share its key)


def _bare(item: Any) -> Any:
    """An input without what it decodes from (an image position's ``source``: pixels, embedding)."""
    if isinstance(item, int) or getattr(item, "source", None) is None:
        return item
    return dataclasses.replace(item, source=None)


def common_prefix(a: Sequence[Any], b: Sequence[Any], start: int = 0) -> int:
    """How many leading inputs ``a`` and ``b`` share, known to share ``start``."""
    n = min(len(a), len(b))
    i = min(start, n)
    step = 256  # slices compare in C
    while i + step <= n and a[i : i + step] == b[i : i + step]:
        i += step
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass
class Entry:
    """A whole state, or one page of a state: the state of inputs ``[start, end)``."""

    key: bytes  # the key of inputs [0, end)
    parent: bytes  # the key of inputs [0, start): the fingerprint root for a whole state
    start: int  # 0 for a whole state
    end: int
    whole: bool
    inputs: tuple[Any, ...] = field(repr=False)  # inputs [start, end), images without their source
    state: Any = field(repr=False)  # the engine's (a page: its positions only); the disk tier: a file name
    nbytes: int  # what it counts against the bound
    prefixes: tuple[bytes, ...] = field(default=(), repr=False)  # a whole state's block prefixes; () for a page

    @property
    def n(self) -> int:
        """Inputs the state holds with the pages before it: positions ``0..n-1``."""
        return self.end

    @property
    def ref(self) -> Ref:
        return (self.key, self.whole)

    @classmethod
    def of_state(cls, chain: Chain, state: Any, nbytes: int) -> Entry:
        """A whole state of exactly ``chain``'s inputs, of ``nbytes`` bytes."""
        return cls(key=chain.key(), parent=chain.prefixes[0], start=0, end=chain.n, whole=True,
                   inputs=tuple(_bare(x) for x in chain.inputs), state=state, prefixes=chain.prefixes,
                   nbytes=nbytes + DIGEST * (len(chain.prefixes) + 1) + INPUT_BYTES * chain.n + ENTRY_OVERHEAD)

    @classmethod
    def of_page(cls, page: Page, inputs: Sequence[Any], state: Any, nbytes: int) -> Entry:
        """The page ``page`` of inputs ``inputs`` (its own, ``page.end - page.start`` of them)."""
        return cls(key=page.key, parent=page.parent, start=page.start, end=page.end, whole=False,
                   inputs=tuple(_bare(x) for x in inputs), state=state,
                   nbytes=nbytes + 2 * DIGEST + INPUT_BYTES * len(inputs) + ENTRY_OVERHEAD)


@dataclass(frozen=True)
class Hit:
    """Stored entries that serve the first ``n`` inputs of a prompt: one whole state, or pages
    from input 0 on, in order (``n <= state_n``: the caller cuts the rest)."""

    entries: tuple[Entry, ...]
    n: int

    @property
    def whole(self) -> bool:
        return self.entries[0].whole

    @property
    def state_n(self) -> int:
        """Inputs the entries' state holds."""
        return self.entries[-1].end

    @property
    def entry(self) -> Entry:
        """The last entry (a whole state: the only one)."""
        return self.entries[-1]


class RamStore:
    """A byte-bounded LRU of pages and whole states (see the module doc)."""

    def __init__(self, limit: int, dropped: Callable[[Entry], None] | None = None) -> None:
        """``limit``: bytes (0: off, nothing is kept); ``dropped``: called with each entry a put
        lets go (evicted, extended by the new state, or after a page that went), outside the
        lock (the disk tier removes its file)."""
        self.limit = max(0, int(limit))
        self._dropped = dropped
        self._entries: OrderedDict[Ref, Entry] = OrderedDict()  # least recently used first
        self._children: dict[bytes, set[bytes]] = {}  # a key -> keys of the pages filed after it
        self._holders: dict[bytes, set[bytes]] = {}  # a block prefix -> keys of whole states holding it
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Bytes counted against the bound now (never above :attr:`limit`)."""
        return self._used

    def __len__(self) -> int:
        return len(self._entries)

    def pages(self) -> int:
        """How many pages are held (whole states not counted)."""
        with self._lock:
            return sum(1 for _, whole in self._entries if not whole)

    @staticmethod
    def cost(chain: Chain, nbytes: int) -> int:
        """What a whole state of ``chain`` of ``nbytes`` bytes counts against the bound."""
        return Entry.of_state(chain, None, nbytes).nbytes

    # ------------------------------------------------------------------------------------ puts
    def put(self, chain: Chain, state: Any, nbytes: int) -> bool:
        """Keep ``state``, the whole KV state of exactly ``chain``'s inputs, of ``nbytes`` bytes.
        False (nothing kept) when the store is off, ``chain`` is empty or the state alone
        exceeds the bound. Saving a key already held only marks it used."""
        if chain.n == 0:
            return False
        entry = Entry.of_state(chain, state, nbytes)
        if entry.nbytes > self.limit:
            return False
        gone: list[Entry] = []
        with self._lock:
            held = self._entries.get(entry.ref)
            if held is not None:
                self._entries.move_to_end(held.ref)
                return True
            gone += self._drop_extended(chain, chain.n)
            gone += self._evict(entry.nbytes)
            self._add(entry)
        self._report(gone)
        return True

    def put_pages(self, chain: Chain, parts: Sequence[tuple[Any, int] | None]) -> int:
        """Keep the state of exactly ``chain``'s inputs as pages: ``parts[i]`` is the state of
        ``chain.pages()[i]`` and its bytes, or None where the caller knows that page is held (a
        None that is not held ends what is kept). Pages held already are only marked used.
        Returns how many of the chain's pages, from the first, are held now: 0 when nothing was
        kept (the store is off, ``chain`` is empty, or its pages together exceed the bound)."""
        pages = chain.pages()
        if len(parts) != len(pages):
            raise ValueError(f"{len(parts)} page states for {len(pages)} pages")
        gone: list[Entry] = []
        with self._lock:
            plan: list[tuple[Entry | None, Entry | None]] = []  # (held, new) per page kept
            for page, part in zip(pages, parts):
                held = self._entries.get((page.key, False))
                if held is None and part is None:
                    break
                new = None if held is not None else Entry.of_page(page, chain.inputs[page.start : page.end], *part)
                plan.append((held, new))
            groups = {id(g): g for g in (new.state.group for _, new in plan
                                         if new is not None and isinstance(new.state, Span)) if not g.live}
            new_cost = sum(new.nbytes for _, new in plan if new is not None) + sum(g.nbytes for g in groups.values())
            if not plan or new_cost + sum(held.nbytes for held, _ in plan if held is not None) > self.limit:
                return 0
            gone += self._drop_extended(chain, pages[len(plan) - 1].end)
            for held, _ in plan:
                if held is not None:
                    self._entries.move_to_end(held.ref)  # newer than anything evicted below
            gone += self._evict(new_cost)
            for held, new in reversed(plan):  # the last page first: parents end up more recent
                if held is not None:
                    self._entries.move_to_end(held.ref)
                else:
                    assert new is not None
                    self._add(new)
        self._report(gone)
        return len(plan)

    def reserve(self, chain: Chain, cost: int) -> None:
        """Make room for ``cost`` more bytes now, ahead of a put of ``chain`` that will count
        them, evicting the least recently used entries (``chain``'s held pages are marked used
        first, so they stay). The disk tier calls it before each file it writes, so the folder
        never holds more than the bound, not even between a write and its put."""
        gone: list[Entry] = []
        with self._lock:
            for page in reversed(chain.pages()):  # the last page first: parents end up more recent
                held = self._entries.get((page.key, False))
                if held is not None:
                    self._entries.move_to_end(held.ref)
            gone += self._evict(cost)
        self._report(gone)

    def add(self, entry: Entry) -> bool:
        """Index ``entry`` (a disk scan's, oldest first) as the most recently used, evicting to
        stay within the bound; False when it alone exceeds the bound or is held already."""
        if entry.nbytes > self.limit:
            return False
        gone: list[Entry] = []
        with self._lock:
            if entry.ref in self._entries:
                return False
            gone += self._evict(entry.nbytes)
            self._add(entry)
        self._report(gone)
        return True

    # ---------------------------------------------------------------------------------- lookup
    def lookup(self, chain: Chain) -> Hit | None:
        """The entries serving the longest prefix of ``chain``'s inputs, or None when none
        serves any. Does not mark them used (:meth:`touch` does)."""
        with self._lock:
            paged, whole = self._lookup_pages(chain), self._lookup_whole(chain)
        if paged is None or (whole is not None and whole.n > paged.n):
            return whole
        return paged

    def _lookup_pages(self, chain: Chain) -> Hit | None:
        path: list[Entry] = []
        for depth in range(1, len(chain.prefixes)):
            page = self._entries.get((chain.prefixes[depth], False))
            if page is None or page.start != (depth - 1) * chain.block:
                break
            path.append(page)
        start = len(path) * chain.block
        best, shared = None, 0
        for key in self._children.get(chain.prefixes[len(path)], ()):
            page = self._entries[(key, False)]
            n = common_prefix(page.inputs, chain.inputs[start : page.end]) if page.start == start else 0
            if n > shared:
                best, shared = page, n
        if best is not None:
            return Hit((*path, best), start + shared)
        return Hit(tuple(path), start) if path else None

    def _lookup_whole(self, chain: Chain) -> Hit | None:
        for depth in range(len(chain.prefixes) - 1, -1, -1):
            keys = self._holders.get(chain.prefixes[depth])
            if not keys:
                continue
            best: Hit | None = None
            for key in keys:
                entry = self._entries[(key, True)]
                n = entry.n if entry.n <= chain.n and chain.key_at(entry.n) == entry.key else \
                    common_prefix(entry.inputs, chain.inputs, depth * chain.block)
                if n > 0 and (best is None or n > best.n):
                    best = Hit((entry,), n)
            return best  # a state not under this prefix shares less than any under it
        return None

    def holds(self, chain: Chain) -> bool:
        """Whether the state of exactly ``chain``'s inputs is held: whole, or every page of it."""
        if chain.n == 0:
            return False
        with self._lock:
            return (chain.key(), True) in self._entries or \
                all((page.key, False) in self._entries for page in chain.pages())

    def touch(self, hit: Hit) -> bool:
        """Mark ``hit``'s entries most recently used (its first the most); False, marking
        nothing, when one of them is no longer held."""
        with self._lock:
            if any(self._entries.get(e.ref) is not e for e in hit.entries):
                return False
            for entry in reversed(hit.entries):
                self._entries.move_to_end(entry.ref)
            return True

    def get(self, key: bytes) -> Entry | None:
        """The whole state filed under ``key``, marked most recently used; None when not held."""
        with self._lock:
            entry = self._entries.get((key, True))
            if entry is not None:
                self._entries.move_to_end(entry.ref)
            return entry

    def page(self, key: bytes) -> Entry | None:
        """The page filed under ``key`` (not marked used); None when not held."""
        with self._lock:
            return self._entries.get((key, False))

    # -------------------------------------------------------------------------------- removal
    def take(self, key: bytes) -> Entry | None:
        """Remove and return the whole state filed under ``key`` (it moves into a slot); None
        when not held."""
        with self._lock:
            entry = self._entries.get((key, True))
            return None if entry is None else self._remove(entry)[0]

    def drop(self, refs: Iterable[Ref]) -> list[Entry]:
        """Remove the entries of ``refs`` (a page with its descendants); what was removed."""
        gone: list[Entry] = []
        with self._lock:
            for ref in refs:
                entry = self._entries.get(ref)
                if entry is not None:
                    gone += self._remove(entry)
        return gone

    def clear(self) -> None:
        with self._lock:
            for entry in self._entries.values():
                if isinstance(entry.state, Span):
                    entry.state.group.live = 0
            self._entries.clear()
            self._children.clear()
            self._holders.clear()
            self._used = 0

    # ------------------------------------------------------------------------------- internals
    def _add(self, entry: Entry) -> None:
        self._entries[entry.ref] = entry
        self._used += entry.nbytes
        if isinstance(entry.state, Span):
            group = entry.state.group
            if not group.live:
                self._used += group.nbytes
            group.live += 1
        if entry.whole:
            for prefix in entry.prefixes:
                self._holders.setdefault(prefix, set()).add(entry.key)
        else:
            self._children.setdefault(entry.parent, set()).add(entry.key)

    def _remove(self, entry: Entry) -> list[Entry]:
        """Remove ``entry`` and, a page, its descendants; what was removed (``entry`` first)."""
        gone, todo = [], [entry]
        while todo:
            e = todo.pop()
            if self._entries.pop(e.ref, None) is None:
                continue
            self._used -= e.nbytes
            if isinstance(e.state, Span):
                group = e.state.group
                group.live -= 1
                if not group.live:
                    self._used -= group.nbytes
            gone.append(e)
            if e.whole:
                for prefix in e.prefixes:
                    _discard(self._holders, prefix, e.key)
                continue
            _discard(self._children, e.parent, e.key)
            todo += [self._entries[(k, False)] for k in self._children.pop(e.key, ()) if (k, False) in self._entries]
        return gone

    def _evict(self, cost: int) -> list[Entry]:
        """Remove least recently used entries until ``cost`` more bytes fit."""
        gone: list[Entry] = []
        while self._entries and self._used + cost > self.limit:
            gone += self._remove(next(iter(self._entries.values())))
        return gone

    def _drop_extended(self, chain: Chain, n: int) -> list[Entry]:
        """Remove the whole states and tail pages holding fewer than ``n`` of ``chain``'s first
        inputs, all of them ``chain``'s (the state of ``chain``'s first ``n`` serves them too)."""
        found = []
        for key in self._holders.get(chain.prefixes[0], ()):  # every whole state of this fingerprint
            entry = self._entries[(key, True)]
            if entry.n < n and chain.key_at(entry.n) == entry.key:
                found.append(entry)
        for depth in range(min(n // chain.block, len(chain.prefixes) - 1) + 1):
            for key in self._children.get(chain.prefixes[depth], ()):
                page = self._entries[(key, False)]
                if page.end - page.start < chain.block and page.n < n and chain.key_at(page.n) == page.key:
                    found.append(page)
        gone: list[Entry] = []
        for entry in found:
            gone += self._remove(entry)
        return gone

    def _report(self, gone: list[Entry]) -> None:
        if self._dropped is not None:
            for entry in gone:
                self._dropped(entry)


def _discard(index: dict[bytes, set[bytes]], at: bytes, key: bytes) -> None:
    keys = index.get(at)
    if keys is not None:
        keys.discard(key)
        if not keys:
            del index[at]
