"""The schema's ordered migrations (`proxy.store.migrations`) and how `Database.open` applies them: each once, in
order, recorded in `migrations`; an older file is upgraded with its data; a failing migration leaves nothing;
another application's database is refused before anything is written to it."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import psycopg
import pytest

from proxy.store import sqlite as database_module
from proxy.store.database import Database, StoreRefused, check_store
from proxy.store.initial_schema import m001_history
from proxy.store.migrations import MIGRATIONS
from proxy.store.pg_migrations import MIGRATIONS as PG_MIGRATIONS
from proxy.store.sqlite import migrate as _migrate
from tests.support.postgres_server import PostgresServer
from tests.support.raw_store import committed_rows

EXPECTED_TABLES = {
    "sessions",
    "messages",
    "message_tokens",
    "summaries",
    "journal_steps",
    "journal_events",
    "journal_owners",
    "summarizer_calls",
}


@contextmanager
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A plain connection of our own (autocommit: transactions only where we open them)."""
    with closing(sqlite3.connect(path, isolation_level=None)) as connection:
        yield connection


def tables(connection: sqlite3.Connection) -> set[str]:
    return {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def recorded(connection: sqlite3.Connection) -> list[tuple[str, float]]:
    return [(row[0], row[1]) for row in connection.execute("SELECT name, applied_at FROM migrations ORDER BY rowid")]


async def open_and_close(path: Path) -> None:
    database = await Database.open(path)
    await database.close()


# --- the list itself -------------------------------------------------------------------------------------------


def test_migration_names_are_unique_and_ordered() -> None:
    names = [migration.__name__ for migration in MIGRATIONS]
    assert names
    assert len(set(names)) == len(names)
    numbers = []
    for name in names:
        match = re.fullmatch(r"m(\d{3})_[a-z0-9_]+", name)
        assert match, f"migration {name!r} is not named mNNN_description"
        numbers.append(int(match.group(1)))
    assert numbers == list(range(1, len(names) + 1))
    assert names == sorted(names)
    assert MIGRATIONS[0] is m001_history


# --- a fresh file ----------------------------------------------------------------------------------------------


async def test_fresh_file_gets_every_migration_in_order(tmp_path: Path) -> None:
    path = tmp_path / "fresh.sqlite"
    await open_and_close(path)
    with raw(path) as connection:
        rows = recorded(connection)
        assert [name for name, _ in rows] == [migration.__name__ for migration in MIGRATIONS]
        times = [applied_at for _, applied_at in rows]
        assert times == sorted(times)
        assert all(applied_at > 0 for applied_at in times)
        assert EXPECTED_TABLES | {"migrations"} <= tables(connection)


async def test_db_fixture_is_fully_migrated(db: Database) -> None:
    rows = await db.fetchall("SELECT name FROM migrations")
    assert {row["name"] for row in rows} == {migration.__name__ for migration in MIGRATIONS}
    assert set(await columns(db)) >= EXPECTED_TABLES


async def columns(db: Database) -> dict[str, set[str]]:
    """Each table's columns, as the engine's own catalogue lists them."""
    if db.dialect == "sqlite":
        rows = await db.fetchall(
            "SELECT m.name, c.name FROM sqlite_master AS m, pragma_table_info(m.name) AS c WHERE m.type = 'table'"
        )
    else:
        rows = await db.fetchall(
            "SELECT table_name, column_name FROM information_schema.columns WHERE table_schema = 'public'"
        )
    found: dict[str, set[str]] = {}
    for row in rows:
        found.setdefault(row[0], set()).add(row[1])
    return found


async def test_both_engines_have_the_same_tables_and_columns(tmp_path: Path, postgres: PostgresServer) -> None:
    on_sqlite = await Database.open(tmp_path / "store.sqlite")
    on_postgres = await Database.open(postgres.database())
    try:
        lite, pg = await columns(on_sqlite), await columns(on_postgres)
    finally:
        await on_sqlite.close()
        await on_postgres.close()
    # Recall's full-text index is each engine's own (FTS5's shadow tables; a tsvector table): `m009_recall`.
    lite = {table: names for table, names in lite.items() if not table.startswith("recall_index")}
    assert pg.pop("recall_index") == {"id", "document"}
    assert pg == lite


def test_migrations_from_two_processes_at_once_apply_each_once(postgres: PostgresServer) -> None:
    url = postgres.database()
    script = (
        "import asyncio, sys\n"
        "from proxy.store.database import Database\n"
        "async def main():\n"
        "    db = await Database.open(sys.argv[1])\n"
        "    await db.close()\n"
        "asyncio.run(main())\n"
    )
    processes = [
        subprocess.Popen([sys.executable, "-c", script, url], stderr=subprocess.PIPE, text=True) for _ in range(3)
    ]
    for process in processes:
        _, stderr = process.communicate(timeout=60)
        assert process.returncode == 0, stderr
    names = postgres.psql_in(url, "SELECT name FROM migrations ORDER BY applied_at").split()
    assert names == [migration.__name__ for migration in PG_MIGRATIONS]


async def test_reopening_applies_nothing_again(tmp_path: Path) -> None:
    path = tmp_path / "twice.sqlite"
    await open_and_close(path)
    with raw(path) as connection:
        first = recorded(connection)
        schema = sorted(connection.execute("SELECT type, name, sql FROM sqlite_master"))
    await open_and_close(path)
    with raw(path) as connection:
        assert recorded(connection) == first
        assert sorted(connection.execute("SELECT type, name, sql FROM sqlite_master")) == schema


def test_migrate_twice_on_one_connection_is_a_no_op(tmp_path: Path) -> None:
    with raw(tmp_path / "direct.sqlite") as connection:
        _migrate(connection)
        first = recorded(connection)
        _migrate(connection)
        assert recorded(connection) == first
        assert not connection.in_transaction


# --- upgrading an older file -----------------------------------------------------------------------------------


async def test_file_with_only_the_first_migration_is_upgraded(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    with raw(path) as connection:
        connection.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
        connection.execute("BEGIN")
        m001_history(connection)
        connection.execute("INSERT INTO migrations (name, applied_at) VALUES ('m001_history', 123.0)")
        connection.execute(
            "INSERT INTO messages (id, parent_id, depth, role, body, created_at) "
            'VALUES (\'msg-1\', NULL, 1, \'user\', \'{"role": "user", "content": "hi"}\', 5.0)'
        )
        connection.execute(
            "INSERT INTO sessions (tenant, id, head_id, model, created_at, updated_at) "
            "VALUES ('open', 's1', 'msg-1', 'm', 5.0, 6.0)"
        )
        connection.execute(
            "INSERT INTO sessions (tenant, id, head_id, model, settings, created_at, updated_at) "
            "VALUES ('open', 's2', 'msg-1', 'm', '{\"budget\": 900}', 5.0, 6.0)"
        )
        connection.execute("COMMIT")
        assert not {"summaries", "journal_steps", "journal_events"} & tables(connection)

    database = await Database.open(path)
    try:
        message = await database.fetchone("SELECT id, depth, role, body FROM messages")
        assert message is not None
        assert tuple(message) == ("msg-1", 1, "user", '{"role": "user", "content": "hi"}')
        session = await database.fetchone("SELECT head_id, anchor_id FROM sessions WHERE id = 's1'")
        assert session is not None
        assert tuple(session) == ("msg-1", None)
        # A session's remembered settings now hold from its head on.
        settings = await database.fetchall("SELECT tenant, message_id, settings FROM context_settings")
        assert [tuple(row) for row in settings] == [("open", "msg-1", '{"budget": 900}')]

        # The new tables work, and reference the old rows.
        def summarize(connection: sqlite3.Connection) -> None:
            connection.execute(
                "INSERT INTO summaries (tenant, start_depth, end_depth, end_id, content, tokens, original_tokens, "
                "model, generated_by, created_at) VALUES ('open', 1, 1, 'msg-1', 'sum', 1, 5, 'm', 'llm', 7.0)"
            )

        await database.write(summarize)
        count = await database.fetchone("SELECT COUNT(*) FROM summaries")
        assert count is not None
        assert count[0] == 1
    finally:
        await database.close()

    with raw(path) as connection:
        rows = recorded(connection)
        assert [name for name, _ in rows] == [migration.__name__ for migration in MIGRATIONS]
        assert rows[0] == ("m001_history", 123.0)
        assert tables(connection) >= EXPECTED_TABLES


async def test_steps_from_before_owners_are_owned_by_nobody(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "before-owners.sqlite"
    monkeypatch.setattr(database_module, "MIGRATIONS", MIGRATIONS[:4])
    await open_and_close(path)
    with raw(path) as connection:
        connection.execute(
            "INSERT INTO journal_steps (tenant, model, fingerprint, stream, status, created_at) "
            "VALUES ('t', 'm', '', 1, 'open', 1.0)"
        )
    monkeypatch.setattr(database_module, "MIGRATIONS", MIGRATIONS)
    await open_and_close(path)
    with raw(path) as connection:
        assert [row[0] for row in connection.execute("SELECT owner FROM journal_steps")] == [None]
        assert "m005_step_owners" in [name for name, _ in recorded(connection)]


# --- a failing migration ---------------------------------------------------------------------------------------


class MigrationBroke(Exception):
    pass


def m999_broken(connection: sqlite3.Connection) -> None:
    connection.execute("CREATE TABLE half_done (id INTEGER PRIMARY KEY)")
    connection.execute("INSERT INTO half_done (id) VALUES (1)")
    raise MigrationBroke("migration failed halfway")


async def test_failing_migration_leaves_nothing_half_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "broken.sqlite"
    monkeypatch.setattr(database_module, "MIGRATIONS", (*MIGRATIONS, m999_broken))
    with pytest.raises(MigrationBroke):
        await Database.open(path)
    with raw(path) as connection:
        assert "half_done" not in tables(connection)
        names = [name for name, _ in recorded(connection)]
        assert "m999_broken" not in names
        # Migrations before the broken one were each committed on their own.
        assert names == [migration.__name__ for migration in MIGRATIONS]
        assert tables(connection) >= EXPECTED_TABLES


async def test_failed_migration_is_retried_on_next_open(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "retry.sqlite"
    monkeypatch.setattr(database_module, "MIGRATIONS", (*MIGRATIONS, m999_broken))
    with pytest.raises(MigrationBroke):
        await Database.open(path)

    def m999_broken_fixed(connection: sqlite3.Connection) -> None:
        connection.execute("CREATE TABLE half_done (id INTEGER PRIMARY KEY)")

    m999_broken_fixed.__name__ = "m999_broken"
    monkeypatch.setattr(database_module, "MIGRATIONS", (*MIGRATIONS, m999_broken_fixed))
    await open_and_close(path)
    with raw(path) as connection:
        assert "half_done" in tables(connection)
        assert [name for name, _ in recorded(connection)][-1] == "m999_broken"


async def test_failing_first_migration_on_fresh_file_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "first.sqlite"
    monkeypatch.setattr(database_module, "MIGRATIONS", (m999_broken, *MIGRATIONS))
    with pytest.raises(MigrationBroke):
        await Database.open(path)
    with raw(path) as connection:
        assert recorded(connection) == []
        assert tables(connection) == {"migrations"}


def test_a_process_migrating_the_same_file_meanwhile_is_not_raced(tmp_path: Path) -> None:
    """Two proxies starting on one new file: the second must not re-run what the first applied in between."""
    path = tmp_path / "store.sqlite"

    class RacedConnection(sqlite3.Connection):
        raced = False

        def execute(self, sql: str, *args: object) -> sqlite3.Cursor:  # type: ignore[override]
            if sql == "BEGIN IMMEDIATE" and not RacedConnection.raced:
                RacedConnection.raced = True
                with raw(path) as other:  # the other process, between our read of `migrations` and our lock
                    _migrate(other)
            return super().execute(sql, *args)  # type: ignore[arg-type]

    with closing(sqlite3.connect(path, isolation_level=None, factory=RacedConnection)) as connection:
        _migrate(connection)
        assert RacedConnection.raced
        assert [name for name, _at in recorded(connection)] == [m.__name__ for m in MIGRATIONS]
        assert tables(connection) >= EXPECTED_TABLES


# --- a database that is not ours -----------------------------------------------------------------------------------

FOREIGN = {
    "a conflicting messages table": [
        "CREATE TABLE messages (id INTEGER PRIMARY KEY, body TEXT)",
        "INSERT INTO messages (id, body) VALUES (1, 'theirs')",
    ],
    "unrelated tables": ["CREATE TABLE users (id INTEGER PRIMARY KEY)", "CREATE VIEW people AS SELECT id FROM users"],
    "a migrations table of another shape": [
        "CREATE TABLE migrations (id INTEGER PRIMARY KEY, migration TEXT, batch INTEGER)",
        "INSERT INTO migrations (id, migration, batch) VALUES (1, '2014_10_12_create_users_table', 1)",
    ],
    "a migrations table of other names": [
        "CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)",
        "INSERT INTO migrations (name, applied_at) VALUES ('0001_initial', 0)",
    ],
    "an empty migrations table beside other tables": [
        "CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)",
        "CREATE TABLE messages (id INTEGER PRIMARY KEY)",
    ],
}


def execute(target: Path | str, statements: list[str]) -> None:
    if isinstance(target, Path):
        with raw(target) as connection:
            for statement in statements:
                connection.execute(statement)
        return
    with psycopg.connect(target, autocommit=True) as connection:
        for statement in statements:
            connection.execute(statement.replace("REAL", "DOUBLE PRECISION"))  # type: ignore[arg-type]


def state(target: Path | str) -> object:
    """All a refused open could have changed: the file's folder, bytes and times; the database's tables and rows."""
    if isinstance(target, Path):
        listing = sorted(path.name for path in target.parent.iterdir())
        return listing, target.read_bytes(), target.stat().st_mtime_ns
    names = [
        row[0]
        for row in committed_rows(
            target, "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public' ORDER BY 1"
        )
    ]
    return {name: committed_rows(target, f"SELECT * FROM {name}") for name in names}


@pytest.mark.parametrize("contents", list(FOREIGN), ids=list(FOREIGN))
async def test_another_applications_database_is_refused_untouched(store_target: Path | str, contents: str) -> None:
    execute(store_target, FOREIGN[contents])
    before = state(store_target)

    refusal = r"is another application's database .* nothing was written to it"
    with pytest.raises(StoreRefused, match=refusal) as refused:
        await Database.open(store_target)
    with pytest.raises(StoreRefused):
        check_store(store_target)

    assert state(store_target) == before
    assert "1 table(s)" in str(refused.value) or "2 table(s)" in str(refused.value)
    assert "password" not in str(refused.value)


@pytest.mark.parametrize(
    "contents",
    [[], ["CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)"]],
    ids=["empty", "a first run stopped before its first migration"],
)
async def test_an_empty_database_is_migrated(store_target: Path | str, contents: list[str]) -> None:
    execute(store_target, contents)  # on SQLite, an empty file at least
    check_store(store_target)
    database = await Database.open(store_target)
    await database.close()
    assert [row[0] for row in committed_rows(store_target, "SELECT name FROM migrations ORDER BY name")] == [
        migration.__name__ for migration in MIGRATIONS
    ]


# --- m010: journal events in a rowid table ---------------------------------------------------------------------

EVENT_CHARS = 1024
EVENTS = 2000
STORED_PER_TEXT_BYTE = 1.5
"""Events of ~1 KB take at most this many bytes on disk per byte of their JSON (WITHOUT ROWID took ~4.6)."""


def add_step_with_events(connection: sqlite3.Connection, count: int, chars: int) -> int:
    """A step and `count` events of `chars` characters each; the events' total size in bytes."""
    connection.execute("BEGIN")
    connection.execute(
        "INSERT INTO journal_steps (id, tenant, model, fingerprint, stream, status, created_at) "
        "VALUES (1, 'open', 'm', 'f', 1, 'open', 1.0)"
    )
    rows = [(1, seq, "chunk", f"{seq:08d}" + "x" * (chars - 8), 1.0) for seq in range(count)]
    connection.executemany(
        "INSERT INTO journal_events (step_id, seq, type, content, created_at) VALUES (?, ?, ?, ?, ?)", rows
    )
    connection.execute("COMMIT")
    return count * chars


def pages_of(connection: sqlite3.Connection, *names: str) -> int:
    """Bytes of the pages the named tables and their indexes take (SQLite's dbstat)."""
    marks = ", ".join("?" for _ in names)
    row = connection.execute(
        f"SELECT SUM(pgsize) FROM dbstat WHERE name IN ({marks}) "
        f"OR name IN (SELECT name FROM sqlite_master WHERE tbl_name IN ({marks}) AND type = 'index')",
        (*names, *names),
    ).fetchone()
    return int(row[0])


async def test_journal_events_of_a_kilobyte_take_about_their_size(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    await open_and_close(path)
    with raw(path) as connection:
        text = add_step_with_events(connection, EVENTS, EVENT_CHARS)
        stored = pages_of(connection, "journal_events")
    assert stored / text < STORED_PER_TEXT_BYTE, f"{stored / text:.2f} bytes stored per byte of event text"


async def test_events_written_before_m010_are_kept_in_order(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    before_m010 = MIGRATIONS[: [m.__name__ for m in MIGRATIONS].index("m010_journal_events_rowid")]
    with raw(path) as connection:
        connection.execute("CREATE TABLE migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
        for migration in before_m010:
            connection.execute("BEGIN")
            migration(connection)
            connection.execute("INSERT INTO migrations (name, applied_at) VALUES (?, 1.0)", (migration.__name__,))
            connection.execute("COMMIT")
        add_step_with_events(connection, 50, 3000)
        old = connection.execute("SELECT * FROM journal_events ORDER BY step_id, seq").fetchall()

    await open_and_close(path)
    with raw(path) as connection:
        assert connection.execute("SELECT * FROM journal_events ORDER BY step_id, seq").fetchall() == old
        sql = connection.execute("SELECT sql FROM sqlite_master WHERE name = 'journal_events'").fetchone()[0]
        assert "WITHOUT ROWID" not in sql
        with pytest.raises(sqlite3.IntegrityError):  # (step_id, seq) is still the key
            connection.execute(
                "INSERT INTO journal_events (step_id, seq, type, content, created_at) VALUES (1, 0, 'chunk', '', 1)"
            )
