"""Tool pairs: each tool output answers a call made before it, and a conversation goes on past a call only once
it is answered. Every provider refuses a conversation that breaks either, so every door checks both before
anything is stored (each in its API's words), and the continuations check the outputs of what they put together.

Pure functions of chat messages in the canonical form; `start` lets a door check only what follows the part of
a kept request that passed (`proxy.doors.resent`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

MAX_SHOWN_IDS = 10
MAX_SHOWN_ID_CHARS = 64
"""An error lists at most this many call ids, each cut to this many characters."""


def unanswered_output(messages: Sequence[Mapping[str, Any]], start: int = 0) -> str | None:
    """The id of the first tool output that answers no call made before it (every provider refuses one).

    `start`: how many leading messages are known to pass, being those a list that passed began with. Only the
    outputs after them are checked; one whose call is not among the new messages is looked for backwards."""
    called: set[str] = set()
    for index in range(start, len(messages)):
        message = messages[index]
        if message["role"] == "tool":
            call_id = message["tool_call_id"]
            if call_id not in called and not _called_before(messages, start, call_id):
                return str(call_id)
            continue
        calls = message.get("tool_calls")
        if calls:
            called.update(call["id"] for call in calls)
    return None


def _called_before(messages: Sequence[Mapping[str, Any]], end: int, call_id: Any) -> bool:
    for index in range(end - 1, -1, -1):
        calls = messages[index].get("tool_calls")
        if calls and any(call["id"] == call_id for call in calls):
            return True
    return False


def unanswered_calls(
    messages: Sequence[Mapping[str, Any]], *, adjacent: bool = True, start: int = 0
) -> tuple[int, list[str]] | None:
    """The first assistant message (its index) with tool calls left unanswered though a message other than a
    tool output follows it, and those calls' ids: every provider refuses one. `adjacent`: each call must be
    answered by the tool messages right after its message (chat, Anthropic); else anywhere after it (Responses
    items). Calls with nothing but tool outputs after them are not refused: the rest are the client's next
    request.

    `start`: how many leading messages a list that passed began with; without `adjacent` (a call may be answered
    anywhere after it), only if that list held no tool output past them. The calls before the last of them that
    is not a tool output were answered there, as here; only the messages from that one on are read."""
    last_other = next((index for index in range(len(messages) - 1, -1, -1) if messages[index]["role"] != "tool"), -1)
    first = start - 1 if start else 0
    while first > 0 and messages[first]["role"] == "tool":
        first -= 1
    answered_at = (
        {}
        if adjacent
        else {
            messages[index]["tool_call_id"]: index
            for index in range(first, len(messages))
            if messages[index]["role"] == "tool"
        }
    )
    for index in range(first, last_other):
        message = messages[index]
        calls = message.get("tool_calls") if message["role"] == "assistant" else None
        if not calls:
            continue
        answered: set[str] = set()
        if adjacent:
            after = index + 1
            while messages[after]["role"] == "tool":
                answered.add(messages[after]["tool_call_id"])
                after += 1
        else:
            answered = {call["id"] for call in calls if answered_at.get(call["id"], -1) > index}
        waiting = [str(call["id"]) for call in calls if call["id"] not in answered]
        if waiting:
            return index, waiting
    return None


def shown_ids(ids: Sequence[str]) -> str:
    """Call ids as an error lists them: the first few, each cut short (a client's ids may be any length)."""
    shown = ", ".join(call_id[:MAX_SHOWN_ID_CHARS] for call_id in ids[:MAX_SHOWN_IDS])
    return shown + (f" (and {len(ids) - MAX_SHOWN_IDS} more)" if len(ids) > MAX_SHOWN_IDS else "")
