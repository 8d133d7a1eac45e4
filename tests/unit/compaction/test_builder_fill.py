"""Never worse than truncation (issue 42): with the config's `headroom_turns` and `summary_share`, the working
context keeps at least the recent originals a sliding window of the same budget keeps, less what the summaries
of the older part take and the headroom one crossing makes; the summaries take a share of the budget that grows
with the past they stand for; the prompt still only grows between crossings.

Pure builder, request by request, through the caller loop (a summary costs its target plus the header)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from proxy.compaction.builder import ContextLayout, Item, Policy, Span, SpanNeeded, build
from proxy.compaction.groups import Cuts, request_growth
from proxy.config.schema import DEFAULT_HEADROOM_TURNS, DEFAULT_SUMMARY_SHARE
from proxy.tokens import REPLY_PRIMING_TOKENS
from tests.unit.compaction.test_builder import check_context

SYSTEM = Item("system", 20)


def filling(budget: int, **changes: object) -> Policy:
    """The builder's policy as the config sets it by default."""
    defaults: dict[str, object] = {
        "headroom_turns": DEFAULT_HEADROOM_TURNS,
        "summary_share": DEFAULT_SUMMARY_SHARE,
    }
    return Policy(budget=budget, **(defaults | changes))  # type: ignore[arg-type]


@dataclass
class Session:
    """A chat replayed request by request: each request adds a user turn, is laid out (writing the spans the
    builder names), then the answer is appended."""

    policy: Policy
    items: list[Item] = field(default_factory=lambda: [SYSTEM])
    spans: list[Span] = field(default_factory=list)
    crossings: int = 0
    next_id: int = 1
    cuts: Cuts | None = None

    def request(self, user: int) -> ContextLayout:
        self.items.append(Item("user", user))
        # As the compactor does: the cut points carried from the previous request's path, only new items read.
        known = 0 if self.cuts is None else len(self.cuts.items)
        self.cuts = Cuts.of(tuple(self.items), self.cuts, known)
        written = False
        for round_ in range(200):
            result = build(self.items, self.spans, self.policy, compacting=round_ > 0, cuts=self.cuts)
            if isinstance(result, ContextLayout):
                self.crossings += written
                check_context(self.items, self.policy, result, self.cuts)
                return result
            assert isinstance(result, SpanNeeded), result
            self.spans = [span for span in self.spans if span.id not in result.replaces]
            tokens = result.target + self.policy.summary_overhead
            self.spans.append(Span(self.next_id, result.start, result.end, tokens))
            self.next_id += 1
            written = True
        raise AssertionError("the loop did not converge")

    def answer(self, tokens: int) -> None:
        self.items.append(Item("assistant", tokens))


def shown_originals(items: Sequence[Item], context: ContextLayout) -> tuple[int, int]:
    """Where the run of originals the context ends with begins, and what it costs (system messages aside)."""
    shown = {part for part in context.parts if isinstance(part, int)}
    start = len(items)
    while start > 0 and (start - 1 in shown) and items[start - 1].role != "system":
        start -= 1
    return start, sum(item.tokens for item in items[start:])


def sliding_window(items: Sequence[Item], budget: int) -> int:
    """What the most recent originals that fit `budget` with the system prompt cost (truncation)."""
    used = SYSTEM.tokens + REPLY_PRIMING_TOKENS
    kept = 0
    for item in reversed(items[1:]):
        if used + kept + item.tokens > budget:
            break
        kept += item.tokens
    return kept


def replay(policy: Policy, turns: int, seed: int, sizes: tuple[int, int] = (15, 120)) -> list[tuple[int, int, int]]:
    """(originals kept, truncation's, summaries' cost) at every request past the first crossing."""
    rng = random.Random(seed)
    session = Session(policy)
    rows = []
    for _ in range(turns):
        context = session.request(rng.randint(*sizes))
        if session.crossings:
            _, kept = shown_originals(session.items, context)
            summaries = context.tokens - kept - SYSTEM.tokens - REPLY_PRIMING_TOKENS
            rows.append((kept, sliding_window(session.items, policy.budget), summaries))
        session.answer(rng.randint(*sizes))
    return rows


@pytest.mark.parametrize(("budget", "seed"), [(3_379, 0), (7_270, 1), (14_336, 2)])
def test_the_context_keeps_what_a_sliding_window_keeps_less_the_summaries_and_one_crossings_headroom(
    budget: int, seed: int
) -> None:
    policy = filling(budget)
    rows = replay(policy, 700, seed)
    assert rows
    growth = 2 * 120  # the most one request adds here (a user turn and its answer)
    headroom = policy.headroom_turns * growth
    free = budget - SYSTEM.tokens - REPLY_PRIMING_TOKENS
    for kept, window, summaries in rows:
        assert kept >= window - summaries - headroom, (kept, window, summaries)
        assert kept + summaries >= free - headroom  # the context is full but for one crossing's headroom


def test_compacting_down_to_compact_to_keeps_far_less_than_a_sliding_window() -> None:
    # The rule before issue 42 (and with the fill turned off): each crossing went down to `compact_to`, and newer
    # originals were summarized before older summaries merged; the sliding window kept more.
    policy = Policy(budget=7_270)
    rows = replay(policy, 700, 1)
    worse = [kept < window - summaries - policy.headroom_turns * 240 for kept, window, summaries in rows]
    assert sum(worse) > len(rows) // 4


@pytest.mark.parametrize("budget", [3_379, 7_270])
def test_the_summaries_take_a_share_of_the_budget_that_grows_with_the_past(budget: int) -> None:
    policy = filling(budget)
    rows = replay(policy, 900, 3)
    free = budget - SYSTEM.tokens - REPLY_PRIMING_TOKENS
    share = policy.summary_share or 0.0
    one = policy.summary_min + policy.summary_overhead + 2 * policy.acknowledgement_tokens
    # at most the room and one shortest summary over it: a crossing whose own summary would take them further
    # merges the oldest with it
    assert max(summaries for _, _, summaries in rows) <= share * free + one
    # the room grows with the past: at the first crossing the summaries take far less than at the end
    assert rows[0][2] < rows[-1][2] / 2


def test_between_crossings_each_prompt_extends_the_previous() -> None:
    rng = random.Random(5)
    session = Session(filling(7_270))
    previous: tuple[int | Span, ...] = ()
    crossings = 0
    for _ in range(500):
        before = session.crossings
        context = session.request(rng.randint(15, 120))
        if session.crossings == before and previous:
            assert context.parts[: len(previous)] == previous
        crossings += session.crossings > before
        previous = context.parts
        session.answer(rng.randint(15, 120))
    # one crossing in about headroom_turns / 2 requests or fewer: the step is several requests' growth
    assert crossings <= 500 * 2 // DEFAULT_HEADROOM_TURNS


def test_large_turns_compact_down_to_compact_to_as_before() -> None:
    # An agent's turn of many steps (a tool call and a 2,000-token output each): a turn's growth is all of them,
    # more than what `compact_to` leaves, so a crossing goes down to `compact_to` and crossings stay as rare as
    # they were (and the agent's prompt as cacheable).
    items = [SYSTEM]
    for turn in range(40):
        call = f"c{turn}"
        items += [Item("assistant", 30, tool_call_ids=(call,)), Item("tool", 2_000, tool_call_id=call)]
    policy = filling(30_000)
    cuts = Cuts.of(items)
    floor = SYSTEM.tokens + REPLY_PRIMING_TOKENS
    assert request_growth(items, cuts) == 32 * 2_030  # the latest 64 messages, no user turn among them
    assert policy.target(floor, request_growth(items, cuts)) == policy.level(policy.compact_to, floor)


def test_a_chats_crossing_aims_near_the_budget() -> None:
    items = [SYSTEM]
    for _ in range(100):
        items += [Item("user", 40), Item("assistant", 60)]
    policy = filling(7_270)
    floor = SYSTEM.tokens + REPLY_PRIMING_TOKENS
    growth = request_growth(items, Cuts.of(items))
    assert growth == 100
    assert policy.target(floor, growth) == policy.budget - DEFAULT_HEADROOM_TURNS * 100
    assert policy.target(floor, growth) > policy.level(policy.compact_to, floor)


def test_a_turn_s_growth_can_be_read_before_its_own_steps() -> None:
    """A recall's room keeps one turn's growth as of the turn's question: the steps that follow it are not read, so
    the room stays the same through them (`compaction.recall_room`)."""
    items = [SYSTEM]
    for _ in range(40):
        items += [Item("user", 40), Item("assistant", 60)]
    question = len(items)
    call = "call-1"
    items += [Item("user", 40), Item("assistant", 30, tool_call_ids=(call,)), Item("tool", 2_000, tool_call_id=call)]
    cuts = Cuts.of(items)
    assert request_growth(items, cuts, end=question) == 100
    assert request_growth(items, cuts) > 100
    items.append(Item("system", 500))
    assert request_growth(items, Cuts.of(items), end=question) == 100


@pytest.mark.parametrize(("budget", "seed"), [(3_379, 0), (7_270, 1)])
def test_a_compacted_chat_leaves_its_recall_room_below_the_budget_at_every_request(budget: int, seed: int) -> None:
    """A question finds the recall's room whatever the point between two crossings it comes at; what the prompt
    keeps is the sliding window's less the summaries, one crossing's headroom and that room."""
    policy = filling(budget, recall_room=1_024)
    floor = SYSTEM.tokens + REPLY_PRIMING_TOKENS
    reserve = policy.reserve(floor, 2 * 15)
    assert 0 < reserve == min(1_024, int(0.15 * (budget - floor)))
    rng = random.Random(seed)
    session = Session(policy)
    headroom = policy.headroom_turns * 2 * 120
    compacted = 0
    for _ in range(600):
        context = session.request(rng.randint(15, 120))
        if session.crossings:
            compacted += 1
            growth = request_growth(session.items, session.cuts or Cuts.of(session.items))
            assert context.tokens <= budget - policy.reserve(floor, growth)
            _, kept = shown_originals(session.items, context)
            summaries = context.tokens - kept - floor
            assert kept >= sliding_window(session.items, budget) - summaries - headroom - reserve
        session.answer(rng.randint(15, 120))
    assert compacted > 400


def test_an_agents_turns_keep_no_recall_room() -> None:
    # The recall's fill needs a turn's room past the turn's own: an agent's turn of tool outputs never leaves it,
    # so its prompt keeps the whole budget, as before.
    policy = filling(30_000, recall_room=1_024)
    floor = SYSTEM.tokens + REPLY_PRIMING_TOKENS
    assert policy.reserve(floor, 2_030) == 0
    assert policy.reserve(floor, 100) == 1_024
    assert policy.reserve(floor, 100, tools=True) == 0
    assert policy.target(floor, 2_030, policy.reserve(floor, 2_030)) == policy.target(floor, 2_030)
