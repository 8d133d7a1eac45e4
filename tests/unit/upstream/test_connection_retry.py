"""Which failures `RetryOnFreshConnection` sends again, and how often: through httpx's `MockTransport` seam (the
real reset connection is in tests/reliability/test_upstream_reuse.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest

from proxy.upstream.connection_retry import RetryOnFreshConnection

Handler = Callable[[httpx.Request], httpx.Response]


def failing(exc: Exception, calls: list[str], name: str) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(name)
        raise exc

    return handle


def answering(calls: list[str], name: str) -> Handler:
    def handle(request: httpx.Request) -> httpx.Response:
        calls.append(name)
        return httpx.Response(200, json={"on": name, "body": request.content.decode()})

    return handle


def post(content: bytes = b'{"q": 1}') -> httpx.Request:
    return httpx.Request("POST", "http://upstream.test/v1/chat/completions", content=content)


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ReadError("[Errno 104] Connection reset by peer"),
        httpx.WriteError("[Errno 32] Broken pipe"),
        httpx.ConnectError("[Errno 111] Connection refused"),
        httpx.RemoteProtocolError("Server disconnected without sending a response."),
    ],
)
async def test_a_request_that_got_no_answer_is_sent_once_more_on_the_fresh_pool(failure: Exception) -> None:
    calls: list[str] = []
    transport = RetryOnFreshConnection(
        httpx.MockTransport(failing(failure, calls, "pooled")), httpx.MockTransport(answering(calls, "fresh"))
    )
    response = await transport.handle_async_request(post())
    await response.aread()
    assert calls == ["pooled", "fresh"]
    assert response.json() == {"on": "fresh", "body": '{"q": 1}'}  # the same body, sent whole again


@pytest.mark.parametrize(
    "failure",
    [
        httpx.ReadTimeout("timed out"),
        httpx.ConnectTimeout("timed out"),
        httpx.PoolTimeout("timed out"),
        httpx.RemoteProtocolError("illegal status line: bytearray(b'HTTP/1.1 2xx')"),
        httpx.LocalProtocolError("Illegal header value"),
    ],
)
async def test_timeouts_and_broken_answers_are_not_sent_again(failure: Exception) -> None:
    calls: list[str] = []
    transport = RetryOnFreshConnection(
        httpx.MockTransport(failing(failure, calls, "pooled")), httpx.MockTransport(answering(calls, "fresh"))
    )
    with pytest.raises(type(failure)):
        await transport.handle_async_request(post())
    assert calls == ["pooled"]


async def test_a_second_failure_is_raised_and_not_retried_again() -> None:
    calls: list[str] = []
    transport = RetryOnFreshConnection(
        httpx.MockTransport(failing(httpx.ReadError("reset"), calls, "pooled")),
        httpx.MockTransport(failing(httpx.ConnectError("refused"), calls, "fresh")),
    )
    with pytest.raises(httpx.ConnectError):
        await transport.handle_async_request(post())
    assert calls == ["pooled", "fresh"]


async def test_a_body_that_cannot_be_sent_twice_is_not_retried() -> None:
    async def parts() -> AsyncIterator[bytes]:
        yield b'{"q": 1}'

    calls: list[str] = []
    transport = RetryOnFreshConnection(
        httpx.MockTransport(failing(httpx.ReadError("reset"), calls, "pooled")),
        httpx.MockTransport(answering(calls, "fresh")),
    )
    request = httpx.Request("POST", "http://upstream.test/v1/chat/completions", content=parts())
    with pytest.raises(httpx.ReadError):
        await transport.handle_async_request(request)
    assert calls == ["pooled"]


async def test_an_answer_that_began_is_returned_as_it_is() -> None:
    calls: list[str] = []
    transport = RetryOnFreshConnection(
        httpx.MockTransport(answering(calls, "pooled")), httpx.MockTransport(answering(calls, "fresh"))
    )
    response = await transport.handle_async_request(post())
    await response.aread()
    assert response.json()["on"] == "pooled"
    assert calls == ["pooled"]
