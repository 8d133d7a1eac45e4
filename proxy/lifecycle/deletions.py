"""Deleting a session or purging a tenant, as the routes, the CLI and retention ask for it.

A session's deletion holds the session's lock (in this process and, on PostgreSQL, across replicas), so it falls
between two of its requests' saves: a request located before it is refused when it is saved (`SessionDeleted`),
never stored on a half-deleted session. The rows go in one write job (`forget.forget`), on the writer thread;
then the space is given back (`Database.reclaim`), also off the event loop. What this process remembers of the
tenant's rows between requests (its recent paths, recall's indexed ids: `ProcessCache`) is forgotten with them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Protocol

from proxy.errors import NotFound
from proxy.history.store import History
from proxy.lifecycle.forget import Forgotten, forget
from proxy.store.database import Database


class ProcessCache(Protocol):
    """What a process keeps of a tenant's stored rows between requests, to skip reading them again: after a
    deletion it may name rows that are gone (a path, an indexed message), so the tenant's part is forgotten."""

    def forget_tenant(self, tenant: str) -> None: ...


class Deletions:
    def __init__(self, db: Database, history: History, caches: Sequence[ProcessCache] = ()) -> None:
        """`caches`: this process's caches beside the history's recent paths (recall's indexed ids), given by the
        serving layer that builds both, so no stage imports another's."""
        self._db = db
        self._history = history
        self._caches: tuple[ProcessCache, ...] = (history.recent, *caches)

    async def delete_session(self, tenant: str, session_id: str) -> Forgotten:
        """Everything the tenant's session stored; NotFound, as for any unknown id, if the tenant has no such
        session (another tenant's id included)."""
        async with self._history.lock(tenant, session_id):
            forgotten = await self._forget(tenant, [session_id])
        if not forgotten.sessions:
            raise NotFound(f"No session with id '{session_id}'.", code="session_not_found")
        await self.reclaim(forgotten)
        return forgotten

    async def delete_sessions(self, tenant: str, session_ids: Sequence[str], *, idle_before: float) -> Forgotten:
        """Several of a tenant's sessions in one transaction (retention's batches): those still idle since before
        `idle_before` when it runs (one used meanwhile stays). Their requests' locks are not taken: a request
        that raced it is refused at its save all the same."""
        return await self._forget(tenant, session_ids, idle_before)

    async def purge_tenant(self, tenant: str) -> Forgotten:
        """Everything the tenant stored, in one transaction."""
        forgotten = await self._forget(tenant, None)
        if forgotten.rows:
            await self.reclaim(forgotten)
        return forgotten

    async def reclaim(self, forgotten: Forgotten) -> None:
        """Give back the space what was forgotten held (`Database.reclaim`)."""
        await self._db.reclaim(documents="recall_messages" in forgotten.rows)

    async def _forget(
        self, tenant: str, session_ids: Sequence[str] | None, idle_before: float | None = None
    ) -> Forgotten:
        work = functools.partial(
            forget, dialect=self._db.dialect, tenant=tenant, session_ids=session_ids, idle_before=idle_before
        )
        forgotten = await self._db.write(work, bulk=True)
        if forgotten.rows:
            for cache in self._caches:
                cache.forget_tenant(tenant)
        return forgotten
