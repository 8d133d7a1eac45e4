"""`Pipeline` built by hand from the real parts on a real SQLite store, with a scripted upstream: no server.

Each test drives one request (or two racing ones) through `Pipeline.answer` and checks what reached the upstream,
what the journal and the history hold afterwards, and in which order the two happened.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from proxy.budget.budgets import Budgets
from proxy.canonical.answers import Answer, Completed, Replayed, Streaming
from proxy.canonical.conversation import Conversation
from proxy.canonical.types import Chunk
from proxy.compaction.compactor import Compactor
from proxy.compaction.span_store import SpanStore
from proxy.compaction.summarizer import Summarizer
from proxy.compaction.summary_text import SUMMARY_HEADER
from proxy.config.schema import Config, JournalConfig, UpstreamConfig, parse_config
from proxy.doors.chat import parse_chat_request
from proxy.doors.context_headers import context_options
from proxy.doors.resent import ResentLists
from proxy.errors import (
    CONTEXT_LENGTH_EXCEEDED,
    Conflict,
    ContextTooLarge,
    NotFound,
    StepKept,
    StoreUnavailable,
    UpstreamError,
)
from proxy.history import chain
from proxy.history.answers import Answers
from proxy.history.store import History
from proxy.journal.assembly import assemble
from proxy.journal.costs import session_cost
from proxy.journal.keys import request_fingerprint
from proxy.journal.reader import JournalReader
from proxy.journal.steps import Step
from proxy.journal.writer import Journal
from proxy.request.pipeline import Pipeline
from proxy.store.database import Database
from proxy.tokens import encoding_for_model
from proxy.upstream.protocol import Upstream
from tests.support.raw_store import committed_rows
from tests.support.scripted_upstream import (
    Call,
    ScriptedUpstream,
    chunk,
    completion,
    context_length_exceeded,
    rate_limited,
)

TENANT = "tenant-a"
MODEL = "small"
WINDOW, MAX_OUTPUT = 8_000, 1_000
BUDGET = WINDOW - MAX_OUTPUT - 400  # the default 5 % safety margin
UPSTREAM_COUNT = 8_100
"""What the upstream says it counted for `long_conversation(13)`, about 4,000 tokens by our count."""
RAW_CONFIG: dict[str, Any] = {
    "models": [
        {"name": MODEL, "model": "openai/gpt-4o-mini", "context_window": WINDOW, "max_output": MAX_OUTPUT},
    ],
}
MESSAGES: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
STREAM = [chunk("Hello"), chunk(" world"), chunk(None, "stop")]
WAIT_S = 5.0
TABLES = ("messages", "sessions", "journal_steps")


class ObservedJournal(Journal):
    """The real journal, telling when a step has been begun."""

    def __init__(self, db: Database, answers: Answers, config: JournalConfig) -> None:
        super().__init__(db, answers, config)
        self.begun = asyncio.Event()

    async def begin(self, **fields: Any) -> Step:
        step = await super().begin(**fields)
        self.begun.set()
        return step


class Rig:
    def __init__(self, db: Database, tmp_path: Path) -> None:
        self.config: Config = parse_config(RAW_CONFIG, tmp_path, environ={})
        self.db = db
        self.history = History(db)
        self.journal = ObservedJournal(db, Answers(self.history), self.config.journal)
        self.reader = JournalReader(db, self.journal.unrecorded)
        self.upstream = ScriptedUpstream()
        self.summarizer_upstream = ScriptedUpstream()
        self.budgets = Budgets(self.config.models, lambda model: None, self.config.context.safety_margin)
        summarizer = Summarizer(self.summarizer_upstream, None, self.budgets, self.config.context)
        self.compactor = Compactor(self.config.context, SpanStore(db), summarizer)
        self.background: set[asyncio.Task[None]] = set()
        upstream: Upstream = self.upstream  # the scripted upstream is an `Upstream`
        self.pipeline = Pipeline(
            config=self.config,
            history=self.history,
            journal=self.journal,
            reader=self.reader,
            upstream=upstream,
            compactor=self.compactor,
            budgets=self.budgets,
            background=self.background,
        )

    async def answer(self, conversation: Conversation, headers: dict[str, str] | None = None) -> Answer:
        async with asyncio.timeout(WAIT_S):
            return await self.pipeline.answer(TENANT, conversation, context_options(headers or {}))

    def rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Read through a fresh connection of its own: only what is committed is visible."""
        return committed_rows(self.db, sql, params)

    def steps(self) -> list[tuple[Any, ...]]:
        """(status, content, error) of every journal step, oldest first."""
        found = self.rows("SELECT status, content, error FROM journal_steps ORDER BY id")
        return [(status, content, None if error is None else json.loads(error)) for status, content, error in found]

    def counts(self) -> tuple[int, ...]:
        """Rows in messages, sessions and journal_steps."""
        return tuple(self.rows(f"SELECT COUNT(*) FROM {table}")[0][0] for table in TABLES)

    async def head_message(self, session_id: str) -> tuple[str, dict[str, Any]]:
        path = await self.history.path(TENANT, session_id, encoding_for_model("openai/gpt-4o-mini"))
        assert path
        return path[-1].id, path[-1].message


@pytest.fixture
async def rig(db: Database, tmp_path: Path) -> AsyncIterator[Rig]:
    made = Rig(db, tmp_path)
    yield made
    for task in made.background:  # a failed test must not leave a pump writing into a closing store
        task.cancel()
    await asyncio.gather(*made.background, return_exceptions=True)


def request(messages: list[dict[str, Any]] = MESSAGES, *, model: str = MODEL, **fields: Any) -> Conversation:
    return parse_chat_request(json.dumps({"model": model, "messages": messages, **fields}).encode())


async def drain(answer: Answer) -> list[Chunk]:
    assert isinstance(answer, Streaming)
    received: list[Chunk] = []
    async with asyncio.timeout(WAIT_S):
        async for group in answer.groups:
            received.extend(item.chunk for item in group)
    return received


async def test_a_json_answer_is_sealed_and_becomes_the_session_head(rig: Rig) -> None:
    answer_body = completion("Hi there")
    rig.upstream.reply(answer_body)
    conversation = request(temperature=0.2, max_tokens=50)
    answer = await rig.answer(conversation)

    assert isinstance(answer, Completed)
    assert answer.response == answer_body
    [call] = rig.upstream.calls
    assert (call.kind, call.entry.name, call.messages, call.params) == (
        "complete",
        MODEL,
        MESSAGES,
        {"temperature": 0.2, "max_tokens": 50},
    )
    report = answer.report
    anchor = chain.chain_ids(TENANT, [chain.normalize(m) for m in MESSAGES])[-1]  # the request's last message
    assert report.session_id == chain.derived_session_id(TENANT, anchor)
    assert report.budget == WINDOW - 50 - 400  # the request's own max_tokens is what is reserved
    assert (report.prompt_tokens, report.summaries) == (report.history_tokens, 0)
    assert report.prompt_tokens > 0
    assert rig.steps() == [("sealed", "Hi there", None)]
    head_id, head = await rig.head_message(report.session_id)
    assert head == {"role": "assistant", "content": "Hi there"}
    assert rig.rows("SELECT message_id, stream FROM journal_steps") == [(head_id, 0)]


async def test_an_answer_joins_the_conversation_before_a_trailing_system_reminder(rig: Rig) -> None:
    """A tool that appends a reminder after the latest turn does not re-send it there: the answer must follow
    the user turn, or every answer would be stored twice and the next request would branch."""
    reminder = {"role": "system", "content": "Reply with a diff."}
    first = [*MESSAGES, reminder]
    rig.upstream.reply(completion("Hi there"))
    answer = await rig.answer(request(first))
    assert isinstance(answer, Completed)
    assert rig.rows("SELECT context FROM journal_steps")[0][0] is not None

    second = [*MESSAGES, {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "more"}]
    rig.upstream.reply(completion("More"))
    again = await rig.answer(request([*second, {**reminder, "content": "Reply with a diff. 10:01"}]))
    assert isinstance(again, Completed)
    assert again.report.session_id == answer.report.session_id
    # system, hello, reminder, Hi there, more, reminder at its new place, More: each message once.
    assert rig.counts()[0] == 7
    _head_id, head = await rig.head_message(again.report.session_id)
    assert head == {"role": "assistant", "content": "More"}
    path = await rig.history.path(TENANT, again.report.session_id)
    assert path is not None
    assert [m.message.get("content") for m in path] == ["be brief", "hello", "Hi there", "more", "More"]


async def test_a_stream_answer_is_relayed_in_journaled_groups(rig: Rig) -> None:
    rig.upstream.stream(STREAM)
    answer = await rig.answer(request(stream=True))

    assert isinstance(answer, Streaming)
    assert rig.upstream.calls[0].kind == "stream"
    assert rig.upstream.calls[0].params == {"stream": True}
    groups = []
    async with asyncio.timeout(WAIT_S):
        async for group in answer.groups:
            groups.append(list(group))
    assert [item.chunk for group in groups for item in group] == STREAM
    assert [item.text for group in groups for item in group] == [json.dumps(c, separators=(",", ":")) for c in STREAM]
    assert rig.steps() == [("sealed", "Hello world", None)]
    _head_id, head = await rig.head_message(answer.report.session_id)
    assert head == {"role": "assistant", "content": "Hello world"}


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("key", [None, "key-1"])
async def test_the_step_begins_beside_the_upstream_call_and_fails_with_it(
    rig: Rig, stream: bool, key: str | None
) -> None:
    error = rate_limited()
    script = rig.upstream.refuse(error)
    release = script.hold()
    steps_at_call: list[list[tuple[Any, ...]]] = []

    def at_call(_call: Call) -> None:
        steps_at_call.append(rig.rows("SELECT status FROM journal_steps"))

    rig.upstream.on_call = at_call
    headers = {} if key is None else {"idempotency-key": key}
    task = asyncio.create_task(rig.answer(request(stream=stream), headers))
    async with asyncio.timeout(WAIT_S):
        await script.taken.wait()
        # Without a key the step is begun beside the call, not before it; a keyed step is begun first, so that
        # a conflicting key is refused before the upstream is paid.
        assert steps_at_call == ([[]] if key is None else [[("open",)]])
        await rig.journal.begun.wait()  # while the call is still held
        assert rig.rows("SELECT status FROM journal_steps") == [("open",)]
        release.set()
        with pytest.raises(UpstreamError) as raised:
            await task
    assert raised.value is error
    assert rig.steps() == [("failed", None, error.fields())]  # no step is left open


async def test_a_seal_the_store_refused_names_the_step_and_keeps_no_answer(
    rig: Rig, monkeypatch: pytest.MonkeyPatch
) -> None:
    rig.upstream.reply(completion("never saved"))
    outage = StoreUnavailable("The proxy's store is unreachable.", retry_after_s=1)

    async def refused(step: Step, response: Chunk | None = None) -> None:
        step.assembly = assemble([response]) if response is not None else step.assembly
        raise outage

    monkeypatch.setattr(rig.journal, "seal", refused)
    with pytest.raises(StoreUnavailable) as raised:
        await rig.answer(request())
    [(step_id,)] = rig.rows("SELECT id FROM journal_steps")
    assert raised.value.message == outage.in_step(step_id, StepKept.NOTHING).message
    assert raised.value.__cause__ is outage
    assert rig.steps() == [("failed", None, raised.value.fields())]  # what the client was told, no answer


async def test_a_stream_that_fails_before_its_first_byte_ends_its_step(rig: Rig) -> None:
    error = rate_limited()
    rig.upstream.refuse(error)
    with pytest.raises(UpstreamError) as raised:
        await rig.answer(request(stream=True))
    assert raised.value is error
    assert rig.steps() == [("failed", None, error.fields())]
    assert not rig.background  # no relay was started


async def test_a_stream_the_upstream_does_not_start_in_time_fails_at_the_first_byte_deadline(rig: Rig) -> None:
    script = rig.upstream.stream(STREAM)
    script.hold()  # the upstream accepts the connection and says nothing
    upstream = UpstreamConfig(first_byte_timeout_s=0.1)
    pipeline = replace(rig.pipeline, config=replace(rig.config, upstream=upstream))
    async with asyncio.timeout(WAIT_S):
        with pytest.raises(UpstreamError) as raised:
            await pipeline.answer(TENANT, request(stream=True), context_options({}))
    assert (raised.value.status, raised.value.code) == (504, "upstream_timeout")  # still a status: nothing sent
    assert rig.steps() == [("failed", None, raised.value.fields())]
    assert not rig.background


async def test_a_request_cancelled_during_the_upstream_call_does_not_leave_its_step_open(rig: Rig) -> None:
    script = rig.upstream.reply(completion("never delivered"))
    script.hold()
    task = asyncio.create_task(rig.answer(request(), {"idempotency-key": "key-1"}))
    async with asyncio.timeout(WAIT_S):
        await script.taken.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    [(status, _content, _error)] = rig.steps()
    assert status in ("interrupted", "failed")
    rig.upstream.reply(completion("retried"))
    retried = await rig.answer(request(), {"idempotency-key": "key-1"})  # the key is free for a retry
    assert isinstance(retried, Completed)


@pytest.mark.parametrize(("same_body", "refusal"), [(True, "still in progress"), (False, "different request body")])
async def test_a_key_held_by_a_live_step_is_refused_before_the_upstream(
    rig: Rig, same_body: bool, refusal: str
) -> None:
    conversation = request()
    held = request() if same_body else request([*MESSAGES[:1], {"role": "user", "content": "another body"}])
    await rig.journal.begin(
        tenant=TENANT,
        session_id=None,
        model=MODEL,
        fingerprint=request_fingerprint(TENANT, held.identity),
        idempotency_key="key-1",
        stream=False,
        parent_message_id=None,
        encoding="o200k_base",
    )
    before = rig.counts()
    with pytest.raises(Conflict, match=refusal) as raised:
        await rig.answer(conversation, {"idempotency-key": "key-1"})
    assert (raised.value.status, raised.value.param) == (409, "Idempotency-Key")
    assert rig.upstream.calls == []
    assert rig.counts() == before  # refused before anything was stored


async def test_a_key_reused_with_another_body_after_it_completed_is_refused(rig: Rig) -> None:
    rig.upstream.reply(completion("first"))
    await rig.answer(request(), {"idempotency-key": "key-1"})
    before = rig.counts()
    other = request([*MESSAGES[:1], {"role": "user", "content": "another body"}])
    with pytest.raises(Conflict, match="different request body"):
        await rig.answer(other, {"idempotency-key": "key-1"})
    assert len(rig.upstream.calls) == 1
    assert rig.counts() == before


async def test_two_racing_requests_with_one_key_pay_the_upstream_once(rig: Rig) -> None:
    script = rig.upstream.reply(completion("only once"))
    release = script.hold()
    first = asyncio.create_task(rig.answer(request(), {"idempotency-key": "key-1"}))
    second = asyncio.create_task(rig.answer(request(), {"idempotency-key": "key-1"}))
    async with asyncio.timeout(WAIT_S):
        done, _pending = await asyncio.wait({first, second}, return_when=asyncio.FIRST_EXCEPTION)
        [refused] = done
        with pytest.raises(Conflict, match="still in progress"):
            refused.result()
        assert len(rig.upstream.calls) == 1  # the loser was refused before it reached the upstream
        release.set()
        [winner] = {first, second} - done
        answer = await winner
    assert isinstance(answer, Completed)
    assert len(rig.upstream.calls) == 1
    assert rig.steps() == [("sealed", "only once", None)]


@pytest.mark.parametrize("first_stream", [False, True])
@pytest.mark.parametrize("retry_stream", [False, True])
async def test_a_keyed_retry_is_replayed_without_the_upstream(rig: Rig, first_stream: bool, retry_stream: bool) -> None:
    headers = {"idempotency-key": "key-1"}
    if first_stream:
        rig.upstream.stream(STREAM)
        await drain(await rig.answer(request(stream=True), headers))
    else:
        rig.upstream.reply(completion("Hello world"))
        assert isinstance(await rig.answer(request(), headers), Completed)
    [(step_id,)] = rig.rows("SELECT id FROM journal_steps")

    answer = await rig.answer(request(stream=retry_stream), headers)
    assert isinstance(answer, Replayed)
    assert len(rig.upstream.calls) == 1
    assert answer.step.id == step_id
    if retry_stream:
        assert all(c["object"] == "chat.completion.chunk" for c in answer.chunks)
        assert assemble(answer.chunks).content == "Hello world"
        if first_stream:
            assert answer.chunks == STREAM  # the very chunks that were relayed
    else:
        [body] = answer.chunks
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["content"] == "Hello world"
        if not first_stream:
            assert body == completion("Hello world")
    assert rig.rows("SELECT COUNT(*) FROM journal_steps") == [(1,)]


def long_conversation(turns: int) -> list[dict[str, Any]]:
    """A system message and `turns` user/assistant messages of about 300 tokens each."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for turn in range(turns):
        role = "user" if turn % 2 == 0 else "assistant"
        messages.append({"role": role, "content": f"Turn {turn}. " + "The quick brown fox jumps over the dog. " * 33})
    return messages


async def test_a_context_length_exceeded_is_healed_once_with_a_smaller_context(rig: Rig) -> None:
    messages = long_conversation(13)
    rig.upstream.refuse(context_length_exceeded(WINDOW, UPSTREAM_COUNT))
    rig.upstream.reply(completion("healed"))
    rig.summarizer_upstream.reply(completion("The user and the assistant talked about a quick brown fox."))

    answer = await rig.answer(request(messages))

    assert isinstance(answer, Completed)
    first, second = rig.upstream.calls
    assert first.messages == messages  # it fit our count: sent as it came
    assert len(second.messages) < len(first.messages)
    assert second.messages[1]["content"].startswith(SUMMARY_HEADER)
    assert second.messages[-4:] == messages[-4:]  # the recent messages are kept verbatim
    assert second.params == first.params
    entry = rig.config.model(MODEL)
    assert entry is not None
    learned = rig.budgets.budget(entry).input_budget
    assert answer.report.budget == learned < BUDGET  # the report shows the healed, learned budget
    assert answer.report.prompt_tokens <= learned < answer.report.history_tokens
    assert answer.report.summaries == 1
    assert len(rig.summarizer_upstream.calls) == 1
    assert rig.steps() == [("sealed", "healed", None)]


async def test_identical_sessions_compacting_at_once_share_one_summary(rig: Rig) -> None:
    """Two sessions that are the same chain (one conversation sent under two ids) need the same summary at the
    same moment: one summarizer call writes it for both."""
    messages = long_conversation(30)
    summary = rig.summarizer_upstream.reply(completion("They talked about a quick brown fox."))
    released = summary.hold()
    for _ in range(3):  # what one session alone needs, and one more: the test fails if it is taken
        rig.summarizer_upstream.reply(completion("They talked about a quick brown fox, then a dog."))
    for _ in range(2):
        rig.upstream.reply(completion("ok"))

    both = asyncio.gather(
        *(rig.answer(request(messages), {"x-session-id": session}) for session in ("first", "second"))
    )
    await asyncio.sleep(0.2)  # both are waiting for the one summarizer call by now
    released.set()
    answers = await both

    written = rig.rows("SELECT start_depth, end_id FROM summaries")
    assert len(written) == len(set(written)) == len(rig.summarizer_upstream.calls)  # no range twice
    assert rig.summarizer_upstream.pending >= 1
    first, second = answers
    assert first.report == replace(second.report, session_id=first.report.session_id)


async def test_a_second_context_length_exceeded_is_not_healed_again(rig: Rig) -> None:
    messages = long_conversation(13)
    rig.upstream.refuse(context_length_exceeded(WINDOW, UPSTREAM_COUNT))
    second = context_length_exceeded(WINDOW, UPSTREAM_COUNT)
    rig.upstream.refuse(second)
    rig.summarizer_upstream.reply(completion("The user and the assistant talked about a quick brown fox."))

    with pytest.raises(UpstreamError) as raised:
        await rig.answer(request(messages, stream=True))
    assert raised.value is second
    assert len(rig.upstream.calls) == 2
    assert rig.upstream.pending == 0
    assert rig.steps() == [("failed", None, second.fields())]


async def test_a_context_length_exceeded_is_passed_through_when_context_mode_is_off(rig: Rig) -> None:
    error = context_length_exceeded(WINDOW, UPSTREAM_COUNT)
    rig.upstream.refuse(error)
    with pytest.raises(UpstreamError) as raised:
        await rig.answer(request(), {"x-context-mode": "off"})
    assert raised.value is error
    assert len(rig.upstream.calls) == 1
    assert rig.steps() == [("failed", None, error.fields())]


async def test_an_unknown_model_is_refused_before_anything_is_stored(rig: Rig) -> None:
    with pytest.raises(NotFound) as raised:
        await rig.answer(request(model="no-such-model"), {"idempotency-key": "key-1"})
    assert (raised.value.status, raised.value.param, raised.value.code) == (404, "model", "model_not_found")
    assert rig.upstream.calls == []
    assert rig.counts() == (0, 0, 0)


@pytest.mark.parametrize("param", ["max_tokens", "max_completion_tokens"])
async def test_a_max_tokens_that_leaves_no_input_room_is_refused_before_anything_is_stored(
    rig: Rig, param: str
) -> None:
    with pytest.raises(ContextTooLarge) as raised:
        body = {"model": MODEL, "messages": MESSAGES, param: WINDOW}
        await rig.answer(parse_chat_request(json.dumps(body).encode()))
    assert (raised.value.status, raised.value.param, raised.value.code) == (400, param, CONTEXT_LENGTH_EXCEEDED)
    assert f"max_tokens={WINDOW}" in raised.value.message
    assert rig.upstream.calls == []
    assert rig.counts() == (0, 0, 0)


async def test_recent_messages_too_large_are_stored_and_then_refused(rig: Rig) -> None:
    messages = [*MESSAGES[:1], {"role": "user", "content": "word " * (2 * BUDGET)}]
    with pytest.raises(ContextTooLarge) as raised:
        await rig.answer(request(messages))
    assert raised.value.param == "messages"
    assert rig.upstream.calls == []
    assert rig.counts() == (2, 1, 0)  # what the client sent is kept; no step was begun


async def test_a_compacted_request_leaves_its_messages_as_the_door_parsed_them(rig: Rig) -> None:
    """A door shares a request's messages with the client's next request (`proxy.doors.resent`): answering one,
    compaction included, changes none of them in place."""
    lists = ResentLists().of("tenant")
    raw = json.dumps({"model": MODEL, "messages": long_conversation(30)}).encode()
    conversation = parse_chat_request(raw, resent=lists)
    as_parsed = copy.deepcopy(conversation.messages)
    rig.summarizer_upstream.reply(completion("They talked about a quick brown fox."))
    rig.upstream.reply(completion("ok"))
    answer = await rig.answer(conversation)
    assert answer.report.summaries >= 1 or answer.report.prompt_tokens < answer.report.history_tokens
    assert conversation.messages == as_parsed
    # Nor the stored messages the history handed out: its cached path shares them with the next request.
    cached = [entry for entries in rig.history.recent._paths.values() for entry in entries]
    assert cached
    assert all(entry.stored.message == entry.private for entry in cached)
    again = parse_chat_request(raw, resent=lists)
    assert again.messages[1] is conversation.messages[1]  # shared with the next request
    assert again.messages == as_parsed


async def test_a_compaction_stores_the_conversation_and_names_it_with_no_step_and_no_model_call(rig: Rig) -> None:
    """`Pipeline.compact` (a client's compaction, the Responses door's item): what is new is stored, nothing goes
    upstream and no journal step begins; the value names the stored conversation's last message."""
    async with asyncio.timeout(WAIT_S):
        stored = await rig.pipeline.compact(TENANT, request(), context_options({}))
    assert rig.upstream.calls == []
    assert rig.counts() == (2, 1, 0)
    path = await rig.history.path_to(stored.message_id)
    assert [entry.message["content"] for entry in path] == ["be brief", "hello"]
    assert stored.report.prompt_tokens == 0 < stored.report.history_tokens
    head_id, _ = await rig.head_message(stored.report.session_id)
    assert head_id == stored.message_id
    async with asyncio.timeout(WAIT_S):
        again = await rig.pipeline.compact(TENANT, request(), context_options({"idempotency-key": "k"}))
    assert again.message_id == stored.message_id
    assert rig.counts() == (2, 1, 0)


@pytest.mark.parametrize("stream", [False, True])
async def test_a_summary_request_answered_locally_costs_nothing_in_the_session_s_cost(rig: Rig, stream: bool) -> None:
    """A client's summary request the proxy answers from the store sends nothing upstream: its usage says so, and
    the session's cost (`GET /sessions/{id}`) counts only what the upstream billed and cached (Pi's 152 local
    answers had counted the whole conversation each as sent and uncached: 0.14 of it cached, not 0.93)."""
    billed = {"prompt_tokens": 1_000, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 900}}
    rig.upstream.reply({**completion("Hi there"), "usage": billed})
    first = await rig.answer(request())
    assert isinstance(first, Completed)
    compact = {"role": "user", "content": "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools. Summarize."}
    conversation = request([*MESSAGES, {"role": "assistant", "content": "Hi there"}, compact], stream=stream)
    answer = await rig.answer(conversation)
    if stream:
        [usage] = [received["usage"] for received in await drain(answer) if received.get("usage")]
    else:
        assert isinstance(answer, Completed)
        usage = answer.response["usage"]
    assert len(rig.upstream.calls) == 1  # answered by the proxy
    assert usage["prompt_tokens"] == 0
    assert answer.report.prompt_tokens == 0 < answer.report.history_tokens
    cost = session_cost(await rig.reader.costs(TENANT, first.report.session_id))
    assert cost["steps"] == 2
    assert (cost["sent_tokens"], cost["cached_tokens"], cost["cached_share"]) == (1_000, 900, 0.9)


async def test_a_compaction_with_no_room_for_its_output_is_refused_before_any_write(rig: Rig) -> None:
    with pytest.raises(ContextTooLarge) as raised:
        await rig.pipeline.compact(TENANT, request(max_tokens=WINDOW), context_options({}))
    assert raised.value.param == "max_tokens"
    assert rig.counts() == (0, 0, 0)
