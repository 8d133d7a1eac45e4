"""The embedded engine: one SQLite file, a writer connection on the writer thread and an aiosqlite reader.

Where a group runs is measured, not guessed. With `synchronous=NORMAL` a WAL commit does not fsync and costs
tens of microseconds, less than handing the group to another thread (which also competes for the GIL), so
small groups run inline on the event loop (a 10-message request: 4.2 ms added instead of 6.9). Groups with a
bulk job (many stream events) and, with `FULL`, every group go to the writer thread, one hop per group, where
the commit overlaps the event loop's work (journal-on relay throughput 90-92 % of journal-off, against 80-88 %
inline). Reads use an aiosqlite connection, which in WAL mode sees committed data without waiting for the
writer. One process serves a file, so the locks across processes are the process's own (`History`'s).
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiosqlite

from proxy.errors import StorageFull
from proxy.store.connection import Row
from proxy.store.engine import Outcome, Works, apply_migrations, refuse_newer, run_job
from proxy.store.migrations import MIGRATIONS

BUSY_TIMEOUT_MS = 10_000


class SqliteEngine:
    name = "sqlite"
    errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(self, path: Path, writer: sqlite3.Connection, reader: aiosqlite.Connection, inline: bool) -> None:
        self.path = path
        self.writer = writer
        self.reader = reader
        self.inline = inline

    @classmethod
    async def open(cls, path: Path, synchronous: str, executor: ThreadPoolExecutor) -> SqliteEngine:
        path.parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        writer = await loop.run_in_executor(executor, _open_writer, path, synchronous)
        try:
            reader = await _connect_reader(path, synchronous)
        except BaseException:
            await loop.run_in_executor(executor, writer.close)
            raise
        return cls(path, writer, reader, inline=synchronous.upper() != "FULL")

    def run_batch(self, works: Works) -> list[Outcome]:
        return _run_batch(self.writer, works)

    def close_writer(self) -> None:
        self.writer.close()

    def unreachable(self) -> str | None:
        return None

    def storage_error(self, exc: BaseException) -> BaseException:
        return storage_error(exc)

    async def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        async with self.reader.execute(sql, params) as cursor:
            return list(await cursor.fetchall())

    async def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        async with self.reader.execute(sql, params) as cursor:
            row: Row | None = await cursor.fetchone()
            return row

    async def fetch_tuples(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        async with self.reader.execute(sql, params) as cursor:
            cursor.row_factory = None  # plain tuples: measurably cheaper than sqlite3.Row for long paths
            return [tuple(row) for row in await cursor.fetchall()]

    @asynccontextmanager
    async def lock(self, name: str) -> AsyncIterator[None]:
        yield

    @asynccontextmanager
    async def try_lock(self, name: str) -> AsyncIterator[bool]:
        yield True

    async def close(self) -> None:
        await self.reader.close()


def _run_batch(connection: sqlite3.Connection, works: Works) -> list[Outcome]:
    outcomes: list[Outcome] = []
    connection.execute("BEGIN IMMEDIATE")
    try:
        for work, atomic in works:
            outcomes.append(run_job(connection, work, atomic, storage_error))
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    return outcomes


def storage_error(exc: BaseException) -> BaseException:
    """SQLite's "database or disk is full" as the 507 a client can act on; any other failure unchanged."""
    if not any(_is_full(cause) for cause in (exc, exc.__context__)):
        return exc
    error = StorageFull("The proxy's storage is full: nothing was saved. The operator must free disk space.")
    error.__cause__ = exc
    return error


def _is_full(exc: BaseException | None) -> bool:
    # A failed write may surface as the ROLLBACK TO that followed it ("no such savepoint": SQLITE_FULL had already
    # rolled the whole transaction back), with the real failure as its context.
    if not isinstance(exc, sqlite3.Error):
        return False
    return getattr(exc, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc)


def _open_writer(path: Path, synchronous: str) -> sqlite3.Connection:
    # isolation_level=None: transactions are ours (BEGIN/COMMIT above), never opened behind our back.
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        connection.row_factory = sqlite3.Row
        for pragma in _pragmas(synchronous):
            connection.execute(pragma)
        migrate(connection)
    except BaseException:
        connection.close()
        raise
    return connection


def _pragmas(synchronous: str) -> list[str]:
    return [
        "PRAGMA journal_mode=WAL",
        f"PRAGMA synchronous={synchronous}",
        f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}",
        "PRAGMA foreign_keys=ON",
    ]


async def _connect_reader(path: Path, synchronous: str) -> aiosqlite.Connection:
    connection = await aiosqlite.connect(path, isolation_level=None)
    connection.row_factory = sqlite3.Row
    for pragma in _pragmas(synchronous):
        await connection.execute(pragma)
    return connection


def check_schema(path: Path) -> None:
    """SchemaTooNew if the store at `path` (if any) was migrated by a newer proxy. Reads only; a missing store
    is fine."""
    if not path.exists():
        return
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        listed = connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'migrations'")
        if listed.fetchone() is not None:
            refuse_newer({row[0] for row in connection.execute("SELECT name FROM migrations")}, MIGRATIONS)
    finally:
        connection.close()


def migrate(connection: sqlite3.Connection) -> None:
    apply_migrations(connection, MIGRATIONS, begin="BEGIN IMMEDIATE", time_type="REAL")
