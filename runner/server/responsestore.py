"""The Responses API's stored responses (``store: true``, OpenAI's default): what
``previous_response_id`` chains to and ``GET``/``DELETE /v1/responses/{id}`` answer.

Kept in the server's memory only, least recently used first out, within two bounds:

- **1,000 responses**: an agent chains each turn to its previous one, so a few per conversation
  in use are enough; the count bounds the bookkeeping of many small ones.
- **256 MiB** of JSON: each entry holds its whole conversation (the chain's input items,
  base64 images included, and the output), so a long agent session's latest turns are megabytes
  each; the bytes bound what a client that never deletes can make the server hold. An entry
  larger than the bound alone is not kept.

A response evicted (or never kept) is gone: chaining to it or reading it is a 404, as for an
id that never existed. Nothing is written to disk; a restart forgets them all.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from .http import dumps

log = logging.getLogger(__name__)

MAX_RESPONSES = 1000
MAX_BYTES = 256 << 20


@dataclass(frozen=True)
class Stored:
    """One kept response, as JSON (immutable, and measured by its length)."""

    response: bytes  # the response object, as GET answers it
    items: bytes  # the input items it answered: its chain's and its request's, in order

    @property
    def size(self) -> int:
        return len(self.response) + len(self.items)

    def conversation(self) -> list[Any]:
        """Its input items and then its output items: what a request chained to it continues."""
        return json.loads(self.items) + json.loads(self.response)["output"]


class ResponseStore:
    """Responses by id, least recently used evicted first past ``max_count`` entries or
    ``max_bytes`` of JSON. Used from the event loop only (no locking)."""

    def __init__(self, max_count: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES) -> None:
        self.max_count = max_count
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, Stored] = OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, ident: str, response: dict[str, Any], items: list[Any]) -> bool:
        """Keep ``response`` (its ``output`` included) with the ``items`` it answered; evict
        the least recently used past the bounds. False when it alone is over ``max_bytes``."""
        entry = Stored(dumps(response), dumps(items))
        self.delete(ident)
        if entry.size > self.max_bytes:
            log.warning("response %s not stored: %d bytes is more than the store's %d", ident, entry.size,
                        self.max_bytes)
            return False
        self._entries[ident] = entry
        self.bytes += entry.size
        while len(self._entries) > self.max_count or self.bytes > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self.bytes -= old.size
        return True

    def get(self, ident: str) -> Stored | None:
        """The response, now the most recently used; None when it is not (or no longer) kept."""
        entry = self._entries.get(ident)
        if entry is not None:
            self._entries.move_to_end(ident)
        return entry

    def delete(self, ident: str) -> bool:
        """Forget the response; False when it was not kept."""
        entry = self._entries.pop(ident, None)
        if entry is None:
            return False
        self.bytes -= entry.size
        return True
