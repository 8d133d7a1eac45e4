"""How uvicorn serves the proxy: its options, and an HTTP protocol that gives every connection deadlines.

uvicorn's protocols time out only an idle keep-alive connection: a client that sends its headers, or a body the
app never reads, one byte at a time holds its socket for ever, and enough of them exhaust the open-file limit.
`DeadlineProtocol` (uvicorn's httptools protocol, which `uvicorn[standard]` installs) closes a connection whose
request headers are not complete within `server.header_timeout_s` of its first byte (or of the connection),
and one whose body is not complete within `server.body_timeout_s` of its headers plus a grace period. Every
route that reads a body (each door, the pin routes) enforces the same deadline itself (`proxy.doors.body.read_body`)
and answers a 408 `request_timeout` first, with `Connection: close`; the protocol's timer is the backstop for a
body nobody reads. A response whose client takes none of its bytes for `server.write_timeout_s` (its socket and
the transport's buffer full) is dropped: the connection is aborted, which the app hears as the client leaving (a
stream's relay journals the answer to its end); an upgraded WebSocket (`proxy.serving.sockets`) has the same write
deadline (`proxy.serving.connections`). The keep-alive timeout stays well above common clients' own (httpx, and so
the OpenAI SDK, keeps an idle connection 5 s): a server that closes at the same moment races the client's next
request on that connection, which then fails with a `ReadError`.

A request's line and headers together are capped at `server.max_header_bytes`: bytes are counted as they
arrive, before httptools sees them (it gathers a header in memory piece by piece, so a 64 MB one costs its size
several times over and stalls the loop), and the request that outgrows the cap is answered 431
`request_headers_too_large` in the error shape of the door its path lies under, OpenAI's elsewhere (`refusal`;
before auth: no app code runs), with `Connection: close`. The connection is then read for a short while with what
arrives dropped, and closed: closing a socket with unread data resets it, and the client would lose the answer it
has not read yet.

Sockets are capped where they are accepted: past `server.max_connections` (by default about half the process's
open-file limit, the other half left to upstream connections and the store) a new connection makes room by closing
an *evictable* one: first the one that has waited longest without a request under way (slow headers, idle
keep-alive, or a WebSocket waiting for its next request), else the slowest whose request body has arrived, for
`BODY_RATE_GRACE_S` or more, slower than `server.min_body_rate` bytes a second (a body the app is not reading, its
socket paused, is not the client's fault and is kept). When nothing is evictable the new connection takes one of
`HEALTH_RESERVE` spare sockets where only a health check (`HEALTH_PATHS`) is served, then closed; anything else is
answered 503 `server_busy` (`Retry-After`, in its door's shape) with `Connection: close`. Slow clients thus cannot
take the sockets real clients need, health checks are answered while every slot is full, and the process never
meets its open-file limit (which `serve` raises to the hard limit).

The CLI (`serve`) and the end-to-end tests' server both take their options from `server_options`.
"""

from __future__ import annotations

import asyncio
import json
import resource
from collections.abc import Iterable
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, ClassVar, Self

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.config.schema import ServerConfig
from proxy.doors.door import error_door
from proxy.doors.registry import DOORS
from proxy.errors import ClientError, ProxyError, openai_error
from proxy.serving.connections import ClientConnection, peer
from proxy.serving.sockets import SocketProtocol

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer

BODY_GRACE_S = 5.0
"""How much longer than `server.body_timeout_s` the protocol waits before closing: the app answers a late body
with a 408 itself, and this timer must not cut that answer off."""


HEADERS_TOO_LARGE = int(HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE)
REFUSAL_LINGER_S = 2.0
"""How long a connection answered 431 is still read (what arrives dropped) before it is closed, so that the
client, still sending its headers, reads the answer instead of a reset."""


RESERVED_FILES = 128
"""Open files kept for the store, logs and the like when the connection cap is derived from the file limit."""

BODY_RATE_GRACE_S = 1.0
"""How long a request body may arrive before its rate is judged: a client's first packets come in bursts."""
HEALTH_RESERVE = 16
"""Sockets beyond `server.max_connections` kept for health checks while every connection is busy."""
HEALTH_PATHS = frozenset({"/healthz", "/"})
SERVER_BUSY = 503


class ServerBusy(ProxyError):
    """Every connection is busy with a request and none is slow enough to close: the client may retry."""

    status, type, code = SERVER_BUSY, "server_error", "server_busy"


class ChunkedBody(bytearray):
    """The body bytes a request's cycle holds until the app receives them, kept as the parser's own chunks.

    uvicorn's cycle appends each chunk to a bytearray and copies that into new bytes on `receive`: two copies of
    every byte, ~0.5 ms a request of 10 MB (an agent re-sends its whole session every turn). The cycle's
    `body += chunk`, `len(body)` and `bytes(body)` are all it does with it; here they hold, count and hand on
    the chunks (one chunk, which is all that waits between two receives but for a slow app, is not copied)."""

    def __init__(self) -> None:
        super().__init__()
        self._chunks: list[bytes] = []
        self._size = 0

    def __iadd__(self, chunk: ReadableBuffer) -> Self:  # type: ignore[override]  # as bytearray's own
        data = bytes(chunk)  # the parser's bytes object itself (`bytes` of exact bytes is no copy)
        self._chunks.append(data)
        self._size += len(data)
        return self

    def __len__(self) -> int:
        return self._size

    def __bytes__(self) -> bytes:
        return self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)


class DeadlineProtocol(ClientConnection, HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a body deadline per request, a cap on the size of
    a request's headers, a write deadline (`ClientConnection`), and a cap on connections enforced at accept
    time."""

    header_timeout_s: ClassVar[float]
    body_timeout_s: ClassVar[float]
    max_header_bytes: ClassVar[int]
    max_connections: ClassVar[int]
    min_body_rate: ClassVar[float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self.waiting_since = None
        self._head_bytes: int | None = 0
        """Bytes of the current request's line and headers received so far (None once they are complete)."""
        self._refused = False
        """Answered 431: what still arrives is dropped until the connection closes."""
        self._body_since: float | None = None
        """Since when the current request's body arrives (None when no body is under way)."""
        self._body_bytes = 0
        self.spare = False
        """Accepted on a spare socket (`HEALTH_RESERVE`): serves one health check, refuses anything else."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.waiting_since = self.loop.time()
        self._arm(self.header_timeout_s)
        if len(self.connections) > self.max_connections:
            self._make_room()

    def _make_room(self) -> None:
        """Close the connection that has waited longest for a request, an HTTP one or a socket alike
        (`ClientConnection`), else the slowest body, else take a spare socket."""
        others = [other for other in _client_connections(self.connections) if other is not self]
        now = self.loop.time()
        waiting = [other for other in others if other.waiting_since is not None and not other.spare]
        if waiting:
            victim = min(waiting, key=lambda other: other.waiting_since or 0.0)
            reason = "it had waited longest without a request"
        else:
            slow = [(rate, other) for other in others if (rate := other.slow_body_rate(now)) is not None]
            if not slow:
                self._take_spare(others)
                return
            rate, victim = min(slow, key=lambda pair: pair[0])
            reason = f"its body arrived at {rate:.0f} bytes/s (server.min_body_rate={self.min_body_rate:g})"
        self.logger.info(
            "closing a connection from %s: %d connections open (server.max_connections=%d), and %s",
            peer(victim.client),
            len(self.connections),
            self.max_connections,
            reason,
        )
        victim.evict()

    def evict(self) -> None:
        self._body_since = None
        super().evict()

    def _take_spare(self, others: list[ClientConnection]) -> None:
        """Every connection is busy: serve a health check on a spare socket, or close this one if none is left."""
        if sum(other.spare for other in others) < HEALTH_RESERVE:
            self.spare = True
            return
        self.logger.info(
            "closing a connection from %s: %d connections open (server.max_connections=%d), all busy",
            peer(self.client),
            len(self.connections),
            self.max_connections,
        )
        self.waiting_since = None
        self.transport.close()

    def slow_body_rate(self, now: float) -> float | None:
        """The rate its body arrives at, if below `server.min_body_rate` after the grace (else None: not slow)."""
        if self._body_since is None or self.transport.is_closing() or self.flow.read_paused:
            return None
        elapsed = now - self._body_since
        if elapsed < BODY_RATE_GRACE_S:
            return None
        rate = self._body_bytes / elapsed
        return rate if rate < self.min_body_rate else None

    def data_received(self, data: bytes) -> None:
        if self._refused or self.transport.is_closing():
            return
        if self._head_bytes is None:
            super().data_received(data)
            return
        room = self.max_header_bytes - self._head_bytes
        if len(data) <= room:
            self._head_bytes += len(data)
            super().data_received(data)
            return
        # Only what fits goes to the parser: if the headers end within it, the rest is body (or the next request).
        self._head_bytes = self.max_header_bytes
        if room > 0:
            super().data_received(data[:room])
        if self.transport.is_closing() or self.transport.get_protocol() is not self:
            return  # refused by the parser, or upgraded to a WebSocket
        if self._head_bytes is not None:
            self._refuse_headers()
        else:
            self.data_received(data[room:])

    def _refuse_headers(self) -> None:
        self.logger.info(
            "refusing a request from %s: its line and headers passed %d bytes (server.max_header_bytes)",
            peer(self.client),
            self.max_header_bytes,
        )
        error = ClientError(
            f"The request's line and headers are larger than {self.max_header_bytes} bytes (server.max_header_bytes).",
            status=HEADERS_TOO_LARGE,
            code="request_headers_too_large",
        )
        self._refuse(error)

    def _refuse(self, error: ProxyError) -> None:
        """Answer `error` in the shape of the door the request's path lies under, and close the connection."""
        self._refused = True
        self._disarm()
        if self.cycle is not None and not self.cycle.response_complete:
            self.transport.close()  # a response is under way on this connection: nothing may be written into it
            return
        path = self.url.partition(b"?")[0].decode("latin-1")
        self.transport.write(refusal(error, path, self.server_state.default_headers))
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._deadline = self.loop.call_later(REFUSAL_LINGER_S, self.transport.close)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self.waiting_since = self.loop.time()  # idle keep-alive until the next request begins

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:
            self._arm(self.header_timeout_s)

    def on_headers_complete(self) -> None:
        self.waiting_since = None
        self._head_bytes = None
        self._disarm()
        if self.spare and _path(self.url) not in HEALTH_PATHS:
            self.logger.info("refusing a request from %s: every connection is busy", peer(self.client))
            self._refuse(
                ServerBusy("Every connection of the proxy is busy; retry shortly.", headers={"Retry-After": "1"})
            )
            return
        super().on_headers_complete()
        if self.spare and self.cycle is not None:
            self.cycle.keep_alive = False  # a spare socket serves one health check: `Connection: close`
        self._body_since, self._body_bytes = self.loop.time(), 0
        self._arm(self.body_timeout_s + BODY_GRACE_S)

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._body_bytes += len(body)
        if self.cycle is not None and type(self.cycle.body) is not ChunkedBody:
            self.cycle.body = ChunkedBody()  # the cycle's empty bytearray (again after each `receive`)
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._disarm()
        self._head_bytes = 0
        self._body_since = None
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
            self.logger.info("closing a connection from %s: its request did not arrive in time", peer(self.client))
            self.transport.close()


def _client_connections(connections: Iterable[object]) -> list[ClientConnection]:
    return [connection for connection in connections if isinstance(connection, ClientConnection)]


def refusal(error: ProxyError, path: str, default_headers: list[tuple[bytes, bytes]]) -> bytes:
    """The whole response, in the error shape of the door `path` lies under, that refuses a request before the
    app sees it and closes the connection."""
    door = error_door(path, DOORS)
    status, fields, headers = (door.error if door is not None else openai_error)(error)
    body = json.dumps(fields).encode()
    head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
    head += [name + b": " + value for name, value in default_headers]
    head += [f"{name}: {value}".encode("latin-1") for name, value in headers.items()]
    head += [b"content-type: application/json", b"content-length: %d" % len(body), b"connection: close"]
    return b"\r\n".join(head) + b"\r\n\r\n" + body


def _path(url: bytes) -> str:
    try:
        return httptools.parse_url(url).path.decode("latin-1")
    except httptools.HttpParserInvalidURLError:
        return ""


def protocol_class(server: ServerConfig) -> type[DeadlineProtocol]:
    """`DeadlineProtocol` bound to this config's deadlines and cap (uvicorn builds protocols from a class)."""
    return type(
        "ProxyHttpProtocol",
        (DeadlineProtocol,),
        {
            "header_timeout_s": server.header_timeout_s,
            "body_timeout_s": server.body_timeout_s,
            "max_header_bytes": server.max_header_bytes,
            "write_timeout_s": server.write_timeout_s,
            "max_connections": server.max_connections or default_max_connections(),
            "min_body_rate": server.min_body_rate,
        },
    )


def socket_protocol_class(server: ServerConfig) -> type[SocketProtocol]:
    """`SocketProtocol` bound to this config's deadlines (uvicorn builds an upgraded socket's protocol from it)."""
    return type(
        "ProxySocketProtocol",
        (SocketProtocol,),
        {"write_timeout_s": server.write_timeout_s, "idle_timeout_s": server.socket_idle_timeout_s},
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
    return {
        "http": protocol_class(server),
        "ws": socket_protocol_class(server),
        "timeout_keep_alive": server.keep_alive_s,
    }
