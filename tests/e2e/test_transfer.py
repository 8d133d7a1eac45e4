"""`context-proxy export` / `import` (`proxy.store.transfer`): a store written by the served proxy, moved from SQLite to
PostgreSQL and back, reads the same, row for row and through the CLI's views, and goes on where it stopped; an
import that cannot be whole (a non-empty store, a bad or cut-short export) writes nothing."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from proxy.cli.commands import EXIT_STORE, main
from proxy.store.database import Database
from proxy.store.transfer import FORMAT, LEFT_OUT, TABLES, VERSION
from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream
from tests.support.postgres_server import PostgresServer
from tests.support.proxy_server import ProxyServer, make_config
from tests.support.raw_store import committed_rows
from tests.support.scripted_session import ScriptedSession, install_responder

WINDOW = 4096
CONTEXT = {"summarizer_model": "summarizer"}
IDENTITY_TABLES = [table.name for table in TABLES if table.identity]


def models(url: str) -> list[dict[str, Any]]:
    common = {"model": "openai/fake-model", "api_base": url, "api_key": "sk-x", "max_output": 512}
    return [
        {"name": "small", **common, "context_window": WINDOW},
        {"name": "summarizer", **common, "model": "openai/fake-summarizer", "context_window": WINDOW},
    ]


def raw_config(folder: Path, upstream: str, target: Path | str) -> dict[str, Any]:
    store = {"path": str(target)} if isinstance(target, Path) else {"url": target}
    return make_config(folder, upstream, models=models(upstream), context=CONTEXT, store=store)


def config_file(folder: Path, upstream: str, target: Path | str, name: str) -> str:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(raw_config(folder, upstream, target)))
    return str(path)


@dataclass(frozen=True)
class Source:
    path: Path
    long: list[dict[str, Any]]
    """The long session's history as its client holds it."""


@pytest.fixture(scope="module")
def source_store(tmp_path_factory: pytest.TempPathFactory, upstream_server: FakeUpstream) -> Source:
    """A SQLite store the served proxy wrote: a long session compacted (summaries, compaction events), with tool
    calls, streamed turns and a pin; a short one with an edited turn (a branch). Read only by the tests."""
    folder = tmp_path_factory.mktemp("source")
    upstream_server.reset()
    upstream_server.context_window = WINDOW
    install_responder(upstream_server)
    with (
        ProxyServer(raw_config(folder, upstream_server.url, folder / "store.db"), folder) as proxy,
        openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30) as client,
    ):
        long = ScriptedSession(client, upstream_server, "long", tool_every=3, stream_every=4)
        long.run(16)
        short = ScriptedSession(client, upstream_server, "short", seed=3)
        short.run(2)
        system = {**short.messages[0], "content": short.messages[0]["content"] + "  \n"}  # a variant of the node
        edited = [system, *short.messages[1:3], {"role": "user", "content": "Another second question, then."}]
        client.chat.completions.create(model="small", messages=edited, extra_headers={"X-Session-Id": "short"})  # type: ignore[arg-type]
        first_user = httpx.get(f"{proxy.url}/sessions/long", timeout=10).json()["messages"][1]["id"]
        pinned = httpx.post(f"{proxy.url}/sessions/long/pins", json={"message_ids": [first_user]}, timeout=10)
        assert pinned.status_code == 200, pinned.text
    upstream_server.reset()
    path = folder / "store.db"
    with sqlite3.connect(path) as db:
        for table in ("summaries", "compaction_events", "pins", "journal_events", "message_variants"):
            assert db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] > 0, table
    return Source(path, long.messages)


@pytest.fixture
def source(source_store: Source) -> Path:
    return source_store.path


def every_row(target: Path | str) -> dict[str, list[tuple[Any, ...]]]:
    return {table.name: sorted(committed_rows(target, f"SELECT * FROM {table.name}")) for table in TABLES}


def views(config: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Everything the CLI shows of a store, as JSON."""

    def shown(*command: str) -> Any:
        assert main([*command, "--config", config, "--json"]) == 0
        return json.loads(capsys.readouterr().out)

    sessions = shown("sessions", "list", "--limit", "100")
    steps = shown("journal", "list", "--limit", "1000")
    found: dict[str, Any] = {"sessions": sessions, "steps": steps}
    for session in sessions["data"]:
        found[session["id"]] = [shown("sessions", verb, session["id"]) for verb in ("show", "pins", "events")]
    for step in steps["data"]:
        found[f"step {step['step_id']}"] = shown("journal", "show", str(step["step_id"]))
    return found


def transfer(command: str, config: str, file: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main([command, "--config", config, str(file)]) == 0, capsys.readouterr().err
    out, err = capsys.readouterr()
    assert out == ""
    return err


def test_a_store_moved_to_postgresql_and_back_reads_the_same(
    source: Path, postgres: PostgresServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    upstream = "http://127.0.0.1:9/v1"  # nothing is sent upstream: the CLI only reads
    from_sqlite = config_file(tmp_path, upstream, source, "sqlite")
    url = postgres.database()
    on_postgres = config_file(tmp_path, upstream, url, "postgres")
    back = config_file(tmp_path, upstream, tmp_path / "back.db", "back")

    exported = transfer("export", from_sqlite, tmp_path / "sqlite.jsonl", capsys)
    imported = transfer("import", on_postgres, tmp_path / "sqlite.jsonl", capsys)
    transfer("export", on_postgres, tmp_path / "postgres.jsonl", capsys)
    transfer("import", back, tmp_path / "postgres.jsonl", capsys)

    rows = every_row(source)
    assert every_row(url) == rows
    assert every_row(tmp_path / "back.db") == rows
    counts = {table: len(found) for table, found in rows.items()}
    assert exported.startswith(f"exported {counts['messages']:,} messages, {counts['sessions']} sessions, ")
    assert imported.startswith(f"imported {counts['messages']:,} messages, ")
    seen = views(from_sqlite, capsys)
    assert len(seen["sessions"]["data"]) == 2
    assert views(on_postgres, capsys) == seen
    assert views(back, capsys) == seen

    first, second = ((tmp_path / name).read_text().splitlines() for name in ("sqlite.jsonl", "postgres.jsonl"))
    header = json.loads(first[0])
    assert (header["format"], header["version"], header["engine"]) == (FORMAT, VERSION, "sqlite")
    assert json.loads(second[0])["migrations"] == header["migrations"]
    assert sorted(first[1:]) == sorted(second[1:])  # the same rows, the same values, the same JSON types
    assert json.loads(first[-1]) == {"end": counts}
    depths: dict[str, int] = {}
    for line in first[1:]:
        record = json.loads(line)
        if record.get("table") == "messages":
            row = record["row"]
            assert row["parent_id"] is None or depths[row["parent_id"]] == row["depth"] - 1  # parents first
            depths[row["id"]] = row["depth"]
            assert isinstance(row["created_at"], float)


def test_on_postgresql_new_ids_follow_the_imported_ones_and_the_session_goes_on(
    source_store: Source,
    postgres: PostgresServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    serve_proxy: ServeProxy,
    fake: FakeUpstream,
) -> None:
    url = postgres.database()
    transfer("export", config_file(tmp_path, fake.url, source_store.path, "sqlite"), tmp_path / "export.jsonl", capsys)
    transfer("import", config_file(tmp_path, fake.url, url, "postgres"), tmp_path / "export.jsonl", capsys)
    highest = {table: committed_rows(url, f"SELECT MAX(id) FROM {table}")[0][0] for table in IDENTITY_TABLES}
    assert all(highest.values())

    summary, event = asyncio.run(insert_without_ids(url))
    assert summary > highest["summaries"]
    assert event > highest["compaction_events"]

    # The proxy on the imported store: the long session's history maps onto the imported rows.
    fake.context_window = WINDOW
    install_responder(fake)
    proxy = serve_proxy(models=models(fake.url), context=CONTEXT, store={"url": url})
    before = httpx.get(f"{proxy.url}/sessions/long", timeout=10).json()
    messages = [*source_store.long, {"role": "user", "content": "And one more thing, briefly."}]
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30) as client:
        client.chat.completions.create(model="small", messages=messages, extra_headers={"X-Session-Id": "long"})  # type: ignore[arg-type]
    after = httpx.get(f"{proxy.url}/sessions/long", timeout=10).json()
    assert [m["id"] for m in after["messages"]][:-2] == [m["id"] for m in before["messages"]]
    assert len(after["messages"]) == len(before["messages"]) + 2
    newest = committed_rows(url, "SELECT MAX(id) FROM journal_steps")[0][0]
    assert newest > highest["journal_steps"]


async def insert_without_ids(url: str) -> tuple[int, int]:
    """A summary and a compaction event as the proxy writes them, the store choosing their ids."""
    db = await Database.open(url)
    try:
        summary: int = await db.write(
            lambda c: c.execute(
                "INSERT INTO summaries (tenant, start_depth, end_depth, end_id, content, tokens, original_tokens, "
                "model, generated_by, created_at) SELECT 'open', 1, 2, id, 'x', 1, 2, 'm', 'rule', 0.0 "
                "FROM messages WHERE depth = 2 LIMIT 1 RETURNING id"
            ).fetchone()[0]
        )
        event: int = await db.write(
            lambda c: c.execute(
                "INSERT INTO compaction_events (tenant, session_id, event, strategy, created_at) "
                "VALUES ('open', 'long', 'start', 'summarize', 0.0) RETURNING id"
            ).fetchone()[0]
        )
    finally:
        await db.close()
    return summary, event


def test_export_to_stdout_and_import_from_stdin(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream = "http://127.0.0.1:9/v1"
    assert main(["export", "--config", config_file(tmp_path, upstream, source, "source"), "-"]) == 0
    out, err = capsys.readouterr()
    assert out.startswith('{"format":"context-infinity-export"')
    assert "exported" in err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(out.encode())))
    assert main(["import", "--config", config_file(tmp_path, upstream, tmp_path / "copy.db", "copy"), "-"]) == 0
    assert every_row(tmp_path / "copy.db") == every_row(source)


@pytest.fixture
def export_lines(source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> list[str]:
    transfer("export", config_file(tmp_path, "http://127.0.0.1:9/v1", source, "source"), tmp_path / "x.jsonl", capsys)
    return (tmp_path / "x.jsonl").read_text().splitlines(keepends=True)


def _with_header(lines: list[str], **changes: Any) -> list[str]:
    return [json.dumps({**json.loads(lines[0]), **changes}) + "\n", *lines[1:]]


def _without_table(lines: list[str], table: str, count: int) -> list[str]:
    """The export without the first `count` rows of `table`."""
    dropped = [i for i, line in enumerate(lines) if f'"table":"{table}"' in line][:count]
    return [line for i, line in enumerate(lines) if i not in dropped]


BAD_EXPORTS = {
    "garbage": (lambda lines: ["hello\n", *lines[1:]], "line 1 of the export is not a JSON object"),
    "empty": (lambda lines: [], "line 1 of the export is empty"),
    "another format": (lambda lines: _with_header(lines, format="something-else"), "not a Context Infinity export"),
    "a newer format": (lambda lines: _with_header(lines, version=VERSION + 1), "newer proxy"),
    "another schema": (
        lambda lines: _with_header(lines, migrations=json.loads(lines[0])["migrations"][:-1]),
        "is not this store's",
    ),
    "cut short": (lambda lines: lines[: len(lines) // 2], "ends before its end line"),
    "a torn row": (lambda lines: [*lines[:5], lines[5][:20] + "\n", *lines[6:]], "line 6 of the export"),
    "an unknown table": (
        lambda lines: [*lines[:3], '{"table":"sqlite_master","row":{}}\n', *lines[3:]],
        "line 4 of the export is not a row of a known table",
    ),
    "a missing parent": (lambda lines: _without_table(lines, "messages", 1), "the store refused a row of messages"),
    "a miscount": (lambda lines: _without_table(lines, "pins", 1), "end line counts"),
}


@pytest.mark.parametrize(
    ("bad", "engine"),
    [(bad, "sqlite") for bad in BAD_EXPORTS]
    # Refused while the rows are written: on PostgreSQL too, the transaction takes all of them back.
    + [(bad, "postgresql") for bad in ("cut short", "a missing parent", "a miscount")],
)
def test_a_bad_export_is_refused_and_writes_nothing(
    export_lines: list[str],
    bad: str,
    engine: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    target: Path | str = tmp_path / "target.db"
    if engine == "postgresql":
        target = request.getfixturevalue("postgres").database()
    damage, message = BAD_EXPORTS[bad]
    (tmp_path / "bad.jsonl").write_text("".join(damage(export_lines)))

    config = config_file(tmp_path, "http://x", target, "target")
    assert main(["import", "--config", config, str(tmp_path / "bad.jsonl")]) == EXIT_STORE

    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("context-proxy: "), err
    assert err.count("\n") == 1, err
    assert message in err
    assert all(rows == [] for rows in every_row(target).values())


@pytest.mark.parametrize("engine", ["sqlite", "postgresql"])
def test_import_into_a_store_that_holds_rows_is_refused_and_writes_nothing(
    source: Path,
    engine: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    request: pytest.FixtureRequest,
) -> None:
    target: Path | str = tmp_path / "target.db"
    if engine == "postgresql":
        target = request.getfixturevalue("postgres").database()
    config = config_file(tmp_path, "http://x", target, "target")
    transfer("export", config_file(tmp_path, "http://x", source, "source"), tmp_path / "x.jsonl", capsys)
    transfer("import", config, tmp_path / "x.jsonl", capsys)
    (tmp_path / "one.jsonl").write_text(
        "".join(_without_table((tmp_path / "x.jsonl").read_text().splitlines(keepends=True), "sessions", 1))
    )
    rows = every_row(target)

    for export in ("x.jsonl", "one.jsonl"):
        assert main(["import", "--config", config, str(tmp_path / export)]) == EXIT_STORE
        err = capsys.readouterr().err
        assert "the store is not empty (it has messages): import only into a new store" in err
    assert every_row(target) == rows


async def test_every_table_is_moved_or_left_out_on_purpose(db: Database) -> None:
    """A migration that adds a table must say here whether an export carries it."""
    if db.dialect == "sqlite":
        listed = await db.fetchall("SELECT name FROM sqlite_master WHERE type = 'table'")
    else:
        listed = await db.fetchall("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    names = {row[0] for row in listed if not row[0].startswith(("sqlite_", "recall_index_"))}
    assert names == {table.name for table in TABLES} | set(LEFT_OUT)


def test_export_warns_when_a_proxy_serves_the_store(
    source: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    served = tmp_path / "served.db"
    with sqlite3.connect(source) as original, sqlite3.connect(served) as copy:
        original.backup(copy)
        copy.execute("INSERT INTO journal_owners VALUES ('o1', 'host', 1, ?, ?)", (time.time(), time.time()))
    err = transfer("export", config_file(tmp_path, "http://x", served, "served"), tmp_path / "x.jsonl", capsys)
    assert err.startswith("context-proxy: warning: 1 proxy process(es) are serving this store")
    assert "journal_owners" not in (tmp_path / "x.jsonl").read_text()
