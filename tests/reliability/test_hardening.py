"""Issue 12, items 4 and 6: upstream text is redacted, and hostile or odd input gets a clear answer, never a 500.

Each test drives the served proxy over loopback (httpx, the openai SDK) against the HTTP fake upstream.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from starlette.applications import Starlette

from proxy.cli.commands import EXIT_STORE, main
from proxy.store.database import Database, SchemaTooNew
from proxy.store.migrations import MIGRATIONS
from tests.conftest import ServeProxy
from tests.reliability.support import assert_openai_error, read_only, sse_events
from tests.support.fake_upstream import FakeUpstream, Fault, Reply, error_body
from tests.support.proxy_server import ProxyServer

UPSTREAM_KEY = "sk-upstream-secret"
CLIENT_KEY = "client-key-4f1e9a"
STRANGER_KEY = "sk-proj-Zq81ahd7Qk2LmN0pX3vB9cYt"
"""Not in the config, but shaped like a provider key: redacted too."""
TIMEOUT_S = 20.0


def chat_body(text: str = "hello there", *, stream: bool = False) -> dict[str, Any]:
    return {"model": "fake", "stream": stream, "messages": [{"role": "user", "content": text}]}


def bearer(key: str = CLIENT_KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def store_bytes(proxy: ProxyServer) -> bytes:
    store = proxy.config.store.path
    return b"".join(p.read_bytes() for p in sorted(store.parent.iterdir()) if p.name.startswith(store.name))


# --- item 4: upstream error text is redacted ---------------------------------------------------------------------

ECHO = f"Incorrect API key provided: {UPSTREAM_KEY}. Header was 'Authorization: Bearer {UPSTREAM_KEY}'; "
ECHO += f"x-api-key: {STRANGER_KEY}; your client sent {CLIENT_KEY}."


@pytest.mark.time_budget(60)
@pytest.mark.parametrize("stream", [False, True])
def test_upstream_errors_echoing_keys_are_redacted_everywhere(
    serve_proxy: ServeProxy, fake: FakeUpstream, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = serve_proxy(auth={"keys": [CLIENT_KEY]})
    chat = f"{proxy.base_url}/chat/completions"
    texts: list[str] = []
    with httpx.Client(timeout=TIMEOUT_S) as http:
        for status in (401, 500, 400):
            fake.fail_next(Fault(status=status, body=error_body(ECHO, "invalid_request_error", None, "bad_key")))
            response = http.post(chat, json=chat_body(stream=stream), headers=bearer())
            assert response.status_code == status, response.text
            error = assert_openai_error(response.json(), status=status)
            assert "[redacted]" in error["message"], error
            texts.append(response.text)
        # After the stream has started: the upstream's error event, relayed as `data: {"error": ...}`.
        if stream:
            fault = Fault(error_after_chunks=1, body=error_body(ECHO, "server_error", None, None))
            fake.fail_next(fault)
            response = http.post(chat, json=chat_body(stream=True), headers=bearer())
            texts.append(response.text)
            assert '"error"' in response.text, response.text
        journal = http.get(f"{proxy.url}/journal", headers=bearer()).text
    texts.append(journal)
    texts.append(caplog.text)
    for text in texts:
        for secret in (UPSTREAM_KEY, STRANGER_KEY, CLIENT_KEY, "sk-upstr"):
            assert secret not in text, (secret, text)
    data = store_bytes(proxy)
    for secret in (UPSTREAM_KEY, STRANGER_KEY, CLIENT_KEY):
        assert secret.encode() not in data, secret


# --- item 6: numbers past every range -----------------------------------------------------------------------------


@pytest.mark.time_budget(30)
def test_huge_numbers_in_headers_paths_and_queries_are_client_errors(proxy: ProxyServer) -> None:
    chat = f"{proxy.base_url}/chat/completions"
    huge = "9" * 5000
    past_sqlite = "99999999999999999999"
    with httpx.Client(timeout=TIMEOUT_S) as http:
        for header in ("X-Context-Budget", "X-Context-Preserve-Recent"):
            for value in (huge, past_sqlite):
                response = http.post(chat, json=chat_body(), headers={header: value})
                assert response.status_code == 400, (header, response.text)
                assert assert_openai_error(response.json())["param"] == header
        for path in (f"/journal/{past_sqlite}", f"/journal/{huge}"):
            response = http.get(f"{proxy.url}{path}")
            assert response.status_code in (400, 404), (path, response.text)
            assert_openai_error(response.json())
        for query in ("limit", "offset"):
            for value in (huge, past_sqlite):
                for route in ("/journal", "/sessions"):
                    response = http.get(f"{proxy.url}{route}", params={query: value})
                    assert response.status_code == 400, (route, query, response.text)
                    assert assert_openai_error(response.json())["param"] == query


@pytest.mark.time_budget(30)
def test_deep_nesting_inside_a_content_part_is_a_400(proxy: ProxyServer) -> None:
    depth = 900
    nested = "[" * depth + "1" + "]" * depth
    raw = (
        '{"model": "fake", "messages": [{"role": "user", "content": '
        '[{"type": "text", "text": "hi", "extra": ' + nested + "}]}]}"
    )
    with httpx.Client(timeout=TIMEOUT_S) as http:
        response = http.post(
            f"{proxy.base_url}/chat/completions", content=raw, headers={"Content-Type": "application/json"}
        )
    assert response.status_code == 400, response.text
    assert "nested" in assert_openai_error(response.json())["message"]


# --- item 6: storage ----------------------------------------------------------------------------------------------


@pytest.mark.time_budget(30)
def test_disk_full_is_a_507_saying_storage_is_full(proxy: ProxyServer) -> None:
    client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=TIMEOUT_S)
    try:
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "warm up"}])
        app = cast(Starlette, proxy._server.config.app)
        writer: sqlite3.Connection = app.state.services.db.engine.writer
        pages = writer.execute("PRAGMA page_count").fetchone()[0]
        writer.execute(f"PRAGMA max_page_count = {pages}")
        with pytest.raises(openai.APIStatusError) as caught:
            client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "x " * 200_000}])
    finally:
        client.close()
    assert caught.value.status_code == 507
    error = assert_openai_error(caught.value.response.json())
    assert error["code"] == "storage_full"
    assert "storage is full" in error["message"]


@pytest.mark.time_budget(30)
def test_disk_full_mid_stream_says_what_was_kept(proxy: ProxyServer, fake: FakeUpstream) -> None:
    fake.chunk_delay_s = 0.01
    fake.responder = lambda body: Reply(content="word " * 300, finish_reason="stop")
    app = cast(Starlette, proxy._server.config.app)
    writer: sqlite3.Connection = app.state.services.db.engine.writer
    body = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": "go on"}]}
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=body, timeout=TIMEOUT_S) as response:
        events = sse_events(response)
        first = next(events)
        pages = writer.execute("PRAGMA page_count").fetchone()[0]
        writer.execute(f"PRAGMA max_page_count = {pages}")
        received = [first, *events]
    last = received[-1]
    assert isinstance(last, dict)
    error = assert_openai_error(last)
    assert error["code"] == "storage_full"
    assert "nothing was saved" not in error["message"]
    assert "relayed before this point is kept" in error["message"]
    with read_only(proxy.config.store.path) as db:
        step_id, journaled = db.execute("SELECT step_id, COUNT(*) FROM journal_events GROUP BY step_id").fetchone()
    assert f"journal step {step_id}" in error["message"]
    assert journaled >= 1


# --- item 6: data after [DONE] ------------------------------------------------------------------------------------

TRAILING = 'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,'
TRAILING += '"delta":{"content":" AFTER-DONE-LEAK"},"finish_reason":null}]}\n\n'


@pytest.mark.time_budget(30)
def test_stream_stops_at_done(proxy: ProxyServer, fake: FakeUpstream) -> None:
    fake.fail_next(Fault(after_done=TRAILING))
    with httpx.Client(timeout=TIMEOUT_S) as http:
        response = http.post(f"{proxy.base_url}/chat/completions", json=chat_body("count", stream=True))
        assert response.status_code == 200, response.text
        journal = http.get(f"{proxy.url}/journal").json()
        step = http.get(f"{proxy.url}/journal/{journal['data'][0]['step_id']}").text
    assert response.text.rstrip().endswith("data: [DONE]"), response.text
    assert "AFTER-DONE-LEAK" not in response.text
    assert "AFTER-DONE-LEAK" not in step
    assert b"AFTER-DONE-LEAK" not in store_bytes(proxy)


# --- item 6: session ids ------------------------------------------------------------------------------------------


@pytest.mark.time_budget(30)
@pytest.mark.parametrize("session_id", ["a/b", "café", "with space", "naïve/ü"])
def test_session_ids_the_http_api_could_not_serve_are_refused(proxy: ProxyServer, session_id: str) -> None:
    with httpx.Client(timeout=TIMEOUT_S) as http:
        response = http.post(
            f"{proxy.base_url}/chat/completions",
            json=chat_body(),
            headers=[(b"X-Session-Id", session_id.encode("utf-8"))],
        )
        assert response.status_code == 400, response.text
        error = assert_openai_error(response.json())
        assert error["param"] == "X-Session-Id"
        assert "letters" in error["message"]
        assert http.get(f"{proxy.url}/sessions").json()["data"] == []


@pytest.mark.time_budget(30)
def test_allowed_session_ids_are_served_back(proxy: ProxyServer) -> None:
    session_id = "Team_A.user-7:chat@2~x"
    with httpx.Client(timeout=TIMEOUT_S) as http:
        response = http.post(
            f"{proxy.base_url}/chat/completions", json=chat_body(), headers={"X-Session-Id": session_id}
        )
        assert response.status_code == 200, response.text
        assert response.headers["X-Session-Id"] == session_id
        read = http.get(f"{proxy.url}/sessions/{session_id}")
        assert read.status_code == 200, read.text


# --- item 6: a store from a newer version -------------------------------------------------------------------------


async def test_a_newer_schema_is_refused_naming_both_versions(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    database = await Database.open(path)
    await database.close()
    with sqlite3.connect(path) as db:
        db.execute("INSERT INTO migrations (name, applied_at) VALUES ('m999_from_the_future', 0)")
    with pytest.raises(SchemaTooNew, match=f"m999_from_the_future.*{MIGRATIONS[-1].__name__}"):
        await Database.open(path)


@pytest.mark.parametrize("command", [["serve"], ["sessions", "list"], ["journal", "list"]])
def test_the_cli_says_a_newer_store_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    store = tmp_path / "store.db"
    with sqlite3.connect(store) as db:
        db.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
        db.execute("INSERT INTO migrations (name, applied_at) VALUES ('m999_from_the_future', 0)")
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"store": {"path": str(store)}, "server": {"port": 1}}))
    assert main([*command, "--config", str(config)]) == EXIT_STORE == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert err.startswith("context-proxy: The store's schema is newer than this proxy")
    assert "m999_from_the_future" in err
    assert "Traceback" not in err
