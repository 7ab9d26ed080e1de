"""The prompt store one loaded model's slot cache uses: its fingerprint over the RAM tier.

:class:`PromptStore` turns input lists into chains under the load's :class:`~.key.Fingerprint`
and keeps whole sequence states in a :class:`~.ram.RamStore`. The slot cache
(:class:`runner.loop.slots.InputCache`) calls it on the loop thread: :meth:`PromptStore.save`
before a slot's contents are lost to another conversation, :meth:`PromptStore.lookup` when a
prompt arrives. (The disk tier joins here: issue 25.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from .key import BLOCK, Fingerprint, chain
from .ram import Entry, RamStore

MIN_INPUTS = BLOCK  # states shorter than one block are not worth keeping: they recompute in a blink


@dataclass(frozen=True)
class Found:
    """A stored state whose first ``n`` inputs are the prompt's first ``n`` (``n <= state_n``)."""

    n: int
    state_n: int  # inputs the stored state holds; the slot cuts the rest after the import
    state: Any  # what the engine's ``export_seq`` gave
    key: bytes  # for :meth:`PromptStore.forget`


class PromptStore:
    def __init__(self, fingerprint: Fingerprint, ram: RamStore, block: int = BLOCK) -> None:
        self.fingerprint = fingerprint
        self.ram = ram
        self.block = block
        self._root = fingerprint.digest

    def holds(self, inputs: Sequence[Any]) -> bool:
        """Whether the state of exactly ``inputs`` is stored (saving it again would be a no-op)."""
        return self.ram.get(chain(self._root, inputs, self.block).key()) is not None

    def wants(self, inputs: Sequence[Any]) -> bool:
        """Whether saving the state of ``inputs`` would keep anything new (the caller exports
        only then: an export copies the whole sequence)."""
        return len(inputs) >= MIN_INPUTS and self.ram.limit > 0 and not self.holds(inputs)

    def save(self, inputs: Sequence[Any], state: Any) -> bool:
        """Keep ``state``, the KV state of exactly ``inputs`` (``len(state)`` bytes). False when
        nothing was kept (too short, the store is off or the state exceeds its bound)."""
        if len(inputs) < MIN_INPUTS:
            return False
        return self.ram.put(chain(self._root, inputs, self.block), state, len(state))

    def lookup(self, prompt: Sequence[Any]) -> Found | None:
        """The stored state serving the longest prefix of ``prompt``; None when none does.
        Marks it recently used."""
        if len(prompt) == 0:
            return None
        hit = self.ram.lookup(chain(self._root, prompt, self.block))
        if hit is None:
            return None
        entry: Entry | None = self.ram.get(hit.entry.key)
        if entry is None:
            return None
        return Found(n=hit.n, state_n=entry.n, state=entry.state, key=entry.key)

    def forget(self, found: Found) -> None:
        """Drop a state: imported into a slot (which holds it now), or refused by the engine."""
        self.ram.take(found.key)

    @property
    def used(self) -> int:
        return self.ram.used
