"""What every client connection shares, HTTP or upgraded to a WebSocket: a write deadline, and being evictable.

The proxy serves with two of uvicorn's protocols, `proxy.serving.server.DeadlineProtocol` (HTTP) and
`proxy.serving.sockets.SocketProtocol` (a WebSocket, once a request upgraded); both mix `ClientConnection` in,
so that one mechanism bounds both:
- A connection whose client takes none of its bytes for `server.write_timeout_s` (the transport's buffer full,
  writing paused) is reset. The app hears the client leave; a stream's relay journals the answer to its end.
- `waiting_since` says since when a connection waits for its client's next request (HTTP: its headers, or an
  idle keep-alive; a socket: its next `response.create`), None while one is under way. Past
  `server.max_connections` a new connection `evict`s the one that has waited longest, whatever its kind
  (`proxy.serving.server.DeadlineProtocol`).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from typing import ClassVar


class ClientConnection(asyncio.Protocol):
    """Mixed into a uvicorn protocol (before it), which provides `loop`, `transport`, `client` and `logger`."""

    write_timeout_s: ClassVar[float]
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    client: tuple[str, int] | None
    logger: logging.Logger

    waiting_since: float | None = None
    """Since when it waits for its client's next request (None while one is under way)."""
    spare: bool = False
    """Accepted on a spare socket while every connection was busy (`proxy.serving.server.HEALTH_RESERVE`)."""
    _write_deadline: asyncio.TimerHandle | None = None

    def slow_body_rate(self, now: float) -> float | None:
        """The rate a request body arrives at, if slow enough to make the connection evictable; else None."""
        return None

    def evict(self) -> None:
        """Close it to make room for a new connection; it was waiting for a request, so nothing is cut."""
        self.waiting_since = None
        self.transport.close()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(self.write_timeout_s, self._write_expired)

    def resume_writing(self) -> None:
        self._disarm_write()
        super().resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_write()
        super().connection_lost(exc)

    def _disarm_write(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _write_expired(self) -> None:
        self._write_deadline = None
        if not self.transport.is_closing() or self.transport.get_write_buffer_size():
            self.logger.info(
                "dropping a client at %s: it took none of its response for %s s (server.write_timeout_s)",
                peer(self.client),
                self.write_timeout_s,
            )
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                # Linger 0: the kernel resets the connection instead of holding the unsent bytes (megabytes) in a
                # closing socket that retries them for minutes.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()  # close() would wait for the buffer to drain, i.e. for ever


def peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown peer"
