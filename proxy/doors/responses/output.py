"""A canonical answer as the Responses API gives it: a `response` object, or its stream of events.

The journal holds the upstream's chat chunks (docs/architecture.md, "The canonical form"); this module renders
them for the Responses door, deterministically, so a stream, its Idempotency-Key replay and a non-stream answer
say the same thing with the same ids:

    response id     `resp_` + the journal step's id (hex)         item ids   `msg_`, `fc_`, `ctc_` + step + index
    output          the answer's text as one assistant message, then one item per tool call: a function_call,
                    or a custom_tool_call for a function that stands for a custom tool (its `input` unwrapped),
                    with its namespace when it came from one
    status          completed; incomplete when the answer stopped at max_output_tokens (`finish_reason` length)
                    or a content filter; failed when the stream failed (`response.failed`, which Codex and the
                    SDKs understand, carrying the error's code and message)

A stream opens with `response.created` and `response.in_progress`, announces every item
(`response.output_item.added`, `response.content_part.added`) before its deltas, closes each with its `.done`
events, and ends with `response.completed` (or `.incomplete`, `.failed`) holding the whole response: the order
`client.responses.stream()` checks and the events Codex takes items from (`response.output_item.done`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.canonical.types import Chunk
from proxy.doors.event_streams import ChunkRenderer, Event
from proxy.doors.responses.fields import ToolNames
from proxy.doors.responses.ids import response_id
from proxy.doors.responses.input import ECHOED_FIELDS
from proxy.errors import error_fields
from proxy.formats.responses_items import CUSTOM_INPUT
from proxy.journal.assembly import assemble

_INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}


@dataclass(frozen=True)
class ResponseShape:
    """What every rendering of one response shares: its id, time, model, the request it echoes, its tools."""

    step_id: int
    created_at: float
    model: str
    request: Mapping[str, Any]
    tools: ToolNames
    reference: str | None = None
    """The response's id when no journal step answered it (a warm-up, a compaction); else the step's."""

    @property
    def id(self) -> str:
        return self.reference if self.reference is not None else response_id(self.step_id)

    def item_id(self, prefix: str, index: int) -> str:
        return f"{prefix}_{self.step_id:x}_{index}"

    def response(
        self, status: str, output: list[Event], usage: Mapping[str, Any] | None, finish_reason: str | None = None
    ) -> Event:
        body: Event = {
            "id": self.id,
            "object": "response",
            "created_at": int(self.created_at),
            "status": status,
            "model": self.model,
            "output": output,
            "parallel_tool_calls": self.request.get("parallel_tool_calls", True),
            "tool_choice": self.request.get("tool_choice", "auto"),
            "tools": self.request.get("tools") or [],
            "usage": responses_usage(usage),
            "error": None,
            "incomplete_details": None,
        }
        for key in ECHOED_FIELDS:
            body[key] = self.request.get(key)
        if body["store"] is None:
            body["store"] = True
        reason = _INCOMPLETE_REASONS.get(finish_reason or "")
        if status == "incomplete" and reason is not None:
            body["incomplete_details"] = {"reason": reason}
        return body

    def tool_call_item(self, index: int, call_id: str, name: str, arguments: str, status: str) -> Event:
        """A tool call as the client's item: a function_call, or a custom_tool_call for a custom tool."""
        namespace, inner = self.tools.namespaced.get(name, (None, name))
        if name in self.tools.custom:
            item: Event = {
                "id": self.item_id("ctc", index),
                "type": "custom_tool_call",
                "status": status,
                "call_id": call_id,
                "name": inner,
                "input": custom_input(arguments),
            }
        else:
            item = {
                "id": self.item_id("fc", index),
                "type": "function_call",
                "status": status,
                "call_id": call_id,
                "name": inner,
                "arguments": arguments,
            }
        if namespace is not None:
            item["namespace"] = namespace
        return item

    def message_item(self, index: int, text: str, status: str) -> Event:
        parts = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
        return {
            "id": self.item_id("msg", index),
            "type": "message",
            "status": status,
            "role": "assistant",
            "content": parts,
        }


def native_response(shape: ResponseShape, response: Mapping[str, Any]) -> Event:
    """A Responses-native upstream's `response` as the client gets it: as the upstream sent it, under this
    proxy's id (the one `GET /v1/responses/{id}` and `previous_response_id` know) and with the
    `previous_response_id` the client sent (which the upstream never saw: the proxy resolves it)."""
    renamed = {**response, "id": shape.id}
    if shape.request.get("previous_response_id") is not None:
        renamed["previous_response_id"] = shape.request["previous_response_id"]
    return renamed


def native_event(shape: ResponseShape, event: Mapping[str, Any]) -> Event:
    """An upstream event relayed as it came, its `response` (if it carries one) renamed (`native_response`)."""
    response = event.get("response")
    if not isinstance(response, Mapping):
        return dict(event)
    return {**event, "response": native_response(shape, response)}


def custom_input(arguments: str) -> str:
    """The free-form input of a call to a function that stands for a custom tool ({"input": ...})."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    value = parsed.get(CUSTOM_INPUT) if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else arguments


def responses_usage(usage: Mapping[str, Any] | None) -> Event | None:
    if not usage:
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(cached)},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": int(reasoning)},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


def status_of(finish_reason: str | None) -> str:
    return "incomplete" if finish_reason in _INCOMPLETE_REASONS else "completed"


def completed_response(shape: ResponseShape, completion: Chunk) -> Event:
    """The `response` object of a non-stream answer (one chat.completion)."""
    assembly = assemble([completion])
    output = output_items(shape, assembly.content, assembly.tool_calls)
    return shape.response(status_of(assembly.finish_reason), output, assembly.usage, assembly.finish_reason)


def output_items(
    shape: ResponseShape, content: str | None, tool_calls: Iterable[Mapping[str, Any]] | None
) -> list[Event]:
    """An answer's text and tool calls as output items, in the order a stream announces them."""
    output: list[Event] = []
    if content:
        output.append(shape.message_item(0, content, "completed"))
    for call in tool_calls or ():
        function = call["function"]
        item = shape.tool_call_item(len(output), call["id"], function["name"], function["arguments"], "completed")
        output.append(item)
    return output


@dataclass
class _Call:
    output_index: int
    call_id: str
    name: str
    arguments: list[str] = field(default_factory=list)


class EventStream(ChunkRenderer):
    """Chat chunks in, Responses events out; one per response, fed in order."""

    def __init__(self, shape: ResponseShape) -> None:
        super().__init__()
        self._shape = shape
        self._sequence = 0
        self._output: list[Event] = []
        self._text: list[str] | None = None
        self._text_index = -1
        self._calls: dict[int, _Call] = {}
        self._open_call: _Call | None = None

    def start(self) -> list[Event]:
        opening = self._shape.response("in_progress", [], None)
        return [
            self._event("response.created", response=opening),
            self._event("response.in_progress", response=opening),
        ]

    def finish(self) -> list[Event]:
        events = self._close_all()
        status = status_of(self.finish_reason)
        final = self._shape.response(status, self._output, self.usage, self.finish_reason)
        events.append(self._event(f"response.{status}", response=final))
        return events

    def whole(self, items: list[Event]) -> list[Event]:
        """The events of a response the proxy answered by itself, its output items known whole (a compaction)."""
        events = self.start()
        for index, item in enumerate(items):
            events.append(self._event("response.output_item.added", output_index=index, item=item))
            events.append(self._event("response.output_item.done", output_index=index, item=item))
        self._output = list(items)
        return [*events, *self.finish()]

    def fail(self, exc: BaseException) -> list[Event]:
        error = error_fields(exc)
        events = self._close_all()
        failed = self._shape.response("failed", self._output, self.usage)
        failed["error"] = {
            "code": error.get("code") or error.get("type") or "server_error",
            "message": error.get("message"),
        }
        events.append(self._event("response.failed", response=failed))
        return events

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return event

    def native(self, event: Mapping[str, Any]) -> Event:
        return native_event(self._shape, event)

    def text(self, content: str) -> list[Event]:
        events: list[Event] = []
        if self._text is None:
            events.extend(self._close_call())
            self._text = []
            self._text_index = len(self._output)
            item = self._shape.message_item(self._text_index, "", "in_progress")
            self._output.append(item)
            events.append(self._event("response.output_item.added", output_index=self._text_index, item=item))
            events.append(
                self._event(
                    "response.content_part.added",
                    item_id=item["id"],
                    output_index=self._text_index,
                    content_index=0,
                    part={"type": "output_text", "text": "", "annotations": []},
                )
            )
        self._text.append(content)
        item_id = self._output[self._text_index]["id"]
        events.append(
            self._event(
                "response.output_text.delta",
                item_id=item_id,
                output_index=self._text_index,
                content_index=0,
                delta=content,
                logprobs=[],
            )
        )
        return events

    def _close_text(self) -> list[Event]:
        if self._text is None:
            return []
        text = "".join(self._text)
        index = self._text_index
        item = self._shape.message_item(index, text, "completed")
        self._output[index] = item
        part = item["content"][0]
        self._text = None
        return [
            self._event(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                text=text,
                logprobs=[],
            ),
            self._event(
                "response.content_part.done", item_id=item["id"], output_index=index, content_index=0, part=part
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def call(self, position: int, delta: Mapping[str, Any]) -> list[Event]:
        index = delta.get("index")
        key = index if isinstance(index, int) else position
        call = self._calls.get(key)
        events: list[Event] = []
        function = delta.get("function") or {}
        if call is None:
            events.extend(self._close_text())
            events.extend(self._close_call())
            call = _Call(len(self._output), str(delta.get("id") or f"call_{key}"), str(function.get("name") or ""))
            self._calls[key] = call
            self._open_call = call
            item = self._shape.tool_call_item(call.output_index, call.call_id, call.name, "", "in_progress")
            self._output.append(item)
            events.append(self._event("response.output_item.added", output_index=call.output_index, item=item))
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            call.arguments.append(arguments)
            if call.name not in self._shape.tools.custom:  # a custom tool's input is whole only at the end
                item_id = self._output[call.output_index]["id"]
                events.append(
                    self._event(
                        "response.function_call_arguments.delta",
                        item_id=item_id,
                        output_index=call.output_index,
                        delta=arguments,
                    )
                )
        return events

    def _close_call(self) -> list[Event]:
        call = self._open_call
        if call is None:
            return []
        self._open_call = None
        arguments = "".join(call.arguments)
        item = self._shape.tool_call_item(call.output_index, call.call_id, call.name, arguments, "completed")
        self._output[call.output_index] = item
        index = call.output_index
        if item["type"] == "custom_tool_call":
            done = [
                self._event(
                    "response.custom_tool_call_input.delta", item_id=item["id"], output_index=index, delta=item["input"]
                ),
                self._event(
                    "response.custom_tool_call_input.done", item_id=item["id"], output_index=index, input=item["input"]
                ),
            ]
        else:
            done = [
                self._event(
                    "response.function_call_arguments.done",
                    item_id=item["id"],
                    output_index=index,
                    name=item["name"],
                    arguments=arguments,
                )
            ]
        return [*done, self._event("response.output_item.done", output_index=index, item=item)]

    def _close_all(self) -> list[Event]:
        return [*self._close_text(), *self._close_call()]
