"""The SQLite store (`proxy.store.database`): one writer with group commit, savepoints per job, a reader that
sees committed data, WAL, and the placement of write groups (inline, or on the writer thread)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.store.database import Database, id_array
from proxy.store.sqlite import BACKSTOP_PAGES, CHECKPOINT_EVERY
from tests.support.raw_store import committed_rows

TIMEOUT_S = 10


class JobFailed(Exception):
    pass


def create_table(connection: sqlite3.Connection) -> None:
    connection.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")


def insert(item_id: int, value: str = "v") -> Callable[[sqlite3.Connection], int]:
    def work(connection: sqlite3.Connection) -> int:
        row = connection.execute(
            "INSERT INTO items (id, value) VALUES (?, ?) RETURNING id", (item_id, value)
        ).fetchone()
        return int(row[0])

    return work


def raw_ids(db: Database | Path) -> list[int]:
    """The committed rows, read by a connection of our own, outside the Database."""
    return [row[0] for row in committed_rows(db, "SELECT id FROM items ORDER BY id")]


class Batches:
    """Records the size of every write group `_run_batch` is given (it is called once per transaction)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, db: Database) -> None:
        self.sizes: list[int] = []
        real = db.engine.run_batch

        def counting(works: list[Any]) -> Any:
            self.sizes.append(len(works))
            return real(works)

        monkeypatch.setattr(db.engine, "run_batch", counting)


@pytest.fixture
async def items(db: Database) -> Database:
    await db.write(create_table)
    return db


@pytest.fixture
async def sqlite_items(tmp_path: Path) -> AsyncIterator[Database]:
    """For what only SQLite has (WAL, groups run inline)."""
    database = await Database.open(tmp_path / "store.sqlite")
    await database.write(create_table)
    yield database
    await database.close()


@pytest.fixture
async def full_db(tmp_path: Path) -> AsyncIterator[Database]:
    database = await Database.open(tmp_path / "full.sqlite", synchronous="FULL")
    await database.write(create_table)
    yield database
    await database.close()


# --- durability and visibility -------------------------------------------------------------------------------


async def test_awaited_write_is_committed(items: Database) -> None:
    assert await items.write(insert(1)) == 1
    assert raw_ids(items) == [1]
    await items.write(insert(2))
    assert raw_ids(items) == [1, 2]


async def test_write_returns_the_jobs_result(items: Database) -> None:
    def work(connection: sqlite3.Connection) -> tuple[str, int]:
        connection.execute("INSERT INTO items (id, value) VALUES (5, 'five')")
        return "done", 42

    assert await items.write(work) == ("done", 42)


async def test_reader_sees_committed_data(items: Database) -> None:
    assert await items.fetchall("SELECT id FROM items") == []
    await items.write(insert(1, "one"))
    await items.write(insert(2, "two"))
    rows = await items.fetchall("SELECT id, value FROM items ORDER BY id")
    assert [(row["id"], row["value"]) for row in rows] == [(1, "one"), (2, "two")]
    row = await items.fetchone("SELECT value FROM items WHERE id = ?", (2,))
    assert row is not None
    assert row["value"] == "two"
    assert await items.fetchone("SELECT value FROM items WHERE id = ?", (3,)) is None


async def test_data_survives_reopening(tmp_path: Path) -> None:
    path = tmp_path / "reopen.sqlite"
    first = await Database.open(path)
    await first.write(create_table)
    await first.write(insert(7, "kept"))
    await first.close()
    second = await Database.open(path)
    try:
        row = await second.fetchone("SELECT value FROM items WHERE id = 7")
        assert row is not None
        assert row["value"] == "kept"
    finally:
        await second.close()


async def test_wal_mode_is_on(sqlite_items: Database) -> None:
    row = await sqlite_items.fetchone("PRAGMA journal_mode")
    assert row is not None
    assert row[0] == "wal"
    connection = sqlite3.connect(sqlite_items.path)
    try:
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    finally:
        connection.close()


async def test_foreign_keys_are_enforced_on_writes(db: Database) -> None:
    def orphan(connection: sqlite3.Connection) -> None:
        connection.execute(
            "INSERT INTO messages (id, parent_id, depth, role, body, created_at) VALUES ('m', 'nope', 1, 'user', "
            "'{}', 0)"
        )

    with pytest.raises(db.errors):
        await db.write(orphan)
    assert await db.fetchall("SELECT id FROM messages") == []


# --- group commit ----------------------------------------------------------------------------------------------


async def test_many_concurrent_writes_are_grouped(items: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = Batches(monkeypatch, items)
    async with asyncio.timeout(TIMEOUT_S):
        results = await asyncio.gather(*(items.write(insert(i)) for i in range(1, 201)))
    assert results == list(range(1, 201))
    assert raw_ids(items) == list(range(1, 201))
    assert sum(batches.sizes) == 200
    assert len(batches.sizes) < 200
    assert max(batches.sizes) > 1


async def test_sequential_writes_each_commit(items: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = Batches(monkeypatch, items)
    for i in range(3):
        await items.write(insert(i))
    assert batches.sizes == [1, 1, 1]


async def test_failing_job_rolls_back_alone(items: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = Batches(monkeypatch, items)
    failure = JobFailed("job two failed")

    def two_statements_then_fail(connection: sqlite3.Connection) -> None:
        connection.execute("INSERT INTO items (id, value) VALUES (20, 'a')")
        connection.execute("INSERT INTO items (id, value) VALUES (21, 'b')")
        raise failure

    async with asyncio.timeout(TIMEOUT_S):
        outcomes = await asyncio.gather(
            items.write(insert(1)),
            items.write(two_statements_then_fail),
            items.write(insert(3)),
            return_exceptions=True,
        )
    assert batches.sizes == [3], "the three jobs should have shared one transaction"
    assert outcomes[0] == 1
    assert outcomes[1] is failure
    assert outcomes[2] == 3
    assert raw_ids(items) == [1, 3]


async def test_failing_job_exception_reaches_its_caller(items: Database) -> None:
    def fail(connection: sqlite3.Connection) -> None:
        connection.execute("INSERT INTO items (id, value) VALUES (1, 'x')")
        raise JobFailed("boom")

    with pytest.raises(JobFailed, match="boom"):
        await items.write(fail)
    assert raw_ids(items) == []
    # The writer is still alive after a failed job.
    await items.write(insert(2))
    assert raw_ids(items) == [2]


async def test_constraint_violation_fails_only_that_job(items: Database) -> None:
    await items.write(insert(1))
    async with asyncio.timeout(TIMEOUT_S):
        outcomes = await asyncio.gather(
            items.write(insert(2)), items.write(insert(1)), items.write(insert(3)), return_exceptions=True
        )
    assert outcomes[0] == 2
    assert isinstance(outcomes[1], items.errors)
    assert outcomes[2] == 3
    assert raw_ids(items) == [1, 2, 3]


async def test_non_atomic_single_statement(items: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    batches = Batches(monkeypatch, items)
    await items.write(insert(1))
    async with asyncio.timeout(TIMEOUT_S):
        outcomes = await asyncio.gather(
            items.write(insert(2), atomic=False),
            items.write(insert(1), atomic=False),
            items.write(insert(4), atomic=False),
            return_exceptions=True,
        )
    assert batches.sizes == [1, 3]
    assert outcomes[0] == 2
    assert isinstance(outcomes[1], items.errors)
    assert outcomes[2] == 4
    assert raw_ids(items) == [1, 2, 4]


async def test_bulk_jobs_run_on_the_writer_thread(items: Database) -> None:
    threads: list[str] = []

    def many_rows(connection: sqlite3.Connection) -> int:
        threads.append(threading.current_thread().name)
        connection.executemany("INSERT INTO items (id, value) VALUES (?, ?)", [(i, "bulk") for i in range(100)])
        return 100

    async with asyncio.timeout(TIMEOUT_S):
        assert await items.write(many_rows, bulk=True) == 100
        results = await asyncio.gather(items.write(insert(1000), bulk=True), items.write(insert(1001)))
    assert results == [1000, 1001]
    assert raw_ids(items) == [*range(100), 1000, 1001]
    assert threads[0].startswith("store-writer")


async def test_normal_mode_runs_small_groups_inline(sqlite_items: Database) -> None:
    items = sqlite_items
    assert items.engine.inline
    threads: list[threading.Thread] = []

    def work(connection: sqlite3.Connection) -> None:
        threads.append(threading.current_thread())

    await items.write(work)
    assert threads == [threading.current_thread()]


async def test_the_log_is_checkpointed_on_the_writer_thread_never_in_an_inline_commit(sqlite_items: Database) -> None:
    """A checkpoint waits for the disk: after every `CHECKPOINT_EVERY` commits the next group goes to the writer
    thread, which checkpoints before it; the writer's own (inside a commit, which may be inline) is put off."""
    items = sqlite_items
    threads: list[str] = []

    def row(item_id: int) -> Callable[[sqlite3.Connection], None]:
        def work(connection: sqlite3.Connection) -> None:
            threads.append(threading.current_thread().name)
            connection.execute("INSERT INTO items (id, value) VALUES (?, ?)", (item_id, "x" * 3000))

        return work

    def autocheckpoint(connection: sqlite3.Connection) -> int:
        return int(connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0])

    assert await items.write(autocheckpoint) == BACKSTOP_PAGES
    for item_id in range(2 * CHECKPOINT_EVERY + 5):  # one at a time: a group each
        await items.write(row(item_id))
    on_thread = [index for index, name in enumerate(threads) if name != threading.current_thread().name]
    # The fixture's table and the pragma above were the first two commits.
    assert on_thread == [CHECKPOINT_EVERY - 2, 2 * CHECKPOINT_EVERY - 2]
    assert all(threads[index].startswith("store-writer") for index in on_thread)
    # Each commit wrote a page or more; the log has been started over since the last checkpoint.
    assert items.path is not None
    connection = sqlite3.connect(items.path)
    try:
        busy, frames, _copied = connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    finally:
        connection.close()
    assert busy == 0
    assert 0 < frames < CHECKPOINT_EVERY // 2


async def test_cancelled_write_is_not_run(full_db: Database) -> None:
    started = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def blocking(connection: sqlite3.Connection) -> None:
        started.set()
        release.wait(TIMEOUT_S)
        ran.append("blocking")

    def never(connection: sqlite3.Connection) -> None:
        ran.append("cancelled")

    async with asyncio.timeout(TIMEOUT_S):
        first = asyncio.create_task(full_db.write(blocking))
        await asyncio.to_thread(started.wait, TIMEOUT_S)
        second = asyncio.create_task(full_db.write(never))
        await asyncio.sleep(0)
        second.cancel()
        release.set()
        await first
        with pytest.raises(asyncio.CancelledError):
            await second
        await full_db.write(insert(1))
    assert ran == ["blocking"]
    assert raw_ids(full_db) == [1]


# --- synchronous=FULL ------------------------------------------------------------------------------------------


async def test_full_synchronous_works(full_db: Database) -> None:
    assert not full_db.engine.inline
    threads: list[str] = []

    def work(connection: sqlite3.Connection) -> int:
        threads.append(threading.current_thread().name)
        return insert(1)(connection)

    assert await full_db.write(work) == 1
    assert threads[0].startswith("store-writer")
    async with asyncio.timeout(TIMEOUT_S):
        await asyncio.gather(*(full_db.write(insert(i)) for i in range(2, 51)))
    assert raw_ids(full_db) == list(range(1, 51))
    synchronous = await full_db.fetchone("PRAGMA synchronous")
    assert synchronous is not None
    assert synchronous[0] == 2  # FULL
    mode = await full_db.fetchone("PRAGMA journal_mode")
    assert mode is not None
    assert mode[0] == "wal"


async def test_full_synchronous_failing_job_rolls_back_alone(full_db: Database) -> None:
    def fail(connection: sqlite3.Connection) -> None:
        connection.execute("INSERT INTO items (id, value) VALUES (9, 'x')")
        raise JobFailed("full")

    async with asyncio.timeout(TIMEOUT_S):
        outcomes = await asyncio.gather(full_db.write(insert(1)), full_db.write(fail), return_exceptions=True)
    assert outcomes[0] == 1
    assert isinstance(outcomes[1], JobFailed)
    assert raw_ids(full_db) == [1]


# --- close -----------------------------------------------------------------------------------------------------


async def test_write_after_close_raises(tmp_path: Path) -> None:
    database = await Database.open(tmp_path / "closed.sqlite")
    await database.write(create_table)
    await database.close()
    with pytest.raises(RuntimeError, match="closed"):
        await database.write(insert(1))


async def test_close_waits_for_queued_writes(tmp_path: Path) -> None:
    database = await Database.open(tmp_path / "drain.sqlite")
    await database.write(create_table)
    pending = [asyncio.ensure_future(database.write(insert(i))) for i in range(20)]
    await asyncio.sleep(0)
    async with asyncio.timeout(TIMEOUT_S):
        await database.close()
        assert await asyncio.gather(*pending) == list(range(20))
    assert raw_ids(database) == list(range(20))


async def test_open_creates_the_parent_folder(tmp_path: Path) -> None:
    path = tmp_path / "a" / "b" / "store.sqlite"
    database = await Database.open(path)
    try:
        assert path.exists()
    finally:
        await database.close()


class WriterKilled(BaseException):
    """Not an Exception: what a job may raise that is no failure of its own (an interrupt, a cancellation)."""


async def test_a_writer_stopped_by_a_base_exception_fails_its_callers_instead_of_hanging(items: Database) -> None:
    def interrupt(connection: sqlite3.Connection) -> None:
        raise WriterKilled

    async with asyncio.timeout(5):
        with pytest.raises(RuntimeError, match="writer stopped"):
            await items.write(interrupt)
        with pytest.raises(RuntimeError, match="closed"):
            await items.write(insert(1))


# --- locks across processes ------------------------------------------------------------------------------------


async def test_a_lock_is_held_against_other_processes_and_released(db: Database, store_target: Path | str) -> None:
    """A second `Database` on the same store stands for another replica. On SQLite one process serves a file,
    so its locks are no-ops that always succeed."""
    other = await Database.open(store_target)
    shared = db.dialect == "postgresql"
    try:
        async with db.lock("a"):
            async with other.try_lock("a") as held:
                assert held is not shared
            async with other.try_lock("b") as held:
                assert held
            if shared:
                waiter = asyncio.create_task(other.lock("a").__aenter__())
                await asyncio.sleep(0.05)
                assert not waiter.done()
                waiter.cancel()  # a waiter that gives up leaves nothing held
                with pytest.raises(asyncio.CancelledError):
                    await waiter
        async with asyncio.timeout(5), other.try_lock("a") as held:
            assert held
        async with db.try_lock("a") as held:
            assert held
    finally:
        await other.close()


@given(st.lists(st.one_of(st.text(), st.text(alphabet="0123456789abcdef", min_size=64, max_size=64))))
def test_an_id_array_is_the_json_of_its_ids(ids: list[str]) -> None:
    assert json.loads(id_array(ids)) == ids
