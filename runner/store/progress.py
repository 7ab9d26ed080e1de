"""Progress of a store change (pull, create): Ollama's ``{status, digest, total, completed}``.

A pull or create is a generator of :class:`Progress`; the server writes each as one NDJSON line
(``/api/pull``, ``/api/create``) and the CLI draws them as spinners and per-layer bars.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Progress:
    status: str
    digest: str = ""  # "sha256:<hex>" while a layer moves, else ""
    total: int = 0
    completed: int = 0

    def wire(self) -> dict[str, Any]:
        """The JSON object Ollama sends: digest/total/completed only for a layer's progress."""
        out: dict[str, Any] = {"status": self.status}
        if self.digest:
            out.update(digest=self.digest, total=self.total, completed=self.completed)
        return out


def layer_status(verb: str, digest: str) -> str:
    """``pulling 6a0746a1ec1a``: the verb and the digest's first 12 hex digits, as Ollama."""
    return f"{verb} {digest.split(':', 1)[-1][:12]}"
