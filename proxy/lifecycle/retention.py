"""Retention: sessions idle longer than `store.retention_days` (or their tenant's `tenant_retention_days`) are
deleted with everything they stored.

A sweep deletes in bounded batches: at most `BATCH_SESSIONS` sessions of one tenant per transaction (each a
`forget.forget` job on the writer thread), with a pause between batches so requests' writes are never queued
behind a long run of deletions, and at most `MAX_BATCHES` batches per sweep (the next sweep goes on). The space
is given back once at the end. A dry run reads which sessions would go and writes nothing. Replicas sharing a
PostgreSQL store sweep one at a time (`Database.try_lock`); the clock is given, so tests move time by hand.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from dataclasses import dataclass, field

from proxy.canonical.types import Clock
from proxy.config.schema import StoreConfig
from proxy.lifecycle.deletions import Deletions
from proxy.lifecycle.forget import Forgotten
from proxy.store.database import Database

log = logging.getLogger(__name__)

DAY_S = 86_400.0
BATCH_SESSIONS = 100
"""Sessions deleted in one transaction: a 4,000-message session's deletion took ~0.4 s on the writer thread."""
MAX_BATCHES = 1_000
"""Batches in one sweep: the next sweep (an hour later) takes what is left."""
BATCH_PAUSE_S = 0.05
"""Between two batches: the writer's queue drains, so requests' writes wait for one batch at most."""
SWEEP_INTERVAL_S = 3600.0
FIRST_SWEEP_S = 60.0
"""After a start: not in the rush of a fleet of replicas starting together."""
LOCK = "retention"
SWEPT_CHARS = 100
"""About what one listed session makes a sweep's answer look at: what decides whether listing them is worth a
thread (`proxy.offload`; 10,000 sessions took ~80 ms on a busy event loop)."""


@dataclass(frozen=True)
class Expired:
    tenant: str
    session_id: str
    updated_at: float


@dataclass
class Sweep:
    """What one sweep deleted (or, in a dry run, would delete)."""

    dry_run: bool
    sessions: list[Expired] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)

    def as_json(self, now: float) -> dict[str, object]:
        return {
            "object": "retention.sweep",
            "dry_run": self.dry_run,
            "sessions": [
                {
                    "tenant": expired.tenant,
                    "id": expired.session_id,
                    "idle_days": round((now - expired.updated_at) / DAY_S, 1),
                }
                for expired in self.sessions
            ],
            "rows": dict(sorted(self.rows.items())),
        }


class Retention:
    def __init__(self, db: Database, deletions: Deletions, config: StoreConfig, *, clock: Clock = time.time) -> None:
        self._db = db
        self._deletions = deletions
        self._config = config
        self._clock = clock

    @property
    def enabled(self) -> bool:
        return self._config.retention_days is not None or any(
            days is not None for _tenant, days in self._config.tenant_retention_days
        )

    async def sweep(self, *, dry_run: bool = False, max_batches: int = MAX_BATCHES) -> Sweep:
        """Delete the sessions idle past their retention, oldest first, batch by batch."""
        result = Sweep(dry_run)
        now = self._clock()
        if dry_run:
            result.sessions = await self._expired(now, None)
            return result
        for _ in range(max_batches):
            batch = await self._expired(now, BATCH_SESSIONS)
            if not batch:
                break
            tenant = batch[0].tenant
            ids = [expired.session_id for expired in batch if expired.tenant == tenant]
            cutoff = now - (self._config.retention_of(tenant) or 0) * DAY_S
            forgotten = await self._deletions.delete_sessions(tenant, ids, idle_before=cutoff)
            gone = set(forgotten.sessions)
            result.sessions.extend(e for e in batch if e.tenant == tenant and e.session_id in gone)
            for table, count in forgotten.rows.items():
                result.rows[table] = result.rows.get(table, 0) + count
            if not forgotten.sessions:
                break  # what was due went meanwhile (another process): the next sweep looks again
            await asyncio.sleep(BATCH_PAUSE_S)
        if result.rows:
            await self._deletions.reclaim(Forgotten((), result.rows))
        return result

    async def sweep_shared(self) -> Sweep | None:
        """A sweep by the one process that holds the store's retention lock; None if another holds it."""
        async with self._db.try_lock(LOCK) as held:
            if not held:
                return None
            return await self.sweep()

    async def _expired(self, now: float, limit: int | None) -> list[Expired]:
        """The sessions past their retention, oldest first (`limit` of them, of the oldest one's tenant first)."""
        special = dict(self._config.tenant_retention_days)
        found: list[Expired] = []
        default = self._config.retention_days
        bounded = "" if limit is None else f" LIMIT {int(limit)}"
        if default is not None:
            rows = await self._db.fetchall(
                "SELECT tenant, id, updated_at FROM sessions WHERE updated_at < ? "
                f"AND NOT (tenant IN (SELECT value FROM json_each(?))) ORDER BY updated_at, tenant, id{bounded}",
                (now - default * DAY_S, _json_list(special)),
            )
            found.extend(Expired(row[0], row[1], float(row[2])) for row in rows)
        for tenant, days in special.items():
            if days is None:
                continue
            rows = await self._db.fetchall(
                f"SELECT tenant, id, updated_at FROM sessions WHERE tenant = ? AND updated_at < ? "
                f"ORDER BY updated_at, id{bounded}",
                (tenant, now - days * DAY_S),
            )
            found.extend(Expired(row[0], row[1], float(row[2])) for row in rows)
        found.sort(key=lambda expired: (expired.updated_at, expired.tenant, expired.session_id))
        return found if limit is None else found[:limit]


def _json_list(values: dict[str, int | None]) -> str:
    return json.dumps(sorted(values))


async def sweep_periodically(retention: Retention) -> None:
    """The serving process's retention: a first sweep a minute after start, then every hour."""
    await asyncio.sleep(FIRST_SWEEP_S)
    while True:
        try:
            swept = await retention.sweep_shared()
        except Exception as exc:
            log.warning("retention: the sweep failed, to be tried again: %s", exc)
        else:
            if swept is not None and swept.sessions:
                log.info("retention: deleted %d idle session(s)", len(swept.sessions))
        await asyncio.sleep(SWEEP_INTERVAL_S)
