"""Deleting a session and purging a tenant through the served proxy (`DELETE /sessions/{id}`,
`DELETE /admin/tenants/{tenant}`), with the official SDK as the client: what named the session (its id, its
Responses ids, its compaction item, its journal steps) names nothing afterwards, another tenant can neither
delete nor tell apart a session of someone else's from an unknown one, and the file no longer holds the text."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.auth import tenant_of
from proxy.cli.commands import main
from tests.conftest import ServeProxy
from tests.support.exposition import Exposition
from tests.support.proxy_server import ProxyServer, make_config

MARKER = "Quillfeather9081"
KEYS = ["alice-key", "bob-key"]
ADMIN = "admin-key"


@pytest.fixture
def proxy(serve_proxy: ServeProxy) -> ProxyServer:
    return serve_proxy(auth={"keys": KEYS, "admin_keys": [ADMIN]})


@pytest.fixture
def alice(proxy: ProxyServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=proxy.base_url, api_key="alice-key", max_retries=0, timeout=20) as client:
        yield client


def call(proxy: ProxyServer, method: str, path: str, key: str) -> httpx.Response:
    return httpx.request(method, f"{proxy.url}{path}", headers={"Authorization": f"Bearer {key}"}, timeout=20)


def converse(client: openai.OpenAI, session: str, turns: int, word: str) -> tuple[list[Any], list[str]]:
    """A Responses thread re-sent whole each turn; returns it and its response ids."""
    history: list[Any] = []
    ids = []
    for turn in range(turns):
        history.append({"role": "user", "content": f"turn {turn}: remember {word} number {turn}"})
        response = client.responses.create(
            model="fake", instructions="Be brief.", input=history, extra_headers={"X-Session-Id": session}
        )
        ids.append(response.id)
        history.extend(item.model_dump(exclude_none=True) for item in response.output)
    return history, ids


def rows(path: Path, sql: str, params: tuple[Any, ...] = ()) -> int:
    with closing(sqlite3.connect(path)) as db:
        return int(db.execute(sql, params).fetchone()[0])


def cli_config(proxy: ProxyServer, tmp_path: Path) -> Path:
    """The config the CLI runs with: the served proxy's store and keys."""
    raw = make_config(tmp_path, "http://127.0.0.1:9", auth={"keys": KEYS, "admin_keys": [ADMIN]})
    raw["store"] = {"path": str(proxy.config.store.path)}
    path = tmp_path / "cli-config.json"
    path.write_text(json.dumps(raw))
    return path


def holds(path: Path, text: str) -> bool:
    return any(text.lower().encode() in file.read_bytes().lower() for file in path.parent.glob(path.name + "*"))


def test_a_deleted_session_and_everything_that_named_it_read_as_unknown(
    proxy: ProxyServer, alice: openai.OpenAI
) -> None:
    history, ids = converse(alice, "doomed", 3, MARKER)
    item = alice.responses.create(
        model="fake",
        instructions="Be brief.",
        input=[*history, {"type": "compaction_trigger"}],  # type: ignore[list-item]
        extra_headers={"X-Session-Id": "doomed"},
    ).output[0]
    converse(alice, "kept", 2, "ordinary")
    store = proxy.config.store.path
    assert holds(store, MARKER)
    steps = call(proxy, "GET", "/journal?session_id=doomed", "alice-key").json()["data"]
    assert steps

    deleted = call(proxy, "DELETE", "/sessions/doomed", "alice-key")

    assert deleted.status_code == 200
    body = deleted.json()
    assert body["id"] == "doomed"
    assert body["object"] == "session.deleted"
    assert body["deleted"] is True
    assert body["rows"]["messages"] > 0
    assert body["rows"]["journal_steps"] == len(steps)
    unknown = call(proxy, "GET", "/sessions/doomed", "alice-key")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "session_not_found"
    assert call(proxy, "DELETE", "/sessions/doomed", "alice-key").status_code == 404
    for step in steps:
        assert call(proxy, "GET", f"/journal/{step['step_id']}", "alice-key").status_code == 404
    for response_id in ids:
        with pytest.raises(openai.NotFoundError):
            alice.responses.retrieve(response_id)
    with pytest.raises(openai.NotFoundError) as previous:
        alice.responses.create(model="fake", input="and then?", previous_response_id=ids[-1])
    assert previous.value.code == "previous_response_not_found"
    with pytest.raises(openai.NotFoundError) as compaction:
        alice.responses.create(
            model="fake",
            input=[item.model_dump(exclude_none=True), {"role": "user", "content": "go on"}],  # type: ignore[list-item]
        )
    assert "compaction_not_found" in str(compaction.value)
    assert call(proxy, "GET", "/sessions/kept", "alice-key").status_code == 200
    assert rows(store, "SELECT COUNT(*) FROM messages WHERE body LIKE ?", (f"%{MARKER}%",)) == 0
    assert not holds(store, MARKER)


def test_another_tenants_session_cannot_be_deleted_nor_told_from_an_unknown_one(
    proxy: ProxyServer, alice: openai.OpenAI
) -> None:
    converse(alice, "private", 1, "secret")
    before = rows(proxy.config.store.path, "SELECT COUNT(*) FROM messages")

    foreign = call(proxy, "DELETE", "/sessions/private", "bob-key")
    unknown = call(proxy, "DELETE", "/sessions/no-such-session", "bob-key")

    assert foreign.status_code == unknown.status_code == 404
    assert foreign.json() == {"error": {**unknown.json()["error"], "message": "No session with id 'private'."}}
    assert rows(proxy.config.store.path, "SELECT COUNT(*) FROM messages") == before
    assert call(proxy, "DELETE", "/sessions/private", "nobody-key").status_code == 401


def test_an_admin_purges_one_tenant_and_no_client_key_can(proxy: ProxyServer, alice: openai.OpenAI) -> None:
    converse(alice, "a1", 2, MARKER)
    converse(alice, "a2", 1, MARKER)
    with openai.OpenAI(base_url=proxy.base_url, api_key="bob-key", max_retries=0, timeout=20) as bob:
        converse(bob, "b1", 2, "harmless")
    store = proxy.config.store.path
    bob_messages = rows(store, "SELECT COUNT(*) FROM messages WHERE body NOT LIKE ?", (f"%{MARKER}%",))
    tenant = tenant_of("alice-key")

    assert call(proxy, "DELETE", f"/admin/tenants/{tenant}", "alice-key").status_code == 401
    purged = call(proxy, "DELETE", f"/admin/tenants/{tenant}", ADMIN)

    assert purged.status_code == 200
    assert purged.json()["sessions"] == 2
    assert call(proxy, "GET", "/sessions", "alice-key").json()["data"] == []
    assert [s["id"] for s in call(proxy, "GET", "/sessions", "bob-key").json()["data"]] == ["b1"]
    for table in ("sessions", "journal_steps", "summaries", "context_settings", "pins", "recall_messages"):
        assert rows(store, f"SELECT COUNT(*) FROM {table} WHERE tenant = ?", (tenant,)) == 0, table
    assert rows(store, "SELECT COUNT(*) FROM messages") <= bob_messages
    assert not holds(store, MARKER)
    with openai.OpenAI(base_url=proxy.base_url, api_key="alice-key", max_retries=0, timeout=20) as again:
        converse(again, "a1", 1, "a fresh start")  # the key works on: its tenant starts empty


def test_the_admin_purge_is_off_without_admin_keys(serve_proxy: ServeProxy) -> None:
    proxy = serve_proxy(auth={"keys": KEYS})
    response = call(proxy, "DELETE", f"/admin/tenants/{tenant_of('alice-key')}", "alice-key")
    assert response.status_code == 403
    assert response.json()["error"]["code"] == "admin_disabled"


def test_the_cli_deletes_beside_the_running_server_whose_next_turn_on_it_starts_a_new_session(
    proxy: ProxyServer, alice: openai.OpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The CLI is another process, as another replica is: the server learns of the deletion from the store, and
    the deleted id names nothing there either (its next turn is stored anew, not refused)."""
    history, _ids = converse(alice, "cli", 2, MARKER)
    config = cli_config(proxy, tmp_path)

    assert main(["sessions", "delete", "cli", "--config", str(config), "--key", "bob-key"]) == 1
    assert "No session with id 'cli'." in capsys.readouterr().err
    assert main(["sessions", "delete", "cli", "--config", str(config), "--key", "alice-key"]) == 0
    assert capsys.readouterr().out.startswith("deleted session cli: 1 session(s); ")

    assert call(proxy, "GET", "/sessions/cli", "alice-key").status_code == 404
    turn = [*history, {"role": "user", "content": "and now?"}]
    assert rows(proxy.config.store.path, "SELECT COUNT(*) FROM sessions") == 0
    alice.responses.create(model="fake", instructions="Be brief.", input=turn, extra_headers={"X-Session-Id": "cli"})
    assert len(call(proxy, "GET", "/sessions/cli", "alice-key").json()["messages"]) == len(turn) + 2


def test_the_cli_lists_tenants_and_purges_one_by_key(
    proxy: ProxyServer, alice: openai.OpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    converse(alice, "a", 1, MARKER)
    config = cli_config(proxy, tmp_path)

    assert main(["tenants", "list", "--config", str(config), "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)["data"]
    assert listed["id"] == tenant_of("alice-key")
    assert listed["key"] == "auth.keys[0]"
    assert listed["sessions"] == 1
    assert main(["tenants", "purge", "--key", "alice-key", "--config", str(config)]) == 0
    assert capsys.readouterr().out.startswith(f"deleted tenant {tenant_of('alice-key')}: 1 session(s); ")
    assert rows(proxy.config.store.path, "SELECT COUNT(*) FROM messages") == 0
    assert main(["tenants", "list", "--config", str(config)]) == 0
    assert capsys.readouterr().out.strip() == "no tenant has stored anything"


def test_the_cli_retention_dry_run_says_what_would_go_and_the_sweep_deletes_it(
    proxy: ProxyServer, alice: openai.OpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    converse(alice, "stale", 1, MARKER)
    converse(alice, "fresh", 1, "recent")
    store = proxy.config.store.path
    with closing(sqlite3.connect(store)) as db, db:
        db.execute("UPDATE sessions SET updated_at = updated_at - 40 * 86400 WHERE id = 'stale'")  # 40 days ago
    config = cli_config(proxy, tmp_path)
    raw = json.loads(config.read_text())
    assert main(["retention", "--dry-run", "--config", str(config)]) == 1
    assert "no retention is configured" in capsys.readouterr().err
    raw["store"]["retention_days"] = 30
    config.write_text(json.dumps(raw))

    assert main(["retention", "--dry-run", "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("would delete 1 idle session(s)\n")
    assert f"{tenant_of('alice-key')}  stale  idle 40.0 days" in out
    assert rows(store, "SELECT COUNT(*) FROM sessions") == 2
    assert main(["retention", "--config", str(config), "--json"]) == 0
    swept = json.loads(capsys.readouterr().out)
    assert [s["id"] for s in swept["sessions"]] == ["stale"]
    assert swept["rows"]["sessions"] == 1
    assert [s["id"] for s in call(proxy, "GET", "/sessions", "alice-key").json()["data"]] == ["fresh"]
    assert not holds(store, MARKER)


def test_the_stores_size_and_rows_are_in_metrics_and_the_cli(
    proxy: ProxyServer, alice: openai.OpenAI, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    converse(alice, "counted", 2, "measured")
    messages = rows(proxy.config.store.path, "SELECT COUNT(*) FROM messages")

    scraped = Exposition.parse(call(proxy, "GET", "/metrics", "alice-key").text)

    assert scraped.value("context_proxy_store_rows", table="messages") == messages
    assert scraped.value("context_proxy_store_rows", table="sessions") == 1
    assert scraped.value("context_proxy_store_bytes") >= proxy.config.store.path.stat().st_size
    assert main(["stats", "--config", str(cli_config(proxy, tmp_path)), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["rows"]["messages"] == messages
    assert printed["sessions_by_last_activity"]["1d"] == 1
    assert main(["stats", "--config", str(cli_config(proxy, tmp_path))]) == 0
    assert f"  messages {messages:>24,}" in capsys.readouterr().out


def test_an_admin_sweeps_retention_now_or_asks_what_it_would_delete(serve_proxy: ServeProxy, tmp_path: Path) -> None:
    proxy = serve_proxy(
        auth={"keys": KEYS, "admin_keys": [ADMIN]}, store={"path": str(tmp_path / "store.db"), "retention_days": 7}
    )
    with openai.OpenAI(base_url=proxy.base_url, api_key="alice-key", max_retries=0, timeout=20) as client:
        converse(client, "stale", 1, MARKER)
        converse(client, "fresh", 1, "recent")
    with closing(sqlite3.connect(proxy.config.store.path)) as db, db:
        db.execute("UPDATE sessions SET updated_at = updated_at - 8 * 86400 WHERE id = 'stale'")

    assert call(proxy, "POST", "/admin/retention", "alice-key").status_code == 401
    dry = call(proxy, "POST", "/admin/retention?dry_run=true", ADMIN).json()
    assert [s["id"] for s in dry["sessions"]] == ["stale"]
    assert dry["dry_run"] is True
    assert rows(proxy.config.store.path, "SELECT COUNT(*) FROM sessions") == 2
    swept = call(proxy, "POST", "/admin/retention", ADMIN).json()
    assert [s["id"] for s in swept["sessions"]] == ["stale"]
    assert rows(proxy.config.store.path, "SELECT COUNT(*) FROM sessions") == 1
    assert not holds(proxy.config.store.path, MARKER)
