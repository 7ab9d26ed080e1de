"""The RAM tier: saved sequence states in host memory, bounded in bytes, least recently used out.

An entry is one sequence's KV state after ``n`` inputs, as the engine exported it (opaque here:
llama.cpp's per-sequence blob for the old engine), with those inputs (images without what they
decode from), filed under the key of exactly those inputs (:meth:`runner.kvstore.key.Chain.key`)
and indexed under each of its block prefixes. A prompt's candidates are the entries under the
deepest block prefix it shares with any (an entry not under it differs within that block, so it
shares less); among them the one sharing the most inputs wins, counted exactly, so a stored state
serves a prompt to the input, as a slot does. The caller cuts the restored state back to that
prefix (``seq_rm``; a sliding-window state cannot be cut back: the loop's ``can_resume`` turns that
into a recompute).

The bound (``OLLAMA_CACHE_RAM`` MiB, :data:`runner.config.DEFAULT_CACHE_RAM`) counts each entry's
state bytes plus its keys; an entry larger than the whole bound is not kept. Saving a state drops
the entries it extends (a prefix of it under the same fingerprint: the new state serves them too),
as llama-server's ``--cache-ram`` does. Thread-safe: one lock around every operation.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .key import DIGEST, Chain

ENTRY_OVERHEAD = 256  # bytes counted per entry besides its state, keys and inputs
INPUT_BYTES = 8  # counted per input held (a reference; small ints are shared)


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
    """One saved sequence state."""

    n: int  # inputs it holds, positions 0..n-1
    key: bytes  # the key of exactly those inputs
    inputs: tuple[Any, ...] = field(repr=False)  # the inputs, images without their source
    prefixes: tuple[bytes, ...]  # the keys of its block prefixes (index 0: the fingerprint root)
    state: Any = field(repr=False)  # the engine's export
    nbytes: int  # what it counts against the bound


@dataclass(frozen=True)
class Hit:
    """An entry that serves the first ``n`` inputs of a prompt (``n <= entry.n``)."""

    entry: Entry
    n: int


class RamStore:
    """A byte-bounded LRU of saved sequence states (see the module doc)."""

    def __init__(self, limit: int, dropped: Callable[[Entry], None] | None = None) -> None:
        """``limit``: bytes (0: off, nothing is kept); ``dropped``: called with each entry
        :meth:`put` lets go (evicted, or extended by the new one), outside the lock (the disk
        tier removes its file)."""
        self.limit = max(0, int(limit))
        self._dropped = dropped
        self._entries: OrderedDict[bytes, Entry] = OrderedDict()  # least recently used first
        self._index: dict[bytes, set[bytes]] = {}  # block prefix key -> keys of entries holding it
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used(self) -> int:
        """Bytes counted against the bound now (never above :attr:`limit`)."""
        return self._used

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, chain: Chain, state: Any, nbytes: int) -> bool:
        """Keep ``state``, the KV state of exactly ``chain``'s inputs, of ``nbytes`` bytes.
        Evicts least recently used entries to stay within the bound. False (nothing kept) when
        the store is off, ``chain`` is empty or the entry alone exceeds the bound. Saving a key
        already held only marks it used."""
        if chain.n == 0:
            return False
        cost = self.cost(chain, nbytes)
        if cost > self.limit:
            return False
        key = chain.key()
        gone: list[Entry] = []
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return True
            for old in [e for e in self._entries.values() if e.n < chain.n and chain.key_at(e.n) == e.key]:
                gone.append(self._remove(old.key))  # the new state extends it
            while self._used + cost > self.limit:
                gone.append(self._remove(next(iter(self._entries))))
            entry = Entry(n=chain.n, key=key, inputs=tuple(_bare(x) for x in chain.inputs), prefixes=chain.prefixes,
                          state=state, nbytes=cost)
            self._entries[key] = entry
            for prefix in entry.prefixes:
                self._index.setdefault(prefix, set()).add(key)
            self._used += cost
        if self._dropped is not None:
            for old_entry in gone:
                self._dropped(old_entry)
        return True

    @staticmethod
    def cost(chain: Chain, nbytes: int) -> int:
        """What an entry of ``chain`` with a state of ``nbytes`` counts against the bound."""
        return nbytes + DIGEST * (len(chain.prefixes) + 1) + INPUT_BYTES * chain.n + ENTRY_OVERHEAD

    def lookup(self, chain: Chain) -> Hit | None:
        """The entry sharing the longest prefix with ``chain``'s inputs, or None when none shares
        any. Does not mark it used (:meth:`get` or :meth:`take` does)."""
        with self._lock:
            for depth in range(len(chain.prefixes) - 1, -1, -1):
                keys = self._index.get(chain.prefixes[depth])
                if not keys:
                    continue
                best: Hit | None = None
                for key in keys:
                    entry = self._entries[key]
                    n = entry.n if entry.n <= chain.n and chain.key_at(entry.n) == entry.key else \
                        common_prefix(entry.inputs, chain.inputs, depth * chain.block)
                    if n > 0 and (best is None or n > best.n):
                        best = Hit(entry, n)
                return best  # an entry not under this prefix shares less than any under it
            return None

    def get(self, key: bytes) -> Entry | None:
        """The entry filed under ``key``, marked most recently used; None when not held."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def take(self, key: bytes) -> Entry | None:
        """Remove and return the entry filed under ``key`` (it moves into a slot); None when not held."""
        with self._lock:
            return self._remove(key) if key in self._entries else None

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._index.clear()
            self._used = 0

    def _remove(self, key: bytes) -> Entry:
        entry = self._entries.pop(key)
        for prefix in entry.prefixes:
            keys = self._index.get(prefix)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._index[prefix]
        self._used -= entry.nbytes
        return entry
