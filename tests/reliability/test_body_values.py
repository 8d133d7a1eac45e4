"""Bodies of many small values (issue 41 item 5), against the served proxy: a body of more values than
`limits.max_body_values` is refused with a 400 in its door's shape, nothing stored and nothing sent upstream, and so
is `metadata` past the bounds its API sets; a body under the limit is answered."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import ServeProxy
from tests.reliability.support import assert_openai_error, row_counts
from tests.reliability.test_fuzz import assert_anthropic_error
from tests.support.fake_upstream import FakeUpstream
from tests.support.proxy_server import ProxyServer

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
MAX_VALUES = 5000
TIMEOUT_S = 60.0


@pytest.fixture
def http(proxy: ProxyServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as client:
        yield client


def zeros(count: int) -> bytes:
    return b"[" + b",".join([b"0"] * count) + b"]"


def body_for(path: str, extra: bytes) -> bytes:
    """A valid request of the door at `path`, with `extra` (`"key":value`) among its members."""
    if path in (MESSAGES, COUNT_TOKENS):
        head = b'{"model":"fake","max_tokens":5,"messages":[{"role":"user","content":"hi"}]'
    elif path == RESPONSES:
        head = b'{"model":"fake","input":"hi"'
    else:
        head = b'{"model":"fake","messages":[{"role":"user","content":"hi"}]'
    return head + b"," + extra + b"}"


def refused_without_a_trace(http: httpx.Client, proxy: ProxyServer, fake: FakeUpstream, path: str, body: bytes) -> str:
    """The refusal's message, once it is shown to be a 400 in the door's shape that stored and sent nothing."""
    before = row_counts(proxy.config.store.path)
    response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 400, (response.status_code, response.text[:500])
    if path in (MESSAGES, COUNT_TOKENS):
        assert_anthropic_error(response.json())
    else:
        assert_openai_error(response.json())
    assert row_counts(proxy.config.store.path) == before
    assert not fake.requests
    message: str = response.json()["error"]["message"]
    return message


@pytest.mark.time_budget(60)
def test_the_issues_body_of_millions_of_integers_is_refused_at_the_default_limit(
    proxy: ProxyServer, http: httpx.Client, fake: FakeUpstream
) -> None:
    body = body_for(CHAT, b'"metadata":{"v":' + zeros(1_200_000) + b"}")
    message = refused_without_a_trace(http, proxy, fake, CHAT, body)
    assert "limits.max_body_values" in message


@pytest.mark.time_budget(60)
@pytest.mark.parametrize("path", [CHAT, RESPONSES, MESSAGES, COUNT_TOKENS])
def test_every_door_refuses_a_body_over_the_configured_limit(
    serve_proxy: ServeProxy, fake: FakeUpstream, path: str
) -> None:
    proxy = serve_proxy(limits={"max_body_values": MAX_VALUES})
    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as http:
        message = refused_without_a_trace(http, proxy, fake, path, body_for(path, b'"x":' + zeros(MAX_VALUES)))
        assert f"more than {MAX_VALUES} values" in message
        answered = http.post(path, content=body_for(path, b'"x":' + zeros(MAX_VALUES - 100)))
        assert answered.status_code == 200, answered.text[:500]


@pytest.mark.time_budget(60)
@pytest.mark.parametrize(
    ("path", "metadata"),
    [
        (CHAT, {f"k{index}": "v" for index in range(17)}),
        (RESPONSES, {"k": "x" * 513}),
        (CHAT, {"v": [0] * 1000}),
        (MESSAGES, {"user_id": "u", "v": [0] * 1000}),
    ],
)
def test_metadata_past_its_apis_bounds_is_refused(
    proxy: ProxyServer, http: httpx.Client, fake: FakeUpstream, path: str, metadata: object
) -> None:
    body = body_for(path, b'"metadata":' + json.dumps(metadata).encode())
    message = refused_without_a_trace(http, proxy, fake, path, body)
    assert "metadata" in message
