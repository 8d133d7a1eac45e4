"""A provider key the proxy reads from the environment is redacted like a configured one.

A model entry without `api_key` sends LiteLLM's environment variable (`OPENAI_API_KEY`); a provider that refuses
it echoes it in its 401. The key must reach neither the client (before a stream, or inside one), nor the journal
and the database (the SQLite file and its WAL), nor the logs.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.reliability.support import assert_openai_error
from tests.support.fake_upstream import FakeUpstream, Fault, error_body
from tests.support.proxy_server import ProxyServer, make_config

ENV_KEY = "envkey-local-0042"
"""Not shaped like a key (no `sk-` prefix, short): only knowing it redacts it."""
CLIENT_KEY = "client-key-5e3a7d"
ECHO = f"Incorrect API key provided: {ENV_KEY}. You can find your API key at https://platform.openai.com."
TIMEOUT_S = 20.0


def store_bytes(proxy: ProxyServer) -> bytes:
    """The SQLite file with its -wal and -shm, as they are on disk."""
    store = proxy.config.store.path
    return b"".join(p.read_bytes() for p in sorted(store.parent.iterdir()) if p.name.startswith(store.name))


@pytest.mark.time_budget(60)
def test_an_environment_key_echoed_by_a_401_reaches_no_client_store_or_log(
    tmp_path: Path, fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("OPENAI_API_KEY", ENV_KEY)
    model = {"name": "fake", "model": "openai/fake-model", "api_base": fake.url, "context_window": 8192}
    raw = make_config(tmp_path, fake.url, models=[model], auth={"keys": [CLIENT_KEY]})
    texts: list[str] = []
    with ProxyServer(raw, tmp_path) as proxy, httpx.Client(timeout=TIMEOUT_S) as http:
        chat = f"{proxy.base_url}/chat/completions"
        headers = {"Authorization": f"Bearer {CLIENT_KEY}"}
        for stream in (False, True):
            body: dict[str, Any] = {"model": "fake", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
            fake.fail_next(Fault(status=401, body=error_body(ECHO, "invalid_request_error", None, "invalid_api_key")))
            response = http.post(chat, json=body, headers=headers)
            assert fake.requests[-1].headers["authorization"] == f"Bearer {ENV_KEY}"
            assert response.status_code == 401, response.text
            assert "[redacted]" in assert_openai_error(response.json(), status=401)["message"]
            texts.append(response.text)
        fake.fail_next(Fault(error_after_chunks=1, body=error_body(ECHO, "server_error", None, None)))
        body = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": "and now?"}]}
        response = http.post(chat, json=body, headers=headers)
        assert '"error"' in response.text, response.text
        texts.append(response.text)
        texts.append(http.get(f"{proxy.url}/journal", headers=headers).text)
        data = store_bytes(proxy)  # while serving: the WAL holds the latest writes (checkpointed away at shutdown)
        store = proxy.config.store.path
        assert store.with_name(store.name + "-wal").exists()
    texts.append(caplog.text)
    assert "[redacted]" in caplog.text
    for text in texts:
        assert ENV_KEY not in text, text
    assert ENV_KEY.encode() not in data
