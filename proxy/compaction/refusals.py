"""Why a request's context cannot be compacted to fit its budget: the client's 400, saying what to change.

Kept apart from the compactor's loop, which raises them: the recent and pinned messages alone need more than the
budget (`RecentTooLarge`), or a span written changed nothing the builder plans with (it would be written again
and again).
"""

from __future__ import annotations

import logging

from proxy.compaction.builder import RecentTooLarge, SpanNeeded
from proxy.compaction.spans import CompactionRequest
from proxy.errors import ContextTooLarge

log = logging.getLogger(__name__)

NAMED_PINS = 10
"""Pinned message ids an error names before it says how many more there are."""


def not_converging(need: SpanNeeded, request: CompactionRequest) -> ContextTooLarge:
    """The builder asked again for a span this request wrote: writing it changed nothing, and would not again."""
    log.error(
        "compaction session=%s: the builder asked twice for the %s span of [%d,%d) replacing %s; giving up",
        request.session_id,
        need.strategy,
        need.start,
        need.end,
        list(need.replaces),
    )
    return ContextTooLarge(
        f"The conversation could not be compacted to fit {request.budget} tokens: compacting messages "
        f"[{need.start}, {need.end}) again would change nothing.",
        param="messages",
    )


def too_large(result: RecentTooLarge, request: CompactionRequest) -> ContextTooLarge:
    if result.pinned:
        ids = [request.path[position].id for position in result.pinned]
        named = ", ".join(ids[:NAMED_PINS]) + (f" and {len(ids) - NAMED_PINS} more" if len(ids) > NAMED_PINS else "")
        return ContextTooLarge(
            f"The session's pinned messages ({named}: {result.pinned_tokens} tokens), the system messages and the "
            f"{request.preserve_recent} most recent messages need {result.needed} tokens, but the input budget for "
            f"model '{request.entry.name}' is {result.budget} tokens. Unpin some (DELETE /sessions/"
            f"{request.session_id}/pins) or use a model with a larger context window.",
            param="messages",
            code="pins_too_large",
        )
    if result.needed > result.recent:  # the recent messages fit: the older part's summaries shrink no further
        return ContextTooLarge(
            f"The conversation could not be compacted to fit the input budget for model '{request.entry.name}' "
            f"({result.budget} tokens): the system messages and the {request.preserve_recent} most recent messages "
            f"need {result.recent} tokens, and the summaries of the older messages, compacted as far as they go, "
            f"{result.needed - result.recent} more. Lower X-Context-Preserve-Recent, start a new session, or use a "
            "model with a larger context window.",
            param="messages",
        )
    return ContextTooLarge(
        f"The system messages and the {request.preserve_recent} most recent messages need {result.needed} tokens, "
        f"but the input budget for model '{request.entry.name}' is {result.budget} tokens. Shorten the latest "
        "messages, lower X-Context-Preserve-Recent, or use a model with a larger context window.",
        param="messages",
    )
