"""Every error leaves in the shape of the door whose routes it falls under (invariant 8), whatever raised it: the
door's own refusals, Starlette's unknown path and wrong method below the door's prefix, an unexpected exception.
Anthropic's shape under `/v1/messages`, OpenAI's everywhere else."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from proxy.request.pipeline import Pipeline
from tests.conftest import ServeProxy
from tests.support.proxy_server import ProxyServer

ANTHROPIC_KEYS = {"type", "error"}


def is_anthropic(body: dict[str, Any]) -> bool:
    error = body.get("error")
    return (
        set(body) == ANTHROPIC_KEYS
        and body["type"] == "error"
        and isinstance(error, dict)
        and set(error) == {"type", "message"}
    )


def is_openai(body: dict[str, Any]) -> bool:
    error = body.get("error")
    return set(body) == {"error"} and isinstance(error, dict) and {"message", "type", "param", "code"} <= set(error)


MESSAGE = {"model": "fake", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v1/messages", {"model": "fake"}, 400),  # the door's own refusal
        ("POST", "/v1/messages", {**MESSAGE, "model": "nope"}, 404),  # the pipeline's
        ("POST", "/v1/messages/nothing", MESSAGE, 404),  # an unknown path below the door
        ("GET", "/v1/messages", None, 405),  # a wrong method
        ("GET", "/v1/messages/count_tokens", None, 405),
        ("POST", "/v1/messages/count_tokens", {"messages": []}, 400),
    ],
)
def test_errors_under_the_messages_door_are_anthropic_shaped(
    proxy: ProxyServer, method: str, path: str, body: dict[str, Any] | None, status: int
) -> None:
    response = httpx.request(method, proxy.url + path, json=body, timeout=10)
    assert response.status_code == status
    assert is_anthropic(response.json()), response.text


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("POST", "/v1/nothing", 404), ("GET", "/v1/chat/completions", 405), ("GET", "/v1/responses", 405)],
)
def test_errors_elsewhere_are_openai_shaped(proxy: ProxyServer, method: str, path: str, status: int) -> None:
    response = httpx.request(method, proxy.url + path, timeout=10)
    assert response.status_code == status
    assert is_openai(response.json()), response.text


def test_an_authentication_failure_takes_the_door_shape(serve_proxy: ServeProxy) -> None:
    proxy = serve_proxy(auth={"keys": ["k1"]})
    messages = httpx.post(proxy.url + "/v1/messages", json=MESSAGE, headers={"x-api-key": "wrong"}, timeout=10)
    assert messages.status_code == 401
    assert is_anthropic(messages.json())
    chat = httpx.post(proxy.url + "/v1/chat/completions", json={}, timeout=10)
    assert chat.status_code == 401
    assert is_openai(chat.json())


def test_an_unexpected_exception_takes_the_door_shape(proxy: ProxyServer, monkeypatch: pytest.MonkeyPatch) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("a bug, with a secret sk-do-not-leak in its text")

    monkeypatch.setattr(Pipeline, "answer", broken)
    messages = httpx.post(proxy.url + "/v1/messages", json=MESSAGE, timeout=10)
    assert messages.status_code == 500
    assert is_anthropic(messages.json())
    assert "sk-do-not-leak" not in messages.text
    chat = httpx.post(
        proxy.url + "/v1/chat/completions",
        json={"model": "fake", "messages": [{"role": "user", "content": "hi"}]},
        timeout=10,
    )
    assert chat.status_code == 500
    assert is_openai(chat.json())
    assert chat.json()["error"]["code"] == "internal_error"
