"""`StreamRelay` on a real SQLite journal, fed by a scripted upstream stream: no server, no sockets.

The scripted stream lets a test decide when each chunk arrives (`Script.gate`), and `HeldJournal` when a commit
completes, so every interleaving of reader, pump and consumer asserted here is reached deterministically.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from proxy.canonical.answers import Journaled
from proxy.canonical.types import Chunk
from proxy.config.models import ModelEntry
from proxy.config.schema import JournalConfig
from proxy.errors import ClientTooSlow, StepKept, StoreUnavailable, UpstreamError, error_fields
from proxy.history.answers import Answers
from proxy.history.store import History
from proxy.journal.reader import JournalReader
from proxy.journal.relay import MAX_BACKLOG_CHARS, MAX_GROUP_CHUNKS, MAX_PENDING_CHUNKS, StreamRelay
from proxy.journal.steps import Step, StepStatus
from proxy.journal.writer import Journal
from proxy.store.database import Database
from proxy.upstream.deadlines import StreamDeadlines
from proxy.upstream.protocol import UpstreamCall
from tests.support.raw_store import committed_rows
from tests.support.scripted_upstream import Script, ScriptedUpstream, chunk, server_error

TENANT = "tenant-a"
SESSION = "s1"
ENCODING = "cl100k_base"
ENTRY = ModelEntry("small", "openai/gpt-4o-mini")
MESSAGES: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
WAIT_S = 5.0
FINGERPRINT = "body-fingerprint"


class HeldJournal(Journal):
    """The real journal, whose appends can be held in flight (`hold`) or made to fail (`failure`)."""

    def __init__(self, db: Database, answers: Answers, config: JournalConfig) -> None:
        super().__init__(db, answers, config)
        self.hold: asyncio.Event | None = None
        self.hold_from = 0
        """The first append (0-based) that `hold` holds."""
        self.appending = asyncio.Event()
        """Set when an append has started (and, if held, is waiting for `hold`)."""
        self.groups: list[int] = []
        """The size of every append, in order."""
        self.failure: Exception | None = None
        self.fail_at: int = 0
        """The append (0-based) that raises `failure`."""

    async def append(self, step: Step, chunks: Sequence[Chunk]) -> list[str]:
        self.groups.append(len(chunks))
        self.appending.set()
        if self.failure is not None and len(self.groups) - 1 == self.fail_at:
            raise self.failure
        if self.hold is not None and len(self.groups) - 1 >= self.hold_from:
            await self.hold.wait()
        return await super().append(step, chunks)


class Rig:
    def __init__(self, db: Database) -> None:
        self.db = db
        self.history = History(db)
        self.journal = HeldJournal(db, Answers(self.history), JournalConfig())
        self.reader = JournalReader(db, self.journal.unrecorded)
        self.upstream = ScriptedUpstream()
        self.background: set[asyncio.Task[None]] = set()
        self.parent = ""

    async def begin(self, key: str | None = None) -> Step:
        reconciled = await self.history.reconcile(TENANT, SESSION, MESSAGES, ENTRY.name, ENCODING)
        self.parent = reconciled.path[-1].id
        return await self.journal.begin(
            tenant=TENANT,
            session_id=SESSION,
            model=ENTRY.name,
            fingerprint="" if key is None else FINGERPRINT,
            idempotency_key=key,
            stream=True,
            parent_message_id=self.parent,
            encoding=ENCODING,
        )

    async def relay(
        self,
        step: Step,
        *,
        finish_on_disconnect: bool = True,
        deadlines: StreamDeadlines | None = None,
        write_timeout_s: float = WAIT_S,
    ) -> StreamRelay:
        chunks = await self.upstream.open_stream(UpstreamCall(ENTRY, MESSAGES, {"stream": True}))
        return StreamRelay(
            self.journal,
            step,
            chunks,
            finish_on_disconnect=finish_on_disconnect,
            background=self.background,
            deadlines=deadlines,
            write_timeout_s=write_timeout_s,
        )

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Read through a fresh connection of its own: only what is committed is visible."""
        return committed_rows(self.db, sql, params)

    def stored(self, step: Step) -> list[str]:
        """The content of the step's chunk events, in seq order."""
        found = self.rows(
            "SELECT content FROM journal_events WHERE step_id = ? AND type NOT IN ('done', 'error') ORDER BY seq",
            (step.id,),
        )
        return [content for (content,) in found]

    def head(self) -> str:
        [(head,)] = self.rows("SELECT head_id FROM sessions WHERE tenant = ? AND id = ?", (TENANT, SESSION))
        return str(head)

    def pump(self) -> asyncio.Task[None]:
        [task] = self.background
        return task


@pytest.fixture
async def rig(db: Database) -> AsyncIterator[Rig]:
    made = Rig(db)
    yield made
    for task in made.background:  # a failed test must not leave a pump writing into a closing store
        task.cancel()
    await asyncio.gather(*made.background, return_exceptions=True)


def texts(chunks: Sequence[Chunk]) -> list[str]:
    return [json.dumps(c, separators=(",", ":")) for c in chunks]


def parts(count: int) -> list[Chunk]:
    return [chunk(f"p{index} ") for index in range(count)] + [chunk(None, "stop")]


async def test_every_group_is_committed_when_the_consumer_receives_it(rig: Rig) -> None:
    chunks = parts(10)
    script = rig.upstream.stream(chunks)
    gates = {4: script.gate(4), 8: script.gate(8)}  # at least three groups: released as the consumer catches up
    step = await rig.begin()
    relay = await rig.relay(step)

    received: list[Journaled] = []
    groups = 0
    async with asyncio.timeout(WAIT_S):
        async for group in relay.events():
            # Invariant 7: at the moment of receipt everything received so far is committed, in order.
            committed = rig.stored(step)
            received.extend(group)
            groups += 1
            assert committed[: len(received)] == [item.text for item in received]
            assert all(json.loads(item.text) == item.chunk for item in group)
            if len(received) in gates:
                gates[len(received)].set()
    assert [item.chunk for item in received] == chunks
    assert [item.text for item in received] == texts(chunks)
    assert groups >= 3


async def test_the_step_is_sealed_into_history_before_the_events_end(rig: Rig) -> None:
    chunks = [chunk("Hello"), chunk(" world"), chunk(None, "stop")]
    rig.upstream.stream(chunks)
    step = await rig.begin()
    relay = await rig.relay(step)

    received: list[Chunk] = []
    async with asyncio.timeout(WAIT_S):
        async for group in relay.events():
            received.extend(item.chunk for item in group)
    # No await since the iteration ended: what is checked here was done before `events()` finished.
    [(status, message_id, content, finish)] = rig.rows(
        "SELECT status, message_id, content, finish_reason FROM journal_steps WHERE id = ?", (step.id,)
    )
    assert (status, content, finish) == ("sealed", "Hello world", "stop")
    assert step.status == StepStatus.SEALED
    assert message_id is not None
    assert rig.head() == message_id
    [(parent_id, body)] = rig.rows("SELECT parent_id, body FROM messages WHERE id = ?", (message_id,))
    assert parent_id == rig.parent
    assert json.loads(body) == {"role": "assistant", "content": "Hello world"}
    assert received == chunks
    done = rig.rows("SELECT type FROM journal_events WHERE step_id = ? ORDER BY seq DESC LIMIT 1", (step.id,))
    assert done == [("done",)]


@pytest.mark.parametrize("before", [0, 2])
async def test_an_upstream_error_mid_stream_comes_after_the_chunks_before_it(rig: Rig, before: int) -> None:
    chunks = [chunk(f"c{index}") for index in range(before)]
    error = server_error("The upstream connection broke mid-stream.")
    rig.upstream.stream(chunks, error=error)
    step = await rig.begin()
    relay = await rig.relay(step)

    received: list[Chunk] = []
    async with asyncio.timeout(WAIT_S):
        with pytest.raises(UpstreamError) as raised:
            async for group in relay.events():
                received.extend(item.chunk for item in group)
    assert raised.value is error
    assert received == chunks

    record = await rig.reader.step(TENANT, step.id)
    assert record is not None
    partial = "".join(f"c{index}" for index in range(before)) or None
    assert (record.status, record.content, record.error, record.message_id) == (
        "failed",
        partial,
        error.fields(),
        None,
    )
    assert rig.stored(step) == texts(chunks)
    [(kind, body)] = rig.rows(
        "SELECT type, content FROM journal_events WHERE step_id = ? ORDER BY seq DESC LIMIT 1", (step.id,)
    )
    assert (kind, json.loads(body)) == ("error", error.fields())
    assert rig.head() == rig.parent  # a failed answer does not join the conversation


async def leave_after_first_group(relay: StreamRelay) -> list[Journaled]:
    events = relay.events()
    async with asyncio.timeout(WAIT_S):
        first = await anext(events)
        await events.aclose()
    return list(first)


async def test_a_consumer_that_leaves_does_not_stop_the_answer_being_read_and_sealed(rig: Rig) -> None:
    chunks = [chunk("first"), chunk(" second"), chunk(" third"), chunk(None, "stop")]
    script = rig.upstream.stream(chunks)
    rest = script.gate(1)
    step = await rig.begin()
    relay = await rig.relay(step, finish_on_disconnect=True)
    pump = rig.pump()

    first = await leave_after_first_group(relay)
    assert [item.chunk for item in first] == chunks[:1]
    assert script.sent == 1  # the client left before the rest of the answer arrived
    rest.set()
    async with asyncio.timeout(WAIT_S):
        await pump
    assert script.ended.is_set()
    record = await rig.reader.step(TENANT, step.id)
    assert record is not None
    assert (record.status, record.content) == ("sealed", "first second third")
    assert rig.stored(step) == texts(chunks)
    assert rig.head() == record.message_id


async def test_a_consumer_that_leaves_interrupts_the_step_without_finish_on_disconnect(rig: Rig) -> None:
    chunks = [chunk("first"), chunk(" second"), chunk(None, "stop")]
    script = rig.upstream.stream(chunks)
    rest = script.gate(1)
    step = await rig.begin()
    relay = await rig.relay(step, finish_on_disconnect=False)
    pump = rig.pump()

    first = await leave_after_first_group(relay)
    assert [item.chunk for item in first] == chunks[:1]
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(pump, return_exceptions=True)
    assert pump.cancelled()
    rest.set()
    await asyncio.sleep(0)
    assert (script.sent, script.ended.is_set()) == (1, False)  # nothing more was read from the upstream
    record = await rig.reader.step(TENANT, step.id)
    assert record is not None
    assert (record.status, record.content, record.message_id, record.events) == ("interrupted", "first", None, 1)
    assert rig.head() == rig.parent


async def test_a_consumer_that_leaves_before_the_first_group_interrupts_the_step(rig: Rig) -> None:
    script = rig.upstream.stream([chunk("first"), chunk(None, "stop")])
    rest = script.gate(1)
    step = await rig.begin()
    relay = await rig.relay(step, finish_on_disconnect=False)
    pump = rig.pump()

    await relay.events().aclose()
    rest.set()
    async with asyncio.timeout(WAIT_S):
        await asyncio.gather(pump, return_exceptions=True)
    assert step.status == StepStatus.INTERRUPTED
    assert script.sent <= 1


async def test_the_first_chunk_is_relayed_before_the_reader_parses_on(rig: Rig) -> None:
    """An upstream that sent its whole answer at once: the first chunk's commit and relay do not wait behind the
    parsing of the rest (time to first chunk)."""
    chunks = long_answer(1000)
    script = rig.upstream.stream(chunks)
    commit = rig.journal.hold = asyncio.Event()
    step = await rig.begin()
    relay = await rig.relay(step)
    events = relay.events()
    async with asyncio.timeout(WAIT_S):
        await rig.journal.appending.wait()  # the pump took chunk 0; its commit is in flight (held)
        for _ in range(50):
            await asyncio.sleep(0)
        assert (script.sent, relay.pending_chunks) == (1, 0)  # the reader waits for the first chunk's relay
        commit.set()
        first = await anext(events)
        assert [item.chunk for item in first] == chunks[:1]
        received = [item.chunk for group in [first, *[g async for g in events]] for item in group]
    assert received == chunks
    assert rig.journal.groups[0] == 1
    assert step.status == StepStatus.SEALED


async def test_chunks_arriving_during_a_commit_form_the_next_group_in_order(rig: Rig) -> None:
    chunks = [chunk("a"), chunk("b"), chunk("c"), chunk("d"), chunk("e"), chunk(None, "stop")]
    script = rig.upstream.stream(chunks)
    second, rest = script.gate(1), script.gate(2)
    commit = rig.journal.hold = asyncio.Event()
    rig.journal.hold_from = 1
    step = await rig.begin()
    relay = await rig.relay(step)
    events = relay.events()
    async with asyncio.timeout(WAIT_S):
        received = [[item.chunk for item in await anext(events)]]
        assert received == [chunks[:1]]  # chunk 0 alone, relayed
        rig.journal.appending.clear()
        second.set()
        await rig.journal.appending.wait()  # the pump took chunk 1; its commit is in flight (held)
        assert rig.journal.groups == [1, 1]
        rest.set()
        await script.ended.wait()  # the other chunks arrived while the commit was held
        await asyncio.sleep(0)
        assert relay.backlog_chars == 0  # nothing is relayed before its commit
        assert rig.stored(step) == texts(chunks[:1])
        commit.set()
        received.extend([[item.chunk for item in group] async for group in events])
    assert rig.journal.groups == [1, 1, 4]
    assert received == [chunks[:1], chunks[1:2], chunks[2:]]
    assert rig.stored(step) == texts(chunks)
    seqs = rig.rows("SELECT seq FROM journal_events WHERE step_id = ? ORDER BY seq", (step.id,))
    assert [seq for (seq,) in seqs] == list(range(len(chunks) + 1))  # the chunks and `done`, no gaps


async def test_a_failing_journal_stops_the_relay_and_fails_the_step(rig: Rig) -> None:
    chunks = [chunk("kept"), chunk(" lost"), chunk(None, "stop")]
    script = rig.upstream.stream(chunks)
    rest, last = script.gate(1), script.gate(2)
    failure = sqlite3.OperationalError("disk I/O error")
    rig.journal.failure, rig.journal.fail_at = failure, 1
    step = await rig.begin()
    relay = await rig.relay(step)
    pump = rig.pump()

    received: list[Chunk] = []
    async with asyncio.timeout(WAIT_S):
        with pytest.raises(sqlite3.OperationalError) as raised:
            async for group in relay.events():
                received.extend(item.chunk for item in group)
                rest.set()
        await pump
    assert raised.value is failure
    assert received == chunks[:1]  # nothing after the failure is relayed
    assert rig.stored(step) == texts(chunks[:1])
    [(status, content, error)] = rig.rows("SELECT status, content, error FROM journal_steps WHERE id = ?", (step.id,))
    assert (status, content, json.loads(error)) == ("failed", "kept", error_fields(failure))
    last.set()
    await asyncio.sleep(0)
    assert (script.sent, script.ended.is_set()) == (2, False)  # the reader was stopped with the pump
    assert script.closed.is_set()  # and the upstream stream closed


async def test_a_journal_that_cannot_record_the_failure_does_not_hold_the_key(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    chunks = [chunk("kept"), chunk(" lost"), chunk(None, "stop")]
    script = rig.upstream.stream(chunks)
    rest = script.gate(1)
    step = await rig.begin("key-1")
    relay = await rig.relay(step)
    pump = rig.pump()
    writable = rig.db.write
    full = sqlite3.OperationalError("database or disk is full")

    async def disk_full(*args: Any, **kwargs: Any) -> Any:
        raise full

    received: list[Chunk] = []
    async with asyncio.timeout(WAIT_S):
        with pytest.raises(sqlite3.OperationalError) as raised:
            async for group in relay.events():
                received.extend(item.chunk for item in group)
                monkeypatch.setattr(rig.db, "write", disk_full)  # every write from now on fails
                rest.set()
        await pump
    assert raised.value is full
    assert received == chunks[:1]
    assert rig.rows("SELECT status FROM journal_steps WHERE id = ?", (step.id,)) == [("open",)]  # not writable
    assert step.status == StepStatus.FAILED  # but this process knows the step is dead

    monkeypatch.setattr(rig.db, "write", writable)  # space again: a retry under the same key is not refused
    assert await rig.reader.replay(TENANT, "key-1", FINGERPRINT) is None
    retry = await rig.begin("key-1")
    assert retry.id != step.id


@pytest.mark.parametrize(
    ("where", "kept"),
    [("first append", StepKept.NOTHING), ("second append", StepKept.RELAYED), ("seal", StepKept.WHOLE)],
)
async def test_a_store_outage_mid_stream_tells_the_client_what_the_step_kept(
    rig: Rig, monkeypatch: pytest.MonkeyPatch, where: str, kept: StepKept
) -> None:
    chunks = [chunk("kept"), chunk(" more"), chunk(None, "stop")]
    script = rig.upstream.stream(chunks)
    rest = script.gate(1)
    outage = StoreUnavailable("The proxy's store is unreachable.", retry_after_s=2)
    if where == "seal":

        async def refused(step: Step, response: Chunk | None = None) -> None:
            raise outage

        monkeypatch.setattr(rig.journal, "seal", refused)
    else:
        rig.journal.failure, rig.journal.fail_at = outage, 0 if where == "first append" else 1
    step = await rig.begin()
    relay = await rig.relay(step)
    if where == "first append":
        rest.set()
    async with asyncio.timeout(WAIT_S):
        with pytest.raises(StoreUnavailable) as raised:
            async for _group in relay.events():
                rest.set()
        await rig.pump()
    told = raised.value
    assert told.message == outage.in_step(step.id, kept).message
    assert f"journal step {step.id}" in told.message
    assert kept.value in told.message
    assert told.headers["Retry-After"] == "2"
    [(status, error)] = rig.rows("SELECT status, error FROM journal_steps WHERE id = ?", (step.id,))
    assert (status, json.loads(error)) == ("failed", told.fields())  # the step keeps what its client was told


def drip(script: Script, every_s: float) -> asyncio.Task[None]:
    """Release the script's chunks one by one, `every_s` apart: an upstream that never stalls long enough for
    a between-reads timeout, yet never ends."""
    gates = [script.gate(index) for index in range(1, len(script.chunks) + 1)]

    async def release() -> None:
        for gate in gates:
            await asyncio.sleep(every_s)
            gate.set()

    return asyncio.create_task(release())


def assert_timed_out(error: UpstreamError) -> None:
    assert (error.status, error.fields()["type"], error.code) == (504, "timeout", "upstream_timeout")


async def test_a_dripping_stream_fails_at_its_total_deadline_and_the_upstream_is_closed(rig: Rig) -> None:
    chunks = parts(200)
    script = rig.upstream.stream(chunks)
    dripping = drip(script, 0.01)
    step = await rig.begin()
    relay = await rig.relay(step, deadlines=StreamDeadlines.from_now(first_byte_s=WAIT_S, total_s=0.3))
    pump = rig.pump()

    received: list[Chunk] = []
    try:
        async with asyncio.timeout(WAIT_S):
            with pytest.raises(UpstreamError) as raised:
                async for group in relay.events():
                    received.extend(item.chunk for item in group)
            await pump
    finally:
        dripping.cancel()
    assert_timed_out(raised.value)
    assert 1 <= len(received) < len(chunks)
    assert script.closed.is_set()
    assert not script.ended.is_set()
    record = await rig.reader.step(TENANT, step.id)
    assert record is not None
    assert (record.status, record.error, record.message_id) == ("failed", raised.value.fields(), None)
    assert record.content == "".join(c["choices"][0]["delta"].get("content", "") for c in received)
    assert rig.stored(step) == texts(received)


async def test_a_stream_without_a_first_chunk_fails_at_its_first_byte_deadline(rig: Rig) -> None:
    script = rig.upstream.stream([chunk("late"), chunk(None, "stop")])
    script.gate(0)  # never released
    step = await rig.begin()
    relay = await rig.relay(step, deadlines=StreamDeadlines.from_now(first_byte_s=0.1, total_s=WAIT_S))

    async with asyncio.timeout(WAIT_S):
        with pytest.raises(UpstreamError) as raised:
            async for _group in relay.events():
                raise AssertionError("no chunk was sent")
        await script.closed.wait()
    assert_timed_out(raised.value)
    assert script.sent == 0
    [(status,)] = rig.rows("SELECT status FROM journal_steps WHERE id = ?", (step.id,))
    assert status == "failed"


async def test_the_first_byte_deadline_no_longer_applies_once_a_chunk_arrived(rig: Rig) -> None:
    chunks = [chunk("early"), chunk(" late"), chunk(None, "stop")]
    script = rig.upstream.stream(chunks)
    dripping = drip(script, 0.15)
    step = await rig.begin()
    relay = await rig.relay(step, deadlines=StreamDeadlines.from_now(first_byte_s=0.1, total_s=WAIT_S))

    received: list[Chunk] = []
    try:
        async with asyncio.timeout(WAIT_S):
            async for group in relay.events():
                received.extend(item.chunk for item in group)
    finally:
        dripping.cancel()
    assert received == chunks
    assert step.status == StepStatus.SEALED


async def test_the_pump_is_a_background_task_until_the_step_ends(rig: Rig) -> None:
    script = rig.upstream.stream([chunk("x"), chunk(None, "stop")])
    end = script.gate(2)
    step = await rig.begin()
    relay = await rig.relay(step)

    pump = rig.pump()
    assert pump.get_name() == f"stream-step-{step.id}"
    events = relay.events()
    async with asyncio.timeout(WAIT_S):
        await anext(events)
        assert rig.background == {pump}
        assert not pump.done()
        end.set()
        async for _group in events:
            pass
        await pump
    assert rig.background == set()
    assert step.status == StepStatus.SEALED


# --- issue 29, items 5 and 6: every stage of a stream is bounded --------------------------------------------------

LONG_PIECE = "x" * 99 + " "
STALL_TIMEOUT_S = 0.5


def long_answer(count: int, piece: str = LONG_PIECE) -> list[Chunk]:
    return [chunk(piece) for _ in range(count)] + [chunk(None, "stop")]


async def watch(relay: StreamRelay, until: asyncio.Task[None], peaks: dict[str, int]) -> None:
    """Record the relay's largest backlog and read-ahead while `until` runs."""
    while not until.done():
        peaks["backlog"] = max(peaks.get("backlog", 0), relay.backlog_chars)
        peaks["pending"] = max(peaks.get("pending", 0), relay.pending_chunks)
        await asyncio.sleep(0)


async def test_a_client_that_stops_reading_holds_a_bounded_backlog_then_is_dropped_and_the_answer_journaled(
    rig: Rig,
) -> None:
    """Item 5: today the ready queue takes every group of the answer while the client reads nothing."""
    chunks = long_answer(4000)  # ~1 MB of JSON, four times what the relay holds for a client
    rig.upstream.stream(chunks)
    step = await rig.begin()
    relay = await rig.relay(step, write_timeout_s=STALL_TIMEOUT_S)
    events = relay.events()
    peaks: dict[str, int] = {}
    async with asyncio.timeout(WAIT_S):
        first = await anext(events)  # then the client takes nothing more
        await asyncio.gather(rig.pump(), watch(relay, rig.pump(), peaks))
    one_group = MAX_GROUP_CHUNKS * max(len(item.text) for item in first)
    assert peaks["backlog"] <= MAX_BACKLOG_CHARS + one_group
    assert peaks["pending"] <= MAX_PENDING_CHUNKS
    assert relay.backlog_chars == 0  # what it did not take is freed

    # Write-before-relay kept: the client is dropped, not the data.
    assert step.status == StepStatus.SEALED
    assert rig.stored(step) == texts(chunks)
    with pytest.raises(ClientTooSlow) as dropped:
        await anext(events)
    assert dropped.value.code == "client_too_slow"
    assert str(step.id) in dropped.value.message
    with pytest.raises(StopAsyncIteration):
        await anext(events)
    await events.aclose()


async def test_a_dropped_client_interrupts_the_step_when_finish_on_disconnect_is_off(rig: Rig) -> None:
    script = rig.upstream.stream(long_answer(4000))
    step = await rig.begin()
    relay = await rig.relay(step, finish_on_disconnect=False, write_timeout_s=STALL_TIMEOUT_S)
    events = relay.events()
    async with asyncio.timeout(WAIT_S):
        await anext(events)
        await asyncio.gather(rig.pump(), return_exceptions=True)
    assert step.status == StepStatus.INTERRUPTED
    assert not script.ended.is_set() or script.sent < 4001
    with pytest.raises(ClientTooSlow):
        await anext(events)


async def test_a_slow_client_that_catches_up_in_time_gets_the_whole_answer(rig: Rig) -> None:
    chunks = long_answer(4000)
    rig.upstream.stream(chunks)
    step = await rig.begin()
    relay = await rig.relay(step, write_timeout_s=WAIT_S)
    received: list[Chunk] = []
    async with asyncio.timeout(WAIT_S):
        async for group in relay.events():
            received.extend(item.chunk for item in group)
            await asyncio.sleep(0.01)  # slower than the upstream: the relay waits for it
    assert received == chunks
    assert step.status == StepStatus.SEALED


async def test_groups_and_read_ahead_are_bounded_however_fast_the_upstream(rig: Rig) -> None:
    """Item 6: today one commit held in flight makes the next group everything the upstream sent meanwhile, so
    the loop's work per group (encoding, assembling, rendering) grew with the answer."""
    chunks = long_answer(5000, "abc ")
    script = rig.upstream.stream(chunks)
    commit = rig.journal.hold = asyncio.Event()
    rig.journal.hold_from = 1  # the first chunk goes alone, before the reader parses on
    step = await rig.begin()
    relay = await rig.relay(step)
    received: list[Chunk] = []
    peaks: dict[str, int] = {}

    async def consume() -> None:
        async for group in relay.events():
            received.extend(item.chunk for item in group)

    consumer = asyncio.create_task(consume())
    watcher = asyncio.create_task(watch(relay, consumer, peaks))
    async with asyncio.timeout(WAIT_S):
        while len(rig.journal.groups) < 2:
            await rig.journal.appending.wait()
            rig.journal.appending.clear()
        for _ in range(200):  # the second commit is in flight: the upstream is read as far as the bound allows
            await asyncio.sleep(0)
        assert relay.pending_chunks == MAX_PENDING_CHUNKS
        assert script.sent <= sum(rig.journal.groups) + MAX_PENDING_CHUNKS + 1
        commit.set()
        await asyncio.gather(consumer, watcher)
    assert received == chunks
    assert max(rig.journal.groups) <= MAX_GROUP_CHUNKS
    assert peaks["pending"] <= MAX_PENDING_CHUNKS
    assert rig.stored(step) == texts(chunks)
    assert step.status == StepStatus.SEALED
