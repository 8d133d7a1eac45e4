"""An agent's session in a small window under a large preamble (Claude Code on a 32k model: a 5.6k system prompt
in ~10.8k for messages, one ~2.4k tool output a turn, stubbed once older): the summaries of the past are sized by
what the crossing's target leaves them, so each crossing makes room for many turns and costs one summarizer call.

Pure builder, request by request, through the caller loop (a summary costs its target plus the header)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pytest

from proxy.compaction.builder import ContextLayout, Item, Policy, Span, SpanNeeded, build
from proxy.compaction.groups import Cuts
from proxy.compaction.precompaction import ahead_policy
from proxy.config.schema import (
    DEFAULT_HEADROOM_TURNS,
    DEFAULT_PRECOMPACT_RATIO,
    DEFAULT_SUMMARY_SHARE,
    SUMMARIZE,
    TOOL_RESULTS,
)

BUDGET = 10_758
SYSTEM = Item("system", 5_583)
TURN = (47, 47, 2_404, 25)
"""A turn: the user's prompt, the model's tool call, its output (60 as a stub), the answer."""
STUB = 60
MASKED_TURN = TURN[0] + TURN[1] + STUB + TURN[3]


@dataclass
class Agent:
    policy: Policy
    items: list[Item] = field(default_factory=lambda: [SYSTEM])
    spans: list[Span] = field(default_factory=list)
    calls: int = 0
    rooms: list[int] = field(default_factory=list)
    """What the budget left right after each crossing that called the summarizer."""
    next_id: int = 1
    shorter: int = 0
    """A summary costs its target plus the header less this: a summarizer that writes short (the benches' fake)."""

    def request(self) -> ContextLayout:
        called = self.calls
        for round_ in range(300):
            result = build(self.items, self.spans, self.policy, compacting=round_ > 0)
            if isinstance(result, ContextLayout):
                assert result.tokens <= self.policy.budget
                if self.calls > called:
                    self.rooms.append(self.policy.budget - result.tokens)
                return result
            assert isinstance(result, SpanNeeded), result
            self.spans = [span for span in self.spans if span.id not in result.replaces]
            mask = result.strategy == TOOL_RESULTS
            tokens = 0 if mask else result.target + self.policy.summary_overhead - self.shorter
            self.spans.append(Span(self.next_id, result.start, result.end, tokens, strategy=result.strategy))
            self.next_id += 1
            self.calls += not mask
        raise AssertionError("the loop did not converge")

    def turn(self, number: int) -> None:
        self.ask(number)
        self.request()
        self.items.append(Item("assistant", TURN[3]))

    def ask(self, number: int) -> None:
        """A turn's question and its tool step, up to the request that sends the tool's output."""
        call = f"call-{number}"
        self.items.append(Item("user", TURN[0]))
        self.request()
        self.items += [
            Item("assistant", TURN[1], tool_call_ids=(call,)),
            Item("tool", TURN[2], tool_call_id=call, stub_tokens=STUB),
        ]


def agent_policy(budget: int) -> Policy:
    """The config's defaults for an agent that masks before it summarizes."""
    return Policy(
        budget=budget,
        headroom_turns=DEFAULT_HEADROOM_TURNS,
        summary_share=DEFAULT_SUMMARY_SHARE,
        strategies=(TOOL_RESULTS, SUMMARIZE),
    )


@pytest.mark.parametrize("budget", [BUDGET, BUDGET + 1_500])
def test_an_agent_in_a_small_window_calls_the_summarizer_once_in_ten_turns_or_fewer(budget: int) -> None:
    agent = Agent(agent_policy(budget))
    turns = 150
    for number in range(turns):
        agent.turn(number)
    assert 0 < agent.calls <= turns // 10, agent.calls
    # Merged summaries sized by the free space (~1.5k here) filled the room a crossing made: the room left fell to
    # ~6 turns, and every other crossing merged again.
    assert min(agent.rooms) >= 10 * MASKED_TURN, agent.rooms
    # None is asked for more than what the target leaves the past (~330 tokens at BUDGET).
    assert all(span.tokens <= 400 + budget - BUDGET for span in agent.spans if span.strategy == SUMMARIZE)


@pytest.mark.parametrize("shorter", [0, 20])
@pytest.mark.parametrize("budget", [BUDGET, BUDGET + 1_500])
def test_every_crossing_leaves_the_next_turns_the_same_room(budget: int, shorter: int) -> None:
    """A crossing whose own summary would leave the summaries over their room by more than one shortest summary
    merges the oldest with it, in its one summarizer call. Merged only once they were already over it, they
    reached two shortest summaries over it every few crossings, and those crossings landed that far above their
    target, a turn closer to the next (Claude Code at 32k: every third call 9 turns after the last, not 10)."""
    agent = Agent(agent_policy(budget), shorter=shorter)
    for number in range(200):
        agent.turn(number)
    assert agent.calls == len(agent.rooms)  # one summarizer call per crossing that called it
    policy = agent.policy
    one = policy.summary_min + policy.summary_overhead + 2 * policy.acknowledgement_tokens
    assert max(agent.rooms) - min(agent.rooms) <= one, agent.rooms


def test_the_past_s_room_is_what_the_target_leaves_below_it() -> None:
    policy = Policy(budget=BUDGET, summary_share=DEFAULT_SUMMARY_SHARE)
    floor = SYSTEM.tokens
    assert policy.summary_room(floor, 50_000) == DEFAULT_SUMMARY_SHARE * (BUDGET - floor)
    assert policy.summary_room(floor, 50_000, past=300) == 300
    assert policy.summary_room(floor, 1_000, past=300) == policy.target_ratio * 1_000
    assert policy.sized_target(50_000, floor, 50_000, past=300) == 300
    assert policy.sized_target(10_000, floor, 50_000, past=300) == policy.summary_min  # a fifth of 300
    assert policy.summary_room(floor, 50_000, past=-20) == 0


def test_a_forced_summary_is_sized_by_the_free_space() -> None:
    """`Compactor.force` aims at the floor: the target leaves the past nothing, and its summaries are not cut to
    that (`Policy.past_room` off)."""
    agent = Agent(Policy(budget=BUDGET, summary_share=DEFAULT_SUMMARY_SHARE, strategies=(TOOL_RESULTS, SUMMARIZE)))
    for number in range(12):
        agent.turn(number)
    forced = Policy(
        budget=BUDGET,
        trigger_ratio=1e-9,
        compact_to=1e-9,
        summary_share=DEFAULT_SUMMARY_SHARE,
        past_room=False,
    )
    need = build(agent.items, agent.spans, forced)
    assert isinstance(need, SpanNeeded)
    assert need.target > forced.summary_min
    cut = build(agent.items, agent.spans, replace(forced, past_room=True))
    assert isinstance(cut, SpanNeeded)
    assert cut.target == forced.summary_min


def test_cuts_of_an_agent_turn_stub_the_tool_output() -> None:
    agent = Agent(Policy(budget=BUDGET))
    agent.turn(0)
    cuts = Cuts.of(agent.items)
    assert cuts.savings[-1] == TURN[2] - STUB


def _ahead(agent: Agent) -> Policy:
    """The policy `Precompactions.start` gives the run after the request the agent just sent."""
    sent = agent.request()
    return ahead_policy(agent.policy, sent.tokens, sent.floor, DEFAULT_PRECOMPACT_RATIO)


def _write_ahead(agent: Agent, aim: Policy) -> list[Span]:
    """What `Compactor._write_ahead` writes, held back (`Span.held`) until the crossing."""
    written: list[Span] = []
    while isinstance(need := build(agent.items, agent.spans, aim, compacting=True), SpanNeeded):
        agent.spans = [span for span in agent.spans if span.id not in need.replaces]
        tokens = 0 if need.strategy == TOOL_RESULTS else need.target + aim.summary_overhead
        written.append(Span(agent.next_id, need.start, need.end, tokens, strategy=need.strategy, held=1))
        agent.spans.append(written[-1])
        agent.next_id += 1
    return written


def test_a_crossing_that_joins_a_pre_compaction_lands_at_its_target() -> None:
    """The pre-compaction runs while the turn in flight is recent, so its summary stops before that turn; at the
    crossing the turn is older and sent as its stubs. The summary leaves it its room: the crossing lands at its
    target (within a shortest summary), not a turn above it, as it did when the summary took the whole past room
    the target leaves (~250 tokens at 32k: a summarizer call every 9 turns instead of 10)."""
    policy = agent_policy(BUDGET)
    agent = Agent(policy)
    for number in range(40):
        agent.turn(number)
    held: list[Span] = []
    while not held:
        number += 1
        agent.ask(number)
        aim = _ahead(agent)
        need = build(agent.items, agent.spans, aim, compacting=True)
        if isinstance(need, SpanNeeded) and need.strategy == SUMMARIZE:
            held = _write_ahead(agent, aim)
        agent.items.append(Item("assistant", TURN[3]))
    summary = next(span for span in held if span.strategy == SUMMARIZE)
    assert summary.end < len(agent.items) - 3  # the turn in flight was recent: outside the summary
    calls = agent.calls
    for later in range(number + 1, number + 4):  # held back until a crossing needs it: the next, or soon after
        agent.turn(later)
        crossing = agent.request()
        if summary in crossing.parts:
            break
    assert summary in crossing.parts
    assert agent.calls == calls  # the crossing joined the summary written ahead, and wrote none of its own
    target = policy.level(policy.compact_to, SYSTEM.tokens)
    assert crossing.tokens <= target + policy.summary_min + policy.summary_overhead, (crossing.tokens, target)
