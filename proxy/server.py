"""How uvicorn serves the proxy: its options, and an HTTP protocol that gives every connection deadlines.

uvicorn's protocols time out only an idle keep-alive connection: a client that sends its headers, or a body the
app never reads, one byte at a time holds its socket for ever, and enough of them exhaust the open-file limit.
`DeadlineProtocol` (uvicorn's httptools protocol, which `uvicorn[standard]` installs) closes a connection whose
request headers are not complete within `server.header_timeout_s` of its first byte (or of the connection),
and one whose body is not complete within `server.body_timeout_s` of its headers plus a grace period. The
chat door enforces the same body deadline itself (`proxy.wire.body.read_body`) and answers a 408 first; the
protocol's timer is the backstop for a body nobody reads. The keep-alive timeout stays well above common
clients' own (httpx, and so the OpenAI SDK, keeps an idle connection 5 s): a server that closes at the same
moment races the client's next request on that connection, which then fails with a `ReadError`.

The CLI (`serve`) and the end-to-end tests' server both take their options from `server_options`.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy.config import ServerConfig

BODY_GRACE_S = 5.0
"""How much longer than `server.body_timeout_s` the protocol waits before closing: the app answers a late body
with a 408 itself, and this timer must not cut that answer off."""


class DeadlineProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline and a body deadline per request."""

    header_timeout_s: ClassVar[float]
    body_timeout_s: ClassVar[float]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:
            self._arm(self.header_timeout_s)

    def on_headers_complete(self) -> None:
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
    """`DeadlineProtocol` bound to this config's deadlines (uvicorn builds protocols from a class)."""
    return type(
        "ProxyHttpProtocol",
        (DeadlineProtocol,),
        {"header_timeout_s": server.header_timeout_s, "body_timeout_s": server.body_timeout_s},
    )


def server_options(server: ServerConfig) -> dict[str, Any]:
    """The keyword arguments of `uvicorn.run` / `uvicorn.Config` that the `server:` section decides."""
    return {
        "http": protocol_class(server),
        "timeout_keep_alive": server.keep_alive_s,
        "limit_concurrency": server.max_connections,
    }
