"""The embedded engine: one SQLite file, a writer connection on the writer thread and an aiosqlite reader.

Where a group runs is measured, not guessed. With `synchronous=NORMAL` a WAL commit does not fsync and costs
tens of microseconds, less than handing the group to another thread (which also competes for the GIL), so
small groups run inline on the event loop (a 10-message request: 4.2 ms added instead of 6.9). Groups with a
bulk job (many stream events) and, with `FULL`, every group go to the writer thread, one hop per group, where
the commit overlaps the event loop's work (journal-on relay throughput 90-92 % of journal-off, against 80-88 %
inline). Reads use an aiosqlite connection, which in WAL mode sees committed data without waiting for the
writer. One process serves a file, so the locks across processes are the process's own (`History`'s).

A checkpoint (the write-ahead log copied into the file, both synced: two fdatasyncs, ~4 ms on a quiet local disk,
far more on a busy or network one) is the one write step that waits for the disk. SQLite runs its own inside the
commit that takes the log past 1,000 pages, which on the event loop stopped the whole proxy (about once a second
in a long agent session). So the writer's own is put off to `BACKSTOP_PAGES`, and every `CHECKPOINT_EVERY`
commits the next group goes to the writer thread, which checkpoints before it begins (`SqliteEngine.runs_inline`).

Before anything is written, `check_store` refuses a file the proxy cannot or must not use (a directory, a damaged
or read-only or locked file, another application's database, a newer proxy's store), each as one `StoreRefused`
naming the file; whatever SQLite raises while opening it is converted the same way (`refusal`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiosqlite

from proxy.errors import StorageFull
from proxy.store.connection import Row
from proxy.store.engine import (
    Outcome,
    StoreRefused,
    Works,
    apply_migrations,
    refuse_foreign,
    refuse_newer,
    run_job,
)
from proxy.store.migrations import MIGRATIONS

log = logging.getLogger(__name__)

BUSY_TIMEOUT_MS = 10_000

CHECKPOINT_EVERY = 100
"""Commits between two of the writer thread's checkpoints: ~800 pages of a long agent session's requests (about
eight small commits each), close to SQLite's own 1,000."""

BACKSTOP_PAGES = 10_000
"""The log's size at which the writer's own checkpoint still runs, inside a commit: reached only when commits write
far more pages than usual between two of the writer thread's checkpoints."""


class SqliteEngine:
    name = "sqlite"
    errors: tuple[type[Exception], ...] = (sqlite3.Error,)

    def __init__(self, path: Path, writer: sqlite3.Connection, reader: aiosqlite.Connection, inline: bool) -> None:
        self.path = path
        self.writer = writer
        self.reader = reader
        self.inline = inline
        """Small groups may commit on the event loop: `synchronous=NORMAL`, whose commits do not sync."""
        self._commits = 0
        """Since the last checkpoint."""
        self._reclaim = False
        """A deletion committed: the next group gives the space back first (`reclaim`)."""
        self._documents = False
        """It deleted documents of the full-text index: the index is rewritten without them."""

    @classmethod
    async def open(cls, path: Path, synchronous: str, executor: ThreadPoolExecutor) -> SqliteEngine:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(executor, check_store, path)
            path.parent.mkdir(parents=True, exist_ok=True)
            writer = await loop.run_in_executor(executor, _open_writer, path, synchronous)
        except (sqlite3.Error, OSError) as exc:
            raise refusal(path, exc) from exc
        try:
            reader = await _connect_reader(path, synchronous)
        except BaseException as exc:
            await loop.run_in_executor(executor, writer.close)
            if isinstance(exc, sqlite3.Error | OSError):
                raise refusal(path, exc) from exc
            raise
        return cls(path, writer, reader, inline=synchronous.upper() != "FULL")

    def runs_inline(self, bulk: bool) -> bool:
        return self.inline and not bulk and self._commits < CHECKPOINT_EVERY and not self._reclaim

    def run_batch(self, works: Works) -> list[Outcome]:
        if self._reclaim:  # on the writer thread (`runs_inline`)
            self._give_back()
        elif self._commits >= CHECKPOINT_EVERY:
            self._checkpoint()
        outcomes = _run_batch(self.writer, works)
        self._commits += 1
        return outcomes

    def reclaim(self, documents: bool) -> None:
        self._reclaim = True
        self._documents = self._documents or documents

    def _give_back(self) -> None:
        """Between two groups, on the writer thread: FTS5's index rewritten without the documents it was told to
        forget (they stay in its segments until a merge; the rewrite holds the writer for as long as the index
        takes to write), free pages returned to the file system (a store created with incremental auto-vacuum; an
        older one reuses them), and the write-ahead log checkpointed and truncated, so no copy of a deleted page is
        left in it. `secure_delete` zeroed the deleted content in the pages."""
        documents, self._reclaim, self._documents = self._documents, False, False
        self._commits = 0
        try:
            if documents:
                self.writer.execute("INSERT INTO recall_index (recall_index) VALUES ('optimize')")
            self.writer.execute("PRAGMA incremental_vacuum").fetchall()
            self.writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error as exc:
            log.warning("giving the store's space back after a deletion failed (a later deletion retries): %s", exc)

    def _checkpoint(self) -> None:
        """Between two groups, so that it completes (no write goes on meanwhile) and the next commit starts the log
        over. PASSIVE: it does not wait for readers; what a reader still holds is copied at the next one."""
        self._commits = 0
        try:
            self.writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error as exc:
            log.warning("checkpointing the store's write-ahead log failed (the next checkpoint retries): %s", exc)

    def close_writer(self) -> None:
        self.writer.close()

    def unreachable(self) -> str | None:
        return None

    def storage_error(self, exc: BaseException) -> BaseException:
        return storage_error(exc)

    async def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]:
        """One trip to the reader's thread (a cursor's execute, fetch and close were three): under load each
        waits for that thread, then the event loop, to get the GIL and a processor (`/healthz` reads `SELECT 1`:
        beside forty streams sealing on two busy processors, its 99th percentile fell from ~0.65 to ~0.4 s)."""
        return list(await self.reader.execute_fetchall(sql, params))

    async def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None:
        """The first row, in one trip as `fetchall` (every caller asks for one row by key, a `LIMIT 1`, or an
        aggregate)."""
        return next(iter(await self.reader.execute_fetchall(sql, params)), None)

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
        if len(works) == 1:
            # A group of one job (the common case) needs no savepoint: the transaction is the job's, and a failure
            # rolls it all back. Two statements fewer on every commit, inline on the event loop.
            outcomes.append(run_job(connection, works[0][0], False, storage_error))
            if outcomes[0][1] is not None:
                if connection.in_transaction:
                    connection.execute("ROLLBACK")
                return outcomes
        else:
            for work, atomic in works:
                outcomes.append(run_job(connection, work, atomic, storage_error))
        if not connection.in_transaction:
            # SQLite rolled the whole transaction back (SQLITE_FULL does): nothing of the group was written, and
            # the job's own failure says why better than COMMIT's "no transaction is active".
            failures = [error for _result, error in outcomes if error is not None]
            raise failures[0] if failures else sqlite3.OperationalError("the transaction was rolled back")
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
        if connection.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0] == 0:
            # A new file: free pages can go back to the file system after a deletion (`SqliteEngine.reclaim`). It
            # must be chosen before the first table; an older store keeps reusing its free pages instead.
            connection.execute("PRAGMA auto_vacuum=INCREMENTAL")
        for pragma in _pragmas(synchronous):
            connection.execute(pragma)
        connection.execute("PRAGMA secure_delete=ON")  # deleted content is zeroed, not left in free space
        connection.execute(f"PRAGMA wal_autocheckpoint={BACKSTOP_PAGES}")
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


def check_store(path: Path) -> None:
    """StoreRefused (SchemaTooNew among them) if the file at `path` is one the proxy cannot or must not use.
    Writes nothing: the file's bytes and times are left as they were. A missing file is fine where it can be
    created. A lock held by another process is waited for as the writer would (`BUSY_TIMEOUT_MS`)."""
    if path.is_dir():
        raise StoreRefused(f"the store {path} is a directory; point store.path at a file (it is created if missing)")
    if not path.exists():
        _refuse_uncreatable(path)
        return
    _refuse_unwritable(path)
    try:
        connection = sqlite3.connect(_uri(path, "ro"), uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            _refuse_unknown(path, connection)
        finally:
            connection.close()
        # The write lock, taken and given back at once: a store another process holds locked fails here, in one
        # line, not at the first request. In WAL mode readers never wait, so only this finds the lock.
        connection = sqlite3.connect(_uri(path, "rw"), uri=True, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("ROLLBACK")
        finally:
            connection.close()
    except sqlite3.Error as exc:
        raise refusal(path, exc) from exc


def _uri(path: Path, mode: str) -> str:
    return f"file:{quote(str(path))}?mode={mode}"


def _refuse_uncreatable(path: Path) -> None:
    existing = path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise StoreRefused(f"the store {path} cannot be created: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise StoreRefused(f"the store {path} cannot be created: the directory {existing} is read-only")


def _refuse_unwritable(path: Path) -> None:
    if not os.access(path, os.R_OK):
        raise StoreRefused(f"the store {path} cannot be read by this process (permission denied)")
    if not os.access(path, os.W_OK):
        raise StoreRefused(f"the store {path} is read-only for this process; the proxy writes to its store")
    sidecars = [path.with_name(path.name + suffix) for suffix in ("-wal", "-shm")]
    if not os.access(path.parent, os.W_OK | os.X_OK) and not all(sidecar.exists() for sidecar in sidecars):
        raise StoreRefused(
            f"the store {path} is in a read-only directory, where SQLite cannot create its -wal and -shm files"
        )


def _refuse_unknown(path: Path, connection: sqlite3.Connection) -> None:
    tables = {
        row[0]
        for row in connection.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")
        if not row[0].startswith("sqlite_")
    }
    columns = [row[1] for row in connection.execute("PRAGMA table_info(migrations)")] if tables else []
    applied: list[str] = []
    if "name" in columns:
        applied = [row[0] for row in connection.execute("SELECT name FROM migrations")]
    refuse_foreign(str(path), tables, columns or None, applied)
    refuse_newer(set(applied), MIGRATIONS)


def refusal(path: Path, exc: sqlite3.Error | OSError) -> StoreRefused:
    """What SQLite (or the file system) said when opening the store at `path`, as the one line to show."""
    if isinstance(exc, OSError):
        return StoreRefused(f"the store {path} cannot be opened: {exc.strerror or exc}")
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF  # the primary code of an extended one
    if code in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
        return StoreRefused(
            f"the store {path} is locked by another process (still after {BUSY_TIMEOUT_MS // 1000} s): stop that "
            "process, or point store.path at another file"
        )
    if code == sqlite3.SQLITE_READONLY:
        return StoreRefused(f"the store {path} is read-only for this process ({exc}); the proxy writes to its store")
    if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
        return StoreRefused(
            f"the store {path} is not a SQLite database, or is damaged ({exc}): restore it from a backup, or point "
            "store.path at a new file"
        )
    return StoreRefused(f"the store {path} cannot be opened: {exc}")


def migrate(connection: sqlite3.Connection) -> None:
    apply_migrations(connection, MIGRATIONS, begin="BEGIN IMMEDIATE", time_type="REAL")
