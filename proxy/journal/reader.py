"""The read side of the journal: pages of steps, one step, and the step an Idempotency-Key points at.

Every read filters by tenant. A step still open has no answer in its row yet, so its record shows what its
events have assembled so far (read for a whole page in one query).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from proxy.canonical.types import Chunk
from proxy.cost import TokenCost
from proxy.journal.costs import StepCost
from proxy.journal.keys import check_key
from proxy.journal.steps import (
    CHUNK_EVENTS,
    ENDED,
    STEP_COLUMNS,
    EventType,
    StepRecord,
    StepStatus,
    UnrecordedEnds,
    record_from_row,
    replay_events,
    stored_events,
)
from proxy.offload import compute
from proxy.store.connection import Row
from proxy.store.database import Database

DEFAULT_PAGE = 50


class JournalReader:
    def __init__(self, db: Database, unrecorded: UnrecordedEnds | None = None) -> None:
        self._db = db
        self._unrecorded = UnrecordedEnds() if unrecorded is None else unrecorded
        """The writer's endings the store could not write (`Journal.unrecorded`): keys they held are free."""

    async def steps(
        self,
        tenant: str,
        *,
        status: StepStatus | None = None,
        session_id: str | None = None,
        limit: int = DEFAULT_PAGE,
        offset: int = 0,
    ) -> tuple[list[StepRecord], bool]:
        """A page of the tenant's steps, newest first, and whether more follow."""
        where, params = ["s.tenant = ?"], [tenant]
        if status is not None:
            where.append("s.status = ?")
            params.append(status)
        if session_id is not None:
            where.append("s.session_id = ?")
            params.append(session_id)
        rows = await self._db.fetchall(
            f"SELECT {STEP_COLUMNS} FROM journal_steps AS s WHERE {' AND '.join(where)} "
            "ORDER BY s.id DESC LIMIT ? OFFSET ?",
            [*params, limit + 1, offset],
        )
        return await self._readable(rows[:limit]), len(rows) > limit

    async def step(self, tenant: str, step_id: int) -> StepRecord | None:
        row = await self._db.fetchone(
            f"SELECT {STEP_COLUMNS} FROM journal_steps AS s WHERE s.tenant = ? AND s.id = ?", (tenant, step_id)
        )
        return None if row is None else (await self._readable([row]))[0]

    async def last_context(self, tenant: str, session_id: str) -> dict[str, Any] | None:
        """What the session's latest step sent upstream (`StepRecord.context`); None before its first step."""
        row = await self._db.fetchone(
            "SELECT context FROM journal_steps WHERE tenant = ? AND session_id = ? AND context IS NOT NULL "
            "ORDER BY id DESC LIMIT 1",
            (tenant, session_id),
        )
        context = None if row is None else json.loads(row[0])
        return context if isinstance(context, dict) else None

    async def last_contexts(self, tenant: str, session_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """`last_context` of several sessions at once (a page of the session list)."""
        if not session_ids:
            return {}
        rows = await self._db.fetchall(
            "SELECT session_id, context FROM journal_steps WHERE id IN (SELECT MAX(id) FROM journal_steps "
            "WHERE tenant = ? AND session_id IN (SELECT value FROM json_each(?)) AND context IS NOT NULL "
            "GROUP BY session_id)",
            (tenant, json.dumps(list(session_ids))),
        )
        contexts = {row["session_id"]: json.loads(row["context"]) for row in rows}
        return {session_id: context for session_id, context in contexts.items() if isinstance(context, dict)}

    async def contexts(self, tenant: str, session_id: str, limit: int) -> list[dict[str, Any]]:
        """The session's latest `limit` steps, oldest first, with what each sent: a plot's points."""
        rows = await self._db.fetchall(
            "SELECT id, status, created_at, context FROM journal_steps WHERE tenant = ? AND session_id = ? "
            "ORDER BY id DESC LIMIT ?",
            (tenant, session_id, limit),
        )
        points = []
        for row in reversed(rows):
            context = json.loads(row["context"]) if row["context"] else {}
            points.append(
                {
                    "step_id": row["id"],
                    "status": row["status"],
                    "created_at": row["created_at"],
                    **{name: context.get(name) for name in ("prompt_tokens", "budget", "summaries")},
                }
            )
        return points

    async def costs(self, tenant: str, session_id: str) -> list[StepCost]:
        """Every step of the session, oldest first, with what it cost (`proxy.journal.costs`)."""
        rows = await self._db.fetchall(
            "SELECT id, status, created_at, model, usage, context FROM journal_steps WHERE tenant = ? AND "
            "session_id = ? ORDER BY id",
            (tenant, session_id),
        )
        # Two JSON documents a step: ~30 ms on the event loop for a 1,000-turn agent session's 2,000 steps.
        size = sum(len(row["usage"] or "") + len(row["context"] or "") for row in rows)
        return await compute(size, _step_costs, rows)

    async def replay(
        self, tenant: str, idempotency_key: str, fingerprint: str
    ) -> tuple[StepRecord, list[Chunk]] | None:
        """The ended step holding this key and its stored chunks; None if there is none (or it failed).

        Chunks are the stream's chunk events, or the one chat.completion of a non-stream step; an empty list
        once the events were pruned (then `proxy.journal.replay` rebuilds them from the record).
        """
        row = await self._db.fetchone(
            f"SELECT {STEP_COLUMNS} FROM journal_steps AS s WHERE s.tenant = ? AND s.idempotency_key = ? "
            "ORDER BY s.id DESC LIMIT 1",
            (tenant, idempotency_key),
        )
        if row is None:
            return None
        status = self._unrecorded.status(row["id"], row["status"])
        check_key(row["fingerprint"], status, fingerprint)
        if status not in ENDED:
            return None
        wanted = CHUNK_EVENTS if row["stream"] else (EventType.DONE,)
        events = (await stored_events(self._db, [row["id"]]))[row["id"]]
        return record_from_row(row), [json.loads(content) for _seq, kind, content in events if kind in wanted]

    async def _readable(self, rows: Sequence[Row]) -> list[StepRecord]:
        open_ids = [row["id"] for row in rows if row["status"] == StepStatus.OPEN and row["events"]]
        events = await stored_events(self._db, open_ids)
        return [
            record_from_row(row, replay_events(bool(row["stream"]), events[row["id"]]).assembly)
            if row["id"] in events
            else record_from_row(row)
            for row in rows
        ]


def _step_costs(rows: Sequence[Row]) -> list[StepCost]:
    costs = []
    for row in rows:
        usage = json.loads(row["usage"]) if row["usage"] else None
        context = json.loads(row["context"]) if row["context"] else {}
        costs.append(
            StepCost(
                step_id=row["id"],
                created_at=row["created_at"],
                status=row["status"],
                model=row["model"],
                upstream=TokenCost.from_usage(usage if isinstance(usage, dict) else None),
                counted=int(context.get("prompt_tokens") or 0),
                requested=int(context.get("history_tokens") or 0),
            )
        )
    return costs
