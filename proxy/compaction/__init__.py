"""Compaction: deciding what of a long conversation goes upstream verbatim and what as summaries.

`builder` is the pure decision (which messages, which summaries, what to summarize next); `summary_text` holds
the summarizer's prompt, the deterministic fallback summary and tool-output reduction. Neither does I/O: the
pipeline feeds them stored messages and summaries and writes what they ask for.
"""

from __future__ import annotations

from proxy.compaction.builder import (
    BuildResult,
    Item,
    NeedsSummary,
    Policy,
    RecentTooLarge,
    Span,
    WorkingContext,
    build,
)
from proxy.compaction.summary_text import (
    SUMMARY_HEADER,
    extractive_summary,
    reduce_tool_output,
    summarizer_messages,
    summary_message,
    target_tokens,
)

__all__ = [
    "SUMMARY_HEADER",
    "BuildResult",
    "Item",
    "NeedsSummary",
    "Policy",
    "RecentTooLarge",
    "Span",
    "WorkingContext",
    "build",
    "extractive_summary",
    "reduce_tool_output",
    "summarizer_messages",
    "summary_message",
    "target_tokens",
]
