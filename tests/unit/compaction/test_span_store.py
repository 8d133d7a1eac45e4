"""The summaries table and the compactor loop around the builder with a fake summarizer."""

from __future__ import annotations

import functools
import logging
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from proxy.budget.budgets import Budgets
from proxy.compaction.compactor import CompactionRequest, Compactor
from proxy.compaction.span_store import ENDING_ON_SQL, SpanStore, StoredSpan, in_force
from proxy.compaction.summarizer import FALLBACK_MODEL, Summarizer, WrittenSummary
from proxy.compaction.summary_text import SUMMARY_HEADER, summary_message
from proxy.compaction.working_context import WorkingContext
from proxy.config.models import ModelEntry
from proxy.config.schema import SUMMARIZE, TOOL_RESULTS, ContextConfig, UpstreamConfig
from proxy.errors import ContextTooLarge
from proxy.history.messages import StoredMessage, StoredPath
from proxy.history.store import History
from proxy.store.database import Database
from proxy.tokens import count_message
from proxy.upstream.router import UpstreamRouter
from tests.support.fake_upstream import FakeUpstream

TENANT = "t"
ENCODING = "cl100k_base"
MODEL = "gpt-4"
ENTRY = ModelEntry(name="chat", model="openai/fake-model")
_TEXT = "the proxy keeps every message and sends a working context that fits the model window"
WORDS = _TEXT.split()


def text(tag: str, words: int = 90) -> str:
    return f"{tag}: {_body(words)}."


@functools.cache
def _body(words: int) -> str:
    """`words` words of `_TEXT`, over and over: made once per length (long test conversations ask thousands)."""
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def conversation(turns: int, tag: str = "") -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    for turn in range(turns):
        messages.append({"role": "user", "content": text(f"question {turn}{tag}")})
        messages.append({"role": "assistant", "content": text(f"answer {turn}{tag}", 60)})
    return messages


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        self.now += 0.25
        return self.now


@dataclass
class Call:
    messages: list[dict[str, Any]]
    target: int
    entry: ModelEntry


UNCAPPED_INPUT = 10_000_000
"""What the fake summarizer can read at once: more than any test conversation."""


class FakeSummarizer(Summarizer):
    """Records each call and answers `content` (about `words` words), or fails over to the fallback."""

    def __init__(self, words: int = 20, fallback: bool = False) -> None:
        self.calls: list[Call] = []
        self.words = words
        self.fallback = fallback

    def input_capacity(self, request_entry: ModelEntry) -> int:
        return UNCAPPED_INPUT

    def available(self, request_entry: ModelEntry) -> bool:
        return True

    def timed_out(self, request_entry: ModelEntry) -> None:
        """A fake has no breaker: every summary asks it."""

    async def summarize(
        self,
        messages: Sequence[Mapping[str, Any]],
        target: int,
        request_entry: ModelEntry,
        instruction: str | None = None,
        session: tuple[str, str] | None = None,
    ) -> WrittenSummary:
        self.calls.append(Call([dict(m) for m in messages], target, request_entry))
        content = f"summary {len(self.calls)}: " + " ".join(["fact"] * self.words)
        if self.fallback:
            return WrittenSummary(content, "fallback", FALLBACK_MODEL)
        return WrittenSummary(content, "llm", "cheap")


@pytest.fixture
def history(db: Database) -> History:
    return History(db)


@pytest.fixture
def summaries(db: Database) -> SpanStore:
    return SpanStore(db, clock=Clock())


async def stored_path(history: History, messages: list[dict[str, Any]], session: str = "s") -> list[StoredMessage]:
    return (await history.reconcile(TENANT, session, messages, MODEL, ENCODING)).path


async def add(summaries: SpanStore, path: Sequence[StoredMessage], start: int, end: int, **fields: Any) -> StoredSpan:
    """A summary of path[start:end]."""
    values: dict[str, Any] = {
        "content": f"covers {start}..{end}",
        "tokens": 20,
        "original_tokens": 400,
        "model": "cheap",
        "generated_by": "llm",
    }
    values.update(fields)
    return await summaries.add(TENANT, start_depth=path[start].depth, end=path[end - 1], **values)


# Summaries: storage and which ones apply to a path.


async def test_a_summary_is_found_on_its_path_as_the_span_it_covers(history: History, summaries: SpanStore) -> None:
    path = await stored_path(history, conversation(4))
    written = await add(summaries, path, 1, 5)

    [found] = await summaries.on_path(TENANT, path)

    assert found == written
    assert found.span.start == 1
    assert found.span.end == 5
    assert found.span.tokens == 20
    assert found.orphaned_at is None
    assert found.as_json()["range"] == [1, 5]
    assert found.as_json()["ratio"] == 0.05
    assert await summaries.on_path("another tenant", path) == []
    assert await summaries.on_path(TENANT, []) == []


async def test_an_edit_after_the_range_keeps_the_summary_and_an_edit_inside_loses_it(
    history: History, summaries: SpanStore
) -> None:
    messages = conversation(4)
    path = await stored_path(history, messages)
    await add(summaries, path, 1, 5)

    after = [*messages[:6], {"role": "user", "content": "edited after the range"}]
    inside = [*messages[:3], {"role": "assistant", "content": "edited inside the range"}, *messages[4:]]

    assert len(await summaries.on_path(TENANT, await stored_path(history, after))) == 1
    assert await summaries.on_path(TENANT, await stored_path(history, inside)) == []


@pytest.mark.parametrize("seed", range(4))
async def test_a_session_s_spans_read_again_are_what_a_whole_read_finds_whoever_wrote_them(
    db: Database, history: History, seed: int
) -> None:
    """A session's reads carry over what was in force for its previous one (`SpanStore.in_force_on`): whatever
    two replicas write (summaries and masks, held or not), orphan or release in between, and however the path
    grows or branches, a read finds what is in force among the spans of the whole path."""
    rng = random.Random(seed)
    replicas = [SpanStore(db, clock=Clock()), SpanStore(db, clock=Clock())]
    messages = conversation(2, f" seed {seed}")
    path = await stored_path(history, messages)
    for step in range(40):
        action = rng.choice(["extend", "extend", "branch", "write", "write", "wider", "release", "other session"])
        writer = rng.choice(replicas)
        if action == "extend":
            messages = [*messages, {"role": "user", "content": text(f"step {step}", 10)}]
            path = await stored_path(history, messages)
        elif action == "branch" and len(messages) > 3:
            at = rng.randrange(1, len(messages))
            # As long as the path it leaves or longer: a read that took the old path's spans as still on it
            # would find spans off it.
            grown = [{"role": "user", "content": text(f"branch {step} {n}", 10)} for n in range(len(messages) - at + 1)]
            messages = [*messages[:at], *grown]
            path = await stored_path(history, messages)
        elif action in ("write", "other session"):
            start = rng.randrange(len(path))
            end = rng.randrange(start, len(path)) + 1
            held = rng.choice([0, 0, step + 1])
            strategy = rng.choice([SUMMARIZE, TOOL_RESULTS])
            if action == "other session":  # a span on another session's path of the same tenant
                other = await stored_path(history, conversation(3, f" other {seed} {step}"), session="o")
                start, end = 1, len(other)
                await add(summaries=writer, path=other, start=start, end=end, held=held, strategy=strategy)
            elif strategy == TOOL_RESULTS:  # a mask from the path's start, as `tool-results` writes them
                await add(writer, path, 0, end, held=held, strategy=strategy)
            else:
                await add(writer, path, start, end, held=held)
        elif action == "wider":
            live = [span for span in await writer.on_path(TENANT, path) if span.orphaned_at is None]
            if live:
                chosen = rng.sample(live, min(2, len(live)))
                start = min(span.start_depth for span in chosen) - path[0].depth
                end = max(span.end_depth for span in chosen) - path[0].depth + 1
                await add(writer, path, start, end, replaces=[span.id for span in chosen])
        elif action == "release":
            held = [span.id for span in await writer.on_path(TENANT, path) if span.held]
            if held:
                await writer.release(TENANT, rng.sample(held, 1))
        for reader in replicas:
            assert await reader.in_force_on(TENANT, path, "s") == in_force(await reader.on_path(TENANT, path)), (
                step,
                action,
            )


async def test_a_wider_summary_orphans_the_ones_it_replaces_and_keeps_them(
    history: History, summaries: SpanStore
) -> None:
    path = await stored_path(history, conversation(6))
    first = await add(summaries, path, 1, 5)
    second = await add(summaries, path, 5, 9)
    wider = await add(summaries, path, 1, 9, replaces=[first.id, second.id])

    found = {s.id: s for s in await summaries.on_path(TENANT, path)}

    assert set(found) == {first.id, second.id, wider.id}
    assert found[first.id].orphaned_at is not None
    assert found[second.id].orphaned_at is not None
    assert found[wider.id].orphaned_at is None
    assert found[wider.id].replaces == (first.id, second.id)
    assert found[wider.id].as_json()["replaces"] == [first.id, second.id]


async def test_an_llm_rewrite_of_a_fallback_range_is_the_one_in_force(history: History, summaries: SpanStore) -> None:
    path = await stored_path(history, conversation(4))
    fallback = await add(summaries, path, 1, 5, generated_by="fallback", model=FALLBACK_MODEL)
    rewrite = await add(summaries, path, 1, 5)
    other = await add(summaries, path, 5, 7)

    chosen = in_force(await summaries.on_path(TENANT, path))

    assert [s.id for s in chosen] == [rewrite.id, other.id]
    assert fallback.id not in {s.id for s in chosen}


def span(id: int, start: int, end: int, strategy: str = TOOL_RESULTS, held: int = 0) -> StoredSpan:
    return StoredSpan(id, start, end, f"m{end}", "", 1, 2, "m", "rule", (), None, 0.0, strategy=strategy, held=held)


def test_a_mask_in_use_inside_another_in_use_is_not_in_force() -> None:
    """The builder stubs what the masks cover together: a mask inside a wider one adds nothing. A held mask
    (written ahead) stays, inside another or not: it says what the pre-compaction has written."""
    widest, inside, held_wide, held_inside = (
        span(1, 0, 30),
        span(2, 0, 10),
        span(3, 0, 50, held=4),
        span(4, 5, 20, held=2),
    )
    summary = span(5, 0, 10, strategy=SUMMARIZE)
    chosen = in_force([widest, inside, held_wide, held_inside, summary])
    assert [s.id for s in chosen] == [summary.id, widest.id, held_wide.id, held_inside.id]  # in path order
    later = span(6, 0, 40)
    assert [s.id for s in in_force([*chosen, later])] == [summary.id, later.id, held_wide.id, held_inside.id]
    assert [s.id for s in in_force([inside])] == [inside.id]


# The compactor: the loop around the builder.


def request(
    path: Sequence[StoredMessage], budget: int, session: str = "s", preserve_recent: int = 4
) -> CompactionRequest:
    return CompactionRequest(
        tenant=TENANT,
        session_id=session,
        messages=[dict(m.message) for m in path],
        path=StoredPath(path),
        entry=ENTRY,
        encoding=ENCODING,
        budget=budget,
        preserve_recent=preserve_recent,
    )


def total(path: Sequence[StoredMessage]) -> int:
    return sum(m.tokens for m in path) + 3


def is_summary(message: Mapping[str, Any]) -> bool:
    return str(message.get("content")).startswith(SUMMARY_HEADER)


async def test_a_conversation_that_fits_is_sent_as_it_is_without_a_summary(
    history: History, summaries: SpanStore
) -> None:
    fake = FakeSummarizer()
    path = await stored_path(history, conversation(3))

    prepared = await Compactor(ContextConfig(), summaries, fake).prepare(request(path, total(path)))

    assert prepared == WorkingContext([dict(m.message) for m in path], total(path), summaries=0, written=0)
    assert fake.calls == []


async def test_an_overflow_summarizes_the_oldest_turns_in_one_big_step(
    history: History, summaries: SpanStore, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeSummarizer()
    messages = conversation(10)
    path = await stored_path(history, messages)
    budget = total(path) - 50
    compactor = Compactor(ContextConfig(), summaries, fake, clock=Clock())

    with caplog.at_level(logging.INFO, logger="proxy.compaction.spans"):
        prepared = await compactor.prepare(request(path, budget))

    assert prepared.written == len(fake.calls) >= 1
    assert prepared.tokens <= ContextConfig().compact_to * budget
    assert fake.calls[0].messages[0] == messages[1]
    assert fake.calls[0].entry == ENTRY
    assert prepared.messages[0] == messages[0]
    assert is_summary(prepared.messages[1])
    assert prepared.messages[-4:] == messages[-4:]
    assert prepared.summaries == sum(is_summary(m) for m in prepared.messages) >= 1
    assert prepared.tokens == sum(count_message(m, ENCODING) for m in prepared.messages) + 3
    stored = await summaries.on_path(TENANT, path)
    assert len(stored) == prepared.written
    assert stored[0].start_depth == 1
    assert (stored[0].model, stored[0].generated_by) == ("cheap", "llm")
    assert stored[0].tokens == count_message(summary_message(stored[0].content), ENCODING)
    assert stored[0].original_tokens == sum(m.tokens for m in path[1 : stored[0].end_depth + 1])
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compaction ")]
    assert len(lines) == prepared.written
    assert "session=s strategy=summarize generated_by=llm range=[1," in lines[0]
    assert "duration_ms=250 model=cheap" in lines[0]


async def test_the_next_turns_reuse_the_summary_and_extend_the_prompt(history: History, summaries: SpanStore) -> None:
    fake = FakeSummarizer()
    messages = conversation(10)
    compactor = Compactor(ContextConfig(), summaries, fake)
    path = await stored_path(history, messages)
    budget = total(path) - 50
    first = await compactor.prepare(request(path, budget))
    calls = len(fake.calls)

    messages += [{"role": "user", "content": text("one more")}]
    second = await compactor.prepare(request(await stored_path(history, messages), budget))

    assert len(fake.calls) == calls
    assert second.written == 0
    assert second.messages[: len(first.messages)] == first.messages
    assert second.messages[len(first.messages) :] == messages[-1:]


async def test_recent_messages_over_the_budget_are_refused_with_the_numbers(
    history: History, summaries: SpanStore
) -> None:
    fake = FakeSummarizer()
    path = await stored_path(history, conversation(10))
    recent = total([path[0], *path[-4:]])

    with pytest.raises(ContextTooLarge) as raised:
        await Compactor(ContextConfig(), summaries, fake).prepare(request(path, recent - 1))

    assert raised.value.code == "context_length_exceeded"
    assert f"need {recent} tokens" in raised.value.message
    assert f"for model 'chat' is {recent - 1} tokens" in raised.value.message
    assert "the 4 most recent messages" in raised.value.message
    assert fake.calls == []


async def test_summaries_are_merged_hierarchically_when_every_old_message_is_summarized(
    history: History, summaries: SpanStore, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeSummarizer(words=60)
    messages = conversation(6)
    path = await stored_path(history, messages)
    compactor = Compactor(ContextConfig(), summaries, fake)
    first = await add(summaries, path, 1, 5, content=" ".join(["old"] * 150), tokens=160)
    second = await add(summaries, path, 5, 9, content=" ".join(["old"] * 150), tokens=160)
    budget = total([path[0], *path[-4:]]) + 200

    with caplog.at_level(logging.INFO, logger="proxy.compaction.spans"):
        prepared = await compactor.prepare(request(path, budget))

    assert len(fake.calls) == 1
    assert [is_summary(m) for m in fake.calls[0].messages] == [True, True]
    assert prepared.summaries == 1
    assert prepared.tokens <= budget
    in_use = in_force(await summaries.on_path(TENANT, path))
    [merged] = [s for s in in_use if s.orphaned_at is None]
    assert merged.replaces == (first.id, second.id)
    assert (merged.start_depth, merged.end_depth) == (1, 8)
    assert f"strategy=summarize generated_by=llm range=[1,9) replaces=[{first.id}, {second.id}]" in caplog.text


async def test_a_fallback_summary_is_stored_and_logged_as_such(
    history: History, summaries: SpanStore, caplog: pytest.LogCaptureFixture
) -> None:
    path = await stored_path(history, conversation(10))
    compactor = Compactor(ContextConfig(), summaries, FakeSummarizer(fallback=True))

    with caplog.at_level(logging.INFO, logger="proxy.compaction.spans"):
        await compactor.prepare(request(path, total(path) - 50))

    stored = await summaries.on_path(TENANT, path)
    assert {(s.generated_by, s.model) for s in stored} == {("fallback", FALLBACK_MODEL)}
    assert "strategy=summarize generated_by=fallback" in caplog.text


async def test_tool_calls_and_their_results_are_summarized_together(history: History, summaries: SpanStore) -> None:
    fake = FakeSummarizer()
    messages = conversation(1)
    for turn in range(6):
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": "read", "arguments": "{}"}}
        messages += [
            {"role": "user", "content": text(f"read {turn}")},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"call_{turn}", "content": text(f"file {turn}", 120)},
            {"role": "assistant", "content": text(f"done {turn}", 30)},
        ]
    path = await stored_path(history, messages)
    compactor = Compactor(ContextConfig(), summaries, fake)

    for budget in range(total(path) - 50, 500, -150):
        prepared = await compactor.prepare(request(path, budget))
        originals = [m for m in prepared.messages if not is_summary(m)]
        for position, message in enumerate(originals):
            if message["role"] == "tool":
                assert originals[position - 1].get("tool_calls")
    for summary in await summaries.on_path(TENANT, path):
        assert path[summary.start_depth].role != "tool"
        assert summary.end_depth + 1 == len(path) or path[summary.end_depth + 1].role != "tool"
    assert fake.calls


async def test_force_summarizes_everything_older_than_the_recent_messages_then_merges(
    history: History, summaries: SpanStore
) -> None:
    fake = FakeSummarizer(words=40)  # within their room: longer, a summary would merge with the next range at once
    messages = conversation(5)
    path = await stored_path(history, messages)
    compactor = Compactor(ContextConfig(), summaries, fake)

    forced = await compactor.force(request(path, 100_000))

    assert forced is not None
    assert (forced.start_depth, forced.end_depth + 1) == (1, len(path) - 4)
    assert fake.calls[0].messages == messages[1:-4]
    assert await compactor.force(request(path, 100_000)) is None

    longer = await stored_path(history, conversation(6))
    extended = await compactor.force(request(longer, 100_000))
    assert extended is not None
    assert (extended.start_depth, extended.end_depth + 1) == (len(path) - 4, len(longer) - 4)
    merged = await compactor.force(request(longer, 100_000))
    assert merged is not None
    assert (merged.start_depth, merged.end_depth + 1) == (1, len(longer) - 4)
    assert merged.replaces == (forced.id, extended.id)
    assert [is_summary(m) for m in fake.calls[-1].messages] == [True, True]
    assert len(fake.calls) == 3


async def test_preserve_recent_widens_to_keep_a_tool_group_whole(history: History, summaries: SpanStore) -> None:
    fake = FakeSummarizer()
    messages = conversation(6)
    call = {"id": "call_x", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_x", "content": text("result", 200)},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "next"},
    ]
    path = await stored_path(history, messages)
    # The tool output older than the last model turn would be stubbed in its place: keep it, to see the group.
    compactor = Compactor(ContextConfig(tool_results_keep_turns=2), summaries, fake)

    prepared = await compactor.prepare(replace(request(path, total(path) - 50), preserve_recent=2))

    assert prepared.messages[-4:] == [m.message for m in path[-4:]]
    assert prepared.written >= 1


async def test_the_summarizer_stays_within_its_own_model(fake: FakeUpstream) -> None:
    tiny = ModelEntry(
        name="tiny", model="openai/fake-model", api_base=fake.url, api_key="k", context_window=4096, max_output=300
    )
    upstream = UpstreamRouter(UpstreamConfig(timeout_s=10), (tiny,))
    budgets = Budgets((tiny,), upstream.model_info, ContextConfig().safety_margin)
    summarizer = Summarizer(upstream, tiny, budgets, ContextConfig())
    try:
        written = await summarizer.summarize([{"role": "user", "content": "x " * 100}], 2048, tiny)
    finally:
        await upstream.aclose()
    assert written.generated_by == "llm"
    assert fake.requests[-1].body["max_tokens"] == 300  # the model's max_output, not 2 × 2048
    capacity = summarizer.input_capacity(tiny)
    assert capacity > 0
    assert capacity + 2 * ContextConfig().target_ratio * capacity < 4096 - 300


async def test_the_spans_ending_on_messages_are_looked_up_by_end_not_by_walking_the_tenants(tmp_path: Path) -> None:
    """SQLite's plan for the lookup every request makes: by `summaries_by_end`, not by the tenant's epoch index
    (which walks every span the tenant wrote: ~90 µs at 700, growing with the session)."""
    db = await Database.open(tmp_path / "store.sqlite")
    try:
        plan = await db.fetchall(f"EXPLAIN QUERY PLAN {ENDING_ON_SQL}", (TENANT, '["a", "b"]'))
    finally:
        await db.close()
    assert "SEARCH summaries USING INDEX summaries_by_end (end_id=? AND tenant=?)" in [row["detail"] for row in plan]
