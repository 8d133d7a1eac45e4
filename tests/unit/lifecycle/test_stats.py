"""What the store holds (`proxy.lifecycle.stats`) on both stores: rows per table, size, sessions by last use,
read at most once a minute unless asked afresh."""

from __future__ import annotations

from typing import Any

from proxy.history.store import History
from proxy.lifecycle.deletions import Deletions
from proxy.lifecycle.stats import DAY_S, TABLES, StatsReader
from proxy.store.database import Database

ENCODING = "cl100k_base"


class Clock:
    def __init__(self) -> None:
        self.now = 5_000_000.0

    def __call__(self) -> float:
        return self.now


def conversation(tag: str, turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "shared"}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{tag} question {turn}"})
        messages.append({"role": "assistant", "content": f"{tag} answer {turn} " + "word " * 200})
    return messages


async def test_the_counts_size_and_last_use_follow_what_is_stored_and_deleted(db: Database) -> None:
    clock = Clock()
    history = History(db, clock=clock)
    stats = StatsReader(db, clock=clock)
    await history.reconcile("t", "old", conversation("old", 20), "m", ENCODING)
    clock.now += 10 * DAY_S
    empty = await stats.read()
    assert set(empty.rows) == set(TABLES)
    await history.reconcile("t", "new", conversation("new", 5), "m", ENCODING)

    assert await stats.read() == empty  # within the minute: the figures read before
    clock.now += 61
    full = await stats.read()
    if db.dialect == "sqlite":  # PostgreSQL's are the planner's estimates, refreshed by ANALYZE
        assert full.rows["messages"] == 1 + 40 + 10
        assert full.rows["sessions"] == 2
        assert full.rows["message_tokens"] == 51
        assert full.bytes >= empty.bytes
    assert full.idle_sessions == {"1d": 1, "7d": 0, "30d": 1, "90d": 0, "older": 0}
    assert full.as_json()["rows_estimated"] is (db.dialect != "sqlite")

    await Deletions(db, history).delete_session("t", "old")
    after = await stats.read(fresh=True)
    assert after.idle_sessions == {"1d": 1, "7d": 0, "30d": 0, "90d": 0, "older": 0}
    if db.dialect == "sqlite":
        assert after.rows["messages"] == 11
        assert after.bytes < full.bytes  # a new file vacuums incrementally: the pages go back
