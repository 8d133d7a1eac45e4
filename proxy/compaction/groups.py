"""Tool groups and the recent block: where the builder may cut a path (rules 2 and 4 of `builder`).

A tool group (an assistant with tool_calls and the tool messages answering it) is never split: a range of the
path begins and ends only at a cut point. The recent block is the last `preserve_recent` messages, widened to
whole groups and back to the latest user turn while it fits (pure).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from proxy.canonical.sharing import shared_prefix
from proxy.compaction.layout import GROWTH_WINDOW, PINNED_ROLES, Item, Policy
from proxy.tokens import REPLY_PRIMING_TOKENS


def cut_points(items: Sequence[Item]) -> list[bool]:
    """cut[p]: may a range boundary fall just before position p? Never inside a tool group (invariant 4).

    A group reaches from an assistant with tool_calls to the last tool message answering it; a tool message
    answers the nearest call before it with its id, so a reused id never joins two turns into one group.
    """
    return Cuts.of(items).points


@dataclass(frozen=True)
class Cuts:
    """A path's cut points and what else the builder reads of its items alone, carried to a path that extends
    it: only the new items are read (a long session's path is walked once, not on every request)."""

    items: Sequence[Item]
    points: list[bool]
    caller: dict[str, int]
    """Which position last made each call id."""
    prefix: list[int]
    """`prefix[p]`: the tokens of the items before position p."""
    system: list[int]
    """The positions of system (and developer) messages, in order."""
    pinned: list[int]
    """The positions the session pinned, in order."""
    stubbable: list[int]
    """The positions of tool outputs whose stub costs less than the output, in order."""
    savings: list[int]
    """`savings[i]`: what stubbing the first i of `stubbable` saves (tokens less stub tokens)."""

    @staticmethod
    def of(items: Sequence[Item], previous: Cuts | None = None, known: int = 0) -> Cuts:
        """The cut points of `items`; from `previous` when `items` extends its items (the same objects, then
        more): only the new items are read, and a late answer to an earlier call closes its group there too.
        `known`: how many first items the caller knows to be `previous`'s very objects (not compared again)."""
        start, caller, points, prefix, system, pinned, stubbable, savings = 0, {}, [], [0], [], [], [], [0]
        end = 0 if previous is None else len(previous.items)
        if previous is not None and len(items) >= end > 0 and _extends(items, previous.items, min(known, end)):
            if len(items) == end:
                return previous
            start, caller, points = end, dict(previous.caller), previous.points[:-1]
            prefix, system, pinned = list(previous.prefix), list(previous.system), list(previous.pinned)
            stubbable, savings = list(previous.stubbable), list(previous.savings)
        last_answer: dict[int, int] = {}
        for position in range(start, len(items)):
            item = items[position]
            if item.tool_call_id is not None and item.tool_call_id in caller:
                last_answer[caller[item.tool_call_id]] = position
            for call_id in item.tool_call_ids:
                caller[call_id] = position
            points.append(item.role != "tool")
            prefix.append(prefix[-1] + item.tokens)
            if item.role in PINNED_ROLES:
                system.append(position)
            if item.pinned:
                pinned.append(position)
            if item.stub_tokens is not None and item.stub_tokens < item.tokens:
                stubbable.append(position)
                savings.append(savings[-1] + item.tokens - item.stub_tokens)
        points.append(True)
        points[0] = True
        # A group closes at its last answer: every position after its call up to that answer is inside it.
        reach = -1
        for call, answer in sorted(last_answer.items()):
            begin = max(call + 1, reach + 1)
            if begin <= answer:
                points[begin : answer + 1] = [False] * (answer + 1 - begin)
            reach = max(reach, answer)
        return Cuts(items, points, caller, prefix, system, pinned, stubbable, savings)


def _extends(items: Sequence[Item], before: Sequence[Item], known: int) -> bool:
    """Whether `items` begins with all of `before`, as the very objects, its first `known` known to."""
    end = len(before)
    return known == end or shared_prefix(items[known:end], before[known:]) == end - known


def with_tool_groups(cuts: Sequence[bool], positions: Iterable[int], end: int | None = None) -> set[int]:
    """`positions` and every message sharing a tool group with one of them (invariant 4: a call and its results
    are kept, or summarized, together), within the first `end` positions (None: all of them)."""
    limit = len(cuts) - 1 if end is None else end
    whole: set[int] = set()
    for position in positions:
        if position in whole:
            continue
        start, stop = position, position + 1
        while start > 0 and not cuts[start]:
            start -= 1
        while stop < limit and not cuts[stop]:
            stop += 1
        whole.update(range(start, stop))
    return whole


def kept_positions(cuts: Cuts, recent: int) -> frozenset[int]:
    """Positions older than the recent block sent verbatim where they stand: system messages, and the messages
    the session pinned, each with its whole tool group (a pinned call keeps its results, and the reverse)."""
    kept = set(cuts.system[: bisect_left(cuts.system, recent)])
    pinned = [position for position in cuts.pinned[: bisect_left(cuts.pinned, recent)] if position not in kept]
    return frozenset(kept | with_tool_groups(cuts.points, pinned, recent))


def recent_start(items: Sequence[Item], preserve_recent: int, cuts: Sequence[bool]) -> int:
    """First position of the recent block: the last N messages, widened to a whole tool group."""
    start = max(0, len(items) - max(0, preserve_recent))
    while start > 0 and not cuts[start]:
        start -= 1
    return start


def recent_block(items: Sequence[Item], policy: Policy, cuts: Cuts) -> int:
    """Where the messages kept verbatim begin (rule 2)."""
    recent = recent_start(items, policy.preserve_recent, cuts.points)
    turn = next((index for index in range(len(items) - 1, -1, -1) if items[index].role == "user"), None)
    if turn is None or turn >= recent:
        return recent
    # The turn may take `compact_to` of what the pinned messages leave: the share compaction aims the rest at.
    system = cuts.system
    pinned = sum(items[position].tokens for position in system)
    in_turn = sum(items[position].tokens for position in system[bisect_left(system, turn) :])
    turn_tokens = cuts.prefix[len(items)] - cuts.prefix[turn] - in_turn
    room = policy.compact_to * (max(0, policy.budget) - pinned - REPLY_PRIMING_TOKENS)
    return turn if turn_tokens <= room else recent


def request_growth(items: Sequence[Item], cuts: Cuts, window: int = GROWTH_WINDOW, end: int | None = None) -> int:
    """About what one turn adds to the path: the latest `window` messages (system messages aside) over the user
    turns among them (a chat turn: a user message and its reply; an agent's turn: a user message and every tool
    step it set off, so an agent's crossing makes room for whole turns and its prompt stays cacheable between
    crossings as before). What a crossing makes room for is counted in these. `end`: the messages before it only
    (a turn's own steps aside)."""
    end = len(items) if end is None else end
    start = max(0, end - window)
    tokens = cuts.prefix[end] - cuts.prefix[start]
    system = cuts.system[bisect_left(cuts.system, start) : bisect_left(cuts.system, end)]
    tokens -= sum(items[position].tokens for position in system)
    turns = sum(1 for position in range(start, end) if items[position].role == "user")
    return max(1, tokens // max(1, turns))
