"""Settling what a previous process left open, and pruning old events; run before serving and periodically.

At startup `recover` classifies every step left open: one whose events show the answer ended (a finish_reason
or a `done`) is sealed into history as `complete`; one with an `error` event is `failed`; the rest are kept as
`interrupted` with their partial text — never deleted. Events of ended steps are pruned after
`journal.keep_events` (the step row keeps the assembled answer, which is enough to replay it); interrupted
steps keep theirs.
"""

from __future__ import annotations

import logging
import sqlite3
from dataclasses import dataclass, field

from proxy.journal.steps import (
    JSON_ENCODER,
    PRUNABLE,
    STEP_COLUMNS,
    EventType,
    StepStatus,
    replay_events,
    step_from_row,
    stored_events,
)
from proxy.journal.writer import Journal
from proxy.store.database import Database

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    complete: list[int] = field(default_factory=list)
    interrupted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    pruned_events: int = 0

    def counts(self) -> dict[str, int]:
        return {"complete": len(self.complete), "interrupted": len(self.interrupted), "failed": len(self.failed)}


class Recovery:
    """Ends steps through the journal's own `close`, with its config and clock."""

    def __init__(self, db: Database, journal: Journal) -> None:
        self._db = db
        self._journal = journal

    async def recover(self) -> RecoveryReport:
        """Classify every step left open by a previous process; run once at startup, before serving."""
        report = RecoveryReport()
        rows = await self._db.fetchall(
            f"SELECT {STEP_COLUMNS} FROM journal_steps AS s WHERE s.status = ? ORDER BY s.id", (StepStatus.OPEN,)
        )
        events = await stored_events(self._db, [row["id"] for row in rows])
        for row in rows:
            step = step_from_row(row, events[row["id"]])
            replayed = replay_events(step.stream, events[row["id"]])
            step.assembly = replayed.assembly
            if replayed.error is not None:
                await self._journal.close(step, StepStatus.FAILED, None, replayed.error)
                report.failed.append(step.id)
            elif replayed.done or replayed.assembly.finish_reason is not None:
                finish = {"finish_reason": replayed.assembly.finish_reason}
                event = None if replayed.done else (EventType.DONE, JSON_ENCODER.encode(finish))
                await self._journal.close(step, StepStatus.COMPLETE, event)
                report.complete.append(step.id)
            else:
                await self._journal.close(step, StepStatus.INTERRUPTED)
                report.interrupted.append(step.id)
        report.pruned_events = await self.prune_expired()
        if rows:
            log.info("journal recovery: %s", report.counts())
        return report

    async def prune_expired(self) -> int:
        """Delete the events of ended steps older than `keep_events_s`; returns how many were deleted."""
        keep = self._journal.config.keep_events_s
        if keep is None:
            return 0
        cutoff = self._journal.clock() - keep
        statuses = tuple(str(status) for status in PRUNABLE)

        def write(connection: sqlite3.Connection) -> int:
            cursor = connection.execute(
                "DELETE FROM journal_events WHERE step_id IN (SELECT id FROM journal_steps "
                f"WHERE status IN {statuses!r} AND COALESCE(sealed_at, created_at) <= ?)",
                (cutoff,),
            )
            return cursor.rowcount

        return await self._db.write(write, atomic=False)
