"""Learned corrections shared by the replicas of one store: a refusal one replica learned from is not paid again by
the others.

`model_corrections` keeps, per configured model name, the largest tokenizer ratio and the smallest window any
replica learned, and when (`updated_at`); each replica publishes what it learns at once and every `REFRESH_S`
(and at startup) takes what the store holds as what it knows, so a fleet behind a round-robin balancer is refused
once per model, not once per replica, and an operator's reset (`forget`) reaches every replica. Learning only
tightens, so the upsert merges with a max and a min, except over a row older than the corrections' lifetime,
which it replaces; rows that old are not read.
"""

from __future__ import annotations

from proxy.budget.corrections import Correction
from proxy.store.connection import Connection
from proxy.store.database import Database

REFRESH_S = 5.0
"""How often a replica reads what the others learned: a refused request is healed at once on its own replica."""

_EXPIRED = "DELETE FROM model_corrections WHERE model = ? AND updated_at <= ?"
_UPSERT = """
INSERT INTO model_corrections (model, factor, context_window, updated_at) VALUES (?, ?, ?, ?)
ON CONFLICT (model) DO UPDATE SET
    factor = CASE WHEN excluded.factor > model_corrections.factor THEN excluded.factor
                  ELSE model_corrections.factor END,
    context_window = CASE WHEN model_corrections.context_window IS NULL
                               OR excluded.context_window < model_corrections.context_window
                          THEN COALESCE(excluded.context_window, model_corrections.context_window)
                          ELSE model_corrections.context_window END,
    updated_at = excluded.updated_at
"""


class SharedCorrections:
    def __init__(self, db: Database, ttl_s: float) -> None:
        self._db = db
        self._ttl_s = ttl_s

    async def publish(self, learned: Correction) -> None:
        def upsert(connection: Connection) -> None:
            connection.execute(_EXPIRED, (learned.model, learned.learned_at - self._ttl_s))
            connection.execute(_UPSERT, (learned.model, learned.factor, learned.window, learned.learned_at))

        await self._db.write(upsert)

    async def read(self, now: float) -> list[Correction]:
        """The corrections in force at `now`."""
        rows = await self._db.fetchall(
            "SELECT model, factor, context_window, updated_at FROM model_corrections WHERE updated_at > ? "
            "ORDER BY model",
            (now - self._ttl_s,),
        )
        return [
            Correction(row["model"], float(row["factor"]), row["context_window"], float(row["updated_at"]))
            for row in rows
        ]

    async def forget(self, model: str | None) -> list[str]:
        """Delete the correction of `model` (None: of every model); returns the models whose row went."""

        def delete(connection: Connection) -> list[str]:
            where, params = ("", ()) if model is None else (" WHERE model = ?", (model,))
            rows = connection.execute(f"SELECT model FROM model_corrections{where} ORDER BY model", params).fetchall()
            connection.execute(f"DELETE FROM model_corrections{where}", params)
            return [row[0] for row in rows]

        return await self._db.write(delete)
