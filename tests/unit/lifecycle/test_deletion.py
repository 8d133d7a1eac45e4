"""Deleting a session and purging a tenant (`proxy.lifecycle`) on both stores: what goes table by table, what a
session sharing its prefix keeps, another tenant untouched, and requests and answers that race the deletion."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from proxy.canonical.types import Chunk
from proxy.compaction.recall import Recall
from proxy.compaction.recall_index import RecallIndex
from proxy.compaction.span_store import SpanStore
from proxy.compaction.summarizer_calls import SummarizerCalls
from proxy.config.schema import JournalConfig
from proxy.cost import TokenCost
from proxy.errors import Conflict, NotFound
from proxy.history.answers import Answers
from proxy.history.messages import StoredMessage
from proxy.history.pins import Pins
from proxy.history.store import History, SessionDeleted
from proxy.journal.reader import JournalReader
from proxy.journal.writer import Journal
from proxy.lifecycle.deletions import Deletions
from proxy.store.database import Database
from tests.unit.compaction.test_recall import FACT, QUESTION, conversation, shown, visible

ENCODING = "cl100k_base"
MODEL = "gpt-4"
MARKER = "Zebrafinch4417"
"""A word planted in one session's messages: nothing may hold it once that session is deleted."""

TENANT_TABLES = (
    "sessions",
    "summaries",
    "journal_steps",
    "context_settings",
    "pins",
    "compaction_events",
    "recall_messages",
    "summarizer_calls",
)


def opening(tag: str) -> list[dict[str, Any]]:
    """The first turns every session of a tenant shares (a tool's system prompt and its first question)."""
    return [{"role": "system", "content": "you are a helpful tool"}, {"role": "user", "content": f"hello {tag}"}]


def turns(tag: str, count: int, word: str = "") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for turn in range(count):
        messages.append({"role": "assistant", "content": f"answer {turn} of {tag}"})
        messages.append({"role": "user", "content": f"question {turn} of {tag} {word}".strip()})
    return messages


def chunk(text: str) -> Chunk:
    return {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}


@dataclass
class Parts:
    db: Database
    history: History
    journal: Journal
    reader: JournalReader
    spans: SpanStore
    deletions: Deletions

    async def session(self, tenant: str, session_id: str, messages: list[dict[str, Any]]) -> list[StoredMessage]:
        reconciled = await self.history.reconcile(tenant, session_id, messages, MODEL, ENCODING)
        return list(reconciled.path)

    async def answered(self, tenant: str, session_id: str, parent: str, text: str) -> int:
        step = await self.journal.begin(
            tenant=tenant,
            session_id=session_id,
            model=MODEL,
            fingerprint="",
            idempotency_key=None,
            stream=True,
            parent_message_id=parent,
            encoding=ENCODING,
        )
        await self.journal.append(step, [chunk(text)])
        await self.journal.seal(step)
        return step.id

    async def rows(self, table: str, where: str = "", params: tuple[Any, ...] = ()) -> int:
        row = await self.db.fetchone(f"SELECT COUNT(*) FROM {table} {where}", params)
        assert row is not None
        return int(row[0])

    async def tenant_rows(self, tenant: str) -> dict[str, int]:
        return {table: await self.rows(table, "WHERE tenant = ?", (tenant,)) for table in TENANT_TABLES}


@pytest.fixture
def parts(db: Database) -> Parts:
    history = History(db)
    return Parts(
        db,
        history,
        Journal(db, Answers(history), JournalConfig()),
        JournalReader(db),
        SpanStore(db),
        Deletions(db, history),
    )


async def everything(parts: Parts, tenant: str, session_id: str, tag: str, word: str = "") -> list[StoredMessage]:
    """A session with a row in every table that holds content: its path, a sealed answer (steps, events), a
    span, a setting, a pin, a compaction event, a summarizer call and recall index entries."""
    path = await parts.session(tenant, session_id, [*opening("all"), *turns(tag, 3, word)])
    await parts.answered(tenant, session_id, path[-1].id, f"the answer of {tag} {word}")
    path = await parts.session(tenant, session_id, [*opening("all"), *turns(tag, 3, word), *turns(tag + "+", 1)])
    await parts.spans.add(
        tenant,
        start_depth=2,
        end=path[5],
        content=f"summary of {tag} {word}",
        tokens=5,
        original_tokens=40,
        model=MODEL,
        generated_by="fallback",
    )
    reconciled = await parts.history.reconcile(tenant, session_id, [m.message for m in path], MODEL, ENCODING)
    await parts.history.attach_settings(reconciled, {"budget": 1000})
    await Pins(parts.db).add(tenant, session_id, [path[4].id])
    await SummarizerCalls(parts.db).record(tenant, session_id, MODEL, TokenCost(sent=10, completion=2))
    await parts.db.write(
        lambda connection: connection.execute(
            "INSERT INTO compaction_events (tenant, session_id, event, strategy, created_at) VALUES (?, ?, ?, ?, ?)",
            (tenant, session_id, "complete", "summarize", 1.0),
        )
    )
    await RecallIndex(parts.db).index_messages(tenant, path[2:8])
    return path


async def test_deleting_a_session_removes_its_rows_and_keeps_what_another_session_reaches(parts: Parts) -> None:
    doomed = await everything(parts, "t", "a", "a", MARKER)
    kept = await everything(parts, "t", "b", "b")
    await everything(parts, "u", "a", "a", MARKER)
    kept_path = await parts.history.path("t", "b")
    foreign_before = await parts.tenant_rows("u")
    assert [m.id for m in doomed[:2]] == [m.id for m in kept[:2]]  # the shared opening: one pair of nodes
    assert await indexed(parts, MARKER.lower()) == 6  # three questions of each tenant's session

    forgotten = await parts.deletions.delete_session("t", "a")

    assert forgotten.sessions == ("a",)
    assert await parts.history.session("t", "a") is None
    assert await parts.history.path("t", "b") == kept_path
    own = [message.id for message in doomed[2:]]
    for table, column in (
        ("messages", "id"),
        ("message_tokens", "message_id"),
        ("message_variants", "message_id"),
        ("context_settings", "message_id"),
        ("summaries", "end_id"),
        ("recall_messages", "message_id"),
        ("pins", "message_id"),
    ):
        listed = ",".join(f"'{node}'" for node in own)
        assert await parts.rows(table, f"WHERE {column} IN ({listed})") == 0, table
    assert await parts.rows("messages", "WHERE id IN (?, ?)", (doomed[0].id, doomed[1].id)) == 2
    for table in ("journal_steps", "pins", "compaction_events", "summarizer_calls"):
        assert await parts.rows(table, "WHERE tenant = 't' AND session_id = 'a'") == 0, table
        assert await parts.rows(table, "WHERE tenant = 't' AND session_id = 'b'") > 0, table
    assert await parts.rows("journal_events", "WHERE content LIKE ?", (f"%{MARKER}%",)) > 0  # tenant u's
    assert await parts.rows("journal_events", "WHERE content LIKE '%of a %'") == 1  # u's answer only
    assert await parts.tenant_rows("u") == foreign_before
    assert await indexed(parts, MARKER.lower()) == 3  # tenant u's
    if parts.db.dialect == "sqlite":
        await parts.db.write(
            lambda connection: connection.execute(
                "INSERT INTO recall_index (recall_index, rank) VALUES ('integrity-check', 0)"
            )
        )


async def test_an_unknown_or_another_tenants_session_is_not_found_and_nothing_changes(parts: Parts) -> None:
    await everything(parts, "u", "theirs", "x")
    before = await parts.tenant_rows("u")
    messages = await parts.rows("messages")
    for session_id in ("theirs", "nobody"):
        with pytest.raises(NotFound) as raised:
            await parts.deletions.delete_session("t", session_id)
        assert raised.value.code == "session_not_found"
        assert raised.value.message == f"No session with id '{session_id}'."
    assert await parts.tenant_rows("u") == before
    assert await parts.rows("messages") == messages


async def test_a_branch_the_session_left_behind_goes_with_it(parts: Parts) -> None:
    first = await parts.session("t", "a", [*opening("x"), *turns("old", 3)])
    edited = await parts.session("t", "a", [*opening("x"), *turns("new", 2)])
    assert first[-1].id != edited[-1].id
    await parts.session("t", "b", opening("x"))

    await parts.deletions.delete_session("t", "a")

    assert await parts.rows("messages") == 2  # the opening session b still has
    assert await parts.rows("message_tokens") == 2


async def test_a_request_located_before_the_deletion_is_refused_whole_and_the_next_is_stored_anew(
    parts: Parts,
) -> None:
    messages = [*opening("x"), *turns("a", 2)]
    await parts.session("t", "a", messages)
    located = await parts.history.locate("t", "a", [*messages, *turns("more", 1)], ENCODING)

    await parts.deletions.delete_session("t", "a")
    with pytest.raises(SessionDeleted) as raised:
        await parts.history.save(located, MODEL)

    assert raised.value.status == 409
    assert await parts.rows("messages") == 0
    assert await parts.history.session("t", "a") is None
    again = await parts.history.reconcile("t", "a", [*messages, *turns("more", 1)], MODEL, ENCODING)
    assert again.stored_before == 0
    assert await parts.rows("messages") == len(messages) + 2


async def test_an_answer_sealed_after_its_session_was_deleted_is_refused_and_leaves_nothing(parts: Parts) -> None:
    path = await parts.session("t", "a", [*opening("x"), *turns("a", 1)])
    step = await parts.journal.begin(
        tenant="t",
        session_id="a",
        model=MODEL,
        fingerprint="",
        idempotency_key=None,
        stream=True,
        parent_message_id=path[-1].id,
        encoding=ENCODING,
    )
    await parts.journal.append(step, [chunk("half an ")])

    await parts.deletions.delete_session("t", "a")

    with pytest.raises(parts.db.errors):  # the step's row is gone: its foreign key refuses the events
        await parts.journal.append(step, [chunk("answer")])
    with pytest.raises(Conflict, match="no longer open"):
        await parts.journal.seal(step)
    assert await parts.rows("messages") == 0
    assert await parts.rows("journal_events") == 0
    assert await parts.rows("journal_steps", "WHERE tenant = 't'") == 0
    assert await parts.reader.step("t", step.id) is None


async def test_purging_a_tenant_removes_every_row_it_stored(parts: Parts) -> None:
    await everything(parts, "u", "a", "a", MARKER)
    foreign = await parts.tenant_rows("u")
    foreign_messages = await parts.rows("messages")
    await everything(parts, "t", "a", "a", MARKER)
    await everything(parts, "t", "b", "b")
    await parts.journal.begin(
        tenant="t",
        session_id=None,
        model=MODEL,
        fingerprint="",
        idempotency_key=None,
        stream=False,
        parent_message_id=None,
        encoding=ENCODING,
    )

    forgotten = await parts.deletions.purge_tenant("t")

    assert sorted(forgotten.sessions) == ["a", "b"]
    assert set((await parts.tenant_rows("t")).values()) == {0}
    assert await parts.tenant_rows("u") == foreign
    assert await parts.rows("span_epochs", "WHERE tenant = 't'") == 0
    assert await parts.rows("messages") == foreign_messages
    assert await parts.rows("message_tokens") == foreign_messages
    assert await indexed(parts, MARKER.lower()) == 3  # tenant u's
    assert await parts.rows("journal_events", "WHERE step_id NOT IN (SELECT id FROM journal_steps)") == 0


async def test_spans_read_before_a_deletion_are_not_carried_into_the_session_sent_again(parts: Parts) -> None:
    """Two processes sharing the store: the one that did not delete reads the spans afresh."""
    other = SpanStore(parts.db)
    path = await everything(parts, "t", "a", "a")
    assert len(await other.in_force_on("t", path, "a")) == 1

    await parts.deletions.delete_session("t", "a")
    again = await parts.session("t", "a", [message.message for message in path])

    assert [message.id for message in again] == [message.id for message in path]
    assert await other.in_force_on("t", again, "a") == ()


async def test_a_deleted_sessions_newest_step_id_is_never_given_again(parts: Parts) -> None:
    path = await parts.session("t", "a", [*opening("x"), *turns("a", 1)])
    step_id = await parts.answered("t", "a", path[-1].id, "an answer")

    await parts.deletions.delete_session("t", "a")
    path = await parts.session("t", "b", [*opening("y"), *turns("b", 1)])
    newer = await parts.answered("t", "b", path[-1].id, "another")

    assert newer > step_id
    assert await parts.reader.step("t", step_id) is None


async def test_the_deleted_text_is_nowhere_in_the_sqlite_file_once_the_space_is_given_back(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "store.sqlite")
    try:
        history = History(db)
        parts = Parts(
            db,
            history,
            Journal(db, Answers(history), JournalConfig()),
            JournalReader(db),
            SpanStore(db),
            Deletions(db, history),
        )
        await everything(parts, "t", "a", "a", MARKER * 40)
        await everything(parts, "t", "b", "b")
        assert _holds(tmp_path, MARKER)

        await parts.deletions.delete_session("t", "a")

        assert not _holds(tmp_path, MARKER)
        assert _holds(tmp_path, "answer 0 of b")
    finally:
        await db.close()


async def indexed(parts: Parts, word: str) -> int:
    """Documents of the recall index (every tenant's) that hold `word`."""
    if parts.db.dialect == "sqlite":
        return await parts.rows("recall_index", "WHERE recall_index MATCH ?", (word,))
    return await parts.rows("recall_index", "WHERE document @@ to_tsquery('simple', ?)", (word,))


def _holds(folder: Path, text: str) -> bool:
    """Whether any of the store's files (the database, its write-ahead log) holds `text`, in any case."""
    needles = (text.encode(), text.lower().encode())
    return any(needle in path.read_bytes() for path in folder.glob("store.sqlite*") for needle in needles)


async def test_a_session_branching_from_the_middle_of_the_deleted_one_keeps_its_whole_path(parts: Parts) -> None:
    doomed = await parts.session("t", "a", [*opening("x"), *turns("a", 4)])
    for index in range(20):  # a root with many branches: looked at only until one holds a reference
        await parts.session("t", f"other-{index}", [*opening("x"), *turns(f"other-{index}", 1)])
    branch = await parts.session("t", "b", [*(m.message for m in doomed[:5]), *turns("b", 2)])
    before = await parts.history.path("t", "b")

    await parts.deletions.delete_session("t", "a")

    assert await parts.history.path("t", "b") == before
    assert [m.id for m in branch[:5]] == [m.id for m in doomed[:5]]
    assert await parts.rows("messages", "WHERE id = ?", (doomed[5].id,)) == 0
    assert await parts.rows("messages") == 5 + 4 + 20 * 2  # b's path, and each other session's own pair


async def test_a_turn_sent_after_the_deletion_is_stored_anew_on_another_replica_as_on_this_one(parts: Parts) -> None:
    """Another replica (its own caches over the same store) still remembers the session's path: the deleted id
    names nothing there either, so its next turn is a new session, stored whole, as on the replica that deleted it
    (only a request located before the deletion is refused)."""
    messages = [*opening("x"), *turns("a", 2)]
    other = History(parts.db)
    await other.reconcile("t", "a", messages, MODEL, ENCODING)
    await parts.session("u", "a", messages)

    await parts.deletions.delete_session("u", "a")
    here = await parts.history.reconcile("u", "a", [*messages, *turns("a+", 1)], MODEL, ENCODING)
    await parts.deletions.delete_session("t", "a")
    there = await other.reconcile("t", "a", [*messages, *turns("a+", 1)], MODEL, ENCODING)

    assert here.stored_before == there.stored_before == 0
    assert [stored.message for stored in there.path] == [*messages, *turns("a+", 1)]
    assert await parts.rows("messages") == 2 * (len(messages) + 2)


async def test_a_deleted_session_sent_again_is_indexed_again_and_recalled(db: Database) -> None:
    """Recall remembers which messages it indexed (`Recall.forget_tenant`): a deletion takes their index entries,
    so the same conversation sent again under the same id (the same nodes: ids are content addresses) is indexed
    again and recalled from, not skipped as indexed."""
    history, recall = History(db), Recall(db)
    deletions = Deletions(db, history, caches=(recall,))
    hidden = list(range(1, 12))

    async def recalled() -> list[str]:
        path = (await history.reconcile("t", "s", conversation(8), MODEL, ENCODING)).path
        passages = await recall.passages(
            "t", "s", path, shown(path, hidden), visible(path, hidden), QUESTION, 500, ENCODING
        )
        return [passage.text for passage in passages]

    first = await recalled()
    assert any(FACT in text for text in first)
    await deletions.delete_session("t", "s")
    assert await recalled() == first


async def test_a_session_deleted_on_another_replica_sent_again_is_indexed_again_and_recalled(db: Database) -> None:
    """The replica that did not delete (its own caches over the same store) learns of the deletion from the store
    (the tenant's span epoch moves past a clearing): it indexes the conversation sent again too."""
    history, recall = History(db), Recall(db)
    deleting = History(db)
    hidden = list(range(1, 12))

    async def recalled() -> list[str]:
        path = (await history.reconcile("t", "s", conversation(8), MODEL, ENCODING)).path
        passages = await recall.passages(
            "t", "s", path, shown(path, hidden), visible(path, hidden), QUESTION, 500, ENCODING
        )
        return [passage.text for passage in passages]

    first = await recalled()
    assert any(FACT in text for text in first)
    await Deletions(db, deleting).delete_session("t", "s")
    assert await recalled() == first


async def test_a_request_adding_nothing_to_a_cached_path_reads_nothing_and_is_saved(
    parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sent again as it was (a retry, a regenerated answer), a cached path is not read: the save checks its last
    node anyway."""
    messages = [*opening("x"), *turns("a", 2)]
    first = await parts.session("t", "a", messages)
    reads: list[str] = []
    fetch = parts.db.fetch_tuples

    async def counted(sql: str, params: Any = ()) -> list[tuple[Any, ...]]:
        reads.append(sql)
        return await fetch(sql, params)

    monkeypatch.setattr(parts.db, "fetch_tuples", counted)
    async with parts.history.stored("t", "a", messages, MODEL, ENCODING) as (located, reconciled):
        assert not located.checked
    assert reads == []
    assert reconciled.stored_before == len(messages)
    assert [stored.id for stored in reconciled.path] == [stored.id for stored in first]


async def test_a_path_sent_again_whole_after_another_replica_deleted_it_is_stored_anew(parts: Parts) -> None:
    """The replica that did not delete still caches the path and reads nothing to locate a request that adds
    nothing to it: its save finds the path gone, and the request is located afresh from the store and stored as a
    new session, as when its locate reads the store (a turn that adds something)."""
    messages = [*opening("x"), *turns("a", 2)]
    other = History(parts.db)
    for tenant in ("t", "u"):
        await other.reconcile(tenant, "a", messages, MODEL, ENCODING)
        await parts.deletions.delete_session(tenant, "a")

    async with other.stored("t", "a", messages, MODEL, ENCODING) as (located, stored):
        assert located.checked  # the second locate, from the store
    again = await other.reconcile("u", "a", messages, MODEL, ENCODING)

    for reconciled in (stored, again):
        assert reconciled.stored_before == 0
        assert [message.message for message in reconciled.path] == messages
    assert await parts.rows("messages") == 2 * len(messages)


async def test_a_request_adding_nothing_located_before_this_replicas_deletion_is_refused(parts: Parts) -> None:
    """This process's deletion forgets the cached path, so the save that finds it gone knows the request was
    located before the deletion: refused, as any request located before it."""
    messages = [*opening("x"), *turns("a", 2)]
    await parts.session("t", "a", messages)
    located = await parts.history.locate("t", "a", messages, ENCODING)
    assert not located.checked

    await parts.deletions.delete_session("t", "a")
    with pytest.raises(SessionDeleted) as raised:
        await parts.history.save(located, MODEL)

    assert type(raised.value) is SessionDeleted
    assert await parts.rows("messages") == 0
