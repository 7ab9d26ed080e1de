"""The prompt store a loaded model's slot cache uses: its fingerprint over the process's tiers.

:class:`Tiers` are the process's RAM tier (:class:`~.ram.RamStore`, ``OLLAMA_CACHE_RAM``) and disk
tier (:class:`~.disk.DiskStore`, ``POLLAMA_CACHE_DIR``/``POLLAMA_CACHE_DISK``): one of each per
process (:func:`tiers`), whatever the models loaded, so the bounds hold for all of them together.
Every key chains from a model's fingerprint, so models share the tiers but never a state.

:class:`PromptStore` is one load's view: it turns input lists into chains under the load's
:class:`~.key.Fingerprint`. The slot cache (:class:`runner.loop.slots.InputCache`) calls it on
the loop thread: :meth:`PromptStore.save` before a slot's contents are lost (another conversation
takes the slot, the model unloads), :meth:`PromptStore.lookup` when a prompt arrives. A save goes
to RAM at once and to disk later (the writer thread), as pages when the engine cuts the state
(its :class:`~.pages.Pager`, the load's KV operations), else whole; a lookup takes the longer of the
two tiers' matches, RAM on a tie (no read), and joins pages into one state for the engine's import.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .disk import DiskStore
from .key import BLOCK, Chain, Fingerprint, chain
from .pages import Pager, Span, cut_group, join, spans_of
from .ram import Hit, RamStore, Ref

MIN_INPUTS = BLOCK  # states shorter than one block are not worth keeping: they recompute in a blink

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Found:
    """A stored state whose first ``n`` inputs are the prompt's first ``n`` (``n <= state_n``)."""

    n: int
    state_n: int  # inputs the stored state holds; the slot cuts the rest after the import
    state: Any  # for the engine's ``import_seq``: a whole state as exported, or pages joined
    refs: tuple[Ref, ...]  # the entries it came from, for :meth:`PromptStore.forget`
    whole: bool  # one whole state (else pages)
    source: str  # "ram" or "disk"


class Tiers:
    """The RAM and disk tiers of one process (either may be off: a limit of 0)."""

    def __init__(self, ram: RamStore, disk: DiskStore | None = None) -> None:
        self.ram = ram
        self.disk = disk if disk is not None and disk.limit > 0 else None

    @property
    def on(self) -> bool:
        return self.ram.limit > 0 or self.disk is not None

    def usage(self) -> dict[str, int]:
        """Bytes used and allowed per tier (``/api/ps``, ``pollama ps``)."""
        disk = self.disk
        if disk is not None:
            disk.refresh()  # files written by an earlier run or another server count too
            return {"ram": self.ram.used, "ram_limit": self.ram.limit, "disk": disk.used, "disk_limit": disk.limit}
        return {"ram": self.ram.used, "ram_limit": self.ram.limit, "disk": 0, "disk_limit": 0}


_shared: tuple[tuple[int, str, int], Tiers] | None = None
_shared_lock = threading.Lock()


def tiers(ram_bytes: int, folder: Path, disk_bytes: int) -> Tiers:
    """The process's tiers for these settings: the same object for every load while they stay
    the same (a server, a ``pollama run``), new ones when they change (tests with another home)."""
    global _shared
    settings = (int(ram_bytes), str(folder), int(disk_bytes))
    with _shared_lock:
        if _shared is None or _shared[0] != settings:
            disk = DiskStore(folder, disk_bytes, BLOCK) if disk_bytes > 0 else None
            _shared = (settings, Tiers(RamStore(ram_bytes), disk))
        return _shared[1]


class PromptStore:
    def __init__(self, fingerprint: Fingerprint, ram: RamStore | Tiers, block: int = BLOCK,
                 pager: Pager | None = None) -> None:
        """``ram``: the tiers to use (a bare RAM store: RAM only); ``pager``: the engine's KV
        operations, which cut states into pages and join them (None: states are kept whole)."""
        self.fingerprint = fingerprint
        self.tiers = ram if isinstance(ram, Tiers) else Tiers(ram)
        self.block = block
        self.pager = pager
        self._root = fingerprint.digest
        self._chains: dict[tuple[Any, ...], Chain] = {}  # the last chains asked for (:meth:`_chain`)

    def _chain(self, inputs: Sequence[Any]) -> Chain:
        """``inputs``' chain under this load's fingerprint. A restore asks for the slot's and the
        prompt's several times (whether to save, from where, the lookup, the save): the last two
        are kept (a 2,300-input chain hashes in ~0.4 ms)."""
        key = tuple(inputs)
        kept = self._chains  # replaced whole, never changed: safe from any thread
        found = kept.get(key)
        if found is None:
            found = chain(self._root, inputs, self.block)
        other = [(k, c) for k, c in kept.items() if k != key][-1:]  # the other one asked for last
        self._chains = dict(other + [(key, found)])
        return found

    @property
    def ram(self) -> RamStore:
        return self.tiers.ram

    def holds(self, inputs: Sequence[Any]) -> bool:
        """Whether the state of exactly ``inputs`` is stored in RAM (and on disk, when that tier
        is on), whole or every page of it: saving it again would be a no-op."""
        found = self._chain(inputs)
        in_ram = self.tiers.ram.limit <= 0 or self.tiers.ram.holds(found)
        disk = self.tiers.disk
        return in_ram and (disk is None or disk.holds(found))

    def wants(self, inputs: Sequence[Any]) -> bool:
        """Whether saving the state of ``inputs`` would keep anything new (the caller exports
        only then: an export copies the whole sequence)."""
        return len(inputs) >= MIN_INPUTS and self.tiers.on and not self.holds(inputs)

    def new_from(self, inputs: Sequence[Any]) -> int:
        """Where the pages the tiers lack of ``inputs``' state start, when the tiers hold every
        page before (a conversation that came back from the store): a save needs the state from
        there on only (:meth:`save`'s ``start``). 0 when they hold none, or not so."""
        if self.pager is None:
            return 0
        pages = self._chain(inputs).pages()
        held = self._held(pages)
        first = len(held)
        return pages[first].start if held == set(range(first)) and 0 < first < len(pages) else 0

    def save(self, inputs: Sequence[Any], state: Any, start: int = 0) -> bool:
        """Keep ``state``, the KV state of exactly ``inputs`` (``len(state)`` bytes): in RAM now,
        on disk soon; as pages when the engine cuts it, else whole. ``start``: the state holds
        positions ``start..`` only (:meth:`new_from` said so; the pages before are stored). False
        when nothing was kept (too short, the tiers are off, or the state exceeds their bounds)."""
        if len(inputs) < MIN_INPUTS:
            return False
        found = self._chain(inputs)
        ram, disk = self.tiers.ram, self.tiers.disk
        if start:
            parts = self._tail(found, state, start)
            if parts is None:
                return False
        else:
            parts = self._split(found, state)
        if parts is None:
            kept = ram.put(found, state, len(state))
        else:  # a span's bytes count with its group's (:mod:`.ram`)
            kept = ram.put_pages(found, [None if p is None else (p, 0 if isinstance(p, Span) else len(p))
                                         for p in parts]) > 0
        if disk is not None and not disk.holds(found):
            if parts is not None:  # what the disk lacks: the pages cut now, or RAM's (the same bytes)
                parts = [None if disk.has_page(page.key) else part if part is not None else self._ram_page(page.key)
                         for page, part in zip(found.pages(), parts)]
            kept = disk.save_later(found, state if parts is None else parts) or kept
        return kept

    def _ram_page(self, key: bytes) -> Any:
        entry = self.tiers.ram.page(key)
        return None if entry is None else entry.state

    def _tail(self, found: Chain, state: Any, start: int) -> list[Any] | None:
        """``state``, the state of ``found``'s positions ``start..``, as the spans of its pages
        (a group), None in place of the pages before; None when ``start`` is not where a page
        begins (nothing is kept)."""
        pages = found.pages()
        first = next((i for i, page in enumerate(pages) if page.start == start), None)
        if first is None or self.pager is None:
            return None
        return [None] * first + spans_of(self.pager, state, [page.start for page in pages] + [found.n], first)

    def _held(self, pages: Sequence[Any]) -> set[int]:
        """The indices of ``pages`` the tiers need not cut again: the ones RAM holds (it gives
        the disk its bytes too), or with the RAM tier off the ones the disk has or has queued."""
        if self.tiers.ram.limit > 0:
            return {i for i, page in enumerate(pages) if self.tiers.ram.page(page.key) is not None}
        if self.tiers.disk is not None:
            return {i for i, page in enumerate(pages) if self.tiers.disk.has_page(page.key)}
        return set()

    def _split(self, found: Chain, state: Any) -> list[Any] | None:
        """``state`` cut into ``found``'s pages, None in place of each page the tiers need not
        have cut: one RAM holds (it gives the disk its bytes too), or with the RAM tier off one
        the disk has or has queued. A conversation that came back from the store adds only its
        new pages: cutting the others again is most of a save's time. The new pages are spans
        of one group (:mod:`.pages`) when they follow all the held ones, as they do but for a
        page evicted meanwhile. None when the engine keeps it whole."""
        if self.pager is None:
            return None
        pages = found.pages()
        held = self._held(pages)
        bounds = [page.start for page in pages] + [found.n]
        first = len(held)
        if held == set(range(first)):
            if first == len(pages):
                return [None] * first
            spans = cut_group(self.pager, state, bounds, first)
            return None if spans is None else [None] * first + spans
        parts = self.pager.split_state(state, bounds, held)
        return None if parts is None else list(parts)

    def lookup(self, prompt: Sequence[Any]) -> Found | None:
        """The stored state serving the longest prefix of ``prompt``; None when none does.
        Marks it recently used. A disk hit reads its files here (one damaged or gone ends the
        state there)."""
        if len(prompt) == 0:
            return None
        wanted = self._chain(prompt)
        hit = self.tiers.ram.lookup(wanted)
        disk = self.tiers.disk
        if disk is not None:
            on_disk = disk.lookup(wanted)
            if on_disk is not None and (hit is None or on_disk.n > hit.n):
                read = disk.read(on_disk)
                if read is not None and (hit is None or read[0].n > hit.n):
                    found = self._found(*read, "disk")
                    if found is not None:
                        return found
        if hit is None or not self.tiers.ram.touch(hit):
            return None
        return self._found(hit, [entry.state for entry in hit.entries], "ram")

    def _found(self, hit: Hit, states: list[Any], source: str) -> Found | None:
        """The state of ``hit``'s entries (pages joined); None when there is no pager to join them,
        or (the entries dropped) when the engine says they do not fit together."""
        state = states[0]
        if not hit.whole:
            if self.pager is None:  # pages another load wrote, this one cannot join
                return None
            try:
                state = join(self.pager, states)
            except ValueError as err:
                log.warning("prompt cache: dropping %d page(s) that do not join (%s)", len(states), err)
                self._drop(tuple(entry.ref for entry in hit.entries))
                return None
        return Found(n=hit.n, state_n=hit.state_n, state=state, refs=tuple(entry.ref for entry in hit.entries),
                     whole=hit.whole, source=source)

    def forget(self, found: Found, refused: bool = False) -> None:
        """``found`` was imported into a slot, which holds it now: a whole state leaves RAM (the
        slot saves it again when it loses it), pages stay (other conversations share them), files
        stay. ``refused``: the engine would not take it; its entries go from every tier."""
        if refused:
            self._drop(found.refs)
        elif found.whole:
            self.tiers.ram.take(found.refs[0][0])

    def _drop(self, refs: tuple[Ref, ...]) -> None:
        self.tiers.ram.drop(refs)
        disk = self.tiers.disk
        if disk is not None:
            disk.forget(refs)

    def serving(self, on: bool) -> None:
        """This load has a request waiting for its first token (True) or none now (False): the
        disk tier's writer starts no file meanwhile (:meth:`.disk.DiskStore.hold`)."""
        disk = self.tiers.disk
        if disk is not None:
            disk.hold(self, on)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for the disk writes queued so far (at an unload, before the process may exit)."""
        disk = self.tiers.disk
        return True if disk is None else disk.flush(timeout)

    @property
    def used(self) -> int:
        return self.tiers.ram.used
