"""The transport under every upstream client: a request whose connection failed before its answer began is sent
once more, on a fresh connection.

Connections to an upstream are pooled and kept alive between calls. An upstream closes an idle one when it likes
(uvicorn after 5 s), and when it does so just as the proxy sends the next request on it, that request fails with
a reset (`ReadError`), a broken pipe (`WriteError`) or a disconnect without an answer (`RemoteProtocolError`) —
~1 request in 24,000 under load. The upstream's application never saw it, so it is sent once more, on a
connection opened for it alone (a second pool that keeps no connection alive: the pool's other idle connections
may have been closed by the same upstream at the same moment).

Only a failure raised while waiting for the answer's head is retried: once `handle_async_request` has returned,
the answer has begun and is never asked for again (the upstream may be generating it, and bill it). A timeout
is never retried (a slow answer is not a lost one), nor a protocol error in a head the upstream did send, nor a
request whose body cannot be sent twice. httpcore reports a head cut off before it ended like no head at all
("disconnected without sending a response"): either way no status reached the proxy, and nothing was relayed.
Every upstream client's transport is made here (`upstream_transport`): the direct chat route, the translated
route, the native clients and LiteLLM's handler for Anthropic; providers whose LiteLLM handler builds its own
client keep LiteLLM's retries (`upstream.num_retries`).
"""

from __future__ import annotations

import logging
import ssl

import httpx

log = logging.getLogger(__name__)

NO_KEEPALIVE = httpx.Limits(max_keepalive_connections=0)
"""The retry's pool: each connection is closed once its answer is read, so a retry always opens a new one."""
DISCONNECTED = "Server disconnected without sending a response"
"""httpcore's words for a connection closed before an answer's head: the only protocol error retried."""


def upstream_transport(verify: ssl.SSLContext | bool = True) -> httpx.AsyncBaseTransport:
    """A pooled transport to an upstream whose stale connections cost no request; both pools share one TLS
    context (loading the CA bundle costs ~0.2 s)."""
    tls = httpx.create_ssl_context() if verify is True else verify
    return RetryOnFreshConnection(
        httpx.AsyncHTTPTransport(verify=tls), httpx.AsyncHTTPTransport(verify=tls, limits=NO_KEEPALIVE)
    )


class RetryOnFreshConnection(httpx.AsyncBaseTransport):
    """Sends on `pooled`; a request that failed there before its answer began is sent once on `fresh`."""

    def __init__(self, pooled: httpx.AsyncBaseTransport, fresh: httpx.AsyncBaseTransport) -> None:
        self._pooled = pooled
        self._fresh = fresh

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        replayable = isinstance(request.stream, httpx.ByteStream)  # before sending: a stream is consumed by it
        try:
            return await self._pooled.handle_async_request(request)
        except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
            if not replayable or not never_answered(exc):
                raise
            log.info(
                "upstream connection failed before an answer (%s); sending the request again on a new one", _why(exc)
            )
        return await self._fresh.handle_async_request(request)

    async def aclose(self) -> None:
        try:
            await self._pooled.aclose()
        finally:
            await self._fresh.aclose()


def never_answered(exc: httpx.HTTPError) -> bool:
    """Whether a failure of sending a request (or waiting for its answer's head) means no answer began."""
    if isinstance(exc, httpx.CloseError):
        return False
    if isinstance(exc, httpx.NetworkError):
        return True  # connect, write, or read before the head: refused, reset, broken pipe
    return isinstance(exc, httpx.RemoteProtocolError) and str(exc).startswith(DISCONNECTED)


def _why(exc: httpx.HTTPError) -> str:
    return str(exc).strip() or type(exc).__name__
