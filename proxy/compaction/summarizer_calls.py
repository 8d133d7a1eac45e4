"""The summarizer's ledger: one row of `summarizer_calls` (migration `m012_summarizer_calls`) per summarizer model
call made for a session, with the tokens the summarizer reported.

The proxy's own calls are part of what a session costs, but they are not answers to the client and run in the
background, across turns: inspection puts each call in the turn during which it ended. A ledger is a record of
work, not part of it: a store that cannot take a row is logged and the summary goes on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from proxy.canonical.types import Clock
from proxy.cost import TokenCost
from proxy.store.connection import Connection
from proxy.store.database import Database

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SummarizerCall:
    model: str
    cost: TokenCost
    created_at: float


class SummarizerCalls:
    def __init__(self, db: Database, clock: Clock = time.time) -> None:
        self._db = db
        self._clock = clock

    async def record(self, tenant: str, session_id: str, model: str, cost: TokenCost) -> None:
        row = (tenant, session_id, model, cost.sent, cost.cached, cost.completion, self._clock())

        def write(connection: Connection) -> None:
            connection.execute(
                "INSERT INTO summarizer_calls (tenant, session_id, model, prompt_tokens, cached_tokens, "
                "completion_tokens, created_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                row,
            )

        try:
            await self._db.write(write, atomic=False)
        except Exception as exc:
            log.warning("summarizer call of session=%s was not recorded: %s", session_id, exc, exc_info=exc)

    async def for_session(self, tenant: str, session_id: str) -> list[SummarizerCall]:
        """The session's summarizer calls, oldest first."""
        rows = await self._db.fetchall(
            "SELECT model, prompt_tokens, cached_tokens, completion_tokens, created_at FROM summarizer_calls "
            "WHERE tenant = ? AND session_id = ? ORDER BY id",
            (tenant, session_id),
        )
        return [
            SummarizerCall(row[0], TokenCost(sent=row[1], cached=row[2], completion=row[3]), row[4]) for row in rows
        ]
