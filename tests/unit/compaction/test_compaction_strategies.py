"""The compactor with every strategy, pins, recall, events and background pre-compaction, over a real SQLite
store and a fake summarizer."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import pytest

from proxy.canonical.vocabulary import ITEMS
from proxy.compaction.compactor import CompactionRequest, Compactor
from proxy.compaction.events import CompactionEvents
from proxy.compaction.recall import RECALL_HEADER, Recall
from proxy.compaction.span_store import SpanStore
from proxy.compaction.stubs import MARKER_PREFIX, STUB_PREFIX
from proxy.compaction.summarizer import EPISODE_INSTRUCTION, WrittenSummary
from proxy.compaction.working_context import WorkingContext
from proxy.config.models import ModelEntry
from proxy.config.schema import ContextConfig
from proxy.errors import ContextTooLarge
from proxy.history.messages import StoredMessage
from proxy.history.pins import Pins
from proxy.history.store import History
from proxy.store.database import Database
from proxy.tokens import count_message
from tests.unit.compaction.test_span_store import (
    TENANT,
    FakeSummarizer,
    conversation,
    request,
    stored_path,
    text,
    total,
)


class RecordingSummarizer(FakeSummarizer):
    """Records the instruction of each call too, and may take its time (on the real clock)."""

    def __init__(self, words: int = 20, seconds: float = 0.0) -> None:
        super().__init__(words)
        self.instructions: list[str | None] = []
        self.seconds = seconds

    async def summarize(
        self,
        messages: Sequence[Mapping[str, Any]],
        target: int,
        request_entry: ModelEntry,
        instruction: str | None = None,
        session: tuple[str, str] | None = None,
    ) -> WrittenSummary:
        self.instructions.append(instruction)
        if self.seconds:
            await asyncio.sleep(self.seconds)
        return await super().summarize(messages, target, request_entry, instruction)


@pytest.fixture
def history(db: Database) -> History:
    return History(db)


@pytest.fixture
def summaries(db: Database) -> SpanStore:
    return SpanStore(db)


def agent(turns: int, output_lines: int = 120) -> list[dict[str, Any]]:
    """A coding agent's conversation: each goal carried out by two tool calls with long outputs."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": text(f"goal {turn}", 30)})
        for step in range(2):
            call = f"call_{turn}_{step}"
            arguments = json.dumps({"path": f"src/module_{turn}_{step}.py"})
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": call, "type": "function", "function": {"name": "read_file", "arguments": arguments}}
                    ],
                }
            )
            lines = [f"line {n}: value_{turn}_{step}_{n} = compute({n})" for n in range(output_lines)]
            messages.append({"role": "tool", "tool_call_id": call, "content": "\n".join(lines)})
        messages.append({"role": "assistant", "content": text(f"done {turn}", 40)})
    return messages


def compactor(summaries: SpanStore, summarizer: FakeSummarizer, **context: Any) -> Compactor:
    return Compactor(ContextConfig(**context), summaries, summarizer)


def with_strategies(path: Sequence[StoredMessage], budget: int, *strategies: str) -> CompactionRequest:
    return replace(request(path, budget), strategies=strategies or None)


def role_order(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(m["role"]) for m in messages if m["role"] not in ("system", "tool")]


def alternates(messages: Sequence[Mapping[str, Any]]) -> bool:
    """User and assistant turns alternate (tool results belong to the assistant's turn)."""
    roles = role_order(messages)
    return all(a != b for a, b in itertools.pairwise(roles))


# --- tool-results ---------------------------------------------------------------------------------------------


async def test_old_tool_outputs_are_stubbed_in_place_without_a_summarizer_call(
    history: History, summaries: SpanStore
) -> None:
    path = await stored_path(history, agent(8))
    fake = FakeSummarizer()
    prepared = await compactor(summaries, fake).prepare(request(path, total(path) // 2))

    assert fake.calls == []
    tools = [m for m in prepared.messages if m["role"] == "tool"]
    stubbed = [m for m in tools if str(m["content"]).startswith(STUB_PREFIX)]
    assert stubbed
    assert len(prepared.messages) == len(path)  # every message where it was: calls keep their results
    assert [m.get("tool_call_id") for m in tools] == [m.message.get("tool_call_id") for m in path if m.role == "tool"]
    first = stubbed[0]["content"]
    assert "read_file(path=src/module_0_0.py)" in first
    assert "120 lines" in first
    assert prepared.messages[-4:] == [dict(m.message) for m in path[-4:]]
    [mask] = await summaries.on_path(TENANT, path)
    assert (mask.strategy, mask.generated_by, mask.content) == ("tool-results", "rule", "")


async def test_a_stub_replaces_the_output_in_the_native_items_too(history: History, summaries: SpanStore) -> None:
    messages = agent(6)
    for message in messages:
        if message["role"] == "tool":
            item = {"type": "function_call_output", "call_id": message["tool_call_id"], "output": message["content"]}
            message[ITEMS] = [item]
    path = await stored_path(history, messages)
    prepared = await compactor(summaries, FakeSummarizer()).prepare(request(path, total(path) // 2))

    stubbed = [m for m in prepared.messages if str(m.get("content")).startswith(STUB_PREFIX)]
    assert stubbed
    for message in stubbed:
        [item] = message[ITEMS]
        assert item == {
            "type": "function_call_output",
            "call_id": message["tool_call_id"],
            "output": message["content"],
        }


# --- sliding-window, goal-batch -------------------------------------------------------------------------------


async def test_sliding_window_omits_the_oldest_turns_behind_a_one_line_marker(
    history: History, summaries: SpanStore
) -> None:
    path = await stored_path(history, conversation(20))
    fake = FakeSummarizer()
    budget = total(path) // 2
    prepared = await compactor(summaries, fake).prepare(with_strategies(path, budget, "sliding-window"))

    assert fake.calls == []
    assert prepared.tokens <= budget
    [marker] = [m for m in prepared.messages if str(m["content"]).startswith(MARKER_PREFIX)]
    assert "\n" not in marker["content"]
    assert re.search(
        r"\d+ earlier messages, user turns 1–\d+; the proxy keeps them in its history\]$", marker["content"]
    )
    assert prepared.messages[1] is not marker or prepared.messages[2]["role"] == "assistant"
    assert alternates(prepared.messages)
    [stored] = await summaries.on_path(TENANT, path)
    assert (stored.strategy, stored.generated_by) == ("sliding-window", "rule")


async def test_goal_batch_summarizes_whole_user_turns_as_episodes(history: History, summaries: SpanStore) -> None:
    path = await stored_path(history, agent(8, output_lines=30))
    fake = RecordingSummarizer()
    await compactor(summaries, fake).prepare(with_strategies(path, total(path) // 2, "goal-batch"))

    assert fake.instructions
    assert set(fake.instructions) == {EPISODE_INSTRUCTION}
    for summary in await summaries.on_path(TENANT, path):
        assert summary.strategy == "goal-batch"
        assert path[summary.start_depth].role == "user"
        assert summary.end_depth + 1 == len(path) or path[summary.end_depth + 1].role == "user"


# --- pins -----------------------------------------------------------------------------------------------------


async def test_a_pinned_message_is_sent_verbatim_through_every_compaction(
    history: History, summaries: SpanStore, db: Database
) -> None:
    path = await stored_path(history, conversation(20))
    pins = Pins(db)
    await pins.add(TENANT, "s", [path[3].id])
    engine = Compactor(ContextConfig(strategies=("summarize",)), summaries, FakeSummarizer(), pins=pins)
    prepared = await engine.prepare(request(path, total(path) // 3))

    assert prepared.summaries >= 1
    assert dict(path[3].message) in prepared.messages
    for summary in await summaries.on_path(TENANT, path):
        assert not summary.start_depth <= 3 <= summary.end_depth
    assert alternates(prepared.messages)


async def test_a_message_matching_a_pin_pattern_is_kept(history: History, summaries: SpanStore) -> None:
    messages = conversation(20)
    messages[5] = {"role": "user", "content": "REMEMBER: the release branch is release/2.4"}
    path = await stored_path(history, messages)
    config = {"strategies": ("summarize",), "pin_patterns": (re.compile(r"^REMEMBER:"),)}
    prepared = await compactor(summaries, FakeSummarizer(), **config).prepare(request(path, total(path) // 3))

    assert prepared.summaries >= 1
    assert messages[5] in prepared.messages


async def test_pins_that_cannot_fit_are_a_400_naming_them(history: History, summaries: SpanStore, db: Database) -> None:
    path = await stored_path(history, conversation(20))
    pins = Pins(db)
    pinned = [path[1].id, path[3].id, path[5].id]
    await pins.add(TENANT, "s", pinned)
    engine = Compactor(ContextConfig(), summaries, FakeSummarizer(), pins=pins)
    budget = sum(path[p].tokens for p in (0, 1, 3, 5)) - 10

    with pytest.raises(ContextTooLarge) as raised:
        await engine.prepare(request(path, budget, preserve_recent=1))

    assert raised.value.code == "pins_too_large"
    for message_id in pinned:
        assert message_id in raised.value.message


# --- recall, events -------------------------------------------------------------------------------------------


async def test_a_fact_only_in_compacted_history_is_recalled_before_the_question(
    history: History, summaries: SpanStore, db: Database
) -> None:
    messages = conversation(20)
    messages[3] = {"role": "user", "content": "We agreed: DEPLOY_REGION=eu-west-3 for the staging cluster."}
    messages.append({"role": "user", "content": "Which DEPLOY_REGION did we pick for staging?"})
    path = await stored_path(history, messages)
    engine = Compactor(ContextConfig(strategies=("summarize",)), summaries, FakeSummarizer(), recall=Recall(db))
    budget = total(path) // 2
    prepared = await engine.prepare(request(path, budget))

    assert prepared.summaries >= 1
    assert prepared.recalled >= 1
    assert prepared.tokens <= budget
    [recalled] = [m for m in prepared.messages if str(m["content"]).startswith(RECALL_HEADER)]
    assert "DEPLOY_REGION=eu-west-3" in recalled["content"]
    at = prepared.messages.index(recalled)
    assert prepared.messages[-1] == messages[-1]
    assert at == len(prepared.messages) - 3  # recall, acknowledgement, the question
    assert alternates(prepared.messages)


async def test_an_ordinary_question_recalls_the_same_passages_through_its_turn_s_tool_calls(
    history: History, summaries: SpanStore, db: Database
) -> None:
    """A question in plain words recalls its hidden turn; the turn's tool results, which show the question's words,
    do not take the recall away from the turn's next request: the prompt up to the question stays as it was sent."""
    messages = conversation(20)
    messages[3] = {"role": "user", "content": "I went to a LGBTQ support group yesterday and it was so powerful."}
    messages.append({"role": "user", "content": "When did I go to the support group?"})
    path = await stored_path(history, messages)
    engine = Compactor(ContextConfig(strategies=("summarize",)), summaries, FakeSummarizer(), recall=Recall(db))
    budget = total(path) // 2
    first = await engine.prepare(request(path, budget))

    assert first.summaries >= 1
    assert first.recalled >= 1
    [recalled] = [m for m in first.messages if str(m["content"]).startswith(RECALL_HEADER)]
    assert "LGBTQ support group yesterday" in recalled["content"]
    call = {"id": "c1", "type": "function", "function": {"name": "search_notes", "arguments": '{"q": "support group"}'}}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "notes: the support group meets weekly"},
    ]
    second = await engine.prepare(request(await stored_path(history, messages), budget))

    assert second.messages[: len(first.messages)] == first.messages
    assert second.recalled == first.recalled


class NamingSummarizer(FakeSummarizer):
    """A summary that names what was talked about without what was said of it."""

    async def summarize(
        self,
        messages: Sequence[Mapping[str, Any]],
        target: int,
        request_entry: ModelEntry,
        instruction: str | None = None,
        session: tuple[str, str] | None = None,
    ) -> WrittenSummary:
        written = await super().summarize(messages, target, request_entry, instruction)
        return replace(written, content=written.content + " They talked about a support group.")


async def test_a_summary_naming_the_question_s_words_does_not_keep_the_original_from_being_recalled(
    history: History, summaries: SpanStore, db: Database
) -> None:
    messages = conversation(20)
    messages[3] = {"role": "user", "content": "I went to a LGBTQ support group yesterday and it was so powerful."}
    messages.append({"role": "user", "content": "When did I go to the support group?"})
    path = await stored_path(history, messages)
    config = ContextConfig(strategies=("summarize",), recall_fill=False)
    engine = Compactor(config, summaries, NamingSummarizer(), recall=Recall(db))
    prepared = await engine.prepare(request(path, total(path) // 2))

    assert any("talked about a support group" in str(m["content"]) for m in prepared.messages)
    [recalled] = [m for m in prepared.messages if str(m["content"]).startswith(RECALL_HEADER)]
    assert "LGBTQ support group yesterday" in recalled["content"]


async def test_the_room_a_turn_is_left_is_filled_with_hidden_turns_before_its_question(
    history: History, summaries: SpanStore, db: Database
) -> None:
    """Between crossings the context grows back from the crossing's target to the budget; what a question's
    request has left (less one turn's growth, kept for the turn's own steps) is filled with hidden turns, just
    before the question, for that turn only: the prompt before them is the one sent before."""
    messages = conversation(30)
    messages.append({"role": "user", "content": "And then?"})
    path = await stored_path(history, messages)
    budget = total(path) // 2
    config = ContextConfig(strategies=("summarize",), recall_tokens=budget)
    filled = Compactor(config, summaries, FakeSummarizer(), recall=Recall(db))
    unfilled = Compactor(replace(config, recall_fill=False), summaries, FakeSummarizer(), recall=Recall(db))
    without = await unfilled.prepare(request(path, budget))
    prepared = await filled.prepare(request(path, budget))

    assert without.recalled == 0
    assert prepared.recalled >= 1
    turn = max(count_message(m) for m in messages[1:])
    assert budget - 3 * turn <= prepared.tokens <= budget
    assert prepared.tokens > without.tokens
    [recalled] = [m for m in prepared.messages if str(m["content"]).startswith(RECALL_HEADER)]
    at = prepared.messages.index(recalled)
    assert prepared.messages[:at] == without.messages[:at]
    assert prepared.messages[-1] == messages[-1]
    assert alternates(prepared.messages)


async def test_a_chat_s_question_is_filled_to_the_budget_past_the_recall_s_own_room(
    history: History, summaries: SpanStore, db: Database
) -> None:
    """A request that declares no tools on a path that calls none is its turn's only request: nothing re-sends its
    recall, so the fill takes what the budget leaves (a turn's excerpt at most short of it), past `recall_tokens`,
    which bounds what the question asks about."""
    messages = conversation(30)
    messages.append({"role": "user", "content": "And then?"})
    path = await stored_path(history, messages)
    budget = total(path) // 2
    config = ContextConfig(strategies=("summarize",), recall_tokens=64)
    engine = Compactor(config, summaries, FakeSummarizer(), recall=Recall(db))
    stepping = await engine.prepare(request(path, budget))
    chatting = await engine.prepare(replace(request(path, budget), tools=False))

    assert stepping.recall_tokens <= 64 + 3 * 7
    assert budget - max(count_message(m) for m in messages[1:]) <= chatting.tokens <= budget
    [recalled] = [m for m in chatting.messages if str(m["content"]).startswith(RECALL_HEADER)]
    at = chatting.messages.index(recalled)
    assert chatting.messages[:at] == stepping.messages[:at]
    assert alternates(chatting.messages)


async def test_nothing_is_recalled_for_a_question_the_context_already_answers(
    history: History, summaries: SpanStore, db: Database
) -> None:
    messages = conversation(20)
    messages[-2] = {"role": "user", "content": "Set DEPLOY_REGION=eu-west-3 please."}
    messages.append({"role": "user", "content": "Which DEPLOY_REGION did we pick?"})
    path = await stored_path(history, messages)
    config = ContextConfig(strategies=("summarize",), recall_fill=False)
    engine = Compactor(config, summaries, FakeSummarizer(), recall=Recall(db))
    prepared = await engine.prepare(request(path, total(path) // 2))

    assert prepared.summaries >= 1
    assert prepared.recalled == 0


async def test_each_compaction_is_recorded_as_start_and_complete_events(
    history: History, summaries: SpanStore, db: Database
) -> None:
    path = await stored_path(history, agent(8))
    events = CompactionEvents(db)
    engine = Compactor(ContextConfig(), summaries, FakeSummarizer(), events=events)
    prepared = await engine.prepare(request(path, total(path) // 4))

    listed, _ = await events.for_session(TENANT, "s", 100)
    assert [e["event"] for e in listed] == ["start", "complete"] * prepared.written
    complete = [e for e in listed if e["event"] == "complete"]
    assert complete[0]["strategy"] == "tool-results"
    assert all(e["tokens_after"] < e["tokens_before"] or e["strategy"] == "tool-results" for e in complete)
    assert all(e["duration_ms"] is not None and not e["background"] for e in complete)


# --- background pre-compaction --------------------------------------------------------------------------------


async def grow(history: History, messages: list[dict[str, Any]], turns: int) -> list[StoredMessage]:
    for turn in range(turns):
        messages += [
            {"role": "user", "content": text(f"later question {turn}")},
            {"role": "assistant", "content": text(f"later answer {turn}", 60)},
        ]
    return await stored_path(history, messages)


async def test_past_the_precompact_ratio_the_crossing_summary_is_written_ahead(
    history: History, summaries: SpanStore, db: Database
) -> None:
    messages = conversation(20)
    path = await stored_path(history, messages)
    budget = int(total(path) / 0.85)  # this turn leaves the session at 85 % of its budget
    fake = RecordingSummarizer()
    events = CompactionEvents(db)
    config = ContextConfig(strategies=("summarize",), headroom_turns=0)  # down to compact_to at a crossing
    engine = Compactor(config, summaries, fake, events=events)
    prepared = await engine.prepare(request(path, budget))
    assert prepared.summaries == 0
    assert not prepared.crossed
    engine.precompact(request(path, budget), prepared)
    await asyncio.wait_for(engine.settled(), 10)
    calls = len(fake.calls)
    assert calls >= 1

    crossing = await grow(history, messages, 6)
    assert total(crossing) > budget
    after = await engine.prepare(request(crossing, budget))

    assert len(fake.calls) == calls  # the crossing paid no summarizer call
    assert after.written == 0
    assert after.crossed, "the spans written ahead joined: the journal marks the step as a crossing"
    assert after.summaries >= 1
    assert after.tokens <= config.compact_to * budget + 2 * total(path[-2:])
    listed, _ = await events.for_session(TENANT, "s", 100)
    assert all(e["background"] for e in listed)
    following = await engine.prepare(request(await grow(history, messages, 1), budget))
    assert not following.crossed
    assert following.summaries == after.summaries


async def test_a_crossing_waits_for_the_running_precompaction_and_makes_no_second_call(
    history: History, summaries: SpanStore
) -> None:
    messages = conversation(20)
    path = await stored_path(history, messages)
    budget = int(total(path) / 0.85)
    fake = RecordingSummarizer(seconds=0.5)
    engine = Compactor(ContextConfig(strategies=("summarize",)), summaries, fake)
    engine.precompact(request(path, budget), WorkingContext([], total(path), 0, 0))

    crossing = await grow(history, messages, 6)
    after = await engine.prepare(request(crossing, budget))

    assert len(fake.calls) == 1
    assert after.written == 0
    assert after.summaries == 1
    assert after.tokens <= budget


async def test_one_precompaction_per_session_at_a_time(history: History, summaries: SpanStore) -> None:
    path = await stored_path(history, conversation(20))
    budget = int(total(path) / 0.85)
    fake = RecordingSummarizer(seconds=0.3)
    engine = Compactor(ContextConfig(strategies=("summarize",)), summaries, fake)
    for _ in range(5):
        engine.precompact(request(path, budget), WorkingContext([], total(path), 0, 0))
    await asyncio.wait_for(engine.settled(), 10)

    assert len(fake.calls) == 1
    assert len(await summaries.on_path(TENANT, path)) == 1


async def test_below_the_precompact_ratio_nothing_runs_in_the_background(
    history: History, summaries: SpanStore
) -> None:
    path = await stored_path(history, conversation(20))
    fake = RecordingSummarizer()
    engine = Compactor(ContextConfig(strategies=("summarize",)), summaries, fake)
    budget = int(total(path) / 0.7)
    engine.precompact(request(path, budget), WorkingContext([], total(path), 0, 0))
    await asyncio.wait_for(engine.settled(), 10)
    assert fake.calls == []


async def test_close_stops_the_background_work(history: History, summaries: SpanStore) -> None:
    path = await stored_path(history, conversation(20))
    fake = RecordingSummarizer(seconds=30)
    engine = Compactor(ContextConfig(strategies=("summarize",)), summaries, fake)
    engine.precompact(request(path, int(total(path) / 0.85)), WorkingContext([], total(path), 0, 0))
    await asyncio.sleep(0.05)
    await asyncio.wait_for(engine.close(grace_s=0.1), 5)
    assert await summaries.on_path(TENANT, path) == []


# --- the view of what the next request sends -------------------------------------------------------------------


@pytest.mark.parametrize("strategies", [("tool-results", "summarize"), ("summarize",), ("sliding-window",)])
async def test_the_view_is_what_prepare_sent_without_a_call_or_a_write(
    history: History, summaries: SpanStore, db: Database, strategies: tuple[str, ...]
) -> None:
    path = await stored_path(history, agent(8, output_lines=40))
    pins = Pins(db)
    await pins.add(TENANT, "s", [path[5].id])
    engine = Compactor(ContextConfig(), summaries, FakeSummarizer(), pins=pins)
    compacting = with_strategies(path, total(path) // 2, *strategies)
    prepared = await engine.prepare(compacting)
    stored = await summaries.on_path(TENANT, path)
    watching = RecordingSummarizer()
    looking = Compactor(ContextConfig(), summaries, watching, pins=pins)

    view = await looking.view(compacting)

    assert watching.calls == []
    assert await summaries.on_path(TENANT, path) == stored
    assert view.tokens == prepared.tokens
    assert not view.compacts
    assert len(view.spans) == prepared.summaries
    covered = {p for span in view.spans for p in range(span.start_depth, span.end_depth + 1)}
    assert 5 not in covered
    sent_stubs = [m["content"] for m in prepared.messages if str(m.get("content")).startswith(STUB_PREFIX)]
    assert [view.stubs[p] for p in sorted(view.stubs)] == sent_stubs
    assert (len(sent_stubs) > 0) == ("tool-results" in strategies)


async def test_a_conversation_that_fits_is_viewed_whole(history: History, summaries: SpanStore) -> None:
    path = await stored_path(history, conversation(4))
    view = await compactor(summaries, FakeSummarizer()).view(request(path, total(path) * 2))
    assert (view.spans, dict(view.stubs), view.tokens, view.compacts) == ((), {}, total(path), False)


async def test_a_view_past_what_is_written_says_the_next_request_compacts(
    history: History, summaries: SpanStore
) -> None:
    path = await stored_path(history, conversation(20))
    view = await compactor(summaries, FakeSummarizer(), strategies=("summarize",)).view(request(path, total(path) // 3))
    assert view.compacts
    assert view.spans == ()
    assert view.tokens == total(path)


async def test_a_question_sent_without_a_recall_gets_none_later_in_its_turn(
    history: History, summaries: SpanStore, db: Database
) -> None:
    """A crossing in the middle of a turn hides what the question followed; a recall placed before the question
    then would go again at the next question, breaking the prompt the upstream cached (Pi's marathon: one break
    after each such crossing). The question went upstream without one, so it stays without one through its turn."""
    messages = conversation(20)
    messages[3] = {"role": "user", "content": "I went to a LGBTQ support group yesterday and it was so powerful."}
    messages.append({"role": "user", "content": "When did I go to the support group?"})
    path = await stored_path(history, messages)
    engine = Compactor(ContextConfig(strategies=("summarize",)), summaries, FakeSummarizer(), recall=Recall(db))
    first = await engine.prepare(request(path, total(path) * 2))
    assert first.recalled == 0  # every original sent
    call = {"id": "c1", "type": "function", "function": {"name": "run", "arguments": '{"q": "x"}'}}
    messages += [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
    ]
    later = await stored_path(history, messages)
    second = await engine.prepare(request(later, total(path) // 2))

    assert second.summaries >= 1
    assert second.recalled == 0
    messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "Was the LGBTQ meeting powerful?"}]
    third = await engine.prepare(request(await stored_path(history, messages), total(path) // 2))
    assert third.recalled >= 1  # a new question is judged as ever
