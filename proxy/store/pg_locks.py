"""Advisory locks across the replicas sharing a PostgreSQL store, all held on one connection of the process.

One connection, not one pooled connection per holder: a request holding a session's lock must still be able to
read, and 32 requests holding locks must not take the read pool. A process that dies releases its locks with
its connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

import psycopg

from proxy.errors import StoreUnavailable
from proxy.store.outage import Outage, reason_of

log = logging.getLogger(__name__)

LOCK_POLL_S = 0.005
LOCK_POLL_MAX_S = 0.1


class AdvisoryLocks:
    """Session-level advisory locks of this process, all on one connection of their own.

    A lock another process holds is waited for by asking again (`pg_try_advisory_lock`, from 5 ms backing off to
    100 ms), not by a blocking `pg_advisory_lock`, which would hold the shared connection for everyone. Callers
    never hold one name twice at once (the session's asyncio lock, one pre-compaction per session come first),
    so PostgreSQL's re-entrant counting stays one per name. An acquisition whose caller is cancelled is finished
    and undone, so a lock never stays held for a caller that has gone. A lost connection released every lock it
    held: releasing one then has nothing left to do.
    """

    def __init__(self, url: str, outage: Outage, reconnect_timeout_s: int) -> None:
        self._url = url
        self._reconnect_timeout_s = reconnect_timeout_s
        self._outage = outage
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._undoing: set[asyncio.Task[None]] = set()

    async def open(self, connect_timeout_s: int) -> None:
        self._connection = await psycopg.AsyncConnection.connect(
            self._url, autocommit=True, connect_timeout=connect_timeout_s
        )

    async def close(self) -> None:
        if self._undoing:
            await asyncio.gather(*self._undoing, return_exceptions=True)
        if self._connection is not None:
            await self._connection.close()

    async def acquire(self, name: str, *, wait: bool) -> bool:
        delay = LOCK_POLL_S
        while True:
            attempt = asyncio.ensure_future(self._query("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", name))
            try:
                held = await asyncio.shield(attempt)
            except asyncio.CancelledError:
                attempt.add_done_callback(functools.partial(self._undo, name))
                raise
            if held or not wait:
                return held
            await asyncio.sleep(delay)
            delay = min(2 * delay, LOCK_POLL_MAX_S)

    async def release(self, name: str) -> None:
        connection = self._connection
        if connection is None or connection.closed:
            return
        with contextlib.suppress(StoreUnavailable):  # the connection died, and the lock with it
            await asyncio.shield(self._query("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", name))

    async def _query(self, sql: str, name: str) -> bool:
        """A connection the server dropped while it was idle (a restart) is only found dead here: then a new one
        is made, once."""
        for retry in (True, False):
            connection = self._connection
            if connection is None or connection.closed:
                # Whatever the lost connection held was released with it; what is held from now on is held again.
                self._outage.admit()
                log.warning("the store's lock connection was lost; reconnecting")
                try:
                    await self.open(self._reconnect_timeout_s)
                except psycopg.OperationalError as exc:
                    raise self._outage.failed(reason_of(exc)) from exc
                connection = self._connection
                assert connection is not None
            try:
                cursor = await connection.execute(sql, (name,))
                row = await cursor.fetchone()
            except psycopg.OperationalError as exc:
                if not connection.closed:
                    raise
                if retry:
                    continue
                raise self._outage.failed(reason_of(exc)) from exc
            return bool(row is not None and row[0])
        raise AssertionError("unreachable")

    def _undo(self, name: str, attempt: asyncio.Future[bool]) -> None:
        if attempt.cancelled() or attempt.exception() is not None or not attempt.result():
            return
        task = asyncio.ensure_future(self.release(name))
        self._undoing.add(task)
        task.add_done_callback(self._undoing.discard)
