"""Which replica of a remote model takes a request: plain data and arithmetic, no I/O, no clock
of its own (the caller passes ``now``), so the rules are table-tested (tests/test_remote_replicas.py).

- **Prefix affinity:** a conversation goes where its prefix went before (its key: a hash of its
  first blocks, :func:`runner.remote.runner.prefix_key`), so the upstream's own prefix cache
  stays warm; a new prefix goes to the least-busy replica and is remembered there.
- **Imbalance:** the remembered replica is left when it has more than ``imbalance`` requests
  in flight beyond the least-busy one (the conversation then moves, and is remembered there).
- **In-flight limit:** a replica with ``limit`` requests in flight takes no more; when every
  replica is full, :meth:`Replicas.pick` says so (None) and the caller waits.
- **Down:** a replica that refused a connection or failed before its first byte is skipped for
  ``down_for`` seconds (or until a health check brings it back, :meth:`Replicas.up`). When every
  replica is down, the one down longest is tried anyway: a request is never refused for want of a
  replica that might answer.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

DEFAULT_IMBALANCE = 4
DEFAULT_DOWN_FOR = 30.0
MAX_KEYS = 4096  # prefixes remembered (least recently used forgotten first)


@dataclass
class Replica:
    in_flight: int = 0
    down_until: float = 0.0  # the replica is skipped until then
    served: int = 0


@dataclass
class Replicas:
    """The routing state of one remote model's replicas (not thread-safe: the caller locks)."""

    count: int
    limit: int = 16
    imbalance: int = DEFAULT_IMBALANCE
    down_for: float = DEFAULT_DOWN_FOR
    replicas: list[Replica] = field(default_factory=list)
    affinity: collections.OrderedDict[str, int] = field(default_factory=collections.OrderedDict)

    def __post_init__(self) -> None:
        if not self.replicas:
            self.replicas = [Replica() for _ in range(self.count)]

    def is_down(self, i: int, now: float) -> bool:
        return self.replicas[i].down_until > now

    def pick(self, key: str | None, now: float, exclude: frozenset[int] = frozenset()) -> int | None:
        """The replica for a request whose prefix is ``key`` (None: no affinity), not one of
        ``exclude`` (those that failed it already); None when every candidate is at its limit
        or excluded. Does not count the request in: :meth:`start` does."""
        open_ = [i for i in range(self.count) if i not in exclude and self.replicas[i].in_flight < self.limit]
        if not open_:
            return None
        up = [i for i in open_ if not self.is_down(i, now)]
        if not up:  # all down: the one down longest (its mark ends first) may be back
            return min(open_, key=lambda i: (self.replicas[i].down_until, i))
        least = min(up, key=lambda i: (self.replicas[i].in_flight, self.replicas[i].served, i))
        if key is not None:
            known = self.affinity.get(key)
            if known is not None and known in up and \
                    self.replicas[known].in_flight - self.replicas[least].in_flight <= self.imbalance:
                return known
        return least

    def start(self, i: int, key: str | None) -> None:
        """Replica ``i`` takes a request whose prefix is ``key``: it is remembered there."""
        self.replicas[i].in_flight += 1
        self.replicas[i].served += 1
        if key is not None:
            self.affinity[key] = i
            self.affinity.move_to_end(key)
            while len(self.affinity) > MAX_KEYS:
                self.affinity.popitem(last=False)

    def finish(self, i: int) -> None:
        """A request on replica ``i`` ended (however it ended)."""
        self.replicas[i].in_flight = max(0, self.replicas[i].in_flight - 1)

    def down(self, i: int, now: float) -> None:
        """Replica ``i`` refused or failed before its first byte: skip it for ``down_for``."""
        self.replicas[i].down_until = now + self.down_for

    def up(self, i: int) -> None:
        """Replica ``i`` answered (a request or a health check): it takes requests again."""
        self.replicas[i].down_until = 0.0

    def downs(self, now: float) -> list[int]:
        """The replicas marked down now (what a health check probes)."""
        return [i for i in range(self.count) if self.is_down(i, now)]
