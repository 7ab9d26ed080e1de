"""The HTTP/1.1 connection: uvicorn's h11 protocol plus read deadlines.

uvicorn closes a kept-alive connection that stays idle *between* requests
(``timeout_keep_alive``), and nothing else: a client that connects and sends nothing, or stops
partway through the request line, the headers or the body, keeps its socket (and, for a body,
a handler waiting on it) forever. Rules added here:

- **Head**: the request line and headers must be complete within :data:`HEAD_TIMEOUT` of the
  connection opening or, on a kept-alive connection, of the next request's first byte. It is a
  total: trickling a byte at a time does not extend it. Real clients send their head in one write.
- **Body**: while a body is being received, at most :data:`BODY_IDLE_TIMEOUT` may pass without a
  byte arriving. A gap, not a total, so a large body on a slow link still gets through. Time
  during which the server itself paused reading (flow control) does not count.

When a deadline passes the connection is closed; a handler waiting on the body sees a disconnect.
TCP sockets get ``TCP_NODELAY``: a response's head and body are two writes.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("runner.server")

HEAD_TIMEOUT = 10.0  # seconds from the first byte (or the connection) to the end of the headers
BODY_IDLE_TIMEOUT = 10.0  # seconds without a byte while a body is incomplete


class Protocol(H11Protocol):
    """uvicorn's h11 protocol with the deadlines of this module."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            # a response goes out in two writes (head, body): with Nagle's rule the body waited
            # for the client's delayed ACK, 40 ms on every answer of a kept-alive connection
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._arm(HEAD_TIMEOUT)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()  # a pipelined request may have been parsed just now

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _follow(self) -> None:
        """Set the deadline from where the client's request stands."""
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            self._arm(BODY_IDLE_TIMEOUT)  # progress: the gap starts again
        elif state is h11.IDLE and self.conn.trailing_data[0]:
            if self._deadline is None:  # a head has begun: its total starts once
                self._arm(HEAD_TIMEOUT)
        else:  # no request under way (idle keep-alive is uvicorn's), or it is complete
            self._disarm()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, seconds)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, seconds: float) -> None:
        self._deadline = None
        if self.transport.is_closing():
            return
        if self.flow.read_paused:  # the server is not reading: not the client's delay
            self._arm(seconds)
            return
        log.debug("closing the connection from %s: request incomplete after %.0fs", self.client, seconds)
        self.transport.close()
