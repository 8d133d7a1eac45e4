"""The messages the no-model strategies send: a tool output's stub (`tool-results`) and the marker that stands
for omitted turns (`sliding-window`).

Both are pure functions of what they stand for, so the same range or the same output is always the same bytes
and prompts stay prefix-extensions between compactions (invariant 6). A stub keeps the tool message's place,
role and call id (tool pairing, invariant 4) and, for a message that keeps a native API's items (Responses
outputs, Anthropic `tool_result` blocks), the same items with the output replaced, so a native upstream gets
the stub too.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from proxy.canonical.types import Message
from proxy.canonical.vocabulary import ITEMS, ORIGIN, Origin, origin
from proxy.compaction.summary_text import key_inputs
from proxy.formats.responses_items import TOOL_OUTPUT_TYPES
from proxy.tokens import content_text

STUB_PREFIX = "[tool output stubbed by the proxy:"
MARKER_PREFIX = "[Omitted from this context:"
OUTCOME_CHARS = 160
_SIGNAL = re.compile(
    r"error|exception|failed|failure|traceback|fatal|panic|exit(?:ed)?(?: with)?(?: code| status)?[ :=]*-?\d+|"
    r"\b\d+ (?:passed|failed|errors?)\b",
    re.IGNORECASE,
)


def tool_stub(output: str, name: str | None, arguments: str | None) -> str:
    """`[tool output stubbed by the proxy: read_file(path=a.py) → "last line" · 120 lines, 4,312 characters; …]`.

    The outcome is the first line that signals one (an error, an exit status, a test count), else the last
    non-empty line: what a model needs to know that the call happened and how it ended.
    """
    lines = output.splitlines()
    outcome = next((line for line in lines if _SIGNAL.search(line)), None)
    if outcome is None:
        outcome = next((line for line in reversed(lines) if line.strip()), "")
    outcome = " ".join(outcome.split())
    if len(outcome) > OUTCOME_CHARS:
        outcome = outcome[: OUTCOME_CHARS - 1] + "…"
    call = f"{name or 'tool'}({key_inputs(arguments)})"
    shown = f' → "{outcome}"' if outcome else ""
    return (
        f"{STUB_PREFIX} {call}{shown} · {len(lines):,} lines, {len(output):,} characters; the original is kept "
        "in the proxy's history]"
    )


def stubbed_message(message: Mapping[str, Any], stub: str) -> Message:
    """The tool message with its output replaced by `stub`, in its chat form and in its native items alike."""
    stubbed: Message = {**message, "content": stub}
    kept = message.get(ITEMS)
    if isinstance(kept, list):
        stubbed[ITEMS] = [_stubbed_item(item, stub) for item in kept]
    return stubbed


def _stubbed_item(item: Any, stub: str) -> Any:
    if not isinstance(item, Mapping):
        return item
    if item.get("type") in TOOL_OUTPUT_TYPES:
        return {**item, "output": stub}
    if item.get("type") == "tool_result":
        return {**item, "content": stub}
    return item


def tool_stubs(message_at: Callable[[int], Mapping[str, Any]], wanted: Iterable[int]) -> Iterator[tuple[int, str]]:
    """(position, stub) of each tool message at a wanted position of a path (`message_at(position)`), named after
    the call it answers: the nearest call before it with its id (some local servers reuse ids), looked for
    backwards from it, so stubbing the newest outputs of a long path reads only their turns."""
    for position in sorted(wanted):
        message = message_at(position)
        if message.get("role") != "tool":
            continue
        name, arguments = _answered_call(message_at, position, str(message.get("tool_call_id")))
        yield position, tool_stub(content_text(message.get("content")), name, arguments)


def _answered_call(
    message_at: Callable[[int], Mapping[str, Any]], position: int, call_id: str
) -> tuple[str | None, str | None]:
    """(name, arguments) of the nearest call before `position` with id `call_id` (a message's last, when it
    repeats the id); (None, None) when there is none."""
    for earlier in range(position - 1, -1, -1):
        found: tuple[str | None, str | None] | None = None
        for call in message_at(earlier).get("tool_calls") or ():
            if isinstance(call, Mapping) and str(call.get("id")) == call_id:
                function = call.get("function")
                function = function if isinstance(function, Mapping) else {}
                arguments = function.get("arguments")
                found = (str(function.get("name") or "tool"), arguments if isinstance(arguments, str) else None)
        if found is not None:
            return found
    return None, None


def marker_text(roles: Sequence[str], start: int, end: int) -> str:
    """The sliding-window marker for messages [start, end) of a path whose roles are `roles`: how many messages
    and which user turns (numbered from the conversation's first) left the working context."""
    turns_before = sum(1 for role in roles[:start] if role == "user")
    turns = sum(1 for role in roles[start:end] if role == "user")
    count = end - start
    which = ""
    if turns == 1:
        which = f", user turn {turns_before + 1}"
    elif turns > 1:
        which = f", user turns {turns_before + 1}–{turns_before + turns}"
    plural = "s" if count != 1 else ""
    return f"{MARKER_PREFIX} {count} earlier message{plural}{which}; the proxy keeps them in its history]"


def marker_message(content: str) -> Message:
    """A marker is a user turn, as a summary is: valid wherever a strict chat template expects one."""
    return {"role": "user", "content": content, ORIGIN: Origin.MARKER}


def is_marker(message: Mapping[str, Any]) -> bool:
    return origin(message) == Origin.MARKER
