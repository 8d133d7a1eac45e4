"""Learned budget corrections across tenants: a client cannot make an upstream that quotes it shrink another
tenant's budget, and the operator sees and resets what was learned (admin route and CLI)."""

from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.cli.commands import main
from tests.conftest import ServeProxy
from tests.support.context_dialects import llama_cpp
from tests.support.fake_upstream import FakeUpstream, Fault, error_body
from tests.support.proxy_server import ProxyServer, make_config

TENANT_A, TENANT_B, ADMIN = "k-tenant-a", "k-tenant-b", "k-admin"
AUTH = {"keys": [TENANT_A, TENANT_B], "admin_keys": [ADMIN]}
CONFIGURED_BUDGET = 8192 - 1024 - 410
"""The fake model's input budget as configured: window − max_output − 5 % margin."""
ATTACK = (
    "This model's maximum context length is 50 tokens. However, your messages resulted in 999999 tokens. "
    "Please reduce the length of the messages."
)


def quoting_upstream(fake: FakeUpstream) -> None:
    """OpenAI's answer to a value it refuses: the value quoted in the message (here, every request that has it)."""
    message = f"Invalid value: '{ATTACK}'. Supported values are: 'a shorter message'."
    body = error_body(message, "invalid_request_error", "messages[0].content", "invalid_value")
    fake.fail_next(Fault(status=400, body=body, when=lambda request: ATTACK in json.dumps(request)), count=10)


def ask(proxy: ProxyServer, key: str, content: str) -> dict[str, str]:
    with openai.OpenAI(base_url=proxy.base_url, api_key=key, max_retries=0, timeout=30) as client:
        raw = client.chat.completions.with_raw_response.create(
            model="fake", messages=[{"role": "user", "content": content}]
        )
    raw.parse()
    return dict(raw.headers.items())


def admin(proxy: ProxyServer, method: str, path: str = "", key: str = ADMIN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"}
    return httpx.request(method, f"{proxy.url}/admin/corrections{path}", headers=headers, timeout=10)


def corrections_rows(tmp_path: Path) -> list[tuple[Any, ...]]:
    with closing(sqlite3.connect(tmp_path / "store.db")) as connection:
        return connection.execute("SELECT model, factor, context_window FROM model_corrections").fetchall()


def test_a_tenant_cannot_shrink_another_tenants_budget_through_a_quoting_upstream(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path
) -> None:
    proxy = serve_proxy(auth=AUTH)
    quoting_upstream(fake)

    with (
        openai.OpenAI(base_url=proxy.base_url, api_key=TENANT_A, max_retries=0, timeout=30) as attacker,
        pytest.raises(openai.BadRequestError) as refused,
    ):
        attacker.chat.completions.create(model="fake", messages=[{"role": "user", "content": f"Repeat: {ATTACK}"}])

    # The attacker hears what the upstream said, once: it was not taken for a context-window refusal.
    assert "Invalid value" in refused.value.message
    assert len(fake.requests) == 1
    assert corrections_rows(tmp_path) == []
    assert admin(proxy, "GET").json() == {"object": "list", "data": []}
    headers = ask(proxy, TENANT_B, "what is a tide?")
    assert int(headers["x-context-budget"]) == CONFIGURED_BUDGET


def prose(sentences: int) -> str:
    return " ".join(f"fact{index} about the harbour tides" for index in range(sentences))


def test_the_operator_sees_and_resets_a_correction_every_tenant_gets(
    serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """llama.cpp serving half the configured window: learned from its refusal, listed, reset."""
    proxy = serve_proxy(auth=AUTH)
    fake.context_window, fake.context_dialect = 4096, llama_cpp
    with openai.OpenAI(base_url=proxy.base_url, api_key=TENANT_A, max_retries=0, timeout=30) as client:
        history: list[Any] = []
        for turn in range(8):
            history.append({"role": "user", "content": f"turn {turn}: " + prose(120)})
            answer = client.chat.completions.create(model="fake", messages=history)
            history.append({"role": "assistant", "content": answer.choices[0].message.content})
    assert int(ask(proxy, TENANT_B, "a tide?")["x-context-budget"]) < CONFIGURED_BUDGET

    listed = admin(proxy, "GET").json()["data"]
    assert [(row["model"], row["context_window"], row["configured_window"]) for row in listed] == [("fake", 4096, 8192)]
    assert listed[0]["expires_at"] - listed[0]["learned_at"] == 6 * 3600
    config = tmp_path / "config.json"
    config.write_text(json.dumps(make_config(tmp_path, fake.url, auth=AUTH)))
    assert main(["corrections", "list", "--config", str(config)]) == 0
    assert "fake" in capsys.readouterr().out
    # A client's key is not the operator's.
    assert admin(proxy, "GET", key=TENANT_A).status_code == 401
    assert admin(proxy, "DELETE", "/other").status_code == 404

    assert admin(proxy, "DELETE", "/fake").json() == {"object": "corrections.reset", "models": ["fake"]}

    assert admin(proxy, "GET").json()["data"] == []
    assert corrections_rows(tmp_path) == []
    assert int(ask(proxy, TENANT_B, "a tide?")["x-context-budget"]) == CONFIGURED_BUDGET
    assert main(["corrections", "reset", "--all", "--config", str(config)]) == 0
    assert "nothing to reset" in capsys.readouterr().out


def test_without_admin_keys_the_admin_routes_are_off(serve_proxy: ServeProxy) -> None:
    proxy = serve_proxy(auth={"keys": [TENANT_A]})

    refused = admin(proxy, "GET", key=TENANT_A)

    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "admin_disabled"
