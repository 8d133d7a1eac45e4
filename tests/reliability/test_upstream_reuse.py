"""Issue 41, item 9: a pooled upstream connection the upstream closed as the proxy reused it costs no request.

An upstream may close an idle keep-alive connection at the very moment the proxy sends the next request on it;
the request then fails before any byte of the answer arrived (a reset: `ReadError`). Such a request never
reached the upstream's application, and is sent once more on a fresh connection, for every kind of upstream
(chat completions, Responses, Anthropic Messages). A failure after part of an answer arrived, or a timeout of a
slow answer, is never retried: the upstream may be working on it. The upstream is a raw asyncio server
(`tests.support.resetting_upstream`) that resets a connection exactly as its second request arrives.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.conftest import ServeProxy
from tests.reliability.support import assert_openai_error, sse_events
from tests.support.proxy_server import ProxyServer
from tests.support.resetting_upstream import ANSWER_TEXT, Mode, ResettingUpstream

TIMEOUT_S = 20.0
KINDS: dict[str, tuple[dict[str, Any], str, dict[str, Any]]] = {
    "chat": (
        {"model": "openai/fake-model"},
        "/v1/chat/completions",
        {"model": "m", "messages": [{"role": "user", "content": "ping"}]},
    ),
    "responses": ({"model": "openai/fake-model", "api": "responses"}, "/v1/responses", {"model": "m", "input": "ping"}),
    "messages": (
        {"model": "anthropic/claude-fake", "api": "messages"},
        "/v1/messages",
        {"model": "m", "max_tokens": 64, "messages": [{"role": "user", "content": "ping"}]},
    ),
}


def answer_text(kind: str, body: dict[str, Any]) -> str:
    if kind == "chat":
        return str(body["choices"][0]["message"]["content"])
    if kind == "responses":
        return str(body["output"][0]["content"][0]["text"])
    return str(body["content"][0]["text"])


@pytest.fixture
def upstream(request: pytest.FixtureRequest) -> Iterator[ResettingUpstream]:
    mode: Mode = request.param
    with ResettingUpstream(mode) as server:
        yield server


def serve(serve_proxy: ServeProxy, upstream: ResettingUpstream, kind: str, **upstream_config: Any) -> ProxyServer:
    entry, _path, _body = KINDS[kind]
    model = {"name": "m", "api_base": upstream.url, "api_key": "sk-upstream", "context_window": 8192, **entry}
    return serve_proxy(models=[model], upstream={"timeout_s": 10, **upstream_config})


@pytest.mark.time_budget(60)
@pytest.mark.parametrize("upstream", ["reset-on-reuse"], indirect=True)
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_request_on_a_connection_the_upstream_reset_is_sent_again_on_a_fresh_one(
    serve_proxy: ServeProxy, upstream: ResettingUpstream, kind: str
) -> None:
    proxy = serve(serve_proxy, upstream, kind)
    _entry, path, body = KINDS[kind]
    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as client:
        for turn in range(4):
            response = client.post(path, json=body)
            assert response.status_code == 200, f"turn {turn}: {response.text}"
            assert answer_text(kind, response.json()) == ANSWER_TEXT
    # Turns 2 and 4 met the kept-alive connection of the turn before reset, and were answered on a new one.
    assert upstream.answers == 4
    assert upstream.requests == 6
    assert upstream.connections == 4


@pytest.mark.time_budget(60)
@pytest.mark.parametrize("upstream", ["reset-on-reuse"], indirect=True)
def test_a_stream_on_a_connection_the_upstream_reset_is_sent_again_on_a_fresh_one(
    serve_proxy: ServeProxy, upstream: ResettingUpstream
) -> None:
    proxy = serve(serve_proxy, upstream, "chat")
    body = {**KINDS["chat"][2], "stream": True}
    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as client:
        for _turn in range(2):
            with client.stream("POST", "/v1/chat/completions", json=body) as response:
                assert response.status_code == 200
                events = list(sse_events(response))
            assert events[-1] == "[DONE]", events
    assert (upstream.answers, upstream.requests) == (2, 3)


@pytest.mark.time_budget(60)
@pytest.mark.parametrize("upstream", ["cut-answer"], indirect=True)
@pytest.mark.parametrize("stream", [False, True])
def test_an_answer_cut_after_its_first_bytes_is_not_sent_again(
    serve_proxy: ServeProxy, upstream: ResettingUpstream, stream: bool
) -> None:
    proxy = serve(serve_proxy, upstream, "chat")
    body = {**KINDS["chat"][2], "stream": stream}
    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as client:
        response = client.post("/v1/chat/completions", json=body)
    if stream:
        assert response.status_code == 200  # the first chunk was relayed: the status was sent with it
        last = [line for line in response.text.splitlines() if line.startswith("data: ")][-1]
        assert '"error"' in last, response.text
    else:
        assert response.status_code == 502, response.text
        assert assert_openai_error(response.json())["code"] == "upstream_unreachable"
    assert upstream.requests == 1


@pytest.mark.time_budget(60)
@pytest.mark.parametrize("upstream", ["silent"], indirect=True)
def test_a_slow_answer_that_times_out_is_not_sent_again(serve_proxy: ServeProxy, upstream: ResettingUpstream) -> None:
    proxy = serve(serve_proxy, upstream, "chat", timeout_s=0.5)
    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as client:
        response = client.post("/v1/chat/completions", json=KINDS["chat"][2])
    assert response.status_code == 504, response.text
    assert upstream.requests == 1
