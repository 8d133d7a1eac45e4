"""How an upgraded WebSocket is served: uvicorn's protocol for it, bounded as an HTTP connection is.

uvicorn's own (websockets' sans-I/O protocol, the one `uvicorn[standard]` picks) keeps a socket for as long as its
client answers pings, counts it toward `server.max_connections` without ever making room, and waits for ever for
a client that reads nothing. `SocketProtocol` mixes in what every connection has (`proxy.serving.connections`):
- A socket is *idle* while the app waits for its client's next message (in WebSocket mode, the next
  `response.create`) and none has arrived; a socket answering is never idle, however long its answer takes.
  An idle socket `waiting_since`, so past `server.max_connections` a new connection closes it as it would an idle
  keep-alive connection (the one that has waited longest goes first), and it is closed after
  `server.socket_idle_timeout_s` anyway. Either way the client gets a close frame, 1001 (going away) with the
  reason, and the app a disconnect.
- A socket whose client takes none of its events for `server.write_timeout_s` is reset: the app's next send
  fails as the client leaving, and the stream's relay journals the answer to its end and seals it.
It reads uvicorn's protocol's own state (`queue`, `close_sent`, `disconnected`, its send waiting while the
transport's buffer is full: `pyproject.toml` asks for the uvicorn that has them).
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn._types import ASGIReceiveEvent
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from proxy.serving.connections import ClientConnection, peer

GOING_AWAY = 1001
"""The close code of a socket the server closes (RFC 6455: "going away")."""
MAX_CLOSE_REASON_BYTES = 123
"""A close frame's payload is at most 125 bytes, two of them the code."""


class SocketProtocol(ClientConnection, WebSocketsSansIOProtocol):
    idle_timeout_s: ClassVar[float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.waiting_since = None
        self._idle: asyncio.TimerHandle | None = None

    async def receive(self) -> ASGIReceiveEvent:
        if self.queue.empty() and self.handshake_complete and not self.disconnected and not self.close_sent:
            self._wait()
        try:
            return await super().receive()
        finally:
            self._stop_waiting()

    def send_receive_event_to_app(self) -> None:
        self._stop_waiting()  # a request arrived: no longer idle, even before the app takes it
        super().send_receive_event_to_app()

    def evict(self) -> None:
        self._going_away("the proxy needed the connection for another client (server.max_connections)")

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_waiting()
        super().connection_lost(exc)

    def _wait(self) -> None:
        self.waiting_since = self.loop.time()
        self._idle = self.loop.call_later(self.idle_timeout_s, self._idle_expired)

    def _stop_waiting(self) -> None:
        self.waiting_since = None
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def _idle_expired(self) -> None:
        self._idle = None
        self.logger.info(
            "closing a WebSocket from %s: no request for %s s (server.socket_idle_timeout_s)",
            peer(self.client),
            self.idle_timeout_s,
        )
        self._going_away(f"no request for {self.idle_timeout_s:g} s (server.socket_idle_timeout_s)")

    def _going_away(self, reason: str) -> None:
        """Close the socket from the server's side: a close frame, then the connection; the app hears a
        disconnect. Only for a socket the app is not writing to (an idle one)."""
        self._stop_waiting()
        if self.close_sent or self.transport.is_closing():
            return
        reason = reason.encode()[:MAX_CLOSE_REASON_BYTES].decode(errors="ignore")
        self.queue.put_nowait({"type": "websocket.disconnect", "code": GOING_AWAY, "reason": reason})
        self.conn.send_close(GOING_AWAY, reason)
        self.transport.write(b"".join(self.conn.data_to_send()))
        self.close_sent = True
        self.transport.close()
