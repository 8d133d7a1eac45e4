"""Stored responses: `GET` / `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, and what a
`previous_response_id` continues from.

A response is a journal step (its id is `resp_` + the step's id in hex), and the Responses door keeps with the
step what rendering it again needs (`Conversation.wire`): the request's echoed fields and tools, whether the
client asked to `store` it, where its own input began. The conversation itself is in the history, as for every
request, so `previous_response_id` works with any upstream model: the proxy sends the stored path up to that
response's answer, then the new input. A response sent with `store: false`, one deleted (which hides it from
this API; the history keeps it, as it keeps every message), an unknown id and another tenant's id all read as
404 in OpenAI's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.doors.context_headers import MAX_STORED_INTEGER
from proxy.doors.event_streams import Event
from proxy.doors.responses.fields import chat_tools
from proxy.doors.responses.output import ResponseShape, output_items, response_id, status_of
from proxy.errors import NotFound
from proxy.history.chain import SYSTEM_ROLES
from proxy.history.messages import StoredMessage
from proxy.history.store import History
from proxy.journal.reader import JournalReader
from proxy.journal.steps import StepRecord, StepStatus
from proxy.journal.writer import Journal
from proxy.types import Message
from proxy.vocabulary import ITEMS

RESPONSES_DOOR = "responses"
RESPONSE_ID_PREFIX = "resp_"
DEFAULT_ITEMS_PAGE = 20
MAX_ITEMS_PAGE = 100


class StoredResponses:
    def __init__(self, reader: JournalReader, journal: Journal, history: History) -> None:
        self._reader = reader
        self._journal = journal
        self._history = history

    async def step(self, tenant: str, response: str, *, param: str | None = None) -> StepRecord:
        """The step behind a stored response the tenant may read; NotFound otherwise."""
        step_id = _step_id(response)
        record = None if step_id is None else await self._reader.step(tenant, step_id)
        wire = _wire(record)
        if record is None or wire.get("door") != RESPONSES_DOOR or not wire.get("store", True) or wire.get("deleted"):
            code = "previous_response_not_found" if param == "previous_response_id" else "not_found"
            raise NotFound(f"Response with id '{response}' not found.", param=param, code=code)
        return record

    async def get(self, tenant: str, response: str) -> Event:
        record = await self.step(tenant, response)
        answer = None if record.message_id is None else await self._history.message(record.message_id)
        items = None if answer is None else answer.get(ITEMS)
        return stored_response(record, items if isinstance(items, list) else None)

    async def delete(self, tenant: str, response: str) -> Event:
        record = await self.step(tenant, response)
        await self._journal.annotate(tenant, record.id, {"deleted": True})
        return {"id": response, "object": "response", "deleted": True}

    async def input_items(self, tenant: str, response: str, *, after: str | None, limit: int, order: str) -> Event:
        record = await self.step(tenant, response)
        items = await self._items(record)
        if order == "desc":
            items.reverse()
        if after is not None:
            ids = [item.get("id") for item in items]
            if after not in ids:
                raise NotFound(f"No input item with id '{after}' in response '{response}'.", param="after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }

    async def continuation(self, tenant: str, response: str) -> tuple[list[Message], str | None]:
        """The conversation up to a previous response's answer, as messages to send before the new input (its
        instructions left out: a new request brings its own), and that response's session."""
        record = await self.step(tenant, response, param="previous_response_id")
        if record.message_id is None:
            raise NotFound(
                f"Response '{response}' has no answer to continue from (status {record.status}).",
                param="previous_response_id",
                code="previous_response_not_found",
            )
        path = await self._history.path_to(record.message_id)
        return [stored.message for stored in path if not _is_instructions(stored)], record.session_id

    async def _items(self, record: StepRecord) -> list[Event]:
        if record.parent_message_id is None:
            return []
        path = await self._history.path_to(record.parent_message_id)
        start = int(_wire(record).get("input_from", 0))
        items: list[Event] = []
        for stored in path[start:]:
            if _is_instructions(stored):
                continue
            kept = stored.message.get(ITEMS)
            own = kept if isinstance(kept, list) else [_as_item(stored.message)]
            for index, item in enumerate(own):
                items.append(item if item.get("id") else {**item, "id": f"msg_{stored.id[:24]}_{index}"})
        return items


def stored_response(record: StepRecord, items: list[Event] | None = None) -> Event:
    """A step rendered as the `response` object its door answered (or would have) with; `items` are the output
    items a Responses-native upstream answered with (its reasoning and ids), as its answer's node keeps them."""
    wire = _wire(record)
    request: Mapping[str, Any] = wire.get("request") or {}
    _tools, names = chat_tools(request.get("tools"))
    shape = ResponseShape(record.id, record.created_at, record.model, request, names)
    output = items if items is not None else output_items(shape, record.content, record.tool_calls)
    if record.status in (StepStatus.SEALED, StepStatus.COMPLETE):
        return shape.response(status_of(record.finish_reason), output, record.usage, record.finish_reason)
    if record.status == StepStatus.OPEN:
        return shape.response("in_progress", output, record.usage)
    if record.status == StepStatus.INTERRUPTED:
        return shape.response("cancelled", output, record.usage)
    failed = shape.response("failed", output, record.usage)
    error = record.error or {}
    failed["error"] = {"code": error.get("code") or "server_error", "message": error.get("message")}
    return failed


def _step_id(response: str) -> int | None:
    digits = response.removeprefix(RESPONSE_ID_PREFIX)
    if not response.startswith(RESPONSE_ID_PREFIX) or not 0 < len(digits) <= 16:
        return None
    try:
        step_id = int(digits, 16)
    except ValueError:
        return None
    # Past SQLite's integers no step can have it (and binding it would raise OverflowError).
    return step_id if step_id <= MAX_STORED_INTEGER and response_id(step_id) == response else None


def _wire(record: StepRecord | None) -> dict[str, Any]:
    wire = (record.context or {}).get("wire") if record is not None else None
    return wire if isinstance(wire, dict) else {}


def _is_instructions(stored: StoredMessage) -> bool:
    """`instructions` enter the conversation as a system message with no items of their own."""
    return stored.role in SYSTEM_ROLES and stored.message.get(ITEMS) == []


def _as_item(message: Message) -> Event:
    """A message that came through another door, as a Responses input item."""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    kind = "output_text" if message.get("role") == "assistant" else "input_text"
    return {"type": "message", "role": message.get("role"), "content": [{"type": kind, "text": text}]}
