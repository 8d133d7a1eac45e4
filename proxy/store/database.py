"""The store behind the proxy: one writer with group commit, readers, ordered migrations, on SQLite (one file,
the default) or PostgreSQL (shared by several replicas), `proxy.store.sqlite` and `proxy.store.postgres`.

Every write is a *job* (a plain function of a connection) handed to the one writer, which runs all jobs that are
waiting as one transaction and commits once: under load, many small writes (journal events of concurrent
streams, new messages of concurrent sessions) share one commit (measured on SQLite: ~200k rows/s against ~6k
with a commit per row; on PostgreSQL a commit is a round trip and an fsync, which the group shares too). A
job's caller resumes only after its commit, so "awaited" means "durable". Each multi-statement job runs in a
savepoint, so one failing job rolls back alone. The engine says where a group runs (the event loop or the
writer thread) and serves reads and the locks that hold across processes.
"""

from __future__ import annotations

import asyncio
import json
import logging
import string
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

from proxy.store import sqlite
from proxy.store.connection import Row, WriteWork
from proxy.store.engine import Engine, SchemaTooNew, StoreRefused, StoreUnavailable

__all__ = [
    "Database",
    "SchemaTooNew",
    "StoreRefused",
    "StoreUnavailable",
    "WriteWork",
    "check_store",
    "lock_name",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_POOL_SIZE = 10


@dataclass
class _Job(Generic[T]):
    work: WriteWork[T]
    atomic: bool
    bulk: bool
    future: asyncio.Future[T] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class Database:
    def __init__(self, engine: Engine, executor: ThreadPoolExecutor, target: Path | str) -> None:
        self.engine = engine
        self.target = target
        """What was opened: the SQLite file or the PostgreSQL URL."""
        self.path = target if isinstance(target, Path) else None
        """The SQLite file; None on PostgreSQL."""
        self.dialect = engine.name
        self.errors = engine.errors
        """What a failing statement raises, for the few callers that carry on without their write (recall)."""
        self._executor = executor
        self._jobs: asyncio.Queue[_Job[Any]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, location: Path | str, synchronous: str = "NORMAL", *, pool_size: int = DEFAULT_POOL_SIZE
    ) -> Database:
        """`location`: a SQLite file, or a `postgresql://` URL. Migrates the store first (safely when several
        processes open it at once), after refusing, before any write, a store it cannot or must not use
        (`StoreRefused`: another application's database, a newer proxy's, a damaged, read-only or locked file)."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store-writer")
        engine: Engine
        try:
            if isinstance(location, Path):
                engine = await sqlite.SqliteEngine.open(location, synchronous, executor)
            else:
                from proxy.store.postgres import PostgresEngine  # psycopg only where PostgreSQL is used

                engine = await PostgresEngine.open(location, pool_size, executor)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        database = cls(engine, executor, location)
        database._task = asyncio.create_task(database._write_loop(), name="database-writer")
        return database

    async def close(self) -> None:
        if self._task is not None:
            await self._jobs.join()
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.engine.close()
        await asyncio.get_running_loop().run_in_executor(self._executor, self.engine.close_writer)
        self._executor.shutdown(wait=True)

    async def write(self, work: WriteWork[T], *, atomic: bool = True, bulk: bool = False) -> T:
        """Run `work(connection)` on the writer in its next transaction; return once committed.

        `work` must be quick and must not touch the event loop: it may run on the writer thread. `atomic=False`
        skips the savepoint for a job of a single statement (SQLite rolls back a failing statement alone;
        PostgreSQL runs every job in a savepoint). `bulk` marks a job that writes many rows (a group of stream
        events): its group goes to the writer thread even where small groups run inline, so the commit overlaps
        the parsing of the next chunks instead of pausing the event loop.
        """
        if self._task is None or self._task.done():
            raise RuntimeError("database is closed")
        job: _Job[T] = _Job(work, atomic, bulk)
        self._jobs.put_nowait(job)
        return await job.future

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[Row]:
        return await self.engine.fetchall(sql, params)

    async def fetchone(self, sql: str, params: Sequence[Any] = ()) -> Row | None:
        return await self.engine.fetchone(sql, params)

    async def fetch_tuples(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        """Rows as plain tuples: cheaper than rows by name, for long results (a session's whole path)."""
        return await self.engine.fetch_tuples(sql, params)

    def unreachable(self) -> str | None:
        """Why the store cannot be reached now (PostgreSQL down); None when it can."""
        return self.engine.unreachable()

    async def reclaim(self, *, documents: bool = False) -> None:
        """Give back the space a deletion freed (`Engine.reclaim`; `documents`: it deleted full-text index entries),
        on the writer between two groups, never on the event loop; returns once done."""
        self.engine.reclaim(documents)
        await self.write(lambda connection: None, bulk=True)

    def lock(self, name: str) -> AbstractAsyncContextManager[None]:
        """Held by one process at a time among all that share the store (on SQLite, one process is all)."""
        return self.engine.lock(name)

    def try_lock(self, name: str) -> AbstractAsyncContextManager[bool]:
        """Like `lock`, without waiting: True if this process holds it for the block, False if another does."""
        return self.engine.try_lock(name)

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        while True:
            batch = [await self._jobs.get()]
            while not self._jobs.empty():
                batch.append(self._jobs.get_nowait())
            try:
                live = [job for job in batch if not job.future.cancelled()]
                works = [(job.work, job.atomic) for job in live]
                try:
                    if engine.runs_inline(any(job.bulk for job in live)):
                        outcomes = engine.run_batch(works)
                    else:
                        outcomes = await loop.run_in_executor(self._executor, engine.run_batch, works)
                except Exception as exc:
                    # The transaction itself failed (disk full, I/O error, the server gone): nothing in it was
                    # committed, and the writer goes on with the next group (an outage is logged where it is seen).
                    if not isinstance(exc, StoreUnavailable):
                        log.error("database write transaction failed: %s", exc)
                    outcomes = [(None, engine.storage_error(exc))] * len(live)
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


_ID_CHARACTERS = (string.ascii_letters + string.digits + "-_").encode()
"""What an id joined into a JSON array unencoded may hold."""


def id_array(ids: Iterable[str]) -> str:
    """A JSON array of ids, for `json_each` (`store.dialect` passes it to PostgreSQL as a list). Node ids are hex
    digests and are joined as they are (`json.dumps` takes ~0.1 ms for a path of 800, on every request; this
    ~0.03 ms); ids of other characters are encoded."""
    listed = list(ids)
    plain = "".join(listed)
    if plain.isascii() and not plain.encode().translate(None, _ID_CHARACTERS):
        return '["' + '","'.join(listed) + '"]' if listed else "[]"
    return json.dumps(listed)


def lock_name(kind: str, tenant: str, *subject: str | int) -> str:
    """The name of a lock, as `Database.lock` takes it: one per kind (a session's requests, its pre-compaction,
    the writing of a span over one range) and subject (a session id, a range), unambiguous whatever they hold."""
    return json.dumps([kind, tenant, *subject])


def check_store(location: Path | str) -> None:
    """StoreRefused (or StoreUnavailable) if `Database.open` would refuse the store: what `serve` checks before
    it starts, to say so in one line. Writes nothing; a missing store is fine."""
    if isinstance(location, Path):
        sqlite.check_store(location)
    else:
        from proxy.store.postgres import check_store as check_postgres

        check_postgres(location)
