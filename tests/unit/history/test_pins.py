"""The pins table (on a real SQLite file) and pinning by `context.pin_patterns`."""

from __future__ import annotations

import re
from typing import Any

import pytest

from proxy.history.pins import Pins, pattern_pinned
from proxy.history.store import History
from proxy.store.database import Database

TENANT = "t"
ENCODING = "cl100k_base"


async def stored_ids(db: Database, session_id: str = "s1", tenant: str = TENANT) -> list[str]:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "remember: the launch code is in the blue folder"},
        {"role": "assistant", "content": "noted"},
        {"role": "user", "content": "and now?"},
    ]
    reconciled = await History(db).reconcile(tenant, session_id, messages, "chat", ENCODING)
    return [message.id for message in reconciled.path]


async def test_pins_are_added_once_read_back_and_removed(db: Database) -> None:
    ids = await stored_ids(db)
    pins = Pins(db, clock=lambda: 42.0)
    assert await pins.on_session(TENANT, "s1") == frozenset()

    await pins.add(TENANT, "s1", [ids[1], ids[2], ids[1]])
    await pins.add(TENANT, "s1", [ids[2]])  # idempotent
    assert await pins.on_session(TENANT, "s1") == {ids[1], ids[2]}
    rows = await db.fetchall("SELECT message_id, created_at FROM pins")
    assert sorted((row["message_id"], row["created_at"]) for row in rows) == sorted([(ids[1], 42.0), (ids[2], 42.0)])

    assert await pins.remove(TENANT, "s1", [ids[1], ids[3]]) == 1
    assert await pins.on_session(TENANT, "s1") == {ids[2]}
    assert await pins.remove(TENANT, "s1", [ids[1]]) == 0
    await pins.add(TENANT, "s1", [])
    assert await pins.on_session(TENANT, "s1") == {ids[2]}


async def test_pins_belong_to_one_session_of_one_tenant(db: Database) -> None:
    ids = await stored_ids(db)
    pins = Pins(db)
    await pins.add(TENANT, "s1", [ids[1]])
    assert await pins.on_session(TENANT, "s2") == frozenset()
    assert await pins.on_session("other-tenant", "s1") == frozenset()
    assert await pins.remove("other-tenant", "s1", [ids[1]]) == 0
    assert await pins.on_session(TENANT, "s1") == {ids[1]}


async def test_a_pin_must_name_a_stored_message(db: Database) -> None:
    ids = await stored_ids(db)
    pins = Pins(db)
    with pytest.raises(db.errors):
        await pins.add(TENANT, "s1", [ids[1], "no-such-message"])
    assert await pins.on_session(TENANT, "s1") == frozenset()  # the whole job rolled back


def test_pattern_pinned_matches_text_anywhere() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "keep this: [PIN] the schema"},
        {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": " [pin]"}]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "content": "DECISION: use sqlite", "tool_call_id": "c1"},
    ]
    patterns = [re.compile(r"\[PIN\]", re.IGNORECASE), re.compile(r"^DECISION:")]
    assert pattern_pinned(patterns, messages) == {1, 2, 4}
    assert pattern_pinned([re.compile(r"^$")], messages) == frozenset()  # no text, no match
    assert pattern_pinned([], messages) == frozenset()
    assert pattern_pinned(patterns, []) == frozenset()


def test_pattern_pinned_finds_one_mark_in_a_long_session() -> None:
    messages = [{"role": "user", "content": f"message {i} " + "lorem ipsum dolor " * 40} for i in range(20_000)]
    messages[12_345]["content"] += " #keep"
    patterns = [re.compile(r"#keep\b"), re.compile(r"IMPORTANT:")]
    assert pattern_pinned(patterns, messages) == {12_345}
    assert pattern_pinned((), messages) == frozenset()
