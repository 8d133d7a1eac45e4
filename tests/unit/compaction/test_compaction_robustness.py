"""Compaction with the conversations real tools send (issue 11, items 5–7), unit by unit.

- A weak summarizer: a summary that does not shrink what it replaces is not used (the extractive fallback is,
  cut until it shrinks), and the summarizer work one request waits for is capped in calls and in time.
- An upstream that reuses tool-call ids: a tool result answers the nearest call before it with that id.
- Role order: every compacted working context is valid for the strictest common chat template (summaries are
  user turns; a synthetic acknowledgement keeps user and assistant turns alternating where a summary would not).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.budget.budgets import Budgets
from proxy.compaction.builder import (
    DEFAULT_ACKNOWLEDGEMENT_TOKENS,
    ContextLayout,
    Item,
    Policy,
    Span,
    build,
)
from proxy.compaction.compactor import Compactor
from proxy.compaction.extractive import fallback_summary
from proxy.compaction.groups import cut_points, recent_start
from proxy.compaction.span_store import SpanStore
from proxy.compaction.summarizer import FALLBACK_MODEL, Summarizer, WrittenSummary
from proxy.compaction.summary_text import (
    ACKNOWLEDGEMENT,
    SUMMARY_HEADER,
    acknowledgement_message,
    summarizer_messages,
    summary_message,
)
from proxy.config.models import ModelEntry
from proxy.config.schema import ConfigError, ContextConfig, parse_config
from proxy.errors import ContextTooLarge
from proxy.history.messages import StoredMessage
from proxy.history.store import History
from proxy.store.database import Database
from proxy.tokens import count_message
from tests.support.fake_upstream import role_order_error
from tests.support.scripted_upstream import ScriptedUpstream, completion
from tests.unit.compaction.test_builder import (
    PRIMING,
    Loop,
    assistant,
    chat,
    check_context,
    check_result,
    system,
    tool,
    user,
)
from tests.unit.compaction.test_span_store import (
    ENCODING,
    ENTRY,
    TENANT,
    FakeSummarizer,
    conversation,
    request,
    stored_path,
    text,
    total,
)

# --- helpers ------------------------------------------------------------------------------------------------


def reused_ids(turns: int, tokens: int = 100) -> list[Item]:
    """Every turn calls a tool, always with the id `call_0`, as some local servers do."""
    items = [system()]
    for _ in range(turns):
        items += [user(tokens), assistant(10, ("call_0",)), tool("call_0", tokens), assistant(tokens)]
    return items


def fresh_ids(turns: int, tokens: int = 100) -> list[Item]:
    """The same conversation with a new id per call."""
    items = [system()]
    for turn in range(turns):
        call = f"call_{turn}"
        items += [user(tokens), assistant(10, (call,)), tool(call, tokens), assistant(tokens)]
    return items


def roles(items: Sequence[Item], context: ContextLayout) -> list[dict[str, Any]]:
    """The working context as the roles of the messages it renders to."""
    messages: list[dict[str, Any]] = []
    for index, part in enumerate(context.parts):
        if index in context.acknowledgements:
            messages.append({"role": "assistant"})
        messages.append({"role": "user"} if isinstance(part, Span) else {"role": items[part].role})
    return messages


def rendering(context: ContextLayout) -> list[object]:
    """Parts and acknowledgements in the order they are sent: what prefix stability is judged on."""
    shown: list[object] = []
    for index, part in enumerate(context.parts):
        if index in context.acknowledgements:
            shown.append("acknowledgement")
        shown.append(part)
    return shown


@st.composite
def template_valid_conversations(draw: st.DrawFn, max_turns: int = 25) -> list[Item]:
    """Conversations a strict chat template accepts: a system prompt, then user and assistant turns (with tool
    calls answered in the same turn), sometimes with every call id reused from turn to turn."""
    reuse = draw(st.booleans())
    sizes = st.integers(1, 2_000)
    items = [system(draw(st.integers(1, 500)))]
    for turn in range(draw(st.integers(0, max_turns))):
        items.append(user(draw(sizes)))
        for step in range(draw(st.integers(0, 2))):
            calls = tuple(f"call_{k}" if reuse else f"t{turn}s{step}c{k}" for k in range(draw(st.integers(1, 3))))
            items.append(assistant(draw(sizes), calls))
            items += [tool(call, draw(sizes)) for call in calls]
        items.append(assistant(draw(sizes)))
    return items


# --- 6: reused tool-call ids in the builder -----------------------------------------------------------------


def test_a_reused_call_id_pairs_each_result_with_the_nearest_call_before_it() -> None:
    items = reused_ids(2)  # system, then user, call, result, answer (twice)
    cuts = cut_points(items)
    assert cuts == [True, True, True, False, True, True, True, False, True, True]
    assert recent_start(items, 2, cuts) == 6
    # A result with no call before it still never starts a range.
    items = [system(), user(), tool("call_0"), assistant(10, ("call_0",)), tool("call_0"), user()]
    assert cut_points(items) == [True, True, False, True, False, True, True]


def test_a_conversation_reusing_call_ids_compacts_like_one_with_fresh_ids() -> None:
    policy = Policy(budget=1_500)
    reused = Loop(policy).run(reused_ids(20))
    assert isinstance(reused, ContextLayout)
    check_context(reused_ids(20), policy, reused)
    assert reused == Loop(policy).run(fresh_ids(20))


# --- 7: role order in the builder ---------------------------------------------------------------------------


def test_a_summary_is_a_user_turn_acknowledged_before_the_next_user_turn() -> None:
    items = chat(20)  # system, then user/assistant pairs: users at odd positions
    span = Span(1, 1, 21, 200)
    result = build(items, [span], Policy(budget=3_000))
    assert isinstance(result, ContextLayout)
    assert result.parts == (0, span, *range(21, 41))
    assert result.acknowledgements == (2,)
    assert result.tokens == 10 + 200 + DEFAULT_ACKNOWLEDGEMENT_TOKENS + 20 * 100 + PRIMING
    assert role_order_error(roles(items, result)) is None
    # Only where needed: none before an assistant turn, none in a conversation sent as it came.
    before_assistant = build(items, [Span(1, 1, 20, 200)], Policy(budget=3_000))
    assert isinstance(before_assistant, ContextLayout)
    assert before_assistant.acknowledgements == ()
    assert before_assistant.tokens == 10 + 200 + 21 * 100 + PRIMING
    assert build(items, [span], Policy(budget=10_000)) == ContextLayout(tuple(range(41)), 4_010 + PRIMING)


def test_a_user_turn_before_a_summary_is_acknowledged_too() -> None:
    items = chat(20)
    span = Span(1, 2, 21, 200)  # the first user message stays an original
    result = build(items, [span], Policy(budget=3_000))
    assert isinstance(result, ContextLayout)
    assert result.parts == (0, 1, span, *range(21, 41))
    assert result.acknowledgements == (2, 3)
    assert role_order_error(roles(items, result)) is None


def test_adjacent_summaries_are_separated_by_an_acknowledgement_after_a_pinned_message() -> None:
    items = [system(), *chat(2, head=())[:-1], system(), *chat(20, head=())]
    # 0 system, 1 user, 2 assistant, 3 user, 4 system, 5 user, 6 assistant, ...
    spans = [Span(1, 1, 4, 50), Span(2, 5, 25, 200)]
    result = build(items, spans, Policy(budget=3_000))
    assert isinstance(result, ContextLayout)
    assert result.parts[:4] == (0, spans[0], 4, spans[1])
    assert result.acknowledgements == (3, 4)  # before the second summary, and before the user turn after it
    assert (
        result.tokens
        == sum(item.tokens for item in items[25:]) + 10 + 10 + 250 + 2 * DEFAULT_ACKNOWLEDGEMENT_TOKENS + PRIMING
    )


def test_acknowledgements_count_against_the_budget() -> None:
    items = chat(20)
    span = Span(1, 1, 21, 200)
    fitting_without = 10 + 200 + 20 * 100 + PRIMING
    assert build(items, [span], Policy(budget=fitting_without + DEFAULT_ACKNOWLEDGEMENT_TOKENS)) == ContextLayout(
        parts=(0, span, *range(21, 41)), tokens=fitting_without + DEFAULT_ACKNOWLEDGEMENT_TOKENS, acknowledgements=(2,)
    )
    squeezed = build(items, [span], Policy(budget=fitting_without, compact_to=0.9))
    assert not isinstance(squeezed, ContextLayout) or squeezed.tokens <= fitting_without


tight_policies = st.builds(
    Policy,
    budget=st.integers(300, 8_000),
    preserve_recent=st.integers(0, 6),
    trigger_ratio=st.sampled_from([1.0, 0.8]),
    compact_to=st.sampled_from([0.55, 0.4]),
)
"""Budgets small enough for the conversations below to need summaries more often than not."""


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=template_valid_conversations(), policy=tight_policies)
def test_property_every_working_context_of_a_valid_conversation_is_valid_for_strict_templates(
    items: list[Item], policy: Policy
) -> None:
    result = Loop(policy).run(items)
    check_result(items, policy, result)
    if isinstance(result, ContextLayout):
        assert role_order_error(roles(items, result)) is None


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), policy=tight_policies)
def test_property_acknowledgements_keep_prompts_prefix_extensions_between_compactions(
    data: st.DataObject, policy: Policy
) -> None:
    loop = Loop(policy)
    whole = data.draw(template_valid_conversations(max_turns=40))
    turns = [i + 1 for i, item in enumerate(whole) if item.role == "assistant" and not item.tool_call_ids]
    previous: list[object] | None = None
    for end in turns:
        before = loop.summaries
        result = loop.run(whole[:end])
        shown = rendering(result) if isinstance(result, ContextLayout) else None
        if shown is not None and previous is not None and loop.summaries == before:
            assert shown[: len(previous)] == previous
        previous = shown


# --- texts: summaries as user turns, acknowledgements, transcripts, the fallback that shrinks ---------------


def test_a_summary_is_sent_as_a_user_message_and_acknowledged_by_an_assistant_message() -> None:
    assert summary_message("facts") == {"role": "user", "content": SUMMARY_HEADER + "\nfacts", "origin": "summary"}
    assert acknowledgement_message() == {"role": "assistant", "content": ACKNOWLEDGEMENT, "origin": "acknowledgement"}
    for encoding in ("cl100k_base", "o200k_base"):
        assert count_message(acknowledgement_message(), encoding) == DEFAULT_ACKNOWLEDGEMENT_TOKENS


def test_the_transcript_names_the_tool_of_the_nearest_call_with_a_reused_id() -> None:
    def call(name: str) -> dict[str, Any]:
        return {"id": "call_0", "type": "function", "function": {"name": name, "arguments": "{}"}}

    transcript = summarizer_messages(
        [
            {"role": "user", "content": "Read it, then test it."},
            {"role": "assistant", "content": None, "tool_calls": [call("read_file")]},
            {"role": "tool", "tool_call_id": "call_0", "content": "def main(): pass"},
            {"role": "assistant", "content": None, "tool_calls": [call("run_tests")]},
            {"role": "tool", "tool_call_id": "call_0", "content": "3 passed"},
        ],
        64,
    )[1]["content"]
    assert "TOOL RESULT (read_file):\ndef main(): pass" in transcript
    assert "TOOL RESULT (run_tests):\n3 passed" in transcript


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
@pytest.mark.parametrize("replaced", [40, 60, 120, 400])
def test_the_fallback_is_cut_until_its_message_costs_less_than_what_it_replaces(encoding: str, replaced: int) -> None:
    messages = conversation(6)[1:]
    content = fallback_summary(messages, 1_000, replaced, encoding)
    assert content
    assert count_message(summary_message(content), encoding) < replaced


# --- the compactor: 5 (weak summarizers), 6 and 7 through `prepare` -----------------------------------------


@pytest.fixture
def history(db: Database) -> History:
    return History(db)


@pytest.fixture
def summaries(db: Database) -> SpanStore:
    return SpanStore(db)


class ManualClock:
    """Time moves only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class NarrowSummarizer(FakeSummarizer):
    """Reads at most `capacity` tokens at once, so a long history needs many summaries; each call may take
    `seconds` of the clock's time."""

    def __init__(self, capacity: int, clock: ManualClock | None = None, seconds: float = 0.0, words: int = 20):
        super().__init__(words=words)
        self.capacity = capacity
        self.clock = clock
        self.seconds = seconds

    def input_capacity(self, request_entry: ModelEntry) -> int:
        return self.capacity

    async def summarize(
        self,
        messages: Sequence[Mapping[str, Any]],
        target: int,
        request_entry: ModelEntry,
        instruction: str | None = None,
        session: tuple[str, str] | None = None,
    ) -> WrittenSummary:
        if self.clock is not None:
            self.clock.now += self.seconds
        return await super().summarize(messages, target, request_entry)


def scripted_summarizer(upstream: ScriptedUpstream, config: ContextConfig) -> Summarizer:
    """The real summarizer over an in-process upstream: what the summarizer model answers is scripted."""
    budgets = Budgets((ENTRY,), lambda model: None, config.safety_margin)
    return Summarizer(upstream, None, budgets, config)


def replaced_tokens(path: Sequence[StoredMessage], start: int, end: int) -> int:
    return sum(message.tokens for message in path[start:end])


async def test_a_summary_longer_than_what_it_replaces_is_not_used_the_fallback_is(
    history: History, summaries: SpanStore, caplog: pytest.LogCaptureFixture
) -> None:
    config = ContextConfig()
    upstream = ScriptedUpstream()
    messages = conversation(10)
    path = await stored_path(history, messages)
    upstream.reply(completion(" ".join(m["content"] for m in messages[1:]) * 2))  # a summarizer that rambles
    compactor = Compactor(config, summaries, scripted_summarizer(upstream, config))

    with caplog.at_level(logging.INFO, logger="proxy.compaction.spans"):
        prepared = await compactor.prepare(request(path, total(path) - 50))

    assert len(upstream.calls) == 1
    [stored] = await summaries.on_path(TENANT, path)
    assert (stored.generated_by, stored.model) == ("fallback", FALLBACK_MODEL)
    assert stored.tokens < replaced_tokens(path, stored.start_depth, stored.end_depth + 1)
    assert stored.tokens == count_message(summary_message(stored.content), ENCODING)
    assert stored.as_json()["ratio"] < 1
    assert prepared.tokens <= ContextConfig().compact_to * (total(path) - 50)
    assert "does not shrink" in caplog.text


async def test_a_fallback_that_does_not_shrink_its_range_is_cut_until_it_does(
    history: History, summaries: SpanStore
) -> None:
    path = await stored_path(history, conversation(10))
    rambling = FakeSummarizer(words=3_000, fallback=True)

    await Compactor(ContextConfig(), summaries, rambling).prepare(request(path, total(path) - 50))

    [stored] = await summaries.on_path(TENANT, path)
    assert stored.generated_by == "fallback"
    assert stored.tokens < replaced_tokens(path, stored.start_depth, stored.end_depth + 1)


async def test_a_hierarchical_summary_must_be_shorter_than_the_summaries_it_merges(
    history: History, summaries: SpanStore
) -> None:
    messages = conversation(6)
    path = await stored_path(history, messages)
    small = {"tokens": 60, "original_tokens": 400, "model": "cheap", "generated_by": "llm"}
    first = await summaries.add(TENANT, start_depth=1, end=path[4], content="first " * 45, **small)
    second = await summaries.add(TENANT, start_depth=5, end=path[8], content="second " * 45, **small)
    compactor = Compactor(ContextConfig(), summaries, FakeSummarizer(words=200))
    budget = total([path[0], *path[-4:]]) + 100

    prepared = await compactor.prepare(request(path, budget))

    merged = [s for s in await summaries.on_path(TENANT, path) if s.replaces]
    assert [s.replaces for s in merged] == [(first.id, second.id)]
    assert merged[0].generated_by == "fallback"
    assert merged[0].tokens < 120  # the two summaries it replaces
    assert prepared.tokens <= budget


async def test_one_request_makes_at_most_max_summarizer_calls_then_uses_the_fallback(
    history: History, summaries: SpanStore, caplog: pytest.LogCaptureFixture
) -> None:
    narrow = NarrowSummarizer(capacity=600)
    path = await stored_path(history, conversation(20))
    budget = total([path[0], *path[-4:]]) + 400
    compactor = Compactor(ContextConfig(max_summarizer_calls=2), summaries, narrow)

    with caplog.at_level(logging.INFO, logger="proxy.compaction.spans"):
        prepared = await compactor.prepare(request(path, budget))

    assert len(narrow.calls) == 2
    assert prepared.written > 2
    assert prepared.tokens <= budget
    written = await summaries.on_path(TENANT, path)
    assert [s.generated_by for s in written[:2]] == ["llm", "llm"]
    assert {s.generated_by for s in written[2:]} == {"fallback"}
    assert sum("2 summarizer calls" in r.getMessage() for r in caplog.records) == 1

    narrow.calls.clear()
    longer = await stored_path(history, conversation(24))
    await compactor.prepare(request(longer, budget))
    assert 1 <= len(narrow.calls) <= 2  # the next request has its own allowance


async def test_the_compactions_of_one_request_share_its_allowance(history: History, summaries: SpanStore) -> None:
    narrow = NarrowSummarizer(capacity=600)
    path = await stored_path(history, conversation(20))
    budget = total([path[0], *path[-4:]]) + 400
    compactor = Compactor(ContextConfig(max_summarizer_calls=2), summaries, narrow)
    allowance = compactor.allowance()

    first = await compactor.prepare(replace(request(path, budget * 2), allowance=allowance))
    healed = await compactor.prepare(replace(request(path, budget), allowance=allowance))  # a smaller budget

    assert first.written >= 1
    assert healed.written >= 1
    assert len(narrow.calls) == 2
    assert healed.tokens <= budget


async def test_no_summarizer_call_starts_after_the_requests_deadline(history: History, summaries: SpanStore) -> None:
    clock = ManualClock()
    slow = NarrowSummarizer(capacity=600, clock=clock, seconds=25.0)
    path = await stored_path(history, conversation(20))
    budget = total([path[0], *path[-4:]]) + 400
    config = ContextConfig(max_summarizer_calls=100, summarizer_deadline_s=60.0)

    prepared = await Compactor(config, summaries, slow, clock=clock).prepare(request(path, budget))

    assert len(slow.calls) == 3  # started at 0, 25 and 50 s; at 75 s the deadline has passed
    assert prepared.written > 3
    assert prepared.tokens <= budget


async def test_a_summarizer_call_still_running_at_the_deadline_is_abandoned_for_the_fallback(
    history: History, summaries: SpanStore, caplog: pytest.LogCaptureFixture
) -> None:
    config = ContextConfig(summarizer_deadline_s=0.2)
    upstream = ScriptedUpstream()
    upstream.reply(completion("never in time")).hold()
    path = await stored_path(history, conversation(10))
    compactor = Compactor(config, summaries, scripted_summarizer(upstream, config))
    started = time.monotonic()

    with caplog.at_level(logging.INFO, logger="proxy.compaction.spans"):
        prepared = await asyncio.wait_for(compactor.prepare(request(path, total(path) - 50)), 10)

    assert time.monotonic() - started < 5
    assert len(upstream.calls) == 1
    assert prepared.written == 1
    assert prepared.crossed
    [stored] = await summaries.on_path(TENANT, path)
    assert stored.generated_by == "fallback"
    assert "0.2 s" in caplog.text


async def test_zero_summarizer_calls_writes_every_summary_with_the_fallback(
    history: History, summaries: SpanStore
) -> None:
    fake = FakeSummarizer()
    path = await stored_path(history, conversation(10))

    await Compactor(ContextConfig(max_summarizer_calls=0), summaries, fake).prepare(request(path, total(path) - 50))

    assert fake.calls == []
    assert {s.generated_by for s in await summaries.on_path(TENANT, path)} == {"fallback"}


def tool_turns(turns: int, call_id: str | None = "call_0") -> list[dict[str, Any]]:
    """A conversation whose every turn calls a tool: with the same id each time unless `call_id` is None."""
    messages = conversation(1)
    for turn in range(turns):
        identifier = call_id or f"call_{turn}"
        call = {"id": identifier, "type": "function", "function": {"name": "read", "arguments": "{}"}}
        messages += [
            {"role": "user", "content": text(f"read {turn}")},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": identifier, "content": text(f"file {turn}", 120)},
            {"role": "assistant", "content": text(f"done {turn}", 30)},
        ]
    return messages


async def test_a_conversation_reusing_one_call_id_is_compacted_not_refused(
    history: History, summaries: SpanStore
) -> None:
    path = await stored_path(history, tool_turns(8))
    compactor = Compactor(ContextConfig(), summaries, FakeSummarizer())

    prepared = await compactor.prepare(request(path, total(path) // 2))

    assert prepared.written >= 1
    assert prepared.messages[-4:] == [dict(m.message) for m in path[-4:]]
    for position, message in enumerate(prepared.messages):
        if message["role"] == "tool":
            assert prepared.messages[position - 1]["tool_calls"][0]["id"] == message["tool_call_id"]


@pytest.mark.parametrize("budget_share", [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9])
@pytest.mark.parametrize("reuse", ["call_0", None])
async def test_every_compacted_context_is_valid_for_strict_templates_and_counted_exactly(
    history: History, summaries: SpanStore, budget_share: float, reuse: str | None
) -> None:
    messages = tool_turns(8, reuse) + conversation(6, "more")[1:]
    path = await stored_path(history, messages)
    budget = int(total(path) * budget_share)
    compactor = Compactor(ContextConfig(), summaries, FakeSummarizer())

    try:
        prepared = await compactor.prepare(request(path, budget))
    except ContextTooLarge:
        assert budget < total([path[0], *path[-4:]]) + 200
        return

    assert prepared.summaries >= 1 or prepared.written >= 1  # summarized, or (a budget close to it) masked
    assert role_order_error(prepared.messages) is None
    assert prepared.tokens == sum(count_message(m, ENCODING) for m in prepared.messages) + PRIMING
    assert prepared.tokens <= budget
    again = await compactor.prepare(request(path, budget))
    assert again.messages == prepared.messages  # the same summaries render the same bytes


@pytest.mark.parametrize(
    ("roles_sent", "error"),
    [
        (["system", "user", "assistant", "user"], None),
        (["user", "assistant", "tool", "assistant", "user", "assistant", "tool", "user"], None),
        (["system", "system", "user"], "System message must be at the beginning."),
        (["system", "user", "system", "assistant"], "System message must be at the beginning."),
        (["system", "assistant", "user"], "must start with a user message"),
        (["system", "user", "user"], "must alternate"),
        (["user", "assistant", "assistant"], "must alternate"),
    ],
)
def test_the_fakes_strict_template_check_refuses_what_strict_templates_refuse(
    roles_sent: list[str], error: str | None
) -> None:
    found = role_order_error([{"role": role} for role in roles_sent])
    assert found == error if error is None else error in str(found)


def test_the_summarizer_allowance_is_configured_per_request() -> None:
    def context(**keys: Any) -> ContextConfig:
        return parse_config({"context": keys}, base_dir=Path("."), environ={}).context

    assert (context().max_summarizer_calls, context().summarizer_deadline_s) == (2, 60.0)
    configured = context(max_summarizer_calls=0, summarizer_deadline_s="7.5")
    assert (configured.max_summarizer_calls, configured.summarizer_deadline_s) == (0, 7.5)
    with pytest.raises(ConfigError, match=r"context\.max_summarizer_calls: must be at least 0"):
        context(max_summarizer_calls=-1)
    with pytest.raises(ConfigError, match=r"context\.summarizer_deadline_s: must be between"):
        context(summarizer_deadline_s=-1)
