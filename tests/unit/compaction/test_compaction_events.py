"""Compaction events: one log line and one row each, read back per session; a store failure never raises."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest

from proxy.compaction.events import CompactionEvent, CompactionEvents, log_line
from proxy.store.database import Database

TENANT = "t"
START = CompactionEvent(session_id="s1", event="start", strategy="llm", range_start=1, range_end=9, tokens_before=5120)
COMPLETE = replace(
    START,
    event="complete",
    tokens_after=410,
    duration_ms=1234.4,
    summary_id=7,
    generated_by="llm",
    model="summarizer",
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


async def test_events_are_read_back_oldest_first_as_json(db: Database) -> None:
    events = CompactionEvents(db, clock=Clock())
    await events.record(TENANT, START)
    await events.record(TENANT, COMPLETE)
    await events.record(TENANT, replace(START, session_id="s2"))
    await events.record("other-tenant", START)

    page, more = await events.for_session(TENANT, "s1", limit=10)
    assert more is False
    assert [e["event"] for e in page] == ["start", "complete"]
    assert page[1] == {
        "id": page[1]["id"],
        "session_id": "s1",
        "event": "complete",
        "strategy": "llm",
        "range_start": 1,
        "range_end": 9,
        "tokens_before": 5120,
        "tokens_after": 410,
        "duration_ms": 1234.4,
        "summary_id": 7,
        "generated_by": "llm",
        "model": "summarizer",
        "background": False,
        "detail": None,
        "created_at": 1002.0,
    }
    assert page[0]["id"] < page[1]["id"]
    assert await events.for_session(TENANT, "nobody", limit=10) == ([], False)


async def test_events_are_paged(db: Database) -> None:
    events = CompactionEvents(db)
    for index in range(5):
        await events.record(TENANT, replace(START, range_start=index))
    first, more = await events.for_session(TENANT, "s1", limit=2)
    rest, more_after = await events.for_session(TENANT, "s1", limit=2, offset=4)
    assert ([e["range_start"] for e in first], more) == ([0, 1], True)
    assert ([e["range_start"] for e in rest], more_after) == ([4], False)


async def test_each_event_is_one_structured_log_line(db: Database, caplog: pytest.LogCaptureFixture) -> None:
    events = CompactionEvents(db)
    error = CompactionEvent(
        session_id="s1",
        event="error",
        strategy="llm",
        background=True,
        detail="summarizer timed out\nafter 60 s",
    )
    with caplog.at_level(logging.INFO, logger="proxy.compaction.events"):
        await events.record(TENANT, COMPLETE)
        await events.record(TENANT, error)
    lines = [r.getMessage() for r in caplog.records if r.name == "proxy.compaction.events"]
    assert lines == [
        "compaction event=complete session=s1 strategy=llm range=[1,9) tokens=5120->410 duration_ms=1234 "
        "summary=7 generated_by=llm model=summarizer background=false detail=-",
        "compaction event=error session=s1 strategy=llm range=- tokens=- duration_ms=- summary=- generated_by=- "
        'model=- background=true detail="summarizer timed out\\nafter 60 s"',
    ]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "proxy.compaction.events")
    assert TENANT not in lines[0].split()
    assert log_line(error).count("\n") == 0


async def test_an_event_the_store_cannot_take_is_logged_not_raised(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    events = CompactionEvents(db)
    await db.write(lambda connection: connection.execute("DROP TABLE compaction_events"))
    with caplog.at_level(logging.INFO, logger="proxy.compaction.events"):
        await events.record(TENANT, COMPLETE)  # does not raise
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "was not stored" in warnings[0].getMessage()
    assert any("event=complete" in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)
    with pytest.raises(db.errors):
        await db.fetchall("SELECT * FROM compaction_events")


async def test_a_closed_store_does_not_fail_the_request(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "closed.sqlite")
    await db.close()
    await CompactionEvents(db).record(TENANT, START)  # logged, not raised
