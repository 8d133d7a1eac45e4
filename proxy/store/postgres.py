"""The shared engine: PostgreSQL through psycopg 3, for several proxy replicas on one store.

The write jobs are the same plain functions as on SQLite, run by a synchronous connection on the writer thread
(psycopg has both sides; a commit here is a round trip and an fsync, never something for the event loop), each
in a savepoint: PostgreSQL aborts the whole transaction on a failing statement, so no job runs without one. A
job that PostgreSQL picks as a deadlock's victim (two replicas' groups inserting the same shared nodes in
another order) is rolled back to its savepoint and run again. Reads come from an async pool. The locks that
hold across replicas (`lock`, `try_lock`) are advisory locks, all held on one connection of the process
(`pg_locks`), never one pooled connection per holder: a request holding a session's lock must still be
able to read, and 32 requests holding locks must not take the whole pool. A process that dies releases its
locks with its connection. Migrations run under an advisory lock, so replicas starting together apply each
one once.

When the server goes away (a restart, an outage), whichever part meets it first (the writer, a read, the lock
connection) reports it to the engine's `Outage`, and from then on every request fails at once with a 503 until
a retry, spaced by back-off, finds the server again: the writer reconnects, the read pool replaces its dead
connections, the lock connection is opened anew. Nothing needs a restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
import psycopg.errors
from psycopg.pq import TransactionStatus
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from proxy.config.schema import redacted_url
from proxy.errors import StorageFull
from proxy.store.connection import Row
from proxy.store.dialect import Translated
from proxy.store.engine import (
    Outcome,
    StoreUnavailable,
    Works,
    apply_migrations,
    refuse_foreign,
    refuse_newer,
    run_job,
)
from proxy.store.outage import Outage, reason_of
from proxy.store.pg_connection import PgConnection, PgRow, Translations, adapt, configure, pg_rows
from proxy.store.pg_locks import AdvisoryLocks
from proxy.store.pg_migrations import MIGRATIONS

log = logging.getLogger(__name__)

T = TypeVar("T")

CONNECT_TIMEOUT_S = 10
RECONNECT_TIMEOUT_S = 3
"""For a connection made again while serving: one caller waits this long at most, the others fail fast."""
READ_WAIT_S = 5
"""How long a read waits for a pooled connection before the store counts as unreachable."""
MIGRATION_LOCK = "context-proxy: migrations"


def _connect(url: str, translations: Translations, timeout: int = CONNECT_TIMEOUT_S) -> PgConnection:
    try:
        connection = psycopg.Connection.connect(url, autocommit=True, row_factory=pg_rows, connect_timeout=timeout)
    except psycopg.OperationalError as exc:
        raise StoreUnavailable(f"cannot connect to the store at {redacted_url(url)}: {reason_of(exc)}") from None
    adapt(connection)
    return PgConnection(connection, translations)


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.errors.DeadlockDetected | psycopg.errors.SerializationFailure)


class PostgresEngine:
    name = "postgresql"
    errors: tuple[type[Exception], ...] = (psycopg.Error,)

    def __init__(
        self,
        url: str,
        writer: PgConnection,
        reads: AsyncConnectionPool[psycopg.AsyncConnection[PgRow]],
        locks: AdvisoryLocks,
        translations: Translations,
        outage: Outage,
    ) -> None:
        self._url = url
        self._writer = writer
        self._reads = reads
        self._locks = locks
        self._translations = translations
        self._outage = outage

    @classmethod
    async def open(cls, url: str, pool_size: int, executor: ThreadPoolExecutor) -> PostgresEngine:
        translations = Translations()
        loop = asyncio.get_running_loop()
        writer = await loop.run_in_executor(executor, _connect, url, translations)
        reads: AsyncConnectionPool[psycopg.AsyncConnection[PgRow]] = AsyncConnectionPool(
            url,
            connection_class=psycopg.AsyncConnection[PgRow],
            kwargs={"autocommit": True, "row_factory": pg_rows, "connect_timeout": CONNECT_TIMEOUT_S},
            configure=configure,
            min_size=1,
            max_size=max(1, pool_size),
            name="store-reads",
            open=False,
        )
        outage = Outage()
        locks = AdvisoryLocks(url, outage, RECONNECT_TIMEOUT_S)
        try:
            await loop.run_in_executor(executor, migrate, writer, redacted_url(url))
            await reads.open(wait=True, timeout=CONNECT_TIMEOUT_S)
            await locks.open(CONNECT_TIMEOUT_S)
        except BaseException:
            await reads.close()
            await locks.close()
            await loop.run_in_executor(executor, writer.raw.close)
            raise
        return cls(url, writer, reads, locks, translations, outage)

    def runs_inline(self, bulk: bool) -> bool:
        return False  # a commit is a round trip to the server

    def reclaim(self, documents: bool) -> None:
        """Deleted rows are dead tuples autovacuum reclaims as it does updated ones: nothing to do here."""

    def run_batch(self, works: Works) -> list[Outcome]:
        connection = self._begin()
        try:
            outcomes = self._run_batch(connection, works)
        except psycopg.OperationalError as exc:
            if connection.raw.closed:  # the server went away: whether the COMMIT happened cannot be known
                error = self._outage.failed(reason_of(exc))
                error.commit_unknown = True
                raise error from exc
            raise
        self._outage.recovered()
        return outcomes

    def _begin(self) -> PgConnection:
        """The writer's connection in a new transaction. A connection the server dropped while it was idle (a
        restart) is only found dead here: then a new one is made, once."""
        for retry in (True, False):
            if self._writer.raw.closed:
                self._outage.admit()
                try:
                    self._writer = _connect(self._url, self._translations, RECONNECT_TIMEOUT_S)
                except StoreUnavailable as exc:
                    raise self._outage.failed(str(exc)) from None
            try:
                self._writer.execute("BEGIN")
            except psycopg.OperationalError as exc:
                if retry and self._writer.raw.closed:
                    continue
                raise self._outage.failed(reason_of(exc)) from exc
            return self._writer
        raise AssertionError("unreachable")

    @staticmethod
    def _run_batch(connection: PgConnection, works: Works) -> list[Outcome]:
        outcomes: list[Outcome] = []
        try:
            for work, _atomic in works:
                outcomes.append(run_job(connection, work, True, storage_error, _retryable))
            connection.execute("COMMIT")
        except BaseException:
            raw = connection.raw
            if not raw.closed and raw.info.transaction_status != TransactionStatus.IDLE:
                raw.execute("ROLLBACK")
            raise
        return outcomes

    def close_writer(self) -> None:
        self._writer.raw.close()

    def unreachable(self) -> str | None:
        return self._outage.reason

    def storage_error(self, exc: BaseException) -> BaseException:
        return storage_error(exc)

    async def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        return await self._read(sql, params, _all)

    async def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        return await self._read(sql, params, _one)

    async def _read(
        self, sql: str, params: Sequence[Any], fetch: Callable[[psycopg.AsyncCursor[PgRow]], Awaitable[T]]
    ) -> T:
        """One read on a pooled connection. A connection found dead is a server that restarted (the pool's idle
        connections all died with it): the pool drops its dead ones and the read runs once more; a second
        failure, a server that refuses a new connection, or no connection in `READ_WAIT_S` is an outage."""
        translated = self._translations(sql)
        parameters = self._parameters(translated, params)
        self._outage.admit()
        for retry in (True, False):
            connection: psycopg.AsyncConnection[PgRow] | None = None
            try:
                async with self._reads.connection(timeout=READ_WAIT_S) as connection:
                    result = await fetch(await connection.execute(translated.sql, parameters))
            except PoolTimeout as exc:
                raise self._outage.failed(f"no connection within {READ_WAIT_S} s: {reason_of(exc)}") from exc
            except psycopg.OperationalError as exc:
                if connection is None or not connection.closed:
                    raise  # the statement's own failure
                if retry:
                    await self._probe()
                    await self._reads.check()
                    continue
                raise self._outage.failed(reason_of(exc)) from exc
            self._outage.recovered()
            return result
        raise AssertionError("unreachable")

    async def fetch_tuples(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
        return [tuple(row) for row in await self.fetchall(sql, params)]

    @asynccontextmanager
    async def lock(self, name: str) -> AsyncIterator[None]:
        await self._locks.acquire(name, wait=True)
        try:
            yield
        finally:
            await self._locks.release(name)

    @asynccontextmanager
    async def try_lock(self, name: str) -> AsyncIterator[bool]:
        held = await self._locks.acquire(name, wait=False)
        try:
            yield held
        finally:
            if held:
                await self._locks.release(name)

    async def close(self) -> None:
        await self._reads.close()
        await self._locks.close()

    async def _probe(self) -> None:
        """Ask the server for a connection of our own: at once `StoreUnavailable` when it is down, where the pool
        would wait for its own reconnection attempts."""
        try:
            connection = await psycopg.AsyncConnection.connect(self._url, connect_timeout=RECONNECT_TIMEOUT_S)
        except psycopg.OperationalError as exc:
            raise self._outage.failed(reason_of(exc)) from exc
        await connection.close()

    @staticmethod
    def _parameters(translated: Translated, params: Sequence[Any]) -> list[Any] | None:
        return translated.parameters(params) if translated.order else None


async def _all(cursor: psycopg.AsyncCursor[PgRow]) -> list[Row]:
    return list(await cursor.fetchall())


async def _one(cursor: psycopg.AsyncCursor[PgRow]) -> Row | None:
    return await cursor.fetchone()


def storage_error(exc: BaseException) -> BaseException:
    """PostgreSQL's "disk full" as the 507 a client can act on; any other failure unchanged."""
    if not isinstance(exc, psycopg.errors.DiskFull):
        return exc
    error = StorageFull("The proxy's storage is full: nothing was saved. The operator must free disk space.")
    error.__cause__ = exc
    return error


def migrate(connection: PgConnection, location: str) -> None:
    """Apply what is missing, each migration in its own transaction, under an advisory lock that every process
    opening the store takes: the first applies, the others wait and find it applied. Another application's
    database is refused first, untouched."""
    connection.execute("SELECT pg_advisory_lock(hashtextextended(?, 0))", (MIGRATION_LOCK,))
    try:
        _refuse_unknown(connection, location)
        apply_migrations(connection, MIGRATIONS, begin="BEGIN", time_type="DOUBLE PRECISION")
    finally:
        connection.execute("SELECT pg_advisory_unlock(hashtextextended(?, 0))", (MIGRATION_LOCK,))


def check_store(url: str) -> None:
    """StoreRefused (SchemaTooNew among them) if the database is another application's or was migrated by a
    newer proxy. Reads only; an empty database is fine."""
    connection = _connect(url, Translations())
    try:
        _refuse_unknown(connection, redacted_url(url))
    finally:
        connection.raw.close()


def _refuse_unknown(connection: PgConnection, location: str) -> None:
    """The tables and views of the schema the store's tables go to (the first of `search_path`)."""
    tables = {
        row[0]
        for row in connection.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema()"
        )
    }
    columns = [
        row[0]
        for row in connection.execute(
            "SELECT column_name FROM information_schema.columns "
            "WHERE table_schema = current_schema() AND table_name = 'migrations'"
        )
    ]
    applied: list[str] = []
    if "name" in columns:
        applied = [row[0] for row in connection.execute("SELECT name FROM migrations")]
    refuse_foreign(location, tables, columns or None, applied)
    refuse_newer(set(applied), MIGRATIONS)
