"""The working context builder: which stored messages go upstream verbatim and which as summaries.

A pure function of the path's messages (role, token count, tool-call links), the summaries that exist for it
and a policy, so that every invariant (docs/architecture.md) can be pinned by unit and property tests without a
database or a model. Its rules:

1. System (and developer) messages are pinned verbatim at their positions.
2. The last `preserve_recent` messages are kept verbatim, widened backwards so a tool group (an assistant
   with tool_calls and the tool messages answering it) is never split, and back to the latest user message
   while the turn since it fits in `compact_to` of what the pinned messages leave of the budget (an agent's
   tool loop outlasts N messages; the instruction it carries out stays in front of the model). A tool message
   answers the nearest call before it with its id: some local servers name every call `call_0`, and pairing the
   first use of an id with its last would make one group of the whole conversation. If the pinned and recent
   messages alone exceed the budget, that is `RecentTooLarge`: the client gets a clear error, never a silent cut.
3. Older messages form blocks: each usable summary span (shown as its summary, or as its originals when they
   are cheaper) and atomic units of unsummarized messages (a tool group is one unit).
4. If the result fits `trigger_ratio * budget` it is the `WorkingContext`. Otherwise `NeedsSummary` names the
   oldest unsummarized range worth summarizing, extended just far enough that the total drops to
   `compact_to * budget`: compaction happens in big steps so that the following requests are prefix-extensions
   of each other and provider prompt caches keep hitting (invariant 6).
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

The caller loop is: build → on `NeedsSummary` write a summary of `parts` (span ids in `replaces` become
orphaned) and build again with `compacting=True`, a bounded number of rounds → `WorkingContext`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

from proxy.compaction.summary_text import (
    DEFAULT_SUMMARY_MAX,
    DEFAULT_SUMMARY_MIN,
    DEFAULT_TARGET_RATIO,
    SUMMARY_ROLE,
    target_tokens,
)
from proxy.tokens import REPLY_PRIMING_TOKENS

PINNED_ROLES = frozenset({"system", "developer"})
DEFAULT_PRESERVE_RECENT = 4
DEFAULT_TRIGGER_RATIO = 1.0
DEFAULT_COMPACT_TO = 0.55
"""Compacting down to about half the budget leaves room for many turns before the next compaction."""
DEFAULT_SUMMARY_OVERHEAD = 12
"""Role, the summary header line and OpenAI's per-message overhead, beyond the summary's own content."""
DEFAULT_ACKNOWLEDGEMENT_TOKENS = 7
"""What `acknowledgement_message()` costs, in cl100k_base and o200k_base alike."""


@dataclass(frozen=True)
class Item:
    """One stored message of the path, in order; its position is its index in the list."""

    role: str
    tokens: int
    tool_call_ids: tuple[str, ...] = ()
    """Ids of the tool_calls on an assistant message."""
    tool_call_id: str | None = None
    """On a tool message: the call it answers."""


@dataclass(frozen=True)
class Span:
    """An existing, non-orphaned summary covering items [start, end)."""

    id: int
    start: int
    end: int
    tokens: int
    """What the summary message costs as sent: `count_message(summary_message(content))`."""


@dataclass(frozen=True)
class Policy:
    budget: int
    """The effective input budget, in tokens."""
    preserve_recent: int = DEFAULT_PRESERVE_RECENT
    trigger_ratio: float = DEFAULT_TRIGGER_RATIO
    compact_to: float = DEFAULT_COMPACT_TO
    summary_overhead: int = DEFAULT_SUMMARY_OVERHEAD
    target_ratio: float = DEFAULT_TARGET_RATIO
    summary_min: int = DEFAULT_SUMMARY_MIN
    summary_max: int = DEFAULT_SUMMARY_MAX
    max_summary_input: int | None = None
    """Tokens one summarization may read (the summarizer's own budget); None for no limit."""
    acknowledgement_tokens: int = DEFAULT_ACKNOWLEDGEMENT_TOKENS
    """What one acknowledgement (rule 6) costs as sent."""

    def summary_target(self, input_tokens: int) -> int:
        """The content size a summary of `input_tokens` tokens should have."""
        return target_tokens(input_tokens, self.target_ratio, self.summary_min, self.summary_max)

    def estimated_summary(self, input_tokens: int) -> int:
        """What a not-yet-written summary of `input_tokens` tokens is expected to cost as a message."""
        return self.summary_target(input_tokens) + self.summary_overhead


Part = int | Span
"""An item index sent verbatim, or a span sent as its summary message."""


@dataclass(frozen=True)
class WorkingContext:
    parts: tuple[Part, ...]
    """In chronological order."""
    tokens: int
    """The prompt's total by our count, including the acknowledgements and the reply priming."""
    acknowledgements: tuple[int, ...] = ()
    """Indices into `parts` before which an assistant acknowledgement is sent (rule 6)."""


@dataclass(frozen=True)
class NeedsSummary:
    """Summarize items [start, end); it may cover existing spans, which the new summary supersedes."""

    start: int
    end: int
    replaces: tuple[int, ...] = ()
    """Ids of the given spans lying inside [start, end): mark them orphaned once the new summary is stored."""
    parts: tuple[Part, ...] = ()
    """What the summarizer should read, in order: items verbatim and existing summaries (hierarchical)."""
    target: int = DEFAULT_SUMMARY_MIN
    """Suggested summary length in tokens: `Policy.summary_target` of what the summarizer reads."""


@dataclass(frozen=True)
class RecentTooLarge:
    """The pinned and recent messages (plus the smallest summaries possible) need more than the budget."""

    needed: int
    budget: int


BuildResult = WorkingContext | NeedsSummary | RecentTooLarge


@dataclass(frozen=True)
class _Block:
    """A span, or an atomic unit of unsummarized messages, older than the recent block."""

    start: int
    end: int
    original: int
    span: Span | None = None

    @property
    def uses_summary(self) -> bool:
        return self.span is not None and self.span.tokens < self.original

    @property
    def cost(self) -> int:
        return self.span.tokens if self.span is not None and self.uses_summary else self.original

    def parts(self) -> tuple[Part, ...]:
        if self.span is not None and self.uses_summary:
            return (self.span,)
        return tuple(range(self.start, self.end))


Layout = list[int | _Block]
"""The region before the recent block: pinned item indices and blocks, in order."""


def build(items: Sequence[Item], spans: Sequence[Span], policy: Policy, *, compacting: bool = False) -> BuildResult:
    """The working context for `items`, or the summary that must be written first, or why it cannot fit.

    `compacting` is True on the calls that follow a `NeedsSummary` within one request: the compaction then
    goes on until the total reaches `compact_to * budget` (or nothing more can be summarized), rather than
    stopping as soon as it fits again, so that one compaction is one big step, however many rounds it takes.
    """
    count = len(items)
    budget = max(0, policy.budget)
    cuts = cut_points(items)
    prefix = [0]
    for item in items:
        prefix.append(prefix[-1] + item.tokens)
    recent = recent_block(items, policy, cuts, prefix)
    pinned_old = sum(item.tokens for item in items[:recent] if item.role in PINNED_ROLES)
    fixed = pinned_old + prefix[count] - prefix[recent] + REPLY_PRIMING_TOKENS
    if fixed > budget:
        return RecentTooLarge(needed=fixed, budget=budget)
    trigger = policy.trigger_ratio * budget
    everything = prefix[count] + REPLY_PRIMING_TOKENS
    if everything <= trigger:
        return WorkingContext(parts=tuple(range(count)), tokens=everything)

    layout = _layout(items, usable_spans(items, spans, recent, cuts), recent, prefix, cuts)
    parts = _parts(layout, recent, count)
    acknowledged = acknowledgements(items, parts)
    total = (
        fixed
        + sum(entry.cost for entry in layout if isinstance(entry, _Block))
        + len(acknowledged) * policy.acknowledgement_tokens
    )
    context = WorkingContext(parts=parts, tokens=total, acknowledgements=acknowledged)
    if total <= (policy.compact_to * budget if compacting else trigger):
        return context
    needed = total - policy.compact_to * budget
    segments = _segments(layout)
    neighbours = _neighbours(items, layout, recent)
    for segment in segments:
        for run in _unsummarized_runs(segment):
            chosen = _choose_range(run, needed, policy, cuts, neighbours, hierarchical=False)
            if chosen is not None:
                return _needs_summary(chosen, spans, policy)
    for segment in segments:
        chosen = _choose_range(segment, needed, policy, cuts, neighbours, hierarchical=True)
        if chosen is not None:
            return _needs_summary(chosen, spans, policy)
    if total <= budget:
        return context
    return RecentTooLarge(needed=total, budget=budget)


def cut_points(items: Sequence[Item]) -> list[bool]:
    """cut[p]: may a range boundary fall just before position p? Never inside a tool group (invariant 4).

    A group reaches from an assistant with tool_calls to the last tool message answering it; a tool message
    answers the nearest call before it with its id, so a reused id never joins two turns into one group.
    """
    count = len(items)
    caller: dict[str, int] = {}
    last_answer: dict[int, int] = {}
    for position, item in enumerate(items):
        if item.tool_call_id is not None and item.tool_call_id in caller:
            last_answer[caller[item.tool_call_id]] = position
        caller.update((call_id, position) for call_id in item.tool_call_ids)
    cuts = [True] * (count + 1)
    reach = -1
    for position, item in enumerate(items):
        if position > 0 and (item.role == "tool" or position <= reach):
            cuts[position] = False
        reach = max(reach, last_answer.get(position, -1))
    return cuts


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


def recent_start(items: Sequence[Item], preserve_recent: int, cuts: Sequence[bool]) -> int:
    """First position of the recent block: the last N messages, widened to a whole tool group."""
    start = max(0, len(items) - max(0, preserve_recent))
    while start > 0 and not cuts[start]:
        start -= 1
    return start


def recent_block(items: Sequence[Item], policy: Policy, cuts: Sequence[bool], prefix: Sequence[int]) -> int:
    """Where the messages kept verbatim begin (rule 2)."""
    recent = recent_start(items, policy.preserve_recent, cuts)
    turn = next((index for index in range(len(items) - 1, -1, -1) if items[index].role == "user"), None)
    if turn is None or turn >= recent:
        return recent
    # The turn may take `compact_to` of what the pinned messages leave: the share compaction aims the rest at.
    pinned = sum(item.tokens for item in items if item.role in PINNED_ROLES)
    turn_tokens = (
        prefix[len(items)] - prefix[turn] - sum(item.tokens for item in items[turn:] if item.role in PINNED_ROLES)
    )
    room = policy.compact_to * (max(0, policy.budget) - pinned - REPLY_PRIMING_TOKENS)
    return turn if turn_tokens <= room else recent


def usable_spans(items: Sequence[Item], spans: Sequence[Span], recent: int, cuts: Sequence[bool]) -> list[Span]:
    """The spans the builder may use, without overlaps: the widest wins (it is the hierarchical one).

    Spans overlapping the recent block or a pinned message, or splitting a tool group, are ignored: they come
    from another preserve_recent or a stale state and using them would break invariants 3 to 5.
    """
    pinned_before = [0]
    for item in items:
        pinned_before.append(pinned_before[-1] + (item.role in PINNED_ROLES))
    valid = [
        span
        for span in spans
        if 0 <= span.start < span.end <= recent
        and cuts[span.start]
        and cuts[span.end]
        and pinned_before[span.end] == pinned_before[span.start]
    ]
    accepted: list[Span] = []
    for span in sorted(valid, key=lambda s: (s.start - s.end, -s.id)):
        if all(span.end <= other.start or other.end <= span.start for other in accepted):
            accepted.append(span)
    return sorted(accepted, key=lambda s: s.start)


def _layout(
    items: Sequence[Item], spans: Sequence[Span], recent: int, prefix: Sequence[int], cuts: Sequence[bool]
) -> Layout:
    span_at = {span.start: span for span in spans}
    layout: Layout = []
    position = 0
    while position < recent:
        span = span_at.get(position)
        if items[position].role in PINNED_ROLES:
            layout.append(position)
            position += 1
        elif span is not None:
            layout.append(_Block(span.start, span.end, prefix[span.end] - prefix[span.start], span))
            position = span.end
        else:
            end = position + 1
            while end < recent and not cuts[end] and items[end].role not in PINNED_ROLES:
                end += 1
            layout.append(_Block(position, end, prefix[end] - prefix[position]))
            position = end
    return layout


def _parts(layout: Layout, recent: int, count: int) -> tuple[Part, ...]:
    parts: list[Part] = []
    for entry in layout:
        if isinstance(entry, _Block):
            parts.extend(entry.parts())
        else:
            parts.append(entry)
    parts.extend(range(recent, count))
    return tuple(parts)


def _segments(layout: Layout) -> list[list[_Block]]:
    """The layout split at pinned messages: no summary may cover one (invariant 5)."""
    segments: list[list[_Block]] = [[]]
    for entry in layout:
        if isinstance(entry, _Block):
            segments[-1].append(entry)
        elif segments[-1]:
            segments.append([])
    return [segment for segment in segments if segment]


def _unsummarized_runs(segment: Sequence[_Block]) -> list[list[_Block]]:
    runs: list[list[_Block]] = [[]]
    for block in segment:
        if block.span is None:
            runs[-1].append(block)
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


@dataclass(frozen=True)
class _Neighbours:
    """What is shown next to each block, pinned messages aside: a summary in its place would need an
    acknowledgement (rule 6) on each side where a user turn is."""

    user_before: dict[int, bool]
    """Block start → is the part shown just before it a user turn (or a summary)?"""
    user_after: dict[int, bool]
    """Block end → is the part shown just after it a user turn (or a summary)?"""


def _neighbours(items: Sequence[Item], layout: Layout, recent: int) -> _Neighbours:
    # (start, end, opens with a user turn, closes with one) of each part shown, pinned messages aside, in order:
    # the older blocks, then the first recent message.
    shown: list[tuple[int, int, bool, bool]] = []
    for entry in layout:
        if isinstance(entry, _Block):
            summary = entry.uses_summary
            opens = summary or items[entry.start].role == "user"
            shown.append((entry.start, entry.end, opens, summary or items[entry.end - 1].role == "user"))
    first_recent = next((p for p in range(recent, len(items)) if items[p].role not in PINNED_ROLES), None)
    if first_recent is not None:
        user = items[first_recent].role == "user"
        shown.append((first_recent, first_recent + 1, user, user))
    user_before = {start: False for start, _, _, _ in shown}
    user_after = {end: False for _, end, _, _ in shown}
    for (_, end, _, closes), (start, _, opens, _) in pairwise(shown):
        user_before[start] = closes
        user_after[end] = opens
    return _Neighbours(user_before, user_after)


@dataclass(frozen=True)
class _Range:
    blocks: tuple[_Block, ...]
    input_tokens: int


def _choose_range(
    blocks: Sequence[_Block],
    needed: float,
    policy: Policy,
    cuts: Sequence[bool],
    neighbours: _Neighbours,
    *,
    hierarchical: bool,
) -> _Range | None:
    """The oldest range of whole blocks whose summary saves tokens, just long enough to save `needed`.

    Savings grow with the range (a summary is at most `summary_max`), so the first start with any saving
    is the oldest one; a hierarchical range must merge at least two blocks, one of them a summary, so that
    every round makes progress. Without a limit on the summarizer's input only the first start is tried.
    The acknowledgements the summary would bring next to it count against its saving, so that one round
    reaches the target whenever the estimate holds.
    """
    limit = policy.max_summary_input
    for first in range(len(blocks)):
        if not cuts[blocks[first].start]:
            continue
        best: tuple[int, int] | None = None  # (last block, input tokens)
        cost = 0
        spans = 0
        for last in range(first, len(blocks)):
            block = blocks[last]
            if limit is not None and last > first and cost + block.cost > limit:
                break
            cost += block.cost
            spans += block.span is not None
            if not cuts[block.end] or (hierarchical and (spans == 0 or last == first)):
                continue
            around = neighbours.user_before[blocks[first].start] + neighbours.user_after[block.end]
            saving = cost - policy.estimated_summary(cost) - around * policy.acknowledgement_tokens
            if saving <= 0:
                continue
            best = (last, cost)
            if saving >= needed:
                break
        if best is not None:
            return _Range(tuple(blocks[first : best[0] + 1]), best[1])
        if limit is None:
            return None
    return None


def _needs_summary(chosen: _Range, spans: Sequence[Span], policy: Policy) -> NeedsSummary:
    start, end = chosen.blocks[0].start, chosen.blocks[-1].end
    replaces = tuple(sorted(span.id for span in spans if start <= span.start and span.end <= end))
    parts = tuple(part for block in chosen.blocks for part in block.parts())
    target = policy.summary_target(chosen.input_tokens)
    return NeedsSummary(start=start, end=end, replaces=replaces, parts=parts, target=target)
