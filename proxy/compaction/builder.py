"""The working context builder: which stored messages go upstream verbatim and which as summaries.

A pure function of the path's messages (role, token count, tool-call links), the summaries that exist for it
and a policy, so that every invariant (docs/architecture.md) can be pinned by unit and property tests without a
database or a model. Its rules:

1. The leading system (and developer) messages are pinned verbatim; a system message further on is verbatim
   at its position while recent, and older than the recent block compactable like the turns around it.
2. The last `preserve_recent` messages are kept verbatim, widened backwards so a tool group (an assistant
   with tool_calls and the tool messages answering it) is never split, and back to the latest user message
   while the turn since it fits in `compact_to` of what the pinned messages leave of the budget (an agent's
   tool loop outlasts N messages; the instruction it carries out stays in front of the model). A tool message
   answers the nearest call before it with its id: some local servers name every call `call_0`, and pairing the
   first use of an id with its last would make one group of the whole conversation. If the pinned and recent
   messages alone exceed the budget, that is `RecentTooLarge`: the client gets a clear error, never a silent cut.
3. Older messages form blocks: each usable summary span (shown as its summary, or as its originals when they
   are cheaper) and atomic units of unsummarized messages (a tool group is one unit).
4. If the result fits the `trigger_ratio` level of the free space (`Policy.level`: what the budget leaves above
   the system and pinned messages) it is the `ContextLayout`. Otherwise (a *crossing*) every span written ahead
   joins, and `SpanNeeded` names the next span to write until the total drops to the `compact_to` level:
   compaction happens in big steps so that the following requests are prefix-extensions of each other and
   provider prompt caches keep hitting (invariant 6).
5. When every older message is summarized, adjacent summaries (and the messages between them) are summarized
   again, hierarchically; when nothing more can be summarized and it still does not fit, `RecentTooLarge`.
6. A summary is a user turn. Where it would make two user turns follow each other (system messages between
   them do not count), an assistant acknowledgement goes between them, counted in the total: a compacted
   context of a conversation that strict chat templates accept is accepted too. It depends only on the two
   neighbours, so the acknowledgements of a prompt stay where they are as the conversation grows.

Stability is a property of the rules, since the builder has no memory of what it sent last time: a span's
representation depends only on the span itself, except that when the whole path fits as originals no summary
is used at all (e.g. after a switch to a bigger model). A greedy "restore what fits" walk was rejected on
purpose: as the conversation grows it would flip restored spans back to summaries between compactions and
break the prompt prefix on every such flip, without calling the summarizer.

The caller loop is: build → on `SpanNeeded` write a summary of `parts` (span ids in `replaces` become
orphaned) and build again with `compacting=True`, a bounded number of rounds → `ContextLayout`.
"""

from __future__ import annotations

import functools
import math
from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import replace

from proxy.compaction.groups import Cuts, kept_positions, recent_block, request_growth
from proxy.compaction.layout import (
    DEFAULT_ACKNOWLEDGEMENT_TOKENS,
    DEFAULT_COMPACT_TO,
    DEFAULT_PRESERVE_RECENT,
    DEFAULT_SUMMARY_OVERHEAD,
    DEFAULT_TRIGGER_RATIO,
    PINNED_ROLES,
    Block,
    BuildResult,
    ContextLayout,
    Item,
    Layout,
    Neighbours,
    Part,
    Policy,
    RecentTooLarge,
    Span,
    SpanNeeded,
    Stubbed,
    View,
)
from proxy.compaction.strategies import next_span
from proxy.compaction.summary_text import SUMMARY_ROLE
from proxy.tokens import REPLY_PRIMING_TOKENS

REACH_TURNS = 2
"""A crossing whose usual target leaves room for fewer turns than this stops at its masks when they leave a
turn's room (`_within_reach`): compacting deeper would not spare the next turn its crossing."""

__all__ = [
    "DEFAULT_ACKNOWLEDGEMENT_TOKENS",
    "DEFAULT_COMPACT_TO",
    "DEFAULT_PRESERVE_RECENT",
    "DEFAULT_SUMMARY_OVERHEAD",
    "DEFAULT_TRIGGER_RATIO",
    "PINNED_ROLES",
    "BuildResult",
    "ContextLayout",
    "Item",
    "Part",
    "Policy",
    "RecentTooLarge",
    "Span",
    "SpanNeeded",
    "acknowledgements",
    "build",
    "usable_spans",
]


def build(
    items: Sequence[Item],
    spans: Sequence[Span],
    policy: Policy,
    *,
    compacting: bool = False,
    cuts: Cuts | None = None,
) -> BuildResult:
    """The working context for `items`, or the span that must be written first, or why it cannot fit.

    `compacting` is True on the calls that follow a `SpanNeeded` within one request (and from the start at a
    crossing): the compaction then goes on until the total reaches the `compact_to` level (or nothing more can
    be compacted), rather than stopping as soon as it fits again, so that one compaction is one big step,
    however many rounds it takes. `cuts`: `Cuts.of(items)`, when the caller has them.
    """
    count = len(items)
    budget = max(0, policy.budget)
    cuts = Cuts.of(items) if cuts is None else cuts
    points, prefix = cuts.points, cuts.prefix
    recent = recent_block(items, policy, cuts)
    kept = kept_positions(cuts, recent)
    kept_tokens = sum(items[position].tokens for position in kept)
    fixed = kept_tokens + prefix[count] - prefix[recent] + REPLY_PRIMING_TOKENS
    if fixed > budget:
        return _too_large(items, kept, fixed, budget)
    floor = (
        kept_tokens
        + sum(items[position].tokens for position in range(recent, count) if items[position].role in PINNED_ROLES)
        + REPLY_PRIMING_TOKENS
    )
    trigger = policy.level(policy.trigger_ratio, floor)
    growth = request_growth(items, cuts)
    reserve = policy.reserve(floor, growth, tools=bool(cuts.caller))
    target = stop = policy.target(floor, growth, reserve)
    masked = request_growth(items, cuts, masked=True)
    if policy.budget - target < REACH_TURNS * growth:
        target, stop = _within_reach(policy, target, masked)
    everything = prefix[count] + REPLY_PRIMING_TOKENS
    if everything <= trigger:
        held = any(span.held for span in spans)
        return ContextLayout(parts=tuple(range(count)), tokens=everything, held_back=held, floor=floor)
    # Once something is hidden, a question may ask for it: the compacted context leaves its recall the room.
    trigger = min(trigger, policy.budget - reserve)

    arrange = functools.partial(_arrange, items, policy, recent, kept, cuts, fixed)
    # Spans written ahead of need (pre-compaction) are held back while the context fits without them, so the
    # prompt changes at the crossing, as it would have without pre-compaction (invariant 6). At the crossing
    # every held batch joins at once and compaction goes on to the target: the prompt changes there anyway,
    # and the deeper it goes in that one step, the further away the next crossing is.
    active = list(spans) if compacting else [span for span in spans if not span.held]
    context, layout, stubbed = arrange(active)
    if not compacting and context.tokens > trigger:
        compacting = True
        if len(active) < len(spans):
            active = list(spans)
            context, layout, stubbed = arrange(active)
    context = replace(context, floor=floor)
    total = context.tokens
    if total <= (stop if compacting else trigger):
        return replace(context, held_back=len(active) < len(spans))
    view = View(
        items=items,
        spans=active,
        policy=policy,
        cuts=points,
        recent=recent,
        layout=layout,
        neighbours=_neighbours(items, layout, recent),
        stubbed=stubbed,
        needed=total - target,
        floor=floor,
        past_room=_past_room(policy, target, fixed, masked),
    )
    need = next_span(view)
    if need is not None:
        return need
    if total <= budget:
        return context
    return RecentTooLarge(needed=total, budget=budget, recent=fixed)


def _past_room(policy: Policy, target: float, fixed: int, in_flight: int) -> float:
    """What the crossing's target leaves the compacted past once the messages no compaction touches (`fixed`: the
    kept and the recent ones) are paid: the summaries' room at most (`View.past_room`).

    A pre-compaction (`ahead_by`) lays out a request before its crossing, and the turn in flight is recent then:
    its spans stop before it. At the crossing that turn is older, outside them, and sent as its stubs (`in_flight`:
    a turn's growth at their cost) beside the crossing's own recent turn, so its room is the past's too. Sized
    without it, the spans took the room the target left, and every crossing that joined them landed that turn
    above its target, a turn closer to the next (Claude Code at 32k: ~250 tokens over, a summarizer call every 9
    turns)."""
    if not policy.past_room:
        return math.inf
    if not policy.ahead_by:
        return max(0.0, target - fixed)
    return max(0.0, target + policy.ahead_by - fixed - in_flight)


def _within_reach(policy: Policy, target: float, growth: int) -> tuple[float, float]:
    """The target and the stopping level of a crossing whose usual target leaves room for fewer than
    `REACH_TURNS` turns (a small window under a large preamble: nearly every turn crosses whatever is compacted,
    and compacting to that target at each called the summarizer on every turn). `growth`: a turn's, its tool
    outputs at their stubs' cost.

    It stops at what the cheap steps (masks, written first) achieve when that leaves a turn's growth (two for a
    pre-compaction: the turn before its crossing, and the one after); only past that it summarizes, down to the
    usual target, so the summarizer runs once in several turns rather than at each."""
    stop = policy.budget - growth - min(policy.ahead_by, growth)
    return min(stop, target), stop


def _arrange(
    items: Sequence[Item],
    policy: Policy,
    recent: int,
    kept: frozenset[int],
    cuts: Cuts,
    fixed: int,
    spans: Sequence[Span],
) -> tuple[ContextLayout, Layout, Stubbed]:
    """The context `spans` give: masks stub in place, the cheaper of each replacing span and its originals."""
    stubbed = Stubbed(cuts.stubbable, cuts.savings, spans, recent, kept)
    layout = _layout(items, usable_spans(items, spans, recent, cuts.points, kept), recent, cuts, stubbed, kept)
    parts = _parts(layout, recent, len(items))
    acknowledged = acknowledgements(items, parts)
    total = (
        fixed
        + sum(entry.cost for entry in layout if isinstance(entry, Block))
        + len(acknowledged) * policy.acknowledgement_tokens
    )
    shown_stubs = frozenset(part for part in parts if isinstance(part, int) and part in stubbed)
    context = ContextLayout(parts=parts, tokens=total, acknowledgements=acknowledged, stubbed=shown_stubs)
    return context, layout, stubbed


def _too_large(items: Sequence[Item], kept: frozenset[int], needed: int, budget: int) -> RecentTooLarge:
    pinned = tuple(sorted(p for p in kept if items[p].role not in PINNED_ROLES))
    return RecentTooLarge(
        needed=needed, budget=budget, recent=needed, pinned=pinned, pinned_tokens=sum(items[p].tokens for p in pinned)
    )


def acknowledgements(items: Sequence[Item], parts: Sequence[Part]) -> tuple[int, ...]:
    """Indices into `parts` before which an acknowledgement keeps user and assistant turns alternating (rule 6).

    One goes before a summary that follows a user turn, and before a user turn (or summary) that follows a
    summary; pinned messages in between are skipped. Two user turns of the client's own are left as they came.
    """
    found: list[int] = []
    previous: Part | None = None
    for index, part in enumerate(parts):
        if isinstance(part, int) and items[part].role in PINNED_ROLES:
            continue
        if (
            previous is not None
            and (isinstance(part, Span) or isinstance(previous, Span))
            and _user_turn(items, part)
            and _user_turn(items, previous)
        ):
            found.append(index)
        previous = part
    return tuple(found)


def _user_turn(items: Sequence[Item], part: Part) -> bool:
    role = SUMMARY_ROLE if isinstance(part, Span) else items[part].role
    return role == "user"


def usable_spans(
    items: Sequence[Item],
    spans: Sequence[Span],
    recent: int,
    cuts: Sequence[bool],
    kept: frozenset[int] | None = None,
) -> list[Span]:
    """The replacing spans the builder may use, without overlaps: the widest wins (it is the hierarchical one).

    Masks are not among them (they stub in place). Spans overlapping the recent block or a kept message, or
    splitting a tool group, are ignored: they come from another preserve_recent, a pin set since, or a stale
    state, and using them would break invariants 3 to 5.
    """
    if kept is None:
        kept = kept_positions(Cuts.of(items), recent)
    ordered = sorted(kept)  # a span holds a kept position when one lies in [start, end): a bisection, not a walk
    valid = [
        span
        for span in spans
        if not span.is_mask
        and 0 <= span.start < span.end <= recent
        and cuts[span.start]
        and cuts[span.end]
        and bisect_left(ordered, span.start) == bisect_left(ordered, span.end)
    ]
    # Widest first. An accepted span is at least as wide as the ones after it, so it overlaps a later one only
    # by covering that one's first or last position: marking what is accepted checks each span in O(1), and
    # marks each position once (a long session has a span per crossing; comparing pairs would be quadratic).
    covered = bytearray(len(items) + 1)
    accepted: list[Span] = []
    for span in sorted(valid, key=lambda s: (s.start - s.end, -s.id)):
        if not covered[span.start] and not covered[span.end - 1]:
            covered[span.start : span.end] = b"\x01" * (span.end - span.start)
            accepted.append(span)
    return sorted(accepted, key=lambda s: s.start)


def _layout(
    items: Sequence[Item],
    spans: Sequence[Span],
    recent: int,
    cuts: Cuts,
    stubbed: Stubbed,
    kept: frozenset[int],
) -> Layout:
    def cost(start: int, end: int) -> int:  # as sent: the stubbed outputs at their stub's cost
        return cuts.prefix[end] - cuts.prefix[start] - stubbed.saved(start, end)

    span_at = {span.start: span for span in spans}
    layout: Layout = []
    position = 0
    while position < recent:
        span = span_at.get(position)
        if position in kept:
            layout.append(position)
            position += 1
        elif span is not None:
            layout.append(Block(span.start, span.end, cost(span.start, span.end), span))
            position = span.end
        else:
            end = position + 1
            while end < recent and not cuts.points[end] and end not in kept:
                end += 1
            layout.append(Block(position, end, cost(position, end)))
            position = end
    return layout


def _parts(layout: Layout, recent: int, count: int) -> tuple[Part, ...]:
    parts: list[Part] = []
    for entry in layout:
        if isinstance(entry, Block):
            parts.extend(entry.parts())
        else:
            parts.append(entry)
    parts.extend(range(recent, count))
    return tuple(parts)


def _neighbours(items: Sequence[Item], layout: Layout, recent: int) -> Neighbours:
    # (start, end, opens with a user turn, closes with one, a system message shown as it is) of each part shown,
    # pinned messages aside, in order: the older blocks, then the first recent message. An interleaved system
    # message is no turn (`acknowledgements` skips it): what lies on each side of it is its neighbours'.
    shown: list[tuple[int, int, bool, bool, bool]] = []
    for entry in layout:
        if isinstance(entry, Block):
            summary = entry.uses_summary
            system = not summary and all(items[p].role in PINNED_ROLES for p in range(entry.start, entry.end))
            opens = summary or items[entry.start].role == "user"
            shown.append((entry.start, entry.end, opens, summary or items[entry.end - 1].role == "user", system))
    first_recent = next((p for p in range(recent, len(items)) if items[p].role not in PINNED_ROLES), None)
    if first_recent is not None:
        user = items[first_recent].role == "user"
        shown.append((first_recent, first_recent + 1, user, user, False))
    user_before: dict[int, bool] = {}
    user_after: dict[int, bool] = {}
    closes_before = False
    waiting: list[int] = []  # ends whose next turn is not shown yet
    for start, end, opens, closes, system in shown:
        user_before[start] = closes_before
        if not system:
            user_after.update(dict.fromkeys(waiting, opens))
            waiting.clear()
            closes_before = closes
        waiting.append(end)
    user_after.update(dict.fromkeys(waiting, False))
    return Neighbours(user_before, user_after)
