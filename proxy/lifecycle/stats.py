"""What the store holds: its size on disk, the space it could give back, rows per table, and how recently its
sessions were used; for `/metrics` and `context-proxy stats`.

SQLite counts its rows exactly (each count walks the table's smallest index, on the reader's thread) and reads its
size from the file's pages and the write-ahead log; PostgreSQL's exact counts are full scans, so it reports the
planner's estimates (`pg_class.reltuples`, refreshed by autovacuum and ANALYZE) and its relations' sizes. Either
way the figures are read at most every `STATS_TTL_S` per process, however often they are scraped.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from proxy.canonical.types import Clock
from proxy.store.database import Database

TABLES = (
    "sessions",
    "messages",
    "message_tokens",
    "message_variants",
    "context_settings",
    "summaries",
    "pins",
    "recall_messages",
    "journal_steps",
    "journal_events",
    "compaction_events",
    "summarizer_calls",
)
"""The tables that hold what tenants stored (the rest are the store's own bookkeeping)."""
STATS_TTL_S = 60.0
IDLE_DAYS = (1, 7, 30, 90)
"""The bounds of the sessions' last-activity buckets (days)."""
DAY_S = 86_400.0


@dataclass(frozen=True)
class StoreStats:
    engine: str
    bytes: int
    """The store's size on disk: the SQLite file and its write-ahead log, or the tables' relations."""
    free_bytes: int
    """SQLite: pages free inside the file (reused by later writes, or given back by incremental vacuum)."""
    rows: dict[str, int]
    estimated: bool
    """Row counts are PostgreSQL's planner estimates."""
    idle_sessions: dict[str, int]
    """Sessions by their last activity: `1d` (used within a day), `7d`, …, `older`."""

    def as_json(self) -> dict[str, object]:
        return {
            "object": "store.stats",
            "engine": self.engine,
            "bytes": self.bytes,
            "free_bytes": self.free_bytes,
            "rows": self.rows,
            "rows_estimated": self.estimated,
            "sessions_by_last_activity": self.idle_sessions,
        }


class StatsReader:
    """The store's `StoreStats`, read at most once a minute (`/metrics` scrapes may come every few seconds)."""

    def __init__(self, db: Database, clock: Clock = time.time) -> None:
        self._db = db
        self._clock = clock
        self._last: tuple[float, StoreStats] | None = None

    async def read(self, *, fresh: bool = False) -> StoreStats:
        now = self._clock()
        if not fresh and self._last is not None and now - self._last[0] < STATS_TTL_S:
            return self._last[1]
        if self._db.dialect == "sqlite":
            size, free, rows = await self._sqlite()
        else:
            size, free, rows = await self._postgresql()
        stats = StoreStats(self._db.dialect, size, free, rows, self._db.dialect != "sqlite", await self._idle(now))
        self._last = (now, stats)
        return stats

    async def _sqlite(self) -> tuple[int, int, dict[str, int]]:
        page = await self._pragma("page_size")
        size = (await self._pragma("page_count")) * page
        free = (await self._pragma("freelist_count")) * page
        if self._db.path is not None:
            wal = self._db.path.with_name(self._db.path.name + "-wal")
            size += wal.stat().st_size if wal.exists() else 0
        rows = {}
        for table in TABLES:
            row = await self._db.fetchone(f"SELECT COUNT(*) FROM {table}")
            rows[table] = 0 if row is None else int(row[0])
        return size, free, rows

    async def _pragma(self, name: str) -> int:
        row = await self._db.fetchone(f"PRAGMA {name}")
        return 0 if row is None else int(row[0])

    async def _postgresql(self) -> tuple[int, int, dict[str, int]]:
        found = await self._db.fetchall(
            "SELECT relname, GREATEST(reltuples, 0)::bigint AS estimate, pg_total_relation_size(oid) AS size "
            "FROM pg_class WHERE relkind = 'r' AND pg_table_is_visible(oid) "
            "AND relname IN (SELECT value FROM json_each(?))",
            (_listed(TABLES),),
        )
        rows = {table: 0 for table in TABLES}
        size = 0
        for row in found:
            rows[row[0]] = int(row[1])
            size += int(row[2])
        return size, 0, rows

    async def _idle(self, now: float) -> dict[str, int]:
        bounds = [now - days * DAY_S for days in IDLE_DAYS]
        cases = " ".join(
            f"WHEN updated_at >= {bound!r} THEN '{days}d'" for days, bound in zip(IDLE_DAYS, bounds, strict=True)
        )
        rows = await self._db.fetchall(
            f"SELECT CASE {cases} ELSE 'older' END AS bucket, COUNT(*) FROM sessions GROUP BY 1"
        )
        counted = {f"{days}d": 0 for days in IDLE_DAYS} | {"older": 0}
        counted.update({row[0]: int(row[1]) for row in rows})
        return counted


def _listed(values: tuple[str, ...]) -> str:
    return json.dumps(list(values))
