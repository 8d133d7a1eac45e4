"""How uvicorn serves the proxy: its options, and an HTTP protocol that gives every connection deadlines.

uvicorn's protocols time out only an idle keep-alive connection: a client that sends its headers, or a body the
app never reads, one byte at a time holds its socket for ever, and enough of them exhaust the open-file limit.
`DeadlineProtocol` (uvicorn's httptools protocol, which `uvicorn[standard]` installs) closes a connection whose
request headers are not complete within `server.header_timeout_s` of its first byte (or of the connection),
and one whose body is not complete within `server.body_timeout_s` of its headers plus a grace period. The
chat door enforces the same body deadline itself (`proxy.doors.body.read_body`) and answers a 408 first; the
protocol's timer is the backstop for a body nobody reads. A response whose client takes none of its bytes for
`server.write_timeout_s` (its socket and the transport's buffer full) is dropped: the connection is aborted,
which the app hears as the client leaving (a stream's relay journals the answer to its end). The keep-alive
timeout stays well above common clients' own (httpx, and so the OpenAI SDK, keeps an idle connection 5 s): a
server that closes at the same moment races the client's next request on that connection, which then fails with
a `ReadError`.

Sockets are capped where they are accepted: past `server.max_connections` (by default about half the process's
open-file limit, the other half left to upstream connections and the store) a new connection makes room by
closing the one that has waited longest without a request under way — slow headers, or idle keep-alive — and
is itself closed only when every connection is busy. Slow clients thus cannot take the sockets real clients
need, and the process never meets its open-file limit (which `serve` raises to the hard limit).

The CLI (`serve`) and the end-to-end tests' server both take their options from `server_options`.
"""

from __future__ import annotations

import asyncio
import resource
import socket
import struct
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.config import ServerConfig

BODY_GRACE_S = 5.0
"""How much longer than `server.body_timeout_s` the protocol waits before closing: the app answers a late body
with a 408 itself, and this timer must not cut that answer off."""


RESERVED_FILES = 128
"""Open files kept for the store, logs and the like when the connection cap is derived from the file limit."""


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a body deadline per request, and a cap on
    connections enforced at accept time."""

    header_timeout_s: ClassVar[float]
    body_timeout_s: ClassVar[float]
    write_timeout_s: ClassVar[float]
    max_connections: ClassVar[int]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._waiting_since: float | None = None
        """Since when this connection waits for a request's headers (None while a request is under way)."""
        self._write_deadline: asyncio.TimerHandle | None = None
        """Armed while the transport's buffer is full (writing paused): the client takes nothing."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = self.loop.time()
        self._arm(self.header_timeout_s)
        if len(self.connections) > self.max_connections:
            self._make_room()

    def _make_room(self) -> None:
        waiting = [
            other
            for other in self.connections
            if isinstance(other, DeadlineProtocol) and other is not self and other._waiting_since is not None
        ]
        victim = min(waiting, key=lambda other: other._waiting_since or 0.0) if waiting else self
        self.logger.info(
            "closing a connection from %s: %d connections open (server.max_connections=%d)%s",
            _peer(victim.client),
            len(self.connections),
            self.max_connections,
            "" if victim is self else ", and it had waited longest without a request",
        )
        victim._waiting_since = None
        victim.transport.close()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._waiting_since = self.loop.time()  # idle keep-alive until the next request begins

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_write()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_deadline is None:
            self._write_deadline = self.loop.call_later(self.write_timeout_s, self._write_expired)

    def resume_writing(self) -> None:
        self._disarm_write()
        super().resume_writing()

    def _disarm_write(self) -> None:
        if self._write_deadline is not None:
            self._write_deadline.cancel()
            self._write_deadline = None

    def _write_expired(self) -> None:
        self._write_deadline = None
        if not self.transport.is_closing() or self.transport.get_write_buffer_size():
            self.logger.info(
                "dropping a client at %s: it took none of its response for %s s (server.write_timeout_s)",
                _peer(self.client),
                self.write_timeout_s,
            )
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                # Linger 0: the kernel resets the connection instead of holding the unsent bytes (megabytes) in a
                # closing socket that retries them for minutes.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.transport.abort()  # close() would wait for the buffer to drain, i.e. for ever

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:
            self._arm(self.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._waiting_since = None
        self._disarm()
        super().on_headers_complete()
        self._arm(self.body_timeout_s + BODY_GRACE_S)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expire)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expire(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.logger.info("closing a connection from %s: its request did not arrive in time", _peer(self.client))
            self.transport.close()


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "an unknown peer"


def protocol_class(server: ServerConfig) -> type[DeadlineProtocol]:
    """`DeadlineProtocol` bound to this config's deadlines and cap (uvicorn builds protocols from a class)."""
    return type(
        "ProxyHttpProtocol",
        (DeadlineProtocol,),
        {
            "header_timeout_s": server.header_timeout_s,
            "body_timeout_s": server.body_timeout_s,
            "write_timeout_s": server.write_timeout_s,
            "max_connections": server.max_connections or default_max_connections(),
        },
    )


def default_max_connections() -> int:
    """Half of what the open-file limit leaves: each client connection may need an upstream one."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(16, (soft - RESERVED_FILES) // 2)


def raise_file_limit() -> None:
    """Lift the soft open-file limit to the hard one, as servers do: 1,024 is a shell default, not a choice."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def server_options(server: ServerConfig) -> dict[str, Any]:
    """The keyword arguments of `uvicorn.run` / `uvicorn.Config` that the `server:` section decides."""
    return {"http": protocol_class(server), "timeout_keep_alive": server.keep_alive_s}
