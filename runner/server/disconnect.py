"""Whether the client of the current request is still there.

A handler that answers one JSON body (``/api/embed``, ``/v1/embeddings``) is not told when its
client leaves: Starlette only watches the connection while a streaming body is sent. The
:class:`TrackClient` middleware keeps each HTTP request's ASGI ``receive`` in a context variable,
so the service can wait for the client's ``http.disconnect`` beside its work (the body has been
read by then, so nothing else is waiting for a message).
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar

from starlette.types import ASGIApp, Receive, Scope, Send

_receive: ContextVar[Receive | None] = ContextVar("pollama_receive", default=None)


class TrackClient:
    """ASGI middleware: remember each HTTP request's ``receive`` for :func:`client_gone`."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token = _receive.set(receive)
        try:
            await self.app(scope, receive, send)
        finally:
            _receive.reset(token)


async def client_gone() -> None:
    """Return once the current request's client has disconnected (wait forever outside a
    tracked request). Call only after the request body was read; cancel it when done."""
    receive = _receive.get()
    if receive is None:
        await asyncio.Event().wait()
        return
    while (await receive())["type"] != "http.disconnect":
        pass
