"""A client's own compaction request (Claude Code's `/compact` and auto-compact, Codex's local compaction, Pi's
and OpenCode's summary calls), answered by the proxy from what it holds, with no model call (which requests those are:
`proxy.compaction.client_prompts`).

Such a request is the whole conversation followed by a prompt asking for a summary; the client then replaces its
turns with the summary. The proxy keeps every turn and compacts by itself, so it answers the prompt at once: the
spans it wrote for older turns and an extractive summary of the rest, and a reference to the stored conversation
(`proxy.request.references`). When the client sends the summary back, the reference makes the proxy send its own working
context of the whole conversation instead (`proxy.request.continuations`): one session, every original still reachable
(inspection, recall, a bigger model). A client that sends its conversation serialized as text in a request of
its own (Pi, OpenCode) is answered for the stored session that text comes from; the reference then names that
session's head, and the turns the client keeps after its summary are found in the stored path
(`proxy.request.continuations`). The switch is `context.client_compaction`.

A client of the Responses API asks for a compaction instead (Codex's `compaction_trigger`, `/v1/responses/compact`)
and expects an item back, not a summary: the pipeline stores the conversation and hands its door a
`StoredConversation` (`Pipeline.compact`), which that door renders as its item (`proxy.doors.responses`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.canonical.answers import ContextReport
from proxy.compaction.client_prompts import UNKNOWN_CLIENT, ClientCompaction, last_answer_turn, last_user_turn
from proxy.compaction.extractive import extractive_summary
from proxy.compaction.span_store import StoredSpan, in_force
from proxy.config.schema import TOOL_RESULTS
from proxy.history.messages import StoredMessage
from proxy.history.reads import HistoryReads
from proxy.offload import compute
from proxy.request.references import reference, reference_in
from proxy.tokens import content_text, rough_size

CANDIDATE_SESSIONS = 8
"""The tenant's most recent sessions a serialized summary request is looked for in."""
REST_TOKENS = 600
"""The extractive summary of the turns no span covers yet: short, since the proxy sends the turns themselves."""
REST_MESSAGES = 64
"""At most the last this many of them are read for it: a client that compacts every turn (Pi told a small
`maxTokens`) must not cost a pass over a long path each time."""


@dataclass(frozen=True)
class StoredConversation:
    """A conversation the proxy stored for a client's compaction request, answered without a model call or a
    journal step: `message_id`, its last message, is what the client's reference to it names."""

    message_id: str
    report: ContextReport
    """What the proxy holds of the conversation (nothing was sent upstream: `prompt_tokens` is 0)."""


async def summarized_session(
    history: HistoryReads, tenant: str, asked: ClientCompaction, text: str
) -> tuple[str, list[StoredMessage]] | None:
    """The session a serialized summary request (`Shape.SERIALIZED`) was written from, and its path, among the
    tenant's most recently updated sessions: the first whose path holds the last user turn the request's
    conversation text shows; for one that shows none, the first holding its last answer (an assistant text or a
    tool result: Pi's summary of a turn's prefix), or the message a reference in `text` names (Pi asks again with
    nothing new, its earlier summary in `<previous-summary>`). When it shows nothing to look for, a client's own
    prompt is answered for the tenant's one recent session; with several, nothing tells which it summarizes, and
    answering for the wrong one would hand the client another conversation's reference, so it is not answered.
    None when not answered: the request then goes to the model."""
    wanted = last_user_turn(asked.conversation)
    answer = None if wanted else last_answer_turn(asked.conversation)
    named = None if wanted else reference_in([{"role": "user", "content": text}])
    heads = await history.recent_heads(tenant, CANDIDATE_SESSIONS)
    for session_id, head_id in heads:
        path = await history.path_to(head_id)
        if wanted and any(_same_turn(stored, wanted) for stored in reversed(path)):
            return session_id, path
        if named is not None and any(stored.id == named[1] for stored in path):
            return session_id, path
        if answer is not None and any(_same_answer(stored, *answer) for stored in reversed(path)):
            return session_id, path
    shows_something = wanted or answer is not None or named is not None
    if shows_something or asked.recognizer is UNKNOWN_CLIENT or len(heads) != 1:
        return None
    session_id, head_id = heads[0]
    return session_id, await history.path_to(head_id)


def _same_turn(stored: StoredMessage, wanted: str) -> bool:
    """Clients join a message's text parts with nothing (Pi) or a newline (OpenCode) when they write it out."""
    if stored.role != "user":
        return False
    content = stored.message.get("content")
    return any(content_text(content, joiner).strip() == wanted for joiner in ("", "\n"))


def _same_answer(stored: StoredMessage, role: str, shown: str) -> bool:
    """An assistant text written out whole, or a tool result written out whole or cut short."""
    if stored.role != role:
        return False
    content = stored.message.get("content")
    for joiner in ("", "\n"):
        whole = content_text(content, joiner).strip()
        if whole == shown or (role == "tool" and whole.startswith(shown)):
            return True
    return False


async def summary_off_loop(
    path: Sequence[StoredMessage], spans: Sequence[StoredSpan], end_id: str, tagged: bool
) -> str:
    """`summary_text`, in a worker thread when the turns it reads are long: its extractive part counts the tokens of
    each tool output's lines as it reduces them (~0.1-0.2 s for 64 turns of long outputs: Pi asks at every turn
    past its threshold), which on the event loop would stall every other request."""
    size = sum(rough_size(stored.message) for stored in path[-REST_MESSAGES:])
    return await compute(size, summary_text, path, spans, end_id, tagged)


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
    rest: list[dict[str, Any]] = [stored.message for stored in path[max(covered, len(path) - REST_MESSAGES) :]]
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
