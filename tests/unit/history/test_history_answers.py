"""Linking answers into history (`proxy.history.answers`) on a real SQLite file: depth, idempotency, the caller's
transaction, what cannot be linked, and the cached path the next request reuses."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from proxy.canonical.types import Message
from proxy.history.answers import Answers
from proxy.history.messages import StoredMessage
from proxy.history.store import History
from proxy.store.database import Database
from tests.unit.history.test_history_store import ENCODING, MODEL, conversation, count


@pytest.fixture
def history(db: Database) -> History:
    return History(db)


async def link(
    db: Database, history: History, tenant: str, session: str, parent: str, message: Message
) -> StoredMessage | None:
    """What the journal's seal does: prepare, write in a transaction, report the commit."""
    answers = Answers(history)
    pending = await answers.prepare(tenant, session, parent, message, ENCODING)
    stored = await db.write(pending.write)
    if stored is not None:
        answers.committed(pending, stored)
    return stored


async def test_a_re_sent_answer_is_the_stored_answer(db: Database, history: History) -> None:
    messages = [*conversation(1), {"role": "user", "content": "call the tool"}]
    request = await history.reconcile("t", "s", messages, MODEL, ENCODING)
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    answer = await link(
        db, history, "t", "s", request.path[-1].id, {"role": "assistant", "content": None, "tool_calls": [call]}
    )
    assert answer is not None
    assert answer.depth == len(messages)
    session = await history.session("t", "s")
    assert session is not None
    assert session.head_id == answer.id

    echoed = {
        "role": "assistant",
        "content": "",
        "refusal": None,
        "audio": None,
        "tool_calls": [{**call, "index": 0}],
    }
    follow_up = [*messages, echoed, {"role": "tool", "tool_call_id": "c1", "content": "42"}]
    warm = await history.reconcile("t", "s", follow_up, MODEL, ENCODING)
    assert warm.stored_before == len(messages) + 1
    assert warm.path[len(messages)].id == answer.id
    cold = await History(db).reconcile("t", "s", follow_up, MODEL, ENCODING)  # no cache: hashed and looked up
    assert cold.stored_before == len(follow_up)
    assert cold.path == warm.path
    assert await count(db, "messages") == len(follow_up)


async def test_linking_an_answer_is_idempotent(db: Database, history: History) -> None:
    request = await history.reconcile("t", "s", [*conversation(0), {"role": "user", "content": "hi"}], MODEL, ENCODING)
    parent = request.path[-1].id
    answer = {"role": "assistant", "content": "yo"}
    first, second = [await link(db, history, "t", "s", parent, answer) for _ in range(2)]
    assert first is not None
    assert second is not None
    assert first.id == second.id
    assert await count(db, "messages") == 3


async def test_an_answer_links_inside_a_callers_transaction(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite"
    db = await Database.open(path)
    request = await History(db).reconcile("t", "s", [{"role": "user", "content": "hi"}], MODEL, ENCODING)
    await db.close()

    db = await Database.open(path)  # a fresh process: nothing about the parent is known in memory
    try:
        history = History(db)
        pending = await Answers(history).prepare("t", "s", request.path[-1].id, {"role": "assistant"}, ENCODING)

        def seal(connection: Any) -> StoredMessage | None:
            connection.execute("CREATE TABLE IF NOT EXISTS seal_marker (x)")
            return pending.write(connection)

        stored = await db.write(seal)
        assert stored is not None
        assert stored.depth == 1
        assert [m.id for m in await history.path("t", "s") or []] == [request.path[0].id, stored.id]
        assert await db.fetchone("SELECT * FROM seal_marker") is None  # the caller's own write committed too
    finally:
        await db.close()


async def test_an_answer_for_an_unknown_parent_or_session_is_not_linked(db: Database, history: History) -> None:
    request = await history.reconcile("t", "s", [{"role": "user", "content": "hi"}], MODEL, ENCODING)
    assert await link(db, history, "t", "s", "0" * 64, {"role": "assistant", "content": "x"}) is None
    assert await link(db, history, "other", "s", request.path[-1].id, {"role": "assistant"}) is None
    assert await count(db, "messages") == 1
    session = await history.session("t", "s")
    assert session is not None
    assert session.head_id == request.path[-1].id


async def test_fifty_concurrent_sessions(db: Database, history: History) -> None:
    turns = 4

    async def chat(index: int) -> None:
        messages: list[dict[str, Any]] = [{"role": "system", "content": f"session {index}"}]
        for turn in range(turns):
            messages.append({"role": "user", "content": f"turn {turn} of {index}"})
            async with history.lock("t", f"s{index}"):
                result = await history.reconcile("t", f"s{index}", messages, MODEL, ENCODING)
                # A first turn finds the system prompt's node stored if another session stored it first.
                assert result.stored_before == len(messages) - 1 if turn else result.stored_before <= 1
                answer = {"role": "assistant", "content": f"reply {turn}"}
                assert await link(db, history, "t", f"s{index}", result.path[-1].id, answer) is not None
            messages.append({**answer, "refusal": None, "annotations": []})

    await asyncio.gather(*(chat(index) for index in range(50)))
    # The system prompts differ but stand at one place: one node, and 49 variants of it.
    assert await count(db, "messages") == 1 + 50 * 2 * turns
    assert await count(db, "message_variants") == 49
    assert await count(db, "sessions") == 50
    if db.dialect == "sqlite":
        row = await db.fetchone("PRAGMA integrity_check")
        assert row is not None
        assert row[0] == "ok"
    page, _ = await history.sessions("t", limit=100)
    assert {info.message_count for info in page} == {1 + 2 * turns}
