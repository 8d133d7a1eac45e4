"""The SQLite file behind the proxy: one writer with group commit, one reader, ordered migrations.

SQLite allows one writer at a time; many coroutines writing through their own transactions would meet as
"database is locked". So every write is a *job* (a plain function of a `sqlite3.Connection`) handed to the one
writer, which runs all jobs that are waiting as one transaction and commits once: under load, many small
writes (journal events of concurrent streams, new messages of concurrent sessions) share one commit —
measured here ~200k rows/s against ~6k with a commit per row.

Where a group runs is measured, not guessed. With `synchronous=NORMAL` a WAL commit does not fsync and costs
tens of microseconds, less than handing the group to another thread (which also competes for the GIL), so
small groups run inline on the event loop (a 10-message request: 4.2 ms added instead of 6.9). Groups with a
bulk job (many stream events) and, with `FULL`, every group go to the writer thread, one hop per group, where
the commit overlaps the event loop's work (journal-on relay throughput 90-92 % of journal-off, against 80-88 %
inline). A job's caller resumes only after its commit, so "awaited" means "durable". Each multi-statement job
runs in a savepoint, so one failing job rolls back alone. Reads use an aiosqlite connection, which in WAL mode
sees committed data without waiting for the writer.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import aiosqlite

from proxy.errors import StorageFull
from proxy.store.migrations import MIGRATIONS

log = logging.getLogger(__name__)

T = TypeVar("T")
WriteWork = Callable[[sqlite3.Connection], T]

BUSY_TIMEOUT_MS = 10_000


@dataclass
class _Job(Generic[T]):
    work: WriteWork[T]
    atomic: bool
    bulk: bool
    future: asyncio.Future[T] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


_Outcome = tuple[Any, BaseException | None]


class Database:
    def __init__(
        self, path: Path, executor: ThreadPoolExecutor, writer: sqlite3.Connection, reader: aiosqlite.Connection
    ) -> None:
        self.path = path
        self._executor = executor
        self._writer = writer
        self.reader = reader
        self._jobs: asyncio.Queue[_Job[Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.inline = False
        """Run write groups on the event loop (no fsync per commit) rather than on the writer thread."""

    @classmethod
    async def open(cls, path: Path, synchronous: str = "NORMAL") -> Database:
        path.parent.mkdir(parents=True, exist_ok=True)
        loop = asyncio.get_running_loop()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        try:
            writer = await loop.run_in_executor(executor, _open_writer, path, synchronous)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        try:
            reader = await _connect_reader(path, synchronous)
        except BaseException:
            await loop.run_in_executor(executor, writer.close)
            executor.shutdown(wait=False)
            raise
        database = cls(path, executor, writer, reader)
        database.inline = synchronous.upper() != "FULL"
        database._task = asyncio.create_task(database._write_loop(), name="database-writer")
        return database

    async def close(self) -> None:
        if self._task is not None:
            await self._jobs.join()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.reader.close()
        await asyncio.get_running_loop().run_in_executor(self._executor, self._writer.close)
        self._executor.shutdown(wait=True)

    async def write(self, work: WriteWork[T], *, atomic: bool = True, bulk: bool = False) -> T:
        """Run `work(connection)` on the writer thread in its next transaction; return once committed.

        `work` must be quick and must not touch the event loop: it may run on the writer thread. `atomic=False`
        skips the savepoint for a job of a single statement (SQLite already rolls back a failing statement
        alone). `bulk` marks a job that writes many rows (a group of stream events): its group goes to the
        writer thread even in NORMAL mode, so the commit overlaps the parsing of the next chunks instead of
        pausing the event loop.
        """
        if self._task is None or self._task.done():
            raise RuntimeError("database is closed")
        job: _Job[T] = _Job(work, atomic, bulk)
        self._jobs.put_nowait(job)
        return await job.future

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        async with self.reader.execute(sql, params) as cursor:
            return list(await cursor.fetchall())

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        async with self.reader.execute(sql, params) as cursor:
            return await cursor.fetchone()

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            batch = [await self._jobs.get()]
            while not self._jobs.empty():
                batch.append(self._jobs.get_nowait())
            try:
                live = [job for job in batch if not job.future.cancelled()]
                works = [(job.work, job.atomic) for job in live]
                try:
                    if self.inline and not any(job.bulk for job in live):
                        outcomes = _run_batch(self._writer, works)
                    else:
                        outcomes = await loop.run_in_executor(self._executor, _run_batch, self._writer, works)
                except (sqlite3.Error, ValueError) as exc:
                    # The transaction itself failed (disk full, I/O error): nothing in it was committed.
                    log.error("database write transaction failed: %s", exc)
                    outcomes = [(None, storage_error(exc))] * len(live)
                for job, (result, error) in zip(live, outcomes, strict=True):
                    if job.future.done():
                        continue
                    if error is None:
                        job.future.set_result(result)
                    else:
                        job.future.set_exception(error)
            except BaseException:
                # Not a failed transaction but the writer itself stopping (cancelled, interrupted): no caller may
                # wait for a commit that will never come.
                while not self._jobs.empty():
                    batch.append(self._jobs.get_nowait())
                for job in batch:
                    if not job.future.done():
                        job.future.set_exception(RuntimeError("the database writer stopped"))
                raise
            finally:
                for _ in batch:
                    self._jobs.task_done()


def _run_batch(connection: sqlite3.Connection, works: list[tuple[WriteWork[Any], bool]]) -> list[_Outcome]:
    """On the writer thread: every job of the group in one transaction, each in its own savepoint."""
    outcomes: list[_Outcome] = []
    connection.execute("BEGIN IMMEDIATE")
    try:
        for work, atomic in works:
            outcomes.append(_run_job(connection, work, atomic))
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise
    return outcomes


def _run_job(connection: sqlite3.Connection, work: WriteWork[Any], atomic: bool) -> _Outcome:
    # A job's own failure is handed to the coroutine awaiting it (re-raised there), never swallowed; it must not
    # end the group, which other requests' writes are part of.
    if not atomic:
        try:
            return work(connection), None
        except Exception as exc:
            return None, storage_error(exc)
    connection.execute("SAVEPOINT job")
    try:
        result = work(connection)
    except Exception as exc:
        connection.execute("ROLLBACK TO job")
        connection.execute("RELEASE job")
        return None, storage_error(exc)
    connection.execute("RELEASE job")
    return result, None


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
        _migrate(connection)
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


class SchemaTooNew(Exception):
    """The store was migrated by a newer version of the proxy: this one would misread or damage it."""


def check_schema(path: Path) -> None:
    """SchemaTooNew if the store at `path` (if any) was migrated by a newer proxy: what `serve` checks before it
    starts, to say so in one line. Reads only; a missing store is fine."""
    if not path.exists():
        return
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
    try:
        listed = connection.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'migrations'")
        if listed.fetchone() is not None:
            _refuse_newer({row[0] for row in connection.execute("SELECT name FROM migrations")})
    finally:
        connection.close()


def _refuse_newer(applied: set[str]) -> None:
    unknown = sorted(applied - {migration.__name__ for migration in MIGRATIONS})
    if unknown:
        raise SchemaTooNew(
            f"The store's schema is newer than this proxy: it has migration(s) {', '.join(unknown)}, and this "
            f"version knows only up to {MIGRATIONS[-1].__name__}. Run the newer proxy, or use another store."
        )


def _migrate(connection: sqlite3.Connection) -> None:
    connection.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    applied = {row[0] for row in connection.execute("SELECT name FROM migrations")}
    _refuse_newer(applied)
    for migration in MIGRATIONS:
        if migration.__name__ in applied:
            continue
        connection.execute("BEGIN IMMEDIATE")
        # Another process opening the same file may have applied it since the read above: ask again under the lock.
        if connection.execute("SELECT 1 FROM migrations WHERE name = ?", (migration.__name__,)).fetchone():
            connection.execute("COMMIT")
            continue
        try:
            migration(connection)
            connection.execute(
                "INSERT INTO migrations (name, applied_at) VALUES (?, ?)", (migration.__name__, time.time())
            )
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        log.info("applied migration %s", migration.__name__)
