"""The compaction strategies in the pure builder: what each names, and the invariants every set keeps."""

from __future__ import annotations

from collections.abc import Sequence
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.compaction import builder, strategies
from proxy.compaction.builder import (
    ContextLayout,
    Item,
    Policy,
    RecentTooLarge,
    Span,
    SpanNeeded,
    build,
)
from proxy.compaction.groups import Cuts, kept_positions, recent_block
from proxy.compaction.layout import Block, BuildResult, View
from proxy.compaction.strategies import ToolResults
from proxy.config.schema import GOAL_BATCH, SLIDING_WINDOW, SUMMARIZE, TOOL_RESULTS
from tests.unit.compaction.test_builder import PRIMING, assistant, pinned_and_recent, system, tool_pairs, user

STUB = 30
MARKER = 25
STRATEGY_SETS = [
    (TOOL_RESULTS, SUMMARIZE),
    (SUMMARIZE,),
    (GOAL_BATCH,),
    (SLIDING_WINDOW,),
    (TOOL_RESULTS, SLIDING_WINDOW),
    (TOOL_RESULTS, GOAL_BATCH, SLIDING_WINDOW),
]


def output(call: str, tokens: int, pinned: bool = False) -> Item:
    """A tool output whose stub costs `STUB` tokens (or the output itself, when shorter)."""
    return Item("tool", tokens, tool_call_id=call, stub_tokens=min(tokens, STUB), pinned=pinned)


def agent(turns: int, steps: int = 3, size: int = 1_000) -> list[Item]:
    """One user goal per turn, each carried out by `steps` tool calls with large outputs."""
    items = [system()]
    for turn in range(turns):
        items.append(user(50))
        for step in range(steps):
            call = f"t{turn}s{step}"
            items += [assistant(20, (call,)), output(call, size)]
        items.append(assistant(80))
    return items


class Loop:
    """The compactor's loop with every kind of span: masks cost nothing themselves, markers `MARKER`."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.spans: list[Span] = []
        self.written: list[SpanNeeded] = []

    def run(self, items: Sequence[Item], rounds: int = 60) -> BuildResult:
        for round_ in range(rounds):
            result = build(items, self.spans, self.policy, compacting=round_ > 0)
            if not isinstance(result, SpanNeeded):
                return result
            self.written.append(result)
            if result.strategy == TOOL_RESULTS:
                tokens = 0
            elif result.strategy == SLIDING_WINDOW:
                tokens = MARKER
            else:
                tokens = self.policy.estimated_summary(shown_tokens(items, result.parts, result.stubbed))
            self.spans = [s for s in self.spans if s.id not in result.replaces]
            self.spans.append(Span(len(self.written), result.start, result.end, tokens, result.strategy))
        raise AssertionError(f"no working context after {rounds} rounds")


def shown_tokens(items: Sequence[Item], parts: Sequence[int | Span], stubbed: frozenset[int]) -> int:
    return sum(
        part.tokens
        if isinstance(part, Span)
        else (items[part].stub_tokens or 0)
        if part in stubbed
        else items[part].tokens
        for part in parts
    )


def rendering(context: ContextLayout) -> list[object]:
    """What is sent, in order: prefix stability is judged on it (a stub is not its original)."""
    shown: list[object] = []
    for index, part in enumerate(context.parts):
        if index in context.acknowledgements:
            shown.append("acknowledgement")
        shown.append(("stub", part) if part in context.stubbed else part)
    return shown


def check(items: Sequence[Item], policy: Policy, context: ContextLayout) -> None:
    """The builder's invariants, with stubs counted at their cost: the budget, every item shown once and in
    order, system, pinned and recent messages verbatim (a stub only for an older tool output), tool pairs whole."""
    acknowledgements = len(context.acknowledgements) * policy.acknowledgement_tokens
    assert context.tokens == shown_tokens(items, context.parts, context.stubbed) + acknowledgements + PRIMING
    assert context.tokens <= policy.budget
    where: dict[int, int | Span] = {}
    for part in context.parts:
        for position in [part] if isinstance(part, int) else range(part.start, part.end):
            assert position not in where
            where[position] = part
    assert sorted(where) == list(range(len(items)))
    order = [p if isinstance(p, int) else p.start for p in context.parts]
    assert order == sorted(order)
    recent, _ = pinned_and_recent(items, policy)
    for position, item in enumerate(items):
        if item.role == "system" or item.pinned or position >= recent:
            assert where[position] == position
            assert position not in context.stubbed
    for position in context.stubbed:
        assert items[position].role == "tool"
        assert where[position] == position
    for call, answer in tool_pairs(items):
        assert where[call] == where[answer] or (where[call] == call and where[answer] == answer)


# --- tool-results ---------------------------------------------------------------------------------------------


def test_tool_results_runs_first_and_masks_every_output_older_than_the_last_turns() -> None:
    items = agent(6)
    policy = Policy(budget=12_000, strategies=(TOOL_RESULTS, SUMMARIZE), keep_turns=2)
    result = build(items, [], policy)
    assert isinstance(result, SpanNeeded)
    assert result.strategy == TOOL_RESULTS
    assistants = [p for p, item in enumerate(items) if item.role == "assistant"]
    boundary = min(recent_block(items, policy, Cuts.of(items)), assistants[-2])
    assert (result.start, result.end) == (0, boundary)
    mask = Span(1, result.start, result.end, 0, TOOL_RESULTS)
    context = build(items, [mask], policy, compacting=True)
    assert isinstance(context, ContextLayout)
    outputs = {p for p, item in enumerate(items) if item.role == "tool"}
    assert context.stubbed == {p for p in outputs if p < boundary}
    assert context.parts == tuple(range(len(items)))  # in place: every call keeps its result next to it
    check(items, policy, context)


def test_a_mask_is_widened_by_replacing_the_last_one() -> None:
    items = agent(10)
    policy = Policy(budget=12_000, strategies=(TOOL_RESULTS, SUMMARIZE), keep_turns=2)
    loop = Loop(policy)
    loop.run(items[:41])
    first = loop.spans[-1]
    assert first.strategy == TOOL_RESULTS
    loop.run(items)
    masks = [span for span in loop.spans if span.is_mask]
    assert len(masks) == 1
    assert masks[0].end > first.end
    assert loop.written[-1].replaces == (first.id,)


def test_masked_outputs_are_sent_whole_again_when_everything_fits() -> None:
    items = agent(4)
    mask = Span(1, 0, len(items) - 4, 0, TOOL_RESULTS)
    result = build(items, [mask], Policy(budget=100_000, strategies=(TOOL_RESULTS,)))
    assert isinstance(result, ContextLayout)
    assert not result.stubbed


def test_outputs_of_pinned_and_recent_messages_are_never_stubbed() -> None:
    items = agent(6)
    items[3] = Item("tool", 1_000, tool_call_id="t0s0", stub_tokens=STUB, pinned=True)
    mask = Span(1, 0, len(items), 0, TOOL_RESULTS)
    result = build(items, [mask], Policy(budget=12_000, strategies=(TOOL_RESULTS,), preserve_recent=4))
    assert isinstance(result, ContextLayout)
    assert 3 not in result.stubbed
    assert not result.stubbed & set(range(len(items) - 4, len(items)))


def test_without_tool_outputs_tool_results_names_nothing_and_the_next_strategy_runs() -> None:
    items = [system(), *[m for _ in range(30) for m in (user(200), assistant(200))]]
    result = build(items, [], Policy(budget=6_000, strategies=(TOOL_RESULTS, SUMMARIZE)))
    assert isinstance(result, SpanNeeded)
    assert result.strategy == SUMMARIZE


# --- sliding-window, goal-batch -------------------------------------------------------------------------------


def test_sliding_window_takes_just_the_oldest_turns_a_marker_saves() -> None:
    items = [system(), *[m for _ in range(30) for m in (user(200), assistant(200))]]
    budget = 10_000
    window = build(items, [], Policy(budget=budget, strategies=(SLIDING_WINDOW,)))
    summary = build(items, [], Policy(budget=budget, strategies=(SUMMARIZE,)))
    assert isinstance(window, SpanNeeded)
    assert isinstance(summary, SpanNeeded)
    assert window.strategy == SLIDING_WINDOW
    assert window.start == 1
    assert window.end < summary.end  # a marker costs less than a summary: fewer turns reach the target
    loop = Loop(Policy(budget=budget, strategies=(SLIDING_WINDOW,)))
    context = loop.run(items)
    assert isinstance(context, ContextLayout)
    assert context.tokens <= 0.55 * budget
    assert {need.strategy for need in loop.written} == {SLIDING_WINDOW}


def test_goal_batch_ranges_are_whole_user_turns() -> None:
    items = agent(12, steps=2, size=400)
    policy = Policy(budget=6_000, strategies=(GOAL_BATCH,))
    loop = Loop(policy)
    context = loop.run(items)
    assert isinstance(context, ContextLayout)
    assert loop.written
    for need in loop.written:
        assert items[need.start].role == "user"
        assert need.end == len(items) or items[need.end].role == "user"


# --- pins -----------------------------------------------------------------------------------------------------


def test_a_pinned_message_is_sent_verbatim_and_never_summarized() -> None:
    items = [system(), *[m for _ in range(30) for m in (user(200), assistant(200))]]
    items[5] = Item("user", 200, pinned=True)
    loop = Loop(Policy(budget=6_000, strategies=(SUMMARIZE,)))
    context = loop.run(items)
    assert isinstance(context, ContextLayout)
    assert 5 in context.parts
    assert all(not span.start <= 5 < span.end for span in loop.spans)


def test_a_pinned_tool_output_keeps_its_call_and_the_reverse() -> None:
    items = agent(8)
    call = next(p for p, item in enumerate(items) if item.tool_call_ids)
    items[call + 1] = Item("tool", 1_000, tool_call_id=items[call].tool_call_ids[0], pinned=True)
    loop = Loop(Policy(budget=9_000, strategies=(SUMMARIZE,)))
    context = loop.run(items)
    assert isinstance(context, ContextLayout)
    assert {call, call + 1} <= set(context.parts)


def test_pins_that_cannot_fit_are_named() -> None:
    items = [system(), user(3_000), assistant(100), user(100), assistant(100)]
    items[1] = Item("user", 3_000, pinned=True)
    result = build(items, [], Policy(budget=2_000, preserve_recent=2))
    assert isinstance(result, RecentTooLarge)
    assert result.pinned == (1,)
    assert result.pinned_tokens == 3_000


# --- every strategy set keeps the invariants ------------------------------------------------------------------


@st.composite
def agent_sessions(draw: st.DrawFn, max_turns: int = 20) -> list[Item]:
    sizes = st.integers(1, 2_000)
    items = [system(draw(st.integers(1, 300)))]
    for turn in range(draw(st.integers(0, max_turns))):
        items.append(Item("user", draw(sizes), pinned=draw(st.integers(0, 29)) == 0))
        for step in range(draw(st.integers(0, 3))):
            calls = tuple(f"t{turn}s{step}c{k}" for k in range(draw(st.integers(1, 2))))
            items.append(assistant(draw(st.integers(1, 200)), calls))
            items += [output(call, draw(sizes), pinned=draw(st.integers(0, 19)) == 0) for call in calls]
        items.append(assistant(draw(sizes)))
    return items


strategy_policies = st.builds(
    Policy,
    budget=st.integers(2_000, 40_000),
    preserve_recent=st.integers(0, 6),
    trigger_ratio=st.sampled_from([1.0, 0.8]),
    compact_to=st.sampled_from([0.55, 0.4]),
    strategies=st.sampled_from(STRATEGY_SETS),
    keep_turns=st.integers(1, 4),
)


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=agent_sessions(), policy=strategy_policies)
def test_property_every_strategy_set_ends_in_a_valid_result(items: list[Item], policy: Policy) -> None:
    result = Loop(policy).run(items)
    if isinstance(result, ContextLayout):
        check(items, policy, result)
    else:
        assert isinstance(result, RecentTooLarge)
        assert result.needed > policy.budget


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), policy=strategy_policies)
def test_property_prompts_are_prefix_extensions_between_compactions(data: st.DataObject, policy: Policy) -> None:
    whole = data.draw(agent_sessions(max_turns=30))
    loop = Loop(policy)
    ends = [i + 1 for i, item in enumerate(whole) if item.role == "assistant" and not item.tool_call_ids]
    previous: list[object] | None = None
    for end in ends:
        before = len(loop.written)
        result = loop.run(whole[:end])
        shown = rendering(result) if isinstance(result, ContextLayout) else None
        if shown is not None and previous is not None and len(loop.written) == before:
            assert shown[: len(previous)] == previous
        previous = shown


@pytest.mark.parametrize("strategies", STRATEGY_SETS)
def test_tool_pairs_stay_whole_under_every_strategy_set(strategies: tuple[str, ...]) -> None:
    items = agent(15, steps=2, size=700)
    policy = Policy(budget=7_000, strategies=strategies)
    context = Loop(policy).run(items)
    assert isinstance(context, ContextLayout)
    where: dict[int, object] = {}
    for part in context.parts:
        for position in [part] if isinstance(part, int) else range(part.start, part.end):
            where[position] = part
    for call, answer in tool_pairs(items):
        assert where[call] == where[answer] or (where[call] == call and where[answer] == answer)


def saving_by_definition(view: View, boundary: int) -> int:
    """What stubbing the outputs before `boundary` saves, walked position by position: not those kept (pinned,
    or in a pinned message's tool group), which no mask stubs."""
    summarized = {
        position
        for entry in view.layout
        if isinstance(entry, Block) and entry.uses_summary
        for position in range(entry.start, entry.end)
    }
    kept = kept_positions(Cuts.of(view.items), view.recent)
    return sum(
        item.tokens - item.stub_tokens
        for position, item in enumerate(view.items[:boundary])
        if item.stub_tokens is not None
        and item.stub_tokens < item.tokens
        and position not in kept
        and position not in view.stubbed
        and position not in summarized
    )


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=agent_sessions(), policy=strategy_policies)
def test_property_what_tool_results_would_save_is_what_walking_the_path_gives(
    items: list[Item], policy: Policy
) -> None:
    """`tool-results` looks only at the carried tool outputs whose stub is cheaper, and at the summarized blocks by
    their bounds: the same as walking every position, in every view a compaction passes through."""
    views: list[View] = []

    def recorded(view: View) -> SpanNeeded | None:
        views.append(view)
        return strategies.next_span(view)

    with mock.patch.object(builder, "next_span", recorded):
        Loop(policy).run(items)
    for view in views:
        for boundary in {0, view.recent // 2, view.recent, len(view.items)}:
            assert ToolResults._saving(view, boundary) == saving_by_definition(view, boundary)
