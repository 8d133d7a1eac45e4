"""Compaction events: what each compaction started, wrote or failed at, kept per session.

Every event is one structured INFO line on `proxy.compaction.events` (`key=value`, like the compactor's own
line: numbers, names and ids, never keys or message text) and one row of `compaction_events` (migration
`m008_compaction_events`), read back oldest first by `GET /sessions/{id}/events` and `context-proxy sessions
events`. An event is a record of work, not part of it: a failure to store one is logged and the request that
compacted goes on.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import astuple, dataclass
from typing import Any, Literal

from proxy.canonical.types import Clock
from proxy.observability.logs import FIELDS_ATTRIBUTE
from proxy.observability.metrics import Metrics
from proxy.store.connection import Connection, Row
from proxy.store.database import Database

log = logging.getLogger(__name__)

EventKind = Literal["start", "complete", "error"]

DETAIL_LOG_CHARS = 200
"""An error's detail is cut to this in the log line; the row keeps it whole."""

_COLUMNS = (
    "session_id, event, strategy, range_start, range_end, tokens_before, tokens_after, duration_ms, summary_id, "
    "generated_by, model, background, detail"
)


@dataclass(frozen=True)
class CompactionEvent:
    session_id: str
    event: EventKind
    strategy: str
    """What the compaction did or tried (e.g. 'llm', 'fallback', 'hierarchical-llm')."""
    range_start: int | None = None
    range_end: int | None = None
    """The path positions [range_start, range_end) it summarizes."""
    tokens_before: int | None = None
    """What the range cost before (its messages, or the summaries it replaces)."""
    tokens_after: int | None = None
    """What its summary costs."""
    duration_ms: float | None = None
    summary_id: int | None = None
    generated_by: str | None = None
    """'llm' or 'fallback', once a summary was written."""
    model: str | None = None
    """The summarizer model."""
    background: bool = False
    """Run ahead of need (pre-compaction), not on a request's path."""
    detail: str | None = None
    """On an error: why, in the proxy's own words (never message text or keys)."""


class CompactionEvents:
    def __init__(self, db: Database, clock: Clock = time.time, metrics: Metrics | None = None) -> None:
        self._db = db
        self._clock = clock
        self._metrics = Metrics() if metrics is None else metrics

    async def record(self, tenant: str, event: CompactionEvent) -> None:
        """Log the event and store it; never raises for a store that cannot take it."""
        log.info("%s", log_line(event), extra={FIELDS_ATTRIBUTE: log_fields(event)})
        if event.event != "start":
            outcome = "error" if event.event == "error" else event.generated_by or "rule"
            self._metrics.compaction(event.strategy, outcome)
        row = (tenant, *astuple(event), self._clock())

        def write(connection: Connection) -> None:
            connection.execute(
                f"INSERT INTO compaction_events (tenant, {_COLUMNS}, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                row,
            )

        try:
            await self._db.write(write, atomic=False)
        except Exception as exc:
            log.warning(
                "compaction event=%s session=%s was not stored: %s", event.event, event.session_id, exc, exc_info=exc
            )

    async def for_session(
        self, tenant: str, session_id: str, limit: int, offset: int = 0
    ) -> tuple[list[dict[str, Any]], bool]:
        """A page of the session's events, oldest first, as JSON-ready dicts, and whether more follow."""
        rows = await self._db.fetchall(
            f"SELECT id, {_COLUMNS}, created_at FROM compaction_events WHERE tenant = ? AND session_id = ? "
            "ORDER BY id LIMIT ? OFFSET ?",
            (tenant, session_id, limit + 1, offset),
        )
        return [_as_json(row) for row in rows[:limit]], len(rows) > limit

    async def latest(self, tenant: str, session_id: str, limit: int) -> list[dict[str, Any]]:
        """The session's latest `limit` events, newest first."""
        rows = await self._db.fetchall(
            f"SELECT id, {_COLUMNS}, created_at FROM compaction_events WHERE tenant = ? AND session_id = ? "
            "ORDER BY id DESC LIMIT ?",
            (tenant, session_id, limit),
        )
        return [_as_json(row) for row in rows]


def log_line(event: CompactionEvent) -> str:
    """`compaction event=complete session=s1 strategy=llm range=[2,14) tokens=5120->410 ...`: one line, `-` for
    what the event does not know."""
    fields = log_fields(event)
    if event.detail is not None:
        fields["detail"] = json.dumps(fields["detail"])
    return "compaction " + " ".join(f"{key}={_text(value)}" for key, value in fields.items())


def log_fields(event: CompactionEvent) -> dict[str, object]:
    """The line's fields, which a JSON log record carries as keys (`proxy.observability.logs`)."""
    return dict(
        [
            ("event", event.event),
            ("session", event.session_id),
            ("strategy", event.strategy),
            ("range", None if event.range_start is None else f"[{event.range_start},{_text(event.range_end)})"),
            ("tokens", None if event.tokens_before is None else f"{event.tokens_before}->{_text(event.tokens_after)}"),
            ("duration_ms", None if event.duration_ms is None else f"{event.duration_ms:.0f}"),
            ("summary", event.summary_id),
            ("generated_by", event.generated_by),
            ("model", event.model),
            ("background", "true" if event.background else "false"),
            ("detail", None if event.detail is None else event.detail[:DETAIL_LOG_CHARS]),
        ]
    )


def _text(value: object) -> str:
    return "-" if value is None else str(value)


def _as_json(row: Row) -> dict[str, Any]:
    event = {key: row[key] for key in row.keys()}  # noqa: SIM118  # Row is not a mapping
    event["background"] = bool(event["background"])
    return event
