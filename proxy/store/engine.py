"""What `Database` needs of the engine under it (SQLite in `proxy.store.sqlite`, PostgreSQL in
`proxy.store.postgres`), and the parts both share: a group of write jobs as one transaction, each job in its
own savepoint, and the refusal of a store this proxy must not use: one from a newer proxy, or another
application's database.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from proxy.errors import StoreUnavailable
from proxy.store.connection import Connection, Row, WriteWork

__all__ = [
    "Engine",
    "Migration",
    "Outcome",
    "SchemaTooNew",
    "StoreRefused",
    "StoreUnavailable",
    "Works",
    "apply_migrations",
    "refuse_foreign",
    "run_job",
    "run_script",
]

log = logging.getLogger(__name__)

Outcome = tuple[Any, BaseException | None]
MIGRATION_NAME = re.compile(r"m[0-9]{3}_\w+")
"""How this proxy names its migrations, this version's and any newer one's."""
LISTED_TABLES = 5
Works = list[tuple[WriteWork[Any], bool]]
Migration = Callable[[Connection], None]
"""One named step of a schema (`proxy.store.migrations`, `proxy.store.pg_migrations`)."""


def run_script(connection: Connection, sql: str) -> None:
    """A migration's statements, separated by `;`, one after the other."""
    for statement in sql.split(";"):
        if statement.strip():
            connection.execute(statement)


class Engine(Protocol):
    name: str
    """`sqlite` or `postgresql`: what the few engine-specific queries (recall's full-text search) choose by."""
    errors: tuple[type[Exception], ...]
    """What a failing statement raises."""

    def runs_inline(self, bulk: bool) -> bool:
        """Whether the next group (`bulk`: it holds a bulk job) runs on the event loop, where a small commit costs
        less than a thread hop, rather than on the writer thread."""
        ...

    def run_batch(self, works: Works) -> list[Outcome]:
        """On the writer: every job of the group in one transaction, each in its own savepoint. Raises when the
        transaction itself failed (nothing in it was committed): `StoreUnavailable` when the server is gone."""
        ...

    def unreachable(self) -> str | None:
        """Why the store's server cannot be reached now; None when it can (always, for a file)."""
        ...

    def reclaim(self, documents: bool) -> None:
        """After a deletion: give the space back before the next group (SQLite: the write-ahead log truncated, free
        pages returned to the file system, and with `documents` the full-text index rewritten without the ones it
        was told to forget; PostgreSQL's autovacuum does it on its own)."""
        ...

    def close_writer(self) -> None: ...

    def storage_error(self, exc: BaseException) -> BaseException: ...

    async def fetchall(self, sql: str, params: Sequence[Any]) -> list[Row]: ...

    async def fetchone(self, sql: str, params: Sequence[Any]) -> Row | None: ...

    async def fetch_tuples(self, sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]: ...

    def lock(self, name: str) -> AbstractAsyncContextManager[None]: ...

    def try_lock(self, name: str) -> AbstractAsyncContextManager[bool]: ...

    async def close(self) -> None: ...


def run_job(
    connection: Connection,
    work: WriteWork[Any],
    atomic: bool,
    storage_error: Callable[[BaseException], BaseException],
    retry: Callable[[BaseException], bool] = lambda exc: False,
) -> Outcome:
    """A job's own failure is handed to the coroutine awaiting it (re-raised there), never swallowed; it must
    not end the group, which other requests' writes are part of. `retry`: failures worth running the job again
    for (PostgreSQL's deadlock victim: the other transaction has gone on)."""
    if not atomic:
        try:
            return work(connection), None
        except Exception as exc:
            return None, storage_error(exc)
    for attempt in range(3):
        connection.execute("SAVEPOINT job")
        try:
            result = work(connection)
        except Exception as exc:
            connection.execute("ROLLBACK TO job")
            connection.execute("RELEASE job")
            if attempt < 2 and retry(exc):
                continue
            return None, storage_error(exc)
        connection.execute("RELEASE job")
        return result, None
    raise AssertionError("unreachable")


class StoreRefused(Exception):
    """A store this proxy must not or cannot use, found when it is opened (before anything is written to it):
    its message names the store and what is wrong, for one line on the command line."""


class SchemaTooNew(StoreRefused):
    """The store was migrated by a newer version of the proxy: this one would misread or damage it."""


def apply_migrations(connection: Connection, migrations: Sequence[Migration], *, begin: str, time_type: str) -> None:
    """Apply, in order, each migration the store has not recorded, each in its own transaction (`begin` opens
    one that holds the store's write lock: SQLite's `BEGIN IMMEDIATE`; on PostgreSQL the caller holds an
    advisory lock around the whole run)."""
    connection.execute(
        f"CREATE TABLE IF NOT EXISTS migrations (name TEXT PRIMARY KEY, applied_at {time_type} NOT NULL)"
    )
    applied = {row[0] for row in connection.execute("SELECT name FROM migrations")}
    refuse_newer(applied, migrations)
    for migration in migrations:
        if migration.__name__ in applied:
            continue
        connection.execute(begin)
        # Another process opening the same store may have applied it since the read above: ask again under the lock.
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


def refuse_newer(applied: set[str], known: Sequence[Migration]) -> None:
    unknown = sorted(applied - {migration.__name__ for migration in known})
    if unknown:
        raise SchemaTooNew(
            f"The store's schema is newer than this proxy: it has migration(s) {', '.join(unknown)}, and this "
            f"version knows only up to {known[-1].__name__}. Run the newer proxy, or use another store."
        )


def refuse_foreign(
    location: str, tables: Collection[str], migration_columns: Collection[str] | None, applied: Collection[str]
) -> None:
    """StoreRefused unless the database is empty or a store of this proxy, which records its migrations, by
    this proxy's names, in `migrations (name, applied_at)`. `migration_columns`: that table's columns, None
    without one; `applied`: the names it holds (empty unless it has those columns). A `migrations` of ours with
    nothing recorded counts as ours only alone (a first run stopped before its first migration)."""
    others = sorted(set(tables) - {"migrations"})
    ours = (
        migration_columns is not None
        and {"name", "applied_at"} <= set(migration_columns)
        and all(MIGRATION_NAME.fullmatch(name) for name in applied)
        and bool(applied or not others)
    )
    if ours or not tables:
        return
    listed = ", ".join(sorted(tables)[:LISTED_TABLES]) + (", ..." if len(tables) > LISTED_TABLES else "")
    raise StoreRefused(
        f"the store {location} is another application's database (it has {len(tables)} table(s): {listed}), "
        "not empty and not this proxy's; nothing was written to it. Point the store at a new database or at the "
        "proxy's own."
    )
