"""A client's own compaction request (Claude Code's `/compact` and auto-compact, Codex's local compaction),
answered by the proxy from what it holds, with no model call.

Such a request is the whole conversation followed by a prompt asking for a summary; the client then replaces its
turns with the summary. The proxy keeps every turn and compacts by itself, so it answers the prompt at once: the
spans it wrote for older turns and an extractive summary of the rest, and a reference to the stored conversation
(`proxy.request.references`). The conversation is stored without that prompt. When the client sends the summary
back, the reference makes the proxy send its own working context of the whole conversation instead
(`proxy.request.continuations`): one session, every original still reachable (inspection, recall, a bigger model).
The prompts are recognized by the words each client uses; the switch is `context.client_compaction`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from proxy.canonical.types import Message
from proxy.compaction.extractive import extractive_summary
from proxy.compaction.span_store import StoredSpan, in_force
from proxy.config.schema import TOOL_RESULTS
from proxy.history.messages import StoredMessage
from proxy.request.references import reference
from proxy.tokens import content_text

PROMPT_OPENINGS = (
    "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.",  # Claude Code's /compact and auto-compact
    "You are performing a CONTEXT CHECKPOINT COMPACTION.",  # Codex's local compaction
)
PROMPT_PHRASES = (
    "Your task is to create a detailed summary of the conversation so far",
    "Your task is to create a detailed summary of the RECENT portion of the conversation",
)
REST_TOKENS = 600
"""The extractive summary of the turns no span covers yet: short, since the proxy sends the turns themselves."""


def compaction_prompt(messages: Sequence[Message]) -> bool:
    """Whether the conversation ends with a client's request to summarize it."""
    if not messages or messages[-1].get("role") != "user":
        return False
    text = content_text(messages[-1].get("content"), "\n").lstrip()
    return text.startswith(PROMPT_OPENINGS) or any(phrase in text for phrase in PROMPT_PHRASES)


def wants_tags(messages: Sequence[Message]) -> bool:
    """Claude Code asks for an `<analysis>` block and then a `<summary>` block."""
    return "<summary>" in content_text(messages[-1].get("content"), "\n")


def summary_text(path: Sequence[StoredMessage], spans: Sequence[StoredSpan], end_id: str, tagged: bool) -> str:
    """The summary the client keeps: the proxy's summaries of older turns, an extractive one of the rest, and the
    reference that brings the whole conversation back."""
    parts: list[str] = []
    covered = 0
    for span in sorted(in_force(spans), key=lambda span: (span.start_depth, -span.end_depth)):
        if span.strategy == TOOL_RESULTS or span.start_depth < covered:
            continue
        parts.append(span.content)
        covered = span.end_depth + 1
    rest: list[dict[str, Any]] = [stored.message for stored in path[covered:]]
    if rest:
        parts.append(extractive_summary(rest, REST_TOKENS))
    kept = (
        f"[Context Infinity keeps this whole conversation ({len(path)} messages) and sends the model what fits: "
        f"{reference(end_id)}]"
    )
    body = "\n\n".join([*(part for part in parts if part.strip()), kept])
    if not tagged:
        return body
    analysis = "The conversation is kept in full by the proxy in front of the model; this summary stands for it."
    return f"<analysis>\n{analysis}\n</analysis>\n\n<summary>\n{body}\n</summary>"
