"""What the working context builder reasons about: the path's items, the spans written for it, the policy, the
results it gives, and the view of one decision that the compaction strategies read.

Pure data, shared by `builder` (which lays the context out) and `strategies` (which each name the next span
to write), so that neither imports the other's internals.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field

from proxy.canonical.vocabulary import SYSTEM_ROLES
from proxy.compaction.summary_text import DEFAULT_SUMMARY_MAX, DEFAULT_SUMMARY_MIN, DEFAULT_TARGET_RATIO, target_tokens
from proxy.config.schema import DEFAULT_TOOL_RESULTS_KEEP_TURNS, SUMMARIZE, TOOL_RESULTS

PINNED_ROLES = frozenset(SYSTEM_ROLES)
"""Roles sent verbatim where they stand; pinned by the client's own protocol, and no turn for role order."""
DEFAULT_PRESERVE_RECENT = 4
DEFAULT_TRIGGER_RATIO = 1.0
DEFAULT_COMPACT_TO = 0.55
"""Compacting down to about half the budget leaves room for many turns before the next compaction."""
DEFAULT_SUMMARY_OVERHEAD = 12
"""Role, the summary header line and OpenAI's per-message overhead, beyond the summary's own content."""
DEFAULT_ACKNOWLEDGEMENT_TOKENS = 7
"""What `acknowledgement_message()` costs, in cl100k_base and o200k_base alike."""
DEFAULT_MARKER_TOKENS = 40
"""What a sliding-window marker costs as sent, at most: one line naming how many messages and which turns."""
MIN_COMPACT_TO = 0.05
"""The lowest target a compaction aims at (`context.compact_to`'s own lower bound)."""
RECALL_SHARE = 0.15
"""The share of the free space a compacted context keeps for the recall before the question at most
(`Policy.reserve`)."""
RESERVE_TURNS = 2
"""A recall room is kept only when it holds this many turns' growth: the fill needs one turn's room past the
turn's own (`recall_room`), which an agent's turn of tool outputs never leaves."""
GROWTH_WINDOW = 64
"""The latest messages whose size says how much one request adds (`groups.request_growth`)."""


@dataclass(frozen=True)
class Item:
    """One stored message of the path, in order; its position is its index in the list."""

    role: str
    tokens: int
    tool_call_ids: tuple[str, ...] = ()
    """Ids of the tool_calls on an assistant message."""
    tool_call_id: str | None = None
    """On a tool message: the call it answers."""
    pinned: bool = False
    """Pinned by the session (API or a configured pattern): sent verbatim, never summarized."""
    stub_tokens: int | None = None
    """On a tool message: what it costs as the stub `tool-results` sends instead (None: not a tool output)."""


@dataclass(frozen=True)
class Span:
    """An existing, non-orphaned span of items [start, end) written by a strategy."""

    id: int
    start: int
    end: int
    tokens: int
    """What the span's message costs as sent: `count_message(summary_message(content))` (a mask: unused)."""
    strategy: str = SUMMARIZE
    """Who wrote it. A `tool-results` span is a mask: its tool outputs are sent as stubs where they stand;
    every other span is replaced by one message (a summary, or a sliding-window marker)."""
    held: int = 0
    """Written ahead of need by the pre-compaction run with this (increasing) number: used only once the context
    does not fit without it; 0 for a span written when it was needed."""

    @property
    def is_mask(self) -> bool:
        return self.strategy == TOOL_RESULTS


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
    strategies: tuple[str, ...] = (SUMMARIZE,)
    """The compaction strategies, in the order they are asked for the next span."""
    keep_turns: int = DEFAULT_TOOL_RESULTS_KEEP_TURNS
    """`tool-results` stubs the tool outputs of model turns older than the last `keep_turns`."""
    marker_tokens: int = DEFAULT_MARKER_TOKENS
    headroom_turns: int = 0
    """A crossing compacts to the budget less this many turns' growth (never below `compact_to`); 0: always
    down to `compact_to`. The config's default (`DEFAULT_HEADROOM_TURNS`) turns it on; the builder's own rules
    are tested with it off and on."""
    summary_share: float | None = None
    """The share of the free space the summaries may take at most (`summary_room`), each sized by what it stands
    for (`sized_target`); None: each sized by what it reads, and newer originals summarized before older
    summaries merge (the config's default, `DEFAULT_SUMMARY_SHARE`, turns it on)."""
    past_room: bool = True
    """The summaries' room is at most what the crossing's target leaves the compacted past (`View.past_room`);
    false for a forced summary (`Compactor.force`), which aims at the floor: sized by the free space alone."""
    ahead_by: int = 0
    """Tokens below the crossing's target a pre-compaction aims at: the room the turns before the crossing fill."""
    recall_room: int = 0
    """Tokens a compacted context keeps free below the budget for the recall before the question (`reserve`);
    0: none. The config's `recall_tokens` when `recall_fill` is on."""

    def level(self, ratio: float, floor: int) -> float:
        """The context size at `ratio` of the free space: what the budget leaves once the `floor` (the messages
        every request sends whatever happens: system prompts, pins) is paid. Triggers and targets are levels, so
        a large fixed preamble does not leave compaction aiming below it (and compacting on every turn)."""
        return floor + ratio * max(0, self.budget - floor)

    def reserve(self, floor: int, growth: int, *, tools: bool = False) -> int:
        """The room a compacted context leaves below the budget for the question's recall and its fill, whatever
        the point between two crossings a question comes at: `recall_room`, at most `RECALL_SHARE` of the free
        space; none when that holds fewer than `RESERVE_TURNS` turns' `growth`, nor for a path that calls `tools`
        (an agent's: its turns are tool outputs, which recall does not fill, and its tool outputs are stubbed
        before they are summarized). Without it a question asked just before a crossing finds the prefix at the
        budget and its recall no room, one asked just after finds the room of the whole headroom."""
        room = min(self.recall_room, int(RECALL_SHARE * max(0, self.budget - floor)))
        return room if room >= RESERVE_TURNS * growth and not tools else 0

    def target(self, floor: int, growth: int, reserve: int = 0) -> float:
        """The level a crossing compacts down to: the budget less the recall's `reserve` and `headroom_turns`
        requests' `growth` (tokens one request adds), never below `compact_to` of the free space; less `ahead_by`
        for a pre-compaction."""
        deepest = self.level(self.compact_to, floor)
        top = self.budget - reserve
        aim = max(deepest, top - self.headroom_turns * growth) if self.headroom_turns else deepest
        return max(self.level(min(MIN_COMPACT_TO, self.compact_to), floor), min(aim, top) - self.ahead_by)

    def summary_room(self, floor: int, compacted: int, past: float = math.inf) -> float:
        """The tokens the summaries of `compacted` tokens of originals may take: `target_ratio` of them, at most
        `summary_share` of the free space above `floor`, and at most `past`: what the crossing's target leaves
        below it once the messages no compaction touches are paid (`View.past_room`). A small window under a
        large preamble (an agent's at 32k) leaves the past a few hundred tokens: summaries sized by the free space
        would fill the room the crossing makes for the next turns, and bring the next crossing, and its
        summarizer call, within a few turns."""
        share = 1.0 if self.summary_share is None else self.summary_share
        return min(self.target_ratio * compacted, share * max(0, self.budget - floor), max(0.0, past))

    def sized_target(self, originals: int, floor: int, compacted: int, past: float = math.inf) -> int:
        """The content size of a summary standing for `originals` tokens when the summaries stand for
        `compacted` in all: its share of `summary_room`, so a merge of old summaries is sized by what they stand
        for, not by the summaries it reads (which would shrink the past at every level)."""
        compacted = max(compacted, originals, 1)
        share = 1.0 if self.summary_share is None else self.summary_share
        room = min(share * max(0, self.budget - floor), max(0.0, past))
        density = min(self.target_ratio, room / compacted)
        return target_tokens(originals, density, self.summary_min, self.summary_max)

    def summary_target(self, input_tokens: int) -> int:
        """The content size a summary of `input_tokens` tokens should have."""
        return target_tokens(input_tokens, self.target_ratio, self.summary_min, self.summary_max)

    def estimated_summary(self, input_tokens: int) -> int:
        """What a not-yet-written summary of `input_tokens` tokens is expected to cost as a message."""
        return self.summary_target(input_tokens) + self.summary_overhead


Part = int | Span
"""An item index sent verbatim (or as its stub), or a span sent as its summary or marker message."""


@dataclass(frozen=True)
class ContextLayout:
    """The working context as the builder lays it out: which originals, spans and stubs, in order, and their cost
    (the compactor renders it as messages: `WorkingContext`)."""

    parts: tuple[Part, ...]
    """In chronological order."""
    tokens: int
    """The prompt's total by our count, including the acknowledgements and the reply priming."""
    acknowledgements: tuple[int, ...] = ()
    """Indices into `parts` before which an assistant acknowledgement is sent (rule 6)."""
    stubbed: frozenset[int] = frozenset()
    """Item indices sent as their tool-output stub."""
    held_back: bool = False
    """Spans written ahead of need are not in use yet: the next crossing's compaction is already written."""
    floor: int = field(default=0, compare=False)
    """What the context sends whatever is compacted (`Policy.level`): its system and pinned messages."""


@dataclass(frozen=True)
class SpanNeeded:
    """Write a span of items [start, end) with `strategy`; it may cover existing spans, which it supersedes."""

    start: int
    end: int
    replaces: tuple[int, ...] = ()
    """Ids of the given spans lying inside [start, end): mark them orphaned once the new span is stored."""
    parts: tuple[Part, ...] = ()
    """What the summarizer should read, in order: items verbatim (or stubbed) and existing spans."""
    target: int = DEFAULT_SUMMARY_MIN
    """Suggested summary length in tokens: `Policy.summary_target` of what the summarizer reads."""
    strategy: str = SUMMARIZE
    stubbed: frozenset[int] = frozenset()
    """Item indices among `parts` shown as their stub (the summarizer reads what the model saw)."""


@dataclass(frozen=True)
class RecentTooLarge:
    """The pinned and recent messages (plus the smallest summaries possible) need more than the budget."""

    needed: int
    budget: int
    recent: int
    """What the pinned, system and recent messages need alone: `needed` less the older part's summaries."""
    pinned: tuple[int, ...] = ()
    """Items older than the recent block kept only because the session pinned them."""
    pinned_tokens: int = 0


BuildResult = ContextLayout | SpanNeeded | RecentTooLarge


@dataclass(frozen=True)
class Block:
    """A replacing span, or an atomic unit of unsummarized messages, older than the recent block."""

    start: int
    end: int
    original: int
    """What its items cost as they would be sent (stubbed tool outputs at their stub's cost)."""
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


Layout = list[int | Block]
"""The region before the recent block: kept (pinned) item indices and blocks, in order."""


@dataclass(frozen=True)
class Neighbours:
    """What is shown next to each block, pinned system messages aside: a summary in its place would need an
    acknowledgement (rule 6) on each side where a user turn is."""

    user_before: dict[int, bool]
    """Block start → is the part shown just before it a user turn (or a summary)?"""
    user_after: dict[int, bool]
    """Block end → is the part shown just after it a user turn (or a summary)?"""


class Stubbed:
    """The tool outputs that `tool-results` masks send as their stub: stubbable (`groups.Cuts.stubbable`, with
    the `savings` of each prefix of them), older than the recent block, not kept, and inside a mask. Looked up,
    not listed: a long session's masks cover every tool output it ever made, of which the context shows a few,
    and blocks and strategies ask only what a range saves.

    Every mask a session ever wrote stays on its path (one per crossing, each from the start), so the masks are
    merged into disjoint ranges first."""

    def __init__(
        self, stubbable: list[int], savings: list[int], spans: Sequence[Span], recent: int, kept: frozenset[int]
    ) -> None:
        self._stubbable, self._savings = stubbable, savings
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in sorted((max(span.start, 0), min(span.end, recent)) for span in spans if span.is_mask):
            if start >= end:
                continue
            if self._ends and start <= self._ends[-1]:
                self._ends[-1] = max(self._ends[-1], end)
            else:
                self._starts.append(start)
                self._ends.append(end)
        self._kept = sorted(position for position in kept if self._masked(position))
        self._kept_stubbable = sorted(position for position in kept if self._stubbable_at(position))

    def __contains__(self, position: object) -> bool:
        return isinstance(position, int) and self._masked(position) and position not in self._kept

    def saved(self, start: int, end: int) -> int:
        """What the stubs among positions [start, end) save."""
        total = 0
        index = max(0, bisect_right(self._starts, start) - 1)
        while index < len(self._starts) and self._starts[index] < end:
            total += self.savable(max(start, self._starts[index]), min(end, self._ends[index]))
            index += 1
        for position in self._kept[bisect_left(self._kept, start) : bisect_left(self._kept, end)]:
            total -= self.savable(position, position + 1)
        return total

    def savable(self, start: int, end: int) -> int:
        """What stubbing every stubbable output among positions [start, end) would save, masked or not."""
        if start >= end:
            return 0
        return self._savings[bisect_left(self._stubbable, end)] - self._savings[bisect_left(self._stubbable, start)]

    def unstubbed(self, start: int, end: int) -> int:
        """What a new mask over positions [start, end) would save: its stubbable outputs that are neither kept
        nor stubbed already."""
        kept = self._kept_stubbable[bisect_left(self._kept_stubbable, start) : bisect_left(self._kept_stubbable, end)]
        return self.savable(start, end) - self.saved(start, end) - sum(self.savable(p, p + 1) for p in kept)

    def _masked(self, position: int) -> bool:
        index = bisect_right(self._starts, position) - 1
        return index >= 0 and position < self._ends[index] and self._stubbable_at(position)

    def _stubbable_at(self, position: int) -> bool:
        found = bisect_left(self._stubbable, position)
        return found < len(self._stubbable) and self._stubbable[found] == position


@dataclass(frozen=True)
class View:
    """One decision's state, for the strategies: the context as it would be sent now, and how far it is over."""

    items: Sequence[Item]
    spans: Sequence[Span]
    """Every span given to the builder, masks included."""
    policy: Policy
    cuts: Sequence[bool]
    recent: int
    layout: Layout
    neighbours: Neighbours
    stubbed: Stubbed
    needed: float
    """Tokens to save to reach the crossing's target (`Policy.target`)."""
    floor: int = 0
    """What the context sends whatever is compacted (`Policy.level`)."""
    past_room: float = math.inf
    """What the crossing's target leaves the compacted past once the messages no compaction touches (kept, the
    recent block) are paid: the summaries' room at most (`Policy.summary_room`)."""

    def summaries(self) -> tuple[int, int]:
        """What the summaries in the layout cost, and what the originals they stand for cost as sent."""
        cost = covered = 0
        for entry in self.layout:
            if isinstance(entry, Block) and entry.uses_summary:
                cost += entry.cost
                covered += entry.original
        return cost, covered

    def segments(self) -> list[list[Block]]:
        """The layout split at kept messages: no span may cover one (invariant 5)."""
        segments: list[list[Block]] = [[]]
        for entry in self.layout:
            if isinstance(entry, Block):
                segments[-1].append(entry)
            elif segments[-1]:
                segments.append([])
        return [segment for segment in segments if segment]
