"""The stream journal on a real SQLite file: lifecycle, durability, recovery after a crash, idempotent replay."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from proxy.canonical.types import Chunk
from proxy.config.schema import JournalConfig
from proxy.errors import Conflict, StoreUnavailable
from proxy.history.answers import Answers
from proxy.history.store import History
from proxy.journal.assembly import assemble
from proxy.journal.reader import JournalReader
from proxy.journal.recovery import Recovery
from proxy.journal.replay import chunks_from_record, completion_from_record
from proxy.journal.steps import Step, event_type
from proxy.journal.writer import Journal
from proxy.store.database import Database

ENCODING = "cl100k_base"
MODEL = "gpt-4"
TENANT = "tenant-a"
SESSION = "s1"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def count(message: Mapping[str, Any], encoding: str) -> int:
    return len(json.dumps(message)) // 4


def text(content: str, finish: str | None = None) -> Chunk:
    delta = {"content": content} if content else {}
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def call(index: int, arguments: str, *, call_id: str | None = None, name: str | None = None) -> Chunk:
    fragment: dict[str, Any] = {"index": index, "function": {"arguments": arguments}}
    if call_id is not None:
        fragment.update(id=call_id, type="function")
        fragment["function"]["name"] = name
    return {"choices": [{"index": 0, "delta": {"tool_calls": [fragment]}, "finish_reason": None}]}


USAGE = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
USAGE_CHUNK: Chunk = {"choices": [], "usage": USAGE}
TOOL_STREAM: list[list[Chunk]] = [
    [text("Let me "), text("check.")],
    [call(0, '{"city": ', call_id="call_a", name="weather"), call(0, '"Paris"}')],
    [call(1, "", call_id="call_b", name="time"), call(1, "{}"), text("", "tool_calls")],
    [USAGE_CHUNK],
]
TOOL_CALLS = [
    {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
    {"id": "call_b", "type": "function", "function": {"name": "time", "arguments": "{}"}},
]


class Store:
    """A Database, History and the journal's parts on one file, reopenable to simulate a restart."""

    def __init__(self, path: Path, config: JournalConfig) -> None:
        self.path, self.config, self.clock = path, config, Clock()

    async def open(self) -> Store:
        self.db = await Database.open(self.path)
        self.history = History(self.db, clock=self.clock, count=count)
        self.journal = Journal(self.db, Answers(self.history), self.config, clock=self.clock)
        self.reader = JournalReader(self.db)
        self.recovery = Recovery(self.db, self.journal)
        return self

    async def conversation(self, tenant: str = TENANT, session: str = SESSION) -> str:
        """A reconciled session; returns its head, the parent of the next answer."""
        messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather?"}]
        reconciled = await self.history.reconcile(tenant, session, messages, MODEL, ENCODING)
        return reconciled.path[-1].id

    async def begin(self, parent: str | None = None, **overrides: Any) -> Step:
        arguments: dict[str, Any] = {
            "tenant": TENANT,
            "session_id": SESSION if parent else None,
            "model": MODEL,
            "fingerprint": "fp-1",
            "idempotency_key": None,
            "stream": True,
            "parent_message_id": parent,
            "encoding": ENCODING,
            **overrides,
        }
        return await self.journal.begin(**arguments)


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store(tmp_path / "store.sqlite", JournalConfig()).open()
    yield opened
    await opened.db.close()


async def stream(store: Store, step: Step, batches: list[list[Chunk]]) -> None:
    for batch in batches:
        await store.journal.append(step, batch)


def rows(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Read with a fresh, separate connection: only what is committed is visible."""
    with sqlite3.connect(path) as connection:
        return connection.execute(sql, params).fetchall()


async def test_a_sealed_stream_assembles_text_and_tool_calls_into_history(store: Store) -> None:
    parent = await store.conversation()
    step = await store.begin(parent)
    await stream(store, step, TOOL_STREAM)
    record = await store.journal.seal(step)

    assert record.status == "sealed"
    assert record.content == "Let me check."
    assert record.tool_calls == TOOL_CALLS
    assert (record.finish_reason, record.usage) == ("tool_calls", USAGE)
    assert record.events == 9  # eight chunks and the `done` event: kept by default
    assert await store.reader.step(TENANT, step.id) == record

    path = await store.history.path(TENANT, SESSION)
    assert path is not None
    assert path[-1].id == record.message_id
    assert path[-1].parent_id == parent
    assert path[-1].message == {"role": "assistant", "content": "Let me check.", "tool_calls": TOOL_CALLS}
    types = rows(store.path, "SELECT type FROM journal_events WHERE step_id = ? ORDER BY seq", (step.id,))
    expected = ["text", "text", "tool_call", "tool_call", "tool_call", "tool_call", "text", "usage", "done"]
    assert [kind for (kind,) in types] == expected


async def test_an_append_is_committed_when_it_returns(store: Store) -> None:
    step = await store.begin()
    await store.journal.append(step, [text("a"), text("b")])
    assert rows(store.path, "SELECT seq, content FROM journal_events WHERE step_id = ?", (step.id,)) == [
        (0, json.dumps(text("a"), separators=(",", ":"))),
        (1, json.dumps(text("b"), separators=(",", ":"))),
    ]
    await store.journal.append(step, [text("c")])
    assert rows(store.path, "SELECT COUNT(*) FROM journal_events WHERE step_id = ?", (step.id,)) == [(3,)]


async def test_a_non_stream_answer_is_stored_as_its_one_event(store: Store) -> None:
    parent = await store.conversation()
    step = await store.begin(parent, stream=False)
    completion = completion_from_record(await seal_stream(store))  # any well-formed chat.completion
    record = await store.journal.seal(step, completion)
    assert (record.content, record.tool_calls, record.usage) == ("Let me check.", TOOL_CALLS, USAGE)
    stored = rows(store.path, "SELECT type, content FROM journal_events WHERE step_id = ?", (step.id,))
    assert [(kind, json.loads(content)) for kind, content in stored] == [("done", completion)]
    assert record.message_id is not None


async def seal_stream(store: Store) -> Any:
    step = await store.begin()
    await stream(store, step, TOOL_STREAM)
    return await store.journal.seal(step)


async def test_keep_events_zero_prunes_on_seal_and_the_record_still_replays(tmp_path: Path) -> None:
    store = await Store(tmp_path / "s.sqlite", JournalConfig(keep_events_s=0)).open()
    try:
        step = await store.begin(idempotency_key="k")
        await stream(store, step, TOOL_STREAM)
        record = await store.journal.seal(step)
        assert record.events == 0
        assert rows(store.path, "SELECT COUNT(*) FROM journal_events") == [(0,)]
        replayed = await store.reader.replay(TENANT, "k", "fp-1")
        assert replayed is not None
        assert replayed == (record, [])
        synthesized = assemble(chunks_from_record(record))
        assert (synthesized.content, synthesized.tool_calls) == (record.content, record.tool_calls)
        assert synthesized.finish_reason == "tool_calls"
    finally:
        await store.db.close()


async def test_expired_events_are_pruned_except_an_interrupted_steps(tmp_path: Path) -> None:
    store = await Store(tmp_path / "s.sqlite", JournalConfig(keep_events_s=60)).open()
    try:
        sealed, cut = await store.begin(), await store.begin()
        await stream(store, sealed, [[text("done", "stop")]])
        await stream(store, cut, [[text("half")]])
        await store.journal.seal(sealed)
        await store.journal.interrupt(cut)
        assert await store.recovery.prune_expired() == 0
        store.clock.now += 61
        assert await store.recovery.prune_expired() == 2  # the chunk and the `done` event
        left = rows(store.path, "SELECT DISTINCT step_id FROM journal_events")
        assert left == [(cut.id,)]
        record = await store.reader.step(TENANT, sealed.id)
        assert record is not None
        assert (record.content, record.events) == ("done", 0)
    finally:
        await store.db.close()


async def test_fail_keeps_the_partial_answer_and_the_error(store: Store) -> None:
    step = await store.begin()
    await stream(store, step, [[text("par"), text("tial")]])
    error = {"message": "upstream went away", "type": "server_error", "param": None, "code": None}
    await store.journal.fail(step, error)
    record = await store.reader.step(TENANT, step.id)
    assert record is not None
    assert (record.status, record.content, record.error, record.message_id) == ("failed", "partial", error, None)
    last = rows(store.path, "SELECT type, content FROM journal_events WHERE step_id = ? ORDER BY seq DESC", (step.id,))
    assert last[0] == ("error", json.dumps(error, separators=(",", ":")))


@contextmanager
def unwritable(store: Store) -> Iterator[None]:
    """The store refuses every write (as a full disk or a lost server would) until the block ends."""
    writer: sqlite3.Connection = store.db.engine.writer  # type: ignore[attr-defined]
    writer.execute("PRAGMA query_only = ON")
    try:
        yield
    finally:
        writer.execute("PRAGMA query_only = OFF")


async def test_an_ending_the_store_could_not_write_is_written_once_it_can(store: Store) -> None:
    step = await store.begin()
    await stream(store, step, [[text("par"), text("tial")]])
    error = {"message": "the store went away", "type": "server_error", "param": None, "code": "store_unavailable"}
    with unwritable(store):
        with pytest.raises(sqlite3.OperationalError):
            await store.journal.fail(step, error)
        assert store.journal.unrecorded.step_ids() == [step.id]
        with pytest.raises(sqlite3.OperationalError):
            await store.recovery.settle_unrecorded()  # still refused: kept for the next try
    assert rows(store.path, "SELECT status FROM journal_steps WHERE id = ?", (step.id,)) == [("open",)]
    assert store.journal.unrecorded.step_ids() == [step.id]
    assert await store.recovery.settle_unrecorded() == [step.id]
    record = await store.reader.step(TENANT, step.id)
    assert record is not None
    assert (record.status, record.content, record.error) == ("failed", "partial", error)
    last = rows(store.path, "SELECT type, content FROM journal_events WHERE step_id = ? ORDER BY seq DESC", (step.id,))
    assert last[0] == ("error", json.dumps(error, separators=(",", ":")))
    assert store.journal.unrecorded.step_ids() == []
    assert await store.recovery.settle_unrecorded() == []


async def test_an_unrecorded_ending_a_keyed_retry_wrote_is_forgotten(store: Store) -> None:
    step = await store.begin(idempotency_key="k")
    with unwritable(store), pytest.raises(sqlite3.OperationalError):
        await store.journal.interrupt(step)
    retry = await store.begin(idempotency_key="k")  # writes the remembered ending before its own step
    assert rows(store.path, "SELECT status FROM journal_steps WHERE id = ?", (step.id,)) == [("interrupted",)]
    assert await store.recovery.settle_unrecorded() == []
    assert store.journal.unrecorded.step_ids() == []
    assert retry.id != step.id


async def test_a_begin_whose_commit_went_unconfirmed_is_ended_once_the_store_is_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.journal.owner = "this-process"
    live = await store.begin()
    store.clock.now += 1
    writable = store.db.write

    async def answer_lost(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(store.db, "write", writable)
        await writable(*args, **kwargs)  # committed, but the server went away before saying so
        lost = StoreUnavailable("The proxy's store is unreachable.")
        lost.commit_unknown = True
        raise lost

    monkeypatch.setattr(store.db, "write", answer_lost)
    with pytest.raises(StoreUnavailable) as raised:
        await store.begin()
    [(unseen,)] = rows(store.path, "SELECT id FROM journal_steps WHERE id != ?", (live.id,))
    assert await store.recovery.settle_unrecorded() == [unseen]
    statuses = rows(store.path, "SELECT id, status, error FROM journal_steps ORDER BY id")
    assert statuses == [
        (live.id, "open", None),
        (unseen, "failed", json.dumps(raised.value.fields(), separators=(",", ":"))),
    ]
    assert store.journal.unrecorded.unconfirmed_begins() == []
    assert await store.recovery.settle_unrecorded() == []


async def test_a_begin_refused_outright_leaves_nothing_to_settle(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    store.journal.owner = "this-process"

    async def refused(*args: Any, **kwargs: Any) -> Any:
        raise StoreUnavailable("The proxy's store is unreachable.")

    monkeypatch.setattr(store.db, "write", refused)
    with pytest.raises(StoreUnavailable):
        await store.begin()
    assert store.journal.unrecorded.unconfirmed_begins() == []


async def test_interrupt_keeps_the_partial_answer_and_a_late_end_is_a_no_op(store: Store) -> None:
    step = await store.begin()
    await stream(store, step, [[text("so far")]])
    await store.journal.interrupt(step)
    await store.journal.fail(step, {"message": "late"})
    record = await store.reader.step(TENANT, step.id)
    assert record is not None
    assert (record.status, record.content, record.error, record.events) == ("interrupted", "so far", None, 1)
    with pytest.raises(Conflict):
        await store.journal.seal(step)
    with pytest.raises(RuntimeError):
        await store.journal.append(step, [text("more")])


async def test_an_answer_that_cannot_join_history_is_still_sealed(
    store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    parent = await store.conversation()
    step = await store.begin(parent, session_id="not-this-tenants")
    await stream(store, step, [[text("kept", "stop")]])
    record = await store.journal.seal(step)
    assert (record.status, record.content, record.message_id) == ("sealed", "kept", None)
    assert "not linked into history" in caplog.text
    path = await store.history.path(TENANT, SESSION)
    assert path is not None
    assert path[-1].id == parent  # the failed link left no node and did not move any head
    assert rows(store.path, "SELECT COUNT(*) FROM messages") == [(2,)]


async def test_an_open_step_reads_as_what_its_events_assembled(store: Store) -> None:
    step = await store.begin()
    await stream(store, step, [[text("live "), text("text")]])
    record = await store.reader.step(TENANT, step.id)
    assert record is not None
    assert (record.status, record.content, record.events) == ("open", "live text", 2)


async def test_recovery_seals_a_finished_stream_and_keeps_an_unfinished_one(tmp_path: Path) -> None:
    first = await Store(tmp_path / "s.sqlite", JournalConfig()).open()
    parent = await first.conversation()
    finished = await first.begin(parent)
    await stream(first, finished, TOOL_STREAM[:3])  # the finish_reason arrived; the usage chunk did not
    unfinished = await first.begin(parent)
    deltas = ["The ", "answer ", "is", " 4"]
    await stream(first, unfinished, [[text(d)] for d in deltas[:2]] + [[text(d) for d in deltas[2:]]])
    await first.db.close()  # crash: neither step sealed

    second = await Store(tmp_path / "s.sqlite", JournalConfig()).open()
    try:
        report = await second.recovery.recover()
        assert (report.complete, report.interrupted, report.failed) == ([finished.id], [unfinished.id], [])
        complete = await second.reader.step(TENANT, finished.id)
        assert complete is not None
        assert (complete.status, complete.content, complete.tool_calls) == ("complete", "Let me check.", TOOL_CALLS)
        path = await second.history.path(TENANT, SESSION)
        assert path is not None
        assert path[-1].id == complete.message_id
        assert path[-1].message["tool_calls"] == TOOL_CALLS

        kept = await second.reader.step(TENANT, unfinished.id)
        assert kept is not None
        assert (kept.status, kept.content, kept.message_id, kept.events) == ("interrupted", "".join(deltas), None, 4)
        again = await second.recovery.recover()
        assert again.counts() == {"complete": 0, "interrupted": 0, "failed": 0}
    finally:
        await second.db.close()


async def test_a_sealed_key_replays_identical_chunks_and_refuses_another_body(store: Store) -> None:
    parent = await store.conversation()
    step = await store.begin(parent, idempotency_key="key-1")
    with pytest.raises(Conflict, match="still in progress"):
        await store.begin(parent, idempotency_key="key-1")
    with pytest.raises(Conflict, match="still in progress"):
        await store.reader.replay(TENANT, "key-1", "fp-1")
    await stream(store, step, TOOL_STREAM)
    record = await store.journal.seal(step)

    replayed = await store.reader.replay(TENANT, "key-1", "fp-1")
    assert replayed is not None
    assert replayed[0] == record
    assert replayed[1] == [chunk for batch in TOOL_STREAM for chunk in batch]
    with pytest.raises(Conflict, match="different request body") as refused:
        await store.reader.replay(TENANT, "key-1", "fp-2")
    assert (refused.value.status, refused.value.param) == (409, "Idempotency-Key")
    with pytest.raises(Conflict, match="different request body"):
        await store.begin(parent, idempotency_key="key-1", fingerprint="fp-2")
    with pytest.raises(Conflict, match="already completed"):
        await store.begin(parent, idempotency_key="key-1")
    assert await store.reader.replay(TENANT, "unknown", "fp-1") is None


async def test_a_failed_keyed_request_can_be_retried_with_its_key(store: Store) -> None:
    failed = await store.begin(idempotency_key="retry")
    await store.journal.fail(failed, {"message": "rate limited"})
    assert await store.reader.replay(TENANT, "retry", "fp-1") is None
    retry = await store.begin(idempotency_key="retry")
    await stream(store, retry, [[text("ok", "stop")]])
    await store.journal.seal(retry)
    replayed = await store.reader.replay(TENANT, "retry", "fp-1")
    assert replayed is not None
    assert (replayed[0].id, replayed[0].content) == (retry.id, "ok")


async def test_a_non_stream_step_replays_its_completion(store: Store) -> None:
    step = await store.begin(stream=False, idempotency_key="json")
    completion = completion_from_record(await seal_stream(store))
    await store.journal.seal(step, completion)
    replayed = await store.reader.replay(TENANT, "json", "fp-1")
    assert replayed is not None
    assert replayed[1] == [completion]


async def test_a_tenant_never_sees_another_tenants_steps(store: Store) -> None:
    step = await store.begin(idempotency_key="shared")
    await stream(store, step, [[text("secret", "stop")]])
    await store.journal.seal(step)
    assert await store.reader.step("tenant-b", step.id) is None
    assert await store.reader.steps("tenant-b") == ([], False)
    assert await store.reader.replay("tenant-b", "shared", "fp-1") is None
    other = await store.begin(tenant="tenant-b", idempotency_key="shared")  # same key, its own namespace
    assert other.id != step.id


async def test_steps_are_paged_newest_first_and_filtered(store: Store) -> None:
    parent = await store.conversation()
    ids = []
    for n in range(5):
        step = await store.begin(parent if n % 2 else None)
        await stream(store, step, [[text(f"answer {n}", "stop")]])
        if n < 4:
            await store.journal.seal(step)
        ids.append(step.id)

    page, more = await store.reader.steps(TENANT, limit=2)
    assert ([r.id for r in page], more) == ([ids[4], ids[3]], True)
    page, more = await store.reader.steps(TENANT, limit=2, offset=4)
    assert ([r.id for r in page], more) == ([ids[0]], False)
    sealed, _ = await store.reader.steps(TENANT, status="sealed")
    assert [r.id for r in sealed] == [ids[3], ids[2], ids[1], ids[0]]
    in_session, _ = await store.reader.steps(TENANT, session_id=SESSION)
    assert [r.id for r in in_session] == [ids[3], ids[1]]
    assert set(page[0].as_json()) == {
        *("step_id", "session_id", "model", "status", "created_at", "sealed_at", "content", "tool_calls"),
        *("finish_reason", "usage", "error", "message_id", "context"),
    }


def test_event_types_and_assembly_of_both_kinds() -> None:
    assert [event_type(c) for c in (text("a"), call(0, "{}"), USAGE_CHUNK, text("", "stop"))] == [
        "text",
        "tool_call",
        "usage",
        "text",
    ]
    chunks = [chunk for batch in TOOL_STREAM for chunk in batch]
    streamed = assemble(chunks)
    assert streamed.message() == {"role": "assistant", "content": "Let me check.", "tool_calls": TOOL_CALLS}
    completion = {"choices": [{"index": 0, "message": streamed.message(), "finish_reason": "tool_calls"}]}
    completed = assemble([completion])
    assert (completed.content, completed.tool_calls, completed.finish_reason) == (
        streamed.content,
        streamed.tool_calls,
        streamed.finish_reason,
    )
