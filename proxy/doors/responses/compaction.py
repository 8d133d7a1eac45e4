"""The client's own compaction in the Responses API, answered by the proxy (Codex's remote compaction).

A client asks for its context to be compacted with an input ending `{"type": "compaction_trigger"}` (or with
`POST /v1/responses/compact`) and expects exactly one `compaction` item back, which it then sends at the head of
its later inputs instead of the turns it stood for. The proxy keeps every message and compacts by itself, so it
answers at once, with no model call: the item carries a reference to the stored conversation
(`proxy.request.references`), and a later input that carries it is expanded back to that conversation
(`proxy.request.continuations`). The messages a client keeps before the item (Codex keeps the user turns) are in that
conversation already.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.canonical.conversation import Continuation
from proxy.errors import InvalidRequest
from proxy.request.references import reference, referenced

COMPACTION = "compaction"
TRIGGER = "compaction_trigger"
_MARKS = (COMPACTION, "compaction_summary")
"""The items that stand for the turns a client compacted (`compaction_summary`: an older name of the item)."""


@dataclass(frozen=True)
class CompactedInput:
    items: list[Any]
    """The input from after the last compaction item on, without a trailing trigger."""
    continues: Continuation | None
    """The stored conversation the last compaction item stands for."""
    trigger: bool
    """The input asked for a compaction."""


def compacts(items: Sequence[Any], start: int = 0) -> bool:
    """Whether an input holds a compaction item or asks for one (`split_input` has then something to split);
    `start`: how many leading items are known to hold none."""
    return any(_kind(items[index]) in (TRIGGER, *_MARKS) for index in range(start, len(items)))


def split_input(items: Sequence[Any]) -> CompactedInput:
    """An input's compaction items read: what it continues, what is its own, whether it asks for a compaction."""
    items = list(items)
    trigger = bool(items) and _kind(items[-1]) == TRIGGER
    if trigger:
        items.pop()
    if any(_kind(item) == TRIGGER for item in items):
        raise InvalidRequest("A 'compaction_trigger' item may only end the input.", param="input")
    marks = [index for index, item in enumerate(items) if _kind(item) in _MARKS]
    last = marks[-1] if marks else None
    if last is None:
        return CompactedInput(items, None, trigger)
    where = f"input[{last}]"
    message_id = message_of(items[last].get("encrypted_content"), where)
    continues = Continuation(None, "responses", "the compaction item", where, message_id=message_id)
    return CompactedInput(items[last + 1 :], continues, trigger)


def compaction_item(message_id: str, item_id: str) -> dict[str, Any]:
    """The item that stands for the stored conversation ending at `message_id`."""
    return {"type": COMPACTION, "id": item_id, "encrypted_content": reference(message_id)}


def message_of(token: Any, where: str) -> str:
    """The stored message a compaction item's content names; a 400 for one the proxy did not write."""
    message_id = referenced(token)
    if message_id is None:
        raise InvalidRequest(
            f"'{where}' is not a compaction item this proxy wrote: send the conversation itself, or the item as "
            "it was returned.",
            param=where,
            code="invalid_compaction_item",
        )
    return message_id


def _kind(item: Any) -> Any:
    return item.get("type") if isinstance(item, dict) else None
