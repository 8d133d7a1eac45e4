"""Stored responses: `GET` / `DELETE /v1/responses/{id}` and `GET /v1/responses/{id}/input_items`.

A response is a journal step (its id is `resp_` + the step's id in hex), and the Responses door keeps with the
step what rendering it again needs (`Conversation.door_state`): the request's echoed fields and tools, whether the
client asked to `store` it, where its own input began. The conversation itself is in the history, as for every
request (what `previous_response_id` continues from: `proxy.request.continuations`). A response sent with
`store: false`, one deleted (which hides it from this API; the history keeps it, as it keeps every message), an
unknown id and another tenant's id all read as 404 in OpenAI's shape.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.canonical.types import Message
from proxy.canonical.vocabulary import ITEMS
from proxy.doors.event_streams import Event
from proxy.doors.responses.fields import chat_tools
from proxy.doors.responses.ids import step_of
from proxy.doors.responses.output import ResponseShape, output_items, status_of
from proxy.errors import NotFound
from proxy.history.store import History
from proxy.journal.reader import JournalReader
from proxy.journal.steps import StepRecord, StepStatus
from proxy.journal.writer import Journal
from proxy.request.continuations import is_instructions

RESPONSES_DOOR = "responses"
DEFAULT_ITEMS_PAGE = 20
MAX_ITEMS_PAGE = 100


class StoredResponses:
    def __init__(self, reader: JournalReader, journal: Journal, history: History) -> None:
        self._reader = reader
        self._journal = journal
        self._history = history

    async def step(self, tenant: str, response: str, *, param: str | None = None) -> StepRecord:
        """The step behind a stored response the tenant may read; NotFound otherwise."""
        step_id = step_of(response)
        record = None if step_id is None else await self._reader.step(tenant, step_id)
        if record is None or not record.readable_through(RESPONSES_DOOR):
            raise NotFound(f"Response with id '{response}' not found.", param=param, code="not_found")
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

    async def _items(self, record: StepRecord) -> list[Event]:
        if record.parent_message_id is None:
            return []
        path = await self._history.path_to(record.parent_message_id)
        start = int(record.door_state().get("input_from", 0))
        items: list[Event] = []
        for stored in path[start:]:
            if is_instructions(stored.message):
                continue
            kept = stored.message.get(ITEMS)
            own = kept if isinstance(kept, list) else [_as_item(stored.message)]
            for index, item in enumerate(own):
                items.append(item if item.get("id") else {**item, "id": f"msg_{stored.id[:24]}_{index}"})
        return items


def stored_response(record: StepRecord, items: list[Event] | None = None) -> Event:
    """A step rendered as the `response` object its door answered (or would have) with; `items` are the output
    items a Responses-native upstream answered with (its reasoning and ids), as its answer's node keeps them."""
    request: Mapping[str, Any] = record.door_state().get("request") or {}
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


def _as_item(message: Message) -> Event:
    """A message that came through another door, as a Responses input item."""
    content = message.get("content")
    text = content if isinstance(content, str) else ""
    kind = "output_text" if message.get("role") == "assistant" else "input_text"
    return {"type": "message", "role": message.get("role"), "content": [{"type": kind, "text": text}]}
