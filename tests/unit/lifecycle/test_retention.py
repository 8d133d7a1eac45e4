"""Retention (`proxy.lifecycle.retention`) on both stores with a clock moved by hand: what is idle past its
tenant's days goes, in bounded batches, oldest first; a dry run deletes nothing; a session used meanwhile stays."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.config.schema import StoreConfig
from proxy.history.store import History
from proxy.lifecycle import retention as retention_module
from proxy.lifecycle.deletions import Deletions
from proxy.lifecycle.retention import DAY_S, Retention
from proxy.store.database import Database

ENCODING = "cl100k_base"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def conversation(tag: str) -> list[dict[str, Any]]:
    return [
        {"role": "system", "content": "shared system prompt"},
        {"role": "user", "content": f"question of {tag}"},
        {"role": "assistant", "content": f"answer of {tag}"},
    ]


async def sessions(db: Database) -> list[tuple[str, str]]:
    rows = await db.fetchall("SELECT tenant, id FROM sessions ORDER BY tenant, id")
    return [(row[0], row[1]) for row in rows]


def make(db: Database, clock: Clock, **config: Any) -> tuple[History, Retention]:
    history = History(db, clock=clock)
    return history, Retention(db, Deletions(db, history), StoreConfig(**config), clock=clock)


async def test_sessions_idle_past_their_days_go_and_the_rest_stay(db: Database) -> None:
    clock = Clock()
    history, retention = make(db, clock, retention_days=30, tenant_retention_days=(("short", 2), ("forever", None)))
    for tenant in ("t", "short", "forever"):
        await history.reconcile(tenant, "old", conversation("old"), "m", ENCODING)
    clock.now += 10 * DAY_S
    for tenant in ("t", "short", "forever"):
        await history.reconcile(tenant, "new", conversation("new"), "m", ENCODING)
    clock.now += 25 * DAY_S  # old: idle 35 days, new: 25

    dry = await retention.sweep(dry_run=True)
    assert sorted((e.tenant, e.session_id) for e in dry.sessions) == [("short", "new"), ("short", "old"), ("t", "old")]
    assert dry.rows == {}
    assert len(await sessions(db)) == 6

    swept = await retention.sweep()

    assert sorted((e.tenant, e.session_id) for e in swept.sessions) == [
        ("short", "new"),
        ("short", "old"),
        ("t", "old"),
    ]
    assert await sessions(db) == [("forever", "new"), ("forever", "old"), ("t", "new")]
    path = await history.path("t", "new")
    assert path is not None
    assert [m.message["content"] for m in path] == [m["content"] for m in conversation("new")]
    assert swept.rows["messages"] == 2 + 5  # t's old question and answer; short's system prompt and both pairs
    assert (await retention.sweep()).sessions == []


async def test_a_sweep_goes_in_bounded_batches_oldest_first(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention_module, "BATCH_SESSIONS", 2)
    monkeypatch.setattr(retention_module, "BATCH_PAUSE_S", 0.0)
    clock = Clock()
    history, retention = make(db, clock, retention_days=1)
    for index in range(5):
        await history.reconcile("t", f"s{index}", conversation(f"s{index}"), "m", ENCODING)
        clock.now += 60
    clock.now += 2 * DAY_S

    first = await retention.sweep(max_batches=1)

    assert [e.session_id for e in first.sessions] == ["s0", "s1"]
    assert [s for _, s in await sessions(db)] == ["s2", "s3", "s4"]
    rest = await retention.sweep()
    assert [e.session_id for e in rest.sessions] == ["s2", "s3", "s4"]
    row = await db.fetchone("SELECT COUNT(*) FROM messages")
    assert row is not None
    assert row[0] == 0


async def test_a_session_used_after_it_was_found_idle_stays(db: Database) -> None:
    clock = Clock()
    history, retention = make(db, clock, retention_days=1)
    await history.reconcile("t", "s", conversation("s"), "m", ENCODING)
    clock.now += 2 * DAY_S
    [expired] = (await retention.sweep(dry_run=True)).sessions
    await history.reconcile("t", "s", [*conversation("s"), {"role": "user", "content": "back again"}], "m", ENCODING)

    forgotten = await Deletions(db, history).delete_sessions("t", [expired.session_id], idle_before=clock.now - DAY_S)

    assert forgotten.sessions == ()
    assert await sessions(db) == [("t", "s")]


def test_retention_is_off_unless_configured() -> None:
    assert not StoreConfig().retention_days
    assert StoreConfig(tenant_retention_days=(("t", 3),)).retention_of("t") == 3
    assert StoreConfig(retention_days=9, tenant_retention_days=(("t", None),)).retention_of("t") is None
