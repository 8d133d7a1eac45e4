"""The working context builder: each rule by example, then the invariants as properties of the caller loop."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from proxy.canonical.sharing import shared_prefix
from proxy.compaction.builder import (
    BuildResult,
    ContextLayout,
    Item,
    Policy,
    RecentTooLarge,
    Span,
    SpanNeeded,
    Stubbed,
    build,
    usable_spans,
)
from proxy.compaction.groups import Cuts, cut_points, recent_block, recent_start, with_tool_groups
from proxy.config.schema import SUMMARIZE, TOOL_RESULTS
from proxy.tokens import REPLY_PRIMING_TOKENS

PRIMING = REPLY_PRIMING_TOKENS


def system(tokens: int = 10) -> Item:
    return Item("system", tokens)


def user(tokens: int = 100) -> Item:
    return Item("user", tokens)


def assistant(tokens: int = 100, calls: tuple[str, ...] = ()) -> Item:
    return Item("assistant", tokens, tool_call_ids=calls)


def tool(call: str, tokens: int = 100) -> Item:
    return Item("tool", tokens, tool_call_id=call)


def chat(turns: int, tokens: int = 100, head: Sequence[Item] = (system(),)) -> list[Item]:
    items = list(head)
    for _ in range(turns):
        items += [user(tokens), assistant(tokens)]
    return items


def input_tokens(items: Sequence[Item], parts: Sequence[int | Span]) -> int:
    return sum(items[p].tokens if isinstance(p, int) else p.tokens for p in parts)


class Loop:
    """The caller loop: build, write an (estimated) summary on SpanNeeded, build again."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self.spans: list[Span] = []
        self.next_id = 1
        self.summaries = 0
        self.merges = 0

    def run(self, items: Sequence[Item], rounds: int = 50) -> BuildResult:
        for round_ in range(rounds):
            result = build(items, self.spans, self.policy, compacting=round_ > 0)
            if not isinstance(result, SpanNeeded):
                return result
            check_needs_summary(items, self.spans, self.policy, result)
            tokens = self.policy.estimated_summary(input_tokens(items, result.parts))
            self.spans = [s for s in self.spans if s.id not in result.replaces]
            self.spans.append(Span(self.next_id, result.start, result.end, tokens))
            self.next_id += 1
            self.summaries += 1
            self.merges += bool(result.replaces)
        raise AssertionError(f"no working context after {rounds} rounds")


def pinned_and_recent(items: Sequence[Item], policy: Policy, cuts: Cuts | None = None) -> tuple[int, int]:
    """The recent block's start and what it costs with the pinned messages; `cuts`: `Cuts.of(items)`, when known."""
    recent = recent_block(items, policy, Cuts.of(items) if cuts is None else cuts)
    pinned = sum(item.tokens for item in items[:recent] if item.role == "system")
    return recent, pinned + sum(item.tokens for item in items[recent:]) + PRIMING


def tool_pairs(items: Sequence[Item]) -> list[tuple[int, int]]:
    """(call, result) positions: a result answers the nearest call before it with its id (ids may be reused)."""
    owner: dict[str, int] = {}
    pairs: list[tuple[int, int]] = []
    for position, item in enumerate(items):
        if item.tool_call_id in owner:
            pairs.append((owner[item.tool_call_id], position))
        for call in item.tool_call_ids:
            owner[call] = position
    return pairs


def check_needs_summary(items: Sequence[Item], spans: Sequence[Span], policy: Policy, need: SpanNeeded) -> None:
    recent, _ = pinned_and_recent(items, policy)
    assert 0 <= need.start < need.end <= recent
    assert all(items[i].role != "system" for i in range(need.start, need.end))
    for call, answer in tool_pairs(items):
        assert (need.start <= call < need.end) == (need.start <= answer < need.end)
    covered = [p for part in need.parts for p in ([part] if isinstance(part, int) else range(part.start, part.end))]
    assert covered == list(range(need.start, need.end))
    assert {s.id for s in spans if need.start <= s.start and s.end <= need.end} == set(need.replaces)
    # Sized by what it stands for (within the summaries' room), or, the last resort, by what it reads.
    stands = sum(items[position].tokens for position in range(need.start, need.end))
    read = policy.summary_target(input_tokens(items, need.parts))
    assert need.target == read or policy.summary_min <= need.target <= policy.summary_target(stands)


def check_context(items: Sequence[Item], policy: Policy, context: ContextLayout, cuts: Cuts | None = None) -> None:
    """The working context's invariants; `cuts`: `Cuts.of(items)`, when the caller carries them (a replayed chat)."""
    assert context.tokens <= policy.budget
    acknowledgements = len(context.acknowledgements) * policy.acknowledgement_tokens
    assert context.tokens == input_tokens(items, context.parts) + acknowledgements + PRIMING
    where: dict[int, int | Span] = {}
    for part in context.parts:
        for position in [part] if isinstance(part, int) else range(part.start, part.end):
            assert position not in where
            where[position] = part
    assert sorted(where) == list(range(len(items)))
    order = [p if isinstance(p, int) else p.start for p in context.parts]
    assert order == sorted(order)
    recent, _ = pinned_and_recent(items, policy, cuts)
    assert recent <= max(0, len(items) - policy.preserve_recent)
    for position, item in enumerate(items):
        if item.role == "system" or position >= recent:
            assert where[position] == position
    for call, answer in tool_pairs(items):
        assert where[call] == where[answer] or (where[call] == call and where[answer] == answer)


# --- model limits of the working context --------------------------------------------------------------------


def test_everything_fits_verbatim() -> None:
    items = chat(3)
    result = build(items, [], Policy(budget=10_000))
    assert result == ContextLayout(parts=tuple(range(7)), tokens=610 + PRIMING)


def test_empty_path_costs_only_the_priming() -> None:
    assert build([], [], Policy(budget=100)) == ContextLayout(parts=(), tokens=PRIMING)


def test_recent_too_large_names_what_pinned_and_recent_need() -> None:
    items = [system(50), user(100), assistant(100), user(900), assistant(900)]
    result = build(items, [], Policy(budget=1_500, preserve_recent=2))
    assert result == RecentTooLarge(needed=50 + 1_800 + PRIMING, budget=1_500, recent=50 + 1_800 + PRIMING)


def test_zero_budget_is_recent_too_large() -> None:
    assert build([user(1)], [], Policy(budget=0)) == RecentTooLarge(needed=1 + PRIMING, budget=0, recent=1 + PRIMING)


def test_recent_block_widens_to_the_whole_tool_group() -> None:
    items = [system(), user(), assistant(10, ("a", "b")), tool("a"), tool("b"), assistant(), user()]
    assert recent_start(items, 3, cut_points(items)) == 2
    assert recent_start(items, 2, cut_points(items)) == 5
    assert recent_start(items, 0, cut_points(items)) == 7


def test_an_agent_turn_keeps_its_instruction_verbatim_while_the_turn_fits() -> None:
    """A tool loop longer than `preserve_recent`: the user message that started the turn stays verbatim (it
    is what the model is carrying out) as long as the turn fits in `compact_to` of the budget."""
    loop = [item for step in range(4) for item in (assistant(20, (f"c{step}",)), tool(f"c{step}", 50))]
    items = [user(400), assistant(400), user(60), *loop]
    policy = Policy(budget=1000, preserve_recent=4, trigger_ratio=1.0, compact_to=0.55)
    assert recent_block(items, policy, Cuts.of(items)) == 2  # the turn's user message
    result = build(items, [], policy)
    assert isinstance(result, SpanNeeded)
    assert (result.start, result.end) == (0, 2)  # the earlier turn is summarized, the instruction is not
    crowded = Policy(budget=600, preserve_recent=4, trigger_ratio=1.0, compact_to=0.55)
    assert recent_block(items, crowded, Cuts.of(items)) == len(items) - 4  # too big: the last N


@settings(max_examples=200)
@given(
    st.lists(
        st.tuples(st.sampled_from(["system", "developer", "user", "assistant"]), st.integers(0, 400)), max_size=24
    ),
    st.integers(0, 3_000),
    st.integers(0, 8),
    st.sampled_from([0.4, 0.55, 0.8]),
)
def test_the_recent_block_reaches_back_to_the_turn_as_the_definition_says(
    shape: list[tuple[str, int]], budget: int, preserve_recent: int, compact_to: float
) -> None:
    """Back to the latest user message while that turn, its system messages aside, fits `compact_to` of what
    the system messages leave of the budget (summed from the cut points' positions, not over the path)."""
    items = [Item(role, tokens) for role, tokens in shape]
    policy = Policy(budget=budget, preserve_recent=preserve_recent, compact_to=compact_to)
    recent = recent_start(items, preserve_recent, cut_points(items))
    users = [position for position, item in enumerate(items) if item.role == "user"]
    expected = recent
    if users and users[-1] < recent:
        turn = users[-1]
        system = sum(item.tokens for item in items if item.role in ("system", "developer"))
        in_turn = sum(item.tokens for item in items[turn:] if item.role not in ("system", "developer"))
        if in_turn <= compact_to * (max(0, budget) - system - PRIMING):
            expected = turn
    assert recent_block(items, policy, Cuts.of(items)) == expected


def test_cut_points_never_fall_inside_a_tool_group() -> None:
    items = [user(), assistant(10, ("a", "b")), tool("a"), tool("b"), user()]
    assert cut_points(items) == [True, True, False, False, True, True]


def test_cut_points_follow_the_call_ids_even_when_answers_are_not_adjacent() -> None:
    items = [assistant(10, ("a",)), user(), tool("a"), user()]
    assert cut_points(items) == [True, False, False, True, True]


def test_a_position_widens_to_its_whole_tool_group_within_the_bound() -> None:
    items = [user(), assistant(10, ("a", "b")), tool("a"), tool("b"), user()]
    cuts = cut_points(items)
    assert with_tool_groups(cuts, [2]) == {1, 2, 3}
    assert with_tool_groups(cuts, [0, 4]) == {0, 4}
    assert with_tool_groups(cuts, [1], end=3) == {1, 2}
    assert with_tool_groups(cuts, []) == set()


# --- compaction: which range to summarize -------------------------------------------------------------------


def test_needs_summary_for_the_oldest_range_just_long_enough_to_reach_compact_to() -> None:
    items = chat(20)  # 10 + 4000 tokens
    policy = Policy(budget=3_000)
    result = build(items, [], policy)
    assert isinstance(result, SpanNeeded)
    assert result.start == 1
    assert result.replaces == ()
    total = sum(item.tokens for item in items) + PRIMING

    def after(end: int) -> float:
        original = sum(item.tokens for item in items[1:end])
        acknowledgement = policy.acknowledgement_tokens if items[end].role == "user" else 0  # rule 6
        return total - original + policy.estimated_summary(original) + acknowledgement

    # The target is `compact_to` of the free space above the system prompt (and the reply priming).
    target = policy.level(policy.compact_to, items[0].tokens + PRIMING)
    assert target > policy.compact_to * policy.budget
    assert after(result.end) <= target
    assert after(result.end - 1) > target
    assert result.parts == tuple(range(1, result.end))
    assert result.target == policy.summary_target(sum(item.tokens for item in items[1 : result.end]))


def test_after_the_summary_the_context_uses_it_and_fits() -> None:
    items = chat(20)
    policy = Policy(budget=3_000)
    loop = Loop(policy)
    result = loop.run(items)
    assert isinstance(result, ContextLayout)
    assert loop.summaries == 1
    assert result.parts[0] == 0
    assert result.parts[1] == loop.spans[0]
    assert result.floor == items[0].tokens + PRIMING
    assert result.tokens <= policy.level(policy.compact_to, result.floor)
    check_context(items, policy, result)


def test_a_large_system_prompt_is_paid_first_and_compaction_aims_at_half_of_what_it_leaves() -> None:
    # An agent's preamble: a system prompt of 60 % of the budget. Aiming at `compact_to` of the whole budget would
    # aim below the system prompt itself, so every compaction would take all it could and the next turn cross
    # again; aiming at `compact_to` of the free space leaves room for turns between compactions.
    policy = Policy(budget=3_000)
    loop = Loop(policy)
    items = chat(0, head=(system(1_800),))
    crossings = 0
    for _turn in range(30):
        items += [user(100), assistant(100)]
        written = loop.summaries
        result = loop.run(items)
        assert isinstance(result, ContextLayout)
        crossings += loop.summaries > written
        assert result.floor == 1_800 + PRIMING
        if loop.summaries > written:
            assert result.tokens <= policy.level(policy.compact_to, result.floor)
            assert result.tokens > 1_800 + 400  # it does not compact further than it must
    assert crossings <= 10  # 200 tokens a turn, ~500 of the free 1,200 freed at each crossing (was: every turn)


def test_range_never_splits_a_tool_group() -> None:
    items = [
        system(),
        user(400),
        assistant(10, ("a", "b", "c")),
        tool("a", 500),
        tool("b", 500),
        tool("c", 500),
    ]
    items += [assistant(), user(), assistant(), user()]
    result = build(items, [], Policy(budget=2_000))
    assert isinstance(result, SpanNeeded)
    assert (result.start, result.end) == (1, 6)


def test_range_never_crosses_a_system_message() -> None:
    items = [system(), *chat(3, head=())[:-1], system(), *chat(10, head=())]
    result = build(items, [], Policy(budget=1_500))
    assert isinstance(result, SpanNeeded)
    assert (result.start, result.end) == (1, 6)


def test_whole_unsummarized_range_first_then_hierarchy() -> None:
    items = [*chat(12, tokens=300), user(100)]
    policy = Policy(budget=2_000, preserve_recent=1)
    first = build(items, [], policy)
    assert isinstance(first, SpanNeeded)
    assert (first.start, first.end) == (1, 25)
    loop = Loop(policy)
    loop.run(items)
    assert len(loop.spans) == 1


def test_hierarchical_summary_replaces_adjacent_spans() -> None:
    items = chat(50, tokens=1_000)
    spans = [Span(7, 1, 25, 2_000), Span(8, 25, 49, 2_000), Span(9, 49, 73, 2_000), Span(10, 73, 97, 2_000)]
    policy = Policy(budget=11_000, compact_to=0.8)
    result = build(items, spans, policy)
    assert isinstance(result, SpanNeeded)
    assert (result.start, result.end, result.replaces) == (1, 49, (7, 8))
    assert result.parts == (spans[0], spans[1])
    assert result.target == policy.summary_target(4_000)


def test_a_run_too_small_to_summarize_alone_is_merged_with_the_span_after_it() -> None:
    items = [system(), user(60), *chat(10, tokens=1_000, head=())]
    spans = [Span(3, 2, 18, 2_000)]
    result = build(items, spans, Policy(budget=5_000, preserve_recent=4))
    assert isinstance(result, SpanNeeded)
    assert (result.start, result.end, result.replaces) == (1, 18, (3,))
    assert result.parts == (1, spans[0])


def test_a_compaction_goes_on_to_compact_to_through_hierarchy() -> None:
    items = chat(30)
    spans = [Span(1, 1, 21, 500), Span(2, 21, 41, 500)]
    policy = Policy(budget=3_000)
    first = build(items, spans, policy)
    assert isinstance(first, SpanNeeded)
    assert (first.start, first.end, first.replaces) == (41, 57, ())
    spans.append(Span(3, 41, 57, policy.estimated_summary(1_600)))
    assert isinstance(build(items, spans, policy), ContextLayout)  # fits again: a new request stops here
    second = build(items, spans, policy, compacting=True)  # but this compaction is not done yet
    assert isinstance(second, SpanNeeded)
    assert (second.start, second.end, second.replaces) == (1, 41, (1, 2))


def test_single_summary_plus_recent_too_large() -> None:
    items = chat(10, tokens=300)
    spans = [Span(1, 1, 17, 1_000)]
    policy = Policy(budget=2_200, preserve_recent=4)
    result = build(items, spans, policy)
    acknowledgement = policy.acknowledgement_tokens  # between the summary and the user turn after it
    recent = 10 + 1_200 + PRIMING
    assert result == RecentTooLarge(needed=recent + 1_000 + acknowledgement, budget=2_200, recent=recent)


def test_max_summary_input_bounds_each_range() -> None:
    items = chat(20)
    result = build(items, [], Policy(budget=1_500, max_summary_input=1_000))
    assert isinstance(result, SpanNeeded)
    assert (result.start, result.end) == (1, 11)


def test_a_run_whose_summary_would_not_be_smaller_is_left_alone() -> None:
    items = [system(), user(30), system(), *chat(10, head=())]
    result = build(items, [], Policy(budget=1_500))
    assert isinstance(result, SpanNeeded)
    assert result.start == 3


# --- trigger ratio ------------------------------------------------------------------------------------------


def test_trigger_ratio_compacts_before_the_budget_is_reached() -> None:
    items = chat(10)
    assert isinstance(build(items, [], Policy(budget=2_500)), ContextLayout)
    assert isinstance(build(items, [], Policy(budget=2_500, trigger_ratio=0.8)), SpanNeeded)


def test_over_trigger_but_within_budget_and_nothing_to_summarize_is_a_context() -> None:
    items = [system(), user(900), assistant(900)]
    result = build(items, [], Policy(budget=2_000, trigger_ratio=0.5, compact_to=0.4))
    assert isinstance(result, ContextLayout)
    assert result.parts == (0, 1, 2)


# --- existing spans: representation, restoration, stale spans -----------------------------------------------


def test_spans_are_used_as_summaries_when_the_originals_do_not_all_fit() -> None:
    items = chat(20)
    span = Span(1, 1, 21, 200)
    result = build(items, [span], Policy(budget=3_000))
    assert isinstance(result, ContextLayout)
    assert result.parts == (0, span, *range(21, 41))


def test_originals_are_restored_when_everything_fits_again() -> None:
    items = chat(20)
    result = build(items, [Span(1, 1, 21, 200)], Policy(budget=100_000))
    assert result == ContextLayout(parts=tuple(range(41)), tokens=4_010 + PRIMING)


def test_a_summarized_span_stays_summarized_while_the_whole_path_does_not_fit() -> None:
    # Its own originals (2,000) would fit next to the rest, but restoring them now would flip them back to the
    # summary a few turns later without a compaction, breaking the prompt prefix (invariant 6).
    items = chat(20)
    span = Span(1, 1, 21, 200)
    result = build(items, [span], Policy(budget=4_000))
    assert isinstance(result, ContextLayout)
    assert span in result.parts


def test_a_span_whose_summary_is_not_smaller_is_shown_as_originals() -> None:
    items = chat(20)
    spans = [Span(1, 1, 3, 500), Span(2, 3, 21, 300)]
    result = build(items, spans, Policy(budget=3_000))
    assert isinstance(result, ContextLayout)
    assert result.parts[:4] == (0, 1, 2, spans[1])


def test_spans_overlapping_recent_system_or_a_tool_group_are_ignored() -> None:
    items = [system(), user(), assistant(10, ("a",)), tool("a"), assistant(), system(), *chat(5, head=())]
    stale = [Span(1, 1, 15, 50), Span(2, 1, 7, 50), Span(3, 1, 3, 50), Span(4, 3, 5, 50)]
    result = build(items, stale, Policy(budget=1_400, trigger_ratio=0.9, compact_to=0.5))
    assert isinstance(result, SpanNeeded)
    assert (result.start, result.end, result.replaces) == (1, 5, (3, 4))
    assert result.parts == (1, 2, 3, 4)


def test_overlapping_spans_prefer_the_widest() -> None:
    items = chat(20)
    spans = [Span(1, 1, 11, 100), Span(2, 11, 21, 100), Span(3, 1, 21, 150), Span(4, 5, 15, 100)]
    result = build(items, spans, Policy(budget=3_000))
    assert isinstance(result, ContextLayout)
    assert result.parts == (0, spans[2], *range(21, 41))


def test_of_two_spans_over_the_same_range_the_newest_wins() -> None:
    items = chat(20)
    spans = [Span(5, 1, 21, 100), Span(6, 1, 21, 120)]
    result = build(items, spans, Policy(budget=3_000))
    assert isinstance(result, ContextLayout)
    assert result.parts[1] == spans[1]


def test_developer_messages_are_pinned_like_system_messages() -> None:
    items = [Item("developer", 10), *chat(20, head=())]
    result = Loop(Policy(budget=2_000)).run(items)
    assert isinstance(result, ContextLayout)
    assert result.parts[0] == 0


def test_preserve_recent_zero_may_summarize_up_to_the_last_message() -> None:
    items = chat(10)
    loop = Loop(Policy(budget=600, preserve_recent=0))
    result = loop.run(items)
    assert isinstance(result, ContextLayout)
    check_context(items, loop.policy, result)


# --- properties ---------------------------------------------------------------------------------------------


@st.composite
def conversations(draw: st.DrawFn, max_turns: int = 25, low: int = 1, high: int = 2_000) -> list[Item]:
    sizes = st.integers(low, high)
    items = [system(draw(st.integers(1, 500)))]
    for turn in range(draw(st.integers(0, max_turns))):
        items += draw(turn_items(turn, sizes))
    return items


@st.composite
def turn_items(draw: st.DrawFn, turn: int, sizes: st.SearchStrategy[int]) -> list[Item]:
    items = []
    if draw(st.integers(0, 19)) == 0:
        items.append(system(draw(sizes)))
    items.append(user(draw(sizes)))
    for step in range(draw(st.integers(0, 2))):
        calls = tuple(f"t{turn}s{step}c{k}" for k in range(draw(st.integers(1, 3))))
        items.append(assistant(draw(sizes), calls))
        items += [tool(call, draw(sizes)) for call in calls]
    items.append(assistant(draw(sizes)))
    return items


policies = st.builds(
    Policy,
    budget=st.integers(300, 60_000),
    preserve_recent=st.integers(0, 6),
    trigger_ratio=st.sampled_from([1.0, 0.8]),
    compact_to=st.sampled_from([0.55, 0.4]),
)


def older_segments(items: Sequence[Item], recent: int) -> int:
    segments, inside = 0, False
    for item in items[:recent]:
        if item.role == "system":
            inside = False
        elif not inside:
            segments, inside = segments + 1, True
    return segments


def check_result(items: Sequence[Item], policy: Policy, result: BuildResult) -> None:
    recent, fixed = pinned_and_recent(items, policy)
    if isinstance(result, ContextLayout):
        check_context(items, policy, result)
        return
    assert isinstance(result, RecentTooLarge)
    assert result.needed > policy.budget
    assert result.needed >= fixed
    if fixed <= policy.budget:
        # Only the smallest summaries possible remain: one per stretch between pinned messages at most, each with
        # up to two acknowledgements around it.
        per_segment = policy.summary_max + policy.summary_overhead + 2 * policy.acknowledgement_tokens
        assert result.needed - fixed <= older_segments(items, recent) * per_segment


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(items=conversations(), policy=policies)
def test_property_loop_always_ends_in_a_valid_result(items: list[Item], policy: Policy) -> None:
    loop = Loop(policy)
    result = loop.run(items)
    check_result(items, policy, result)
    assert Loop(policy).run(items) == result  # deterministic
    assert build(items, list(reversed(loop.spans)), policy) == build(items, loop.spans, policy)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data(), policy=policies)
def test_property_prompts_are_prefix_extensions_between_compactions(data: st.DataObject, policy: Policy) -> None:
    loop = Loop(policy)
    items: list[Item] = [system(data.draw(st.integers(1, 300)))]
    previous: ContextLayout | None = None
    for turn in range(data.draw(st.integers(1, 40))):
        items += data.draw(turn_items(turn, st.integers(1, 2_000)))
        before = loop.summaries
        result = loop.run(items)
        check_result(items, policy, result)
        compacted = loop.summaries > before
        if isinstance(result, ContextLayout) and previous is not None and not compacted:
            assert result.parts[: len(previous.parts)] == previous.parts
        previous = result if isinstance(result, ContextLayout) else None


@pytest.mark.parametrize("seed", range(4))
def test_typical_conversation_compacts_rarely(seed: int) -> None:
    rng = random.Random(seed)
    policy = Policy(budget=16_000, preserve_recent=4)
    loop = Loop(policy)
    items: list[Item] = [system(300)]
    turns, compactions, previous = 150, 0, None
    for turn in range(turns):
        items.append(user(rng.randint(20, 400)))
        for step in range(rng.choice([0, 0, 1, 2])):
            calls = tuple(f"{turn}.{step}.{k}" for k in range(rng.randint(1, 3)))
            items.append(assistant(rng.randint(20, 200), calls))
            items += [tool(call, rng.randint(20, 400)) for call in calls]
        items.append(assistant(rng.randint(20, 400)))
        before = loop.summaries
        result = loop.run(items)
        assert isinstance(result, ContextLayout)
        check_context(items, policy, result)
        if loop.summaries > before:
            compactions += 1
        elif previous is not None:
            assert result.parts[: len(previous.parts)] == previous.parts
        previous = result
    assert 1 <= compactions <= turns / 5


def cuts_by_definition(items: Sequence[Item]) -> list[bool]:
    """A boundary may fall before p unless p is a tool message or lies after a call and at or before that
    call's last answer (each answer belonging to the nearest call before it with its id)."""
    answers: dict[int, int] = {}
    for position, item in enumerate(items):
        if item.tool_call_id is not None:
            callers = [q for q in range(position) if item.tool_call_id in items[q].tool_call_ids]
            if callers:
                answers[callers[-1]] = position
    return [
        position == 0
        or position == len(items)
        or (items[position].role != "tool" and not any(q < position <= a for q, a in answers.items()))
        for position in range(len(items) + 1)
    ]


@given(st.lists(st.tuples(st.sampled_from(["user", "calls", "tool", "assistant"]), st.integers(0, 3)), max_size=40))
def test_cut_points_are_those_of_the_definition(shape: list[tuple[str, int]]) -> None:
    items = [
        Item("assistant", 5, tool_call_ids=(f"c{n}", f"c{(n + 1) % 4}"))
        if kind == "calls"
        else Item("tool", 5, tool_call_id=f"c{n}")
        if kind == "tool"
        else Item(kind, 5)
        for kind, n in shape
    ]
    assert cut_points(items) == cuts_by_definition(items)


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["user", "calls", "tool", "assistant", "system"]),
            st.integers(0, 3),
            st.integers(0, 50),
            st.booleans(),
            st.none() | st.integers(0, 60),
        ),
        max_size=30,
    ),
    st.lists(st.integers(1, 6), max_size=5),
    st.floats(0, 1),
    st.none() | st.integers(0, 40),
)
def test_cut_points_carried_over_a_growing_path_are_those_of_the_whole(
    shape: list[tuple[str, int, int, bool, int | None]], growth: list[int], known_share: float, other: int | None
) -> None:
    """A later request's answer may close a group an earlier one opened (an agent's call answered in the
    next request): the carried cut points close it too. What else is carried (token sums, where the system and
    pinned messages are) is that of the whole path too, whatever part of the path before the caller says it
    knows is shared, and when an item past that part is another object (`other`: more tokens at each step)."""
    items = [
        Item("assistant", tokens, tool_call_ids=(f"c{n}",), pinned=pinned)
        if kind == "calls"
        else Item("tool", tokens, tool_call_id=f"c{n}", pinned=pinned, stub_tokens=stub)
        if kind == "tool"
        else Item(kind, tokens, pinned=pinned)
        for kind, n, tokens, pinned, stub in shape
    ]
    cuts: Cuts | None = None
    end = 0
    for number, step in enumerate([*growth, len(items)], 1):
        end = min(len(items), end + step)
        path = items[:end]
        known = 0 if cuts is None else min(int(known_share * len(cuts.items)), shared_prefix(path, cuts.items))
        if other is not None and known <= other < end:
            path[other] = replace(path[other], tokens=path[other].tokens + number)
        cuts = Cuts.of(path, cuts, known)
        assert cuts.points == cuts_by_definition(path)
        assert cuts.prefix == [sum(item.tokens for item in path[:p]) for p in range(end + 1)]
        assert cuts.system == [p for p in range(end) if path[p].role == "system"]
        assert cuts.pinned == [p for p in range(end) if path[p].pinned]
        stub_costs = [path[p].stub_tokens for p in range(end)]
        assert cuts.stubbable == [p for p, stub in enumerate(stub_costs) if stub is not None and stub < path[p].tokens]
        saving = [path[p].tokens - (path[p].stub_tokens or 0) for p in cuts.stubbable]
        assert cuts.savings == [sum(saving[:i]) for i in range(len(saving) + 1)]


@pytest.mark.slow
@example(shape=[(9, 1)] * 12, spans=[(0, 10, True), (2, 3, True)], recent=12, kept={4})  # a mask inside a mask
@settings(max_examples=300)
@given(
    st.lists(st.tuples(st.integers(0, 50), st.none() | st.integers(0, 60)), max_size=30),
    st.lists(st.tuples(st.integers(-2, 32), st.integers(0, 12), st.booleans()), max_size=6),
    st.integers(0, 32),
    st.sets(st.integers(0, 31), max_size=6),
)
def test_stubbed_outputs_and_their_savings_are_those_of_the_definition(
    shape: list[tuple[int, int | None]], spans: list[tuple[int, int, bool]], recent: int, kept: set[int]
) -> None:
    """A stubbed output is stubbable, older than the recent block, not kept and inside a mask (masks overlap and
    reach past the recent block); what a range saves is the sum over the stubbed outputs in it, and what it could
    save the sum over its stubbable ones (a new mask: those neither kept nor stubbed)."""
    items = [Item("tool", tokens, tool_call_id="c", stub_tokens=stub) for tokens, stub in shape]
    cuts = Cuts.of(items)
    given_spans = [
        Span(n, start, start + length, 0, strategy=TOOL_RESULTS if mask else SUMMARIZE)
        for n, (start, length, mask) in enumerate(spans)
    ]
    stubbed = Stubbed(cuts.stubbable, cuts.savings, given_spans, recent, frozenset(kept))
    masked = {p for span in given_spans if span.is_mask for p in range(span.start, span.end)}
    expected = {p for p in cuts.stubbable if p < recent and p not in kept and p in masked}
    assert {p for p in range(len(items) + 2) if p in stubbed} == expected
    for start in range(len(items) + 1):
        for end in range(start, len(items) + 1):
            saved = sum(items[p].tokens - (items[p].stub_tokens or 0) for p in expected if start <= p < end)
            assert stubbed.saved(start, end) == saved
            savable = sum(items[p].tokens - (items[p].stub_tokens or 0) for p in cuts.stubbable if start <= p < end)
            assert stubbed.savable(start, end) == savable
            new = [p for p in cuts.stubbable if start <= p < end and p not in kept and p not in expected]
            assert stubbed.unstubbed(start, end) == sum(items[p].tokens - (items[p].stub_tokens or 0) for p in new)


def test_an_answer_in_a_later_request_closes_the_group_its_call_opened() -> None:
    first = [user(), assistant(10, ("a",)), user()]
    cuts = Cuts.of(first)
    assert cuts.points == [True, True, True, True]
    later = Cuts.of([*first, tool("a"), user()], cuts)
    assert later.points == [True, True, False, False, True, True]


def test_a_replacing_span_holding_a_kept_message_is_not_usable() -> None:
    items = [Item("user", 5) for _ in range(12)]
    cuts = Cuts.of(items).points
    spans = [Span(1, 2, 5, 3), Span(2, 5, 8, 3), Span(3, 8, 10, 3)]
    for kept, usable in [({4}, [2, 3]), ({5}, [1, 3]), ({7}, [1, 3]), ({10}, [1, 2, 3]), ({1, 8}, [1, 2])]:
        assert [span.id for span in usable_spans(items, spans, 11, cuts, frozenset(kept))] == usable, kept
