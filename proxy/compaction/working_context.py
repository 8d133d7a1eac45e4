"""The working context: the messages one request sends upstream for its session's path, as the compactor renders
them from the builder's layout (`proxy.compaction.layout.ContextLayout`) — spans as summary or marker messages,
masked tool outputs as stubs, acknowledgements between turns a span would join — with recalled passages put in
before the latest question; and what the inspection views show of it (`ContextView`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from proxy.canonical.types import Message
from proxy.canonical.vocabulary import SYSTEM_ROLES
from proxy.compaction.layout import ContextLayout, Span
from proxy.compaction.span_store import StoredSpan
from proxy.compaction.stubs import marker_message, stubbed_message
from proxy.compaction.summary_text import acknowledgement_message, summary_message
from proxy.config.schema import SLIDING_WINDOW
from proxy.tokens import count_message


@dataclass(frozen=True)
class WorkingContext:
    """The working context: the messages one request sends upstream for its session's path, and what they cost."""

    messages: list[Message]
    tokens: int
    summaries: int
    """Summaries (and markers) in the working context."""
    written: int
    """Spans written by this request."""
    recalled: int = 0
    """Archived passages recalled into the working context."""
    recall_tokens: int = 0
    """What the recall (its message and acknowledgements) adds to `tokens`: for this request only, so not what
    the session's context has grown to."""
    ahead: bool = False
    """Spans written ahead of need wait for the next crossing: there is nothing to pre-compact."""
    crossed: bool = False
    """This request crossed the budget: it wrote spans (masks included) or joined those written ahead, so its
    prompt is not the previous one's extension (the journal keeps it with the step: `Plan.context`)."""
    floor: int = field(default=0, compare=False)
    """What it sends whatever is compacted (`Policy.level`): system and pinned messages."""


@dataclass(frozen=True)
class ContextView:
    """What a session's next request would send, worked out without writing anything (the inspection views)."""

    spans: tuple[StoredSpan, ...]
    """The summaries and markers in the working context, in order (masks are `stubs`)."""
    stubs: Mapping[int, str]
    """Path position → the stub sent in place of that tool output."""
    tokens: int
    """The working context's size; with `compacts` the whole history's."""
    compacts: bool = False
    """It does not fit as the spans stand: the next request writes more (spans: those in force, not held)."""


def rendered(
    messages: Sequence[Message],
    context: ContextLayout,
    stored: Mapping[int, StoredSpan],
    stubs: Mapping[int, str],
    written: int,
) -> WorkingContext:
    """`context` as the messages it sends: `messages` are the request's, by path position; `stubs` the stubs of
    masked tool outputs; `written` the spans this request wrote."""
    sent: list[Message] = []
    summaries = 0
    acknowledged = frozenset(context.acknowledgements)
    for index, part in enumerate(context.parts):
        if index in acknowledged:
            sent.append(acknowledgement_message())
        if isinstance(part, Span):
            sent.append(span_message(stored[part.id]))
            summaries += 1
        elif part in context.stubbed:
            sent.append(stubbed_message(messages[part], stubs[part]))
        else:
            sent.append(messages[part])
    return WorkingContext(sent, context.tokens, summaries, written, ahead=context.held_back, floor=context.floor)


def with_recalled(
    prepared: WorkingContext, at: int, recalled: Message, passages: int, encoding: str, acknowledgement: int
) -> WorkingContext:
    """`prepared` with the recall message put in at message `at` (just before the latest question), acknowledged
    on each side so that turns alternate; `acknowledgement` is what one costs."""
    before = prepared.messages[:at]
    previous = next((m for m in reversed(before) if m.get("role") not in SYSTEM_ROLES), None)
    inserted = [recalled, acknowledgement_message()]
    if previous is not None and previous.get("role") == "user":
        inserted.insert(0, acknowledgement_message())
    added = count_message(recalled, encoding) + (len(inserted) - 1) * acknowledgement
    return replace(
        prepared,
        messages=[*before, *inserted, *prepared.messages[at:]],
        tokens=prepared.tokens + added,
        recalled=passages,
        recall_tokens=added,
    )


def span_message(summary: StoredSpan) -> Message:
    """The message a span is sent as: a sliding-window marker, or a summary."""
    return marker_message(summary.content) if summary.strategy == SLIDING_WINDOW else summary_message(summary.content)


def message_index(context: ContextLayout, position: int) -> int:
    """Where item `position` is in the rendered messages (acknowledgements included)."""
    index = context.parts.index(position)
    return index + sum(1 for acknowledged in context.acknowledgements if acknowledged <= index)
