"""Settling steps whose process is gone, and pruning old events; run before serving and periodically.

`recover` takes only the open steps whose owner is gone (`proxy.journal.owners`): another process serving the
same store keeps its live streams. One whose events show the answer ended (a finish_reason or a `done`) is
sealed into history as `complete`; one with an `error` event is `failed`; the rest are kept as `interrupted`
with their partial text — never deleted. Two processes may recover at once: each ending is an update of an
open row, so one of them ends the step and the other skips it. A gone owner's row is deleted once it holds no
open step. A live process's own steps that it ended while the store could not be written
(`Journal.unrecorded`) are written by it once the store takes writes again (`settle_unrecorded`). Events of
ended steps are pruned after `journal.keep_events` (the step row keeps the assembled answer, which is enough to
replay it); interrupted steps keep theirs.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from proxy.errors import Conflict
from proxy.journal.owners import Owner, Owners
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
from proxy.store.connection import Connection, Row
from proxy.store.database import Database

log = logging.getLogger(__name__)


@dataclass
class RecoveryReport:
    complete: list[int] = field(default_factory=list)
    interrupted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)
    """Steps another process ended while this one was ending them."""
    owners_removed: int = 0
    pruned_events: int = 0

    def counts(self) -> dict[str, int]:
        return {"complete": len(self.complete), "interrupted": len(self.interrupted), "failed": len(self.failed)}

    def empty(self) -> bool:
        return not (self.complete or self.interrupted or self.failed or self.skipped or self.owners_removed)


_OPEN_STEP_OWNERS = """SELECT s.id, s.owner, o.id AS owner_id, o.host AS owner_host, o.pid AS owner_pid,
    o.heartbeat_at AS owner_heartbeat_at
FROM journal_steps AS s LEFT JOIN journal_owners AS o ON o.id = s.owner
WHERE s.status = ?"""

_BEGUN = f"""SELECT {STEP_COLUMNS} FROM journal_steps AS s
WHERE s.status = ? AND s.owner = ? AND s.tenant = ? AND s.created_at = ?"""

_STEPS = f"""SELECT {STEP_COLUMNS} FROM journal_steps AS s
WHERE s.status = ? AND s.id IN (SELECT value FROM json_each(?)) ORDER BY s.id"""


class Recovery:
    """Ends steps through the journal's own `close`, with its config and clock.

    Without `owners` (the CLI, tests) it judges owners as an unregistered process of this host would.
    """

    def __init__(self, db: Database, journal: Journal, owners: Owners | None = None) -> None:
        self._db = db
        self._journal = journal
        self._owners = Owners(db, journal.clock) if owners is None else owners

    async def recover(self) -> RecoveryReport:
        """Settle the steps of gone owners and prune expired events; run at startup, before serving."""
        report = await self.settle()
        report.pruned_events = await self.prune_expired()
        return report

    async def settle(self) -> RecoveryReport:
        """Classify every open step whose owner is gone, then forget the gone owners left with no open step."""
        report = RecoveryReport()
        # Steps and their owners in one query, one snapshot: an owner that registers after it has no step in it.
        # Then the whole rows of the steps taken only (the sweep runs every few seconds beside live streams).
        owned = await self._db.fetchall(_OPEN_STEP_OWNERS, (StepStatus.OPEN,))
        now = self._journal.clock()
        mine = {self._owners.id} | ({self._journal.owner} if self._journal.owner is not None else set())
        taken = [row["id"] for row in owned if row["owner"] not in mine and self._owners.is_gone(_row_owner(row), now)]
        rows = await self._db.fetchall(_STEPS, (StepStatus.OPEN, json.dumps(taken))) if taken else []
        events = await stored_events(self._db, [row["id"] for row in rows])
        for row in rows:
            step = step_from_row(row, events[row["id"]])
            replayed = replay_events(step.stream, events[row["id"]])
            step.assembly = replayed.assembly
            if replayed.error is not None:
                ended = await self._journal.close(step, StepStatus.FAILED, None, replayed.error)
                (report.failed if ended is not None else report.skipped).append(step.id)
            elif replayed.done or replayed.assembly.finish_reason is not None:
                finish = {"finish_reason": replayed.assembly.finish_reason}
                event = None if replayed.done else (EventType.DONE, JSON_ENCODER.encode(finish))
                try:
                    await self._journal.close(step, StepStatus.COMPLETE, event)
                except Conflict:
                    report.skipped.append(step.id)
                else:
                    report.complete.append(step.id)
            else:
                ended = await self._journal.close(step, StepStatus.INTERRUPTED)
                (report.interrupted if ended is not None else report.skipped).append(step.id)
        report.owners_removed = await self._owners.forget(await self._owners.gone())
        for outcome, count in report.counts().items():
            if count:
                self._journal.metrics.recoveries.labels(outcome).inc(count)
        if not report.empty():
            log.info(
                "journal recovery: %s, %d ended elsewhere, %d gone owners removed",
                report.counts(),
                len(report.skipped),
                report.owners_removed,
            )
        return report

    async def settle_unrecorded(self) -> list[int]:
        """Write the endings this process decided for its own steps while the store could not take them (an
        outage, a full disk: `Journal.unrecorded`); returns the steps ended. Each keeps its answer as its stored
        events add up to: what was made durable, which is what its client was relayed and told of. A row no
        longer open (ended by a retry under its key, or by a write whose answer was lost) is only forgotten. The
        rows of begins whose commit went unconfirmed are ended too (`_settle_unconfirmed_begins`). Raises, with
        the rest left for the next try, while the store still fails."""
        unrecorded = self._journal.unrecorded
        ended = await self._settle_unconfirmed_begins()
        wanted = unrecorded.step_ids()
        if not wanted:
            return ended
        rows = await self._db.fetchall(_STEPS, (StepStatus.OPEN, json.dumps(wanted)))
        events = await stored_events(self._db, [row["id"] for row in rows])
        for step_id in set(wanted) - {row["id"] for row in rows}:
            unrecorded.forget(step_id)
        for row in rows:
            known = unrecorded.ending(row["id"])
            if known is None:
                continue  # written meanwhile, by a retry under its key
            status, error = known
            step = step_from_row(row, events[row["id"]])
            step.assembly = replay_events(step.stream, events[row["id"]]).assembly
            event = (EventType.ERROR, error) if status == StepStatus.FAILED and error is not None else None
            if await self._journal.close(step, status, event, None if error is None else json.loads(error)):
                ended.append(step.id)
            unrecorded.forget(step.id)
        if ended:
            log.info("journal: %d steps ended while the store could not be written are recorded now", len(ended))
        return ended

    async def _settle_unconfirmed_begins(self) -> list[int]:
        """End `failed` the rows of begins this process saw fail but whose commit may have happened (the server
        went away before confirming it): its client was told the request failed, and no handle of it lives here.
        Found by owner, tenant and begin time, which no other step of this process shares."""
        unrecorded = self._journal.unrecorded
        ended: list[int] = []
        for tenant, created_at, error in unrecorded.unconfirmed_begins():
            rows = await self._db.fetchall(_BEGUN, (StepStatus.OPEN, self._journal.owner, tenant, created_at))
            for row in rows:
                step = step_from_row(row, [])
                if await self._journal.close(step, StepStatus.FAILED, (EventType.ERROR, error), json.loads(error)):
                    ended.append(step.id)
            unrecorded.forget_begin(tenant, created_at)
        return ended

    async def prune_expired(self) -> int:
        """Delete the events of ended steps older than `keep_events_s`; returns how many were deleted."""
        keep = self._journal.config.keep_events_s
        if keep is None:
            return 0
        cutoff = self._journal.clock() - keep
        statuses = tuple(str(status) for status in PRUNABLE)

        def write(connection: Connection) -> int:
            cursor = connection.execute(
                "DELETE FROM journal_events WHERE step_id IN (SELECT id FROM journal_steps "
                f"WHERE status IN {statuses!r} AND COALESCE(sealed_at, created_at) <= ?)",
                (cutoff,),
            )
            return cursor.rowcount

        return await self._db.write(write, atomic=False)


def _row_owner(row: Row) -> Owner | None:
    if row["owner_id"] is None:
        return None
    return Owner(row["owner_id"], row["owner_host"], int(row["owner_pid"]), float(row["owner_heartbeat_at"]))
