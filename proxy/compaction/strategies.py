"""The compaction strategies: each names the next span to write when the working context is over its target.

A strategy is a small unit with a `name`, a `should_run` (is there anything for it to do in this view?) and a
`compact` (the span to write, or None). The builder asks them in the configured order (`context.strategies`,
or the session's `X-Context-Strategy`) and writes the first span one names; it then builds again, so a later
strategy only runs for what the earlier ones could not save. Every span keeps the builder's invariants: it lies
older than the recent block, never covers a kept (pinned) message, never splits a tool group, and is chosen
large enough to reach `compact_to` of the budget in one step (invariant 6).

- `tool-results`: tool outputs older than the last `keep_turns` model turns are sent as stubs (the tool, its
  key inputs, the outcome, the size) where they stand; no model call. Published agent runs show masking old
  observations halves cost without losing solve rate. The span is a *mask* from the path's start to the
  boundary, replacing the previous mask: a stub depends only on its message, so what was stubbed stays the same
  bytes and the prompt stays a prefix-extension between compactions.
- `summarize`: the oldest unsummarized range, then (hierarchically) summaries with what lies between them.
- `goal-batch`: like `summarize`, with ranges made of whole completed user turns (a user goal and everything up
  to the next), each summarized as one episode; a range of any blocks when no whole turn is old enough.
- `sliding-window`: no model at all: the oldest turns leave the working context (never the history) for a
  one-line marker naming how many messages and which turns were omitted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from proxy.compaction.layout import Block, SpanNeeded, View
from proxy.config.schema import GOAL_BATCH, SLIDING_WINDOW, SUMMARIZE, TOOL_RESULTS

Estimate = Callable[[int, int, int], tuple[int, int]]
"""For a range (what it reads, what its originals cost as sent, and that of them no summary stands for yet): what
its message will cost as sent, and the content target to ask for."""


class Strategy(Protocol):
    @property
    def name(self) -> str: ...

    def should_run(self, view: View) -> bool: ...

    def compact(self, view: View) -> SpanNeeded | None: ...


@dataclass(frozen=True)
class ToolResults:
    name: str = TOOL_RESULTS

    def should_run(self, view: View) -> bool:
        return self._saving(view, self._boundary(view)) > 0

    def compact(self, view: View) -> SpanNeeded | None:
        boundary = self._boundary(view)
        if self._saving(view, boundary) <= 0:
            return None
        replaces = tuple(sorted(span.id for span in view.spans if span.is_mask and span.end <= boundary))
        return SpanNeeded(start=0, end=boundary, replaces=replaces, strategy=self.name)

    @staticmethod
    def _boundary(view: View) -> int:
        """The first position of the last `keep_turns` (at least 1) model turns (each assistant message starts
        one), or of the recent block if that comes first; looked for from the end, not over the whole path."""
        keep, items = view.policy.keep_turns, view.items
        for position in range(len(items) - 1, -1, -1):
            if items[position].role == "assistant":
                keep -= 1
                if not keep:
                    return min(view.recent, position)
        return 0

    @staticmethod
    def _saving(view: View, boundary: int) -> int:
        """What a mask before `boundary` saves: its outputs whose stub is cheaper, neither kept (pinned, or in a
        pinned message's tool group) nor stubbed yet (`Stubbed.unstubbed`), nor inside a block sent as its
        summary. Summed by ranges: a long session has thousands of tool outputs and a few summaries."""
        saving = view.stubbed.unstubbed(0, boundary)
        for entry in view.layout:
            if isinstance(entry, Block) and entry.uses_summary and entry.start < boundary:
                saving -= view.stubbed.unstubbed(entry.start, min(entry.end, boundary))
        return saving


@dataclass(frozen=True)
class Summarize:
    name: str = SUMMARIZE

    def should_run(self, view: View) -> bool:
        return view.needed > 0

    def compact(self, view: View) -> SpanNeeded | None:
        return summary_range(view, self.name, view.cuts)


@dataclass(frozen=True)
class GoalBatch:
    name: str = GOAL_BATCH

    def should_run(self, view: View) -> bool:
        return view.needed > 0

    def compact(self, view: View) -> SpanNeeded | None:
        # A boundary falls where a user turn starts (or at the recent block): each range is whole episodes.
        turns = [
            cut and (position >= len(view.items) or position == view.recent or view.items[position].role == "user")
            for position, cut in enumerate(view.cuts)
        ]
        return summary_range(view, self.name, turns) or summary_range(view, self.name, view.cuts)


@dataclass(frozen=True)
class SlidingWindow:
    name: str = SLIDING_WINDOW

    def should_run(self, view: View) -> bool:
        return view.needed > 0

    def compact(self, view: View) -> SpanNeeded | None:
        marker = view.policy.marker_tokens
        return summary_range(view, self.name, view.cuts, estimate=lambda *_: (marker, marker), capped=False)


STRATEGIES: dict[str, Strategy] = {
    strategy.name: strategy for strategy in (ToolResults(), Summarize(), GoalBatch(), SlidingWindow())
}


def next_span(view: View) -> SpanNeeded | None:
    """The first span a configured strategy names, in their order."""
    for name in view.policy.strategies:
        strategy = STRATEGIES[name]
        if strategy.should_run(view):
            need = strategy.compact(view)
            if need is not None:
                return need
    return None


def summary_range(
    view: View,
    strategy: str,
    cuts: Sequence[bool],
    *,
    estimate: Estimate | None = None,
    capped: bool = True,
) -> SpanNeeded | None:
    """The oldest range to replace by one message: unsummarized blocks first, then (hierarchically) spans with
    what lies between them. When the range's own summary would leave the summaries over their room
    (`Policy.summary_room`) by more than one shortest summary, the oldest are merged with it instead, in the same
    call: the past is kept shorter rather than newer originals summarized apart. A summary is sized
    by what it stands for (`Policy.sized_target`); the last resort, merges sized by what they read, is the old
    shrinking one, for a context that fits no other way. `estimate` gives what the message will cost for a
    range (a summary by default); `capped`: what it reads is limited by the summarizer's capacity."""
    policy = view.policy
    cap = policy.max_summary_input if capped else None
    segments = view.segments()
    cost, covered = view.summaries()

    def sized(_input: int, stands: int, fresh: int) -> tuple[int, int]:
        target = policy.sized_target(stands, view.floor, covered + fresh, view.past_room)
        return target + policy.summary_overhead, target

    def shrinking(input_tokens: int, _stands: int, _fresh: int) -> tuple[int, int]:
        return policy.estimated_summary(input_tokens), policy.summary_target(input_tokens)

    first = estimate or (shrinking if policy.summary_share is None else sized)

    def oldest(hierarchical: bool, chosen_estimate: Estimate) -> _Range | None:
        runs = segments if hierarchical else [run for segment in segments for run in _unsummarized_runs(segment)]
        for run in runs:
            chosen = _choose_range(run, view, cuts, hierarchical, chosen_estimate, cap)
            if chosen is not None:
                return chosen
        return None

    own = oldest(False, first)
    # Judged after the own summary: merging only once the summaries were over their room let a crossing add its
    # own on top, two shortest summaries over it, and land that far above its target, a turn closer to the next
    # (an agent at 32k, whose past has room for one summary). The slack: a summary of a short past is over
    # `target_ratio` of it by its minimum size alone, and merging it at every crossing would only rewrite it.
    if policy.summary_share is not None:
        summaries = cost + (own.message if own is not None else 0)
        stand_for = covered + (own.original if own is not None else 0)
        slack = policy.summary_min + policy.summary_overhead
        if summaries > policy.summary_room(view.floor, stand_for, view.past_room) + slack:
            merged = oldest(True, first)
            if merged is not None:
                return _needs_summary(view, merged, strategy)
    chosen = own or oldest(True, estimate or shrinking)
    return None if chosen is None else _needs_summary(view, chosen, strategy)


def _unsummarized_runs(segment: Sequence[Block]) -> list[list[Block]]:
    runs: list[list[Block]] = [[]]
    for block in segment:
        if block.span is None:
            runs[-1].append(block)
        elif runs[-1]:
            runs.append([])
    return [run for run in runs if run]


@dataclass(frozen=True)
class _Range:
    blocks: tuple[Block, ...]
    target: int
    message: int
    """What its message will cost as sent (the estimate's)."""

    @property
    def original(self) -> int:
        """What the originals it stands for cost as sent."""
        return sum(block.original for block in self.blocks)


def _choose_range(
    blocks: Sequence[Block],
    view: View,
    cuts: Sequence[bool],
    hierarchical: bool,
    estimate: Estimate,
    limit: int | None,
) -> _Range | None:
    """The oldest range of whole blocks whose replacement saves tokens, just long enough to save `view.needed`.

    Savings grow with the range, so the first start with any saving is the oldest one; a hierarchical range
    must merge at least two blocks, one of them a span, so that every round makes progress. Without a limit on
    what the range may read only the first start is tried. The acknowledgements the new message would bring
    next to it count against its saving, so that one round reaches the target whenever the estimate holds.
    """
    policy, neighbours = view.policy, view.neighbours
    for first in range(len(blocks)):
        if not cuts[blocks[first].start]:
            continue
        best: tuple[int, int, int] | None = None  # (last block, target, message)
        cost = stands = fresh = spans = 0
        for last in range(first, len(blocks)):
            block = blocks[last]
            if limit is not None and last > first and cost + block.cost > limit:
                break
            cost += block.cost
            stands += block.original
            fresh += 0 if block.uses_summary else block.original
            spans += block.span is not None
            if not cuts[block.end] or (hierarchical and (spans == 0 or last == first)):
                continue
            around = neighbours.user_before[blocks[first].start] + neighbours.user_after[block.end]
            message, target = estimate(cost, stands, fresh)
            saving = cost - message - around * policy.acknowledgement_tokens
            if saving <= 0:
                continue
            best = (last, target, message)
            if saving >= view.needed:
                break
        if best is not None:
            return _Range(tuple(blocks[first : best[0] + 1]), best[1], best[2])
        if limit is None:
            return None
    return None


def _needs_summary(view: View, chosen: _Range, strategy: str) -> SpanNeeded:
    start, end = chosen.blocks[0].start, chosen.blocks[-1].end
    replaces = tuple(
        sorted(span.id for span in view.spans if not span.is_mask and start <= span.start and span.end <= end)
    )
    parts = tuple(part for block in chosen.blocks for part in block.parts())
    stubbed = frozenset(part for part in parts if isinstance(part, int) and part in view.stubbed)
    return SpanNeeded(
        start=start, end=end, replaces=replaces, parts=parts, target=chosen.target, strategy=strategy, stubbed=stubbed
    )
