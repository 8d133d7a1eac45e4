"""Learned corrections shared by the replicas of one store: a refusal one replica learned from is not paid again by
the others.

`model_corrections` keeps, per configured model name, the largest tokenizer ratio and the smallest window any
replica learned; each replica publishes what it learns at once and adopts what the others learned every
`REFRESH_S` (and at startup), so a fleet behind a round-robin balancer is refused once per model, not once per
replica. Both only ever tighten the budget, so merging is a max and a min, in the upsert and in memory alike.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.store.database import Database

REFRESH_S = 5.0
"""How often a replica reads what the others learned: a refused request is healed at once on its own replica."""

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


@dataclass(frozen=True)
class Learned:
    """What the fleet learned for one model: the tokenizer ratio (≥ 1) and a smaller window, if one was reported."""

    model: str
    factor: float
    window: int | None


class SharedCorrections:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def publish(self, learned: Learned, now: float) -> None:
        await self._db.write(
            lambda connection: connection.execute(_UPSERT, (learned.model, learned.factor, learned.window, now))
        )

    async def read(self) -> list[Learned]:
        rows = await self._db.fetchall("SELECT model, factor, context_window FROM model_corrections")
        return [Learned(row["model"], float(row["factor"]), row["context_window"]) for row in rows]
