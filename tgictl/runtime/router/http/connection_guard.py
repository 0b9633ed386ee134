"""Slow and excess clients at the connection: a header timeout and a connection cap (the body timeout is the
body guard's, app.py).

uvicorn times out idle keep-alive connections, but nothing bounds how long a client may take to send a
request's headers, nor how many connections it may hold: 1,000 connections sending a header byte per second
were all still open after 77 s (slowloris). `guarded_protocol` returns uvicorn's h11 protocol with both limits:
- a request's headers must be complete within `header_timeout_s` of the connection, or of the previous
  response on a keep-alive connection; a connection that misses it is closed (nginx's client_header_timeout);
- a connection beyond `max_connections` open ones is answered 503 and closed at once, before it can send
  anything (so it holds no task and no buffer).

The limits live in the class (uvicorn builds the protocol from its class with fixed arguments), one class per
server.
"""

from __future__ import annotations

import asyncio
import logging

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger(__name__)

_REFUSED_BODY = b'{"error":"too many open connections; try again later","error_type":"overloaded"}'
_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: " + str(len(_REFUSED_BODY)).encode() + b"\r\n\r\n" + _REFUSED_BODY
)


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header timeout and a connection cap (set by `guarded_protocol`)."""

    header_timeout_s: float = 10.0
    max_connections: int = 1024

    _header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.max_connections:
            log.warning("refused a connection: %d are open (--max-connections)", len(self.connections))
            transport.write(_REFUSED)
            transport.close()
            return
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_header_timer()
        if self.transport is None:  # refused in connection_made: uvicorn never saw it
            return
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.transport is None:
            return
        super().data_received(data)

    def handle_events(self) -> None:
        super().handle_events()
        if self.conn.their_state is not h11.IDLE:  # the request's headers are in
            self._cancel_header_timer()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.conn.their_state is h11.IDLE:
            self._arm_header_timer()  # the next request on this keep-alive connection

    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            self.transport.close()


def guarded_protocol(header_timeout_s: float, max_connections: int) -> type[GuardedH11Protocol]:
    """The protocol class for one server's limits."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {
        "header_timeout_s": header_timeout_s, "max_connections": max_connections,
    })
