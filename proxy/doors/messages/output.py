"""A canonical answer as Anthropic's Messages API gives it: a `message` object, its event stream, its errors.

Rendered from the journal's chat chunks, deterministically (the message id is `msg_` + the journal step's id), so
a stream, its Idempotency-Key replay and a JSON answer agree. Text becomes a `text` block; each tool call a
`tool_use` block (its JSON arguments as `input`, its id kept: the client echoes it in its `tool_result`). A stream
is `message_start`, per block `content_block_start` / `_delta` (`text_delta`, `input_json_delta`) / `_stop`,
then `message_delta` (stop reason, output tokens) and `message_stop`; a failure after the start is an `error`
event. Errors before it are Anthropic's `{"type": "error", "error": {"type", "message"}}` with the status.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.canonical.types import Chunk
from proxy.cost import TokenCost
from proxy.doors.event_streams import ChunkRenderer, Event
from proxy.errors import ProxyError
from proxy.journal.assembly import assemble

STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens", "content_filter": "refusal"}
ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error(exc: BaseException) -> tuple[int, Event, dict[str, str]]:
    """Status, Anthropic's error body and extra headers for any exception that reaches this door."""
    if isinstance(exc, ProxyError):
        return exc.status, error_body(exc.status, exc.message), dict(exc.headers)
    message = f"The proxy failed unexpectedly ({type(exc).__name__}); the failure was logged."
    return 500, error_body(500, message), {}


def error_body(status: int, message: str | None) -> Event:
    kind = ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message or "error"}}


@dataclass(frozen=True)
class MessageShape:
    step_id: int
    model: str
    prompt_tokens: int
    """The proxy's count of what it sent: message_start reports it before the upstream's usage is known."""

    @property
    def id(self) -> str:
        return f"msg_{self.step_id:016x}"

    def message(self, content: list[Event], stop_reason: str | None, usage: Mapping[str, Any] | None) -> Event:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": anthropic_usage(usage, self.prompt_tokens),
        }


def anthropic_usage(usage: Mapping[str, Any] | None, prompt_tokens: int = 0) -> Event:
    """Anthropic's usage: `input_tokens` is only what was neither read from nor written to the prompt cache (a
    client such as Claude Code adds the three up as the context's size)."""
    cost = TokenCost.from_usage(usage)
    return {
        "input_tokens": cost.uncached if cost.sent else prompt_tokens,
        "output_tokens": cost.completion,
        "cache_creation_input_tokens": cost.cache_creation,
        "cache_read_input_tokens": cost.cached,
    }


def tool_input(arguments: str) -> Any:
    """A tool call's JSON arguments as a tool_use block's `input` (an object)."""
    try:
        value = json.loads(arguments) if arguments else {}
    except ValueError:
        return {"arguments": arguments}
    return value if isinstance(value, dict) else {"value": value}


def completed_message(shape: MessageShape, completion: Chunk) -> Event:
    assembly = assemble([completion])
    content: list[Event] = []
    if assembly.content:
        content.append({"type": "text", "text": assembly.content})
    for call in assembly.tool_calls or ():
        function = call["function"]
        content.append(
            {"type": "tool_use", "id": call["id"], "name": function["name"], "input": tool_input(function["arguments"])}
        )
    return shape.message(content, STOP_REASONS.get(assembly.finish_reason or "stop", "end_turn"), assembly.usage)


class MessageEvents(ChunkRenderer):
    """Chat chunks in, Anthropic stream events out; one per message, fed in order."""

    def __init__(self, shape: MessageShape) -> None:
        super().__init__()
        self._shape = shape
        self._index = -1
        self._open: str | None = None
        """The kind of the block being streamed: "text", or a tool call's chunk index as text."""
        self._calls: dict[int, int] = {}

    def start(self) -> list[Event]:
        return [{"type": "message_start", "message": self._shape.message([], None, None)}]

    def finish(self) -> list[Event]:
        stop = STOP_REASONS.get(self.finish_reason or "stop", "end_turn")
        usage = anthropic_usage(self.usage, self._shape.prompt_tokens)
        return [
            *self._close(),
            {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None}, "usage": usage},
            {"type": "message_stop"},
        ]

    def fail(self, exc: BaseException) -> list[Event]:
        _status, body, _headers = anthropic_error(exc)
        return [*self._close(), body]

    def native(self, event: Mapping[str, Any]) -> Event:
        """An Anthropic upstream's event as it came, its message under the proxy's id."""
        message = event.get("message")
        return {**event, "message": {**message, "id": self._shape.id}} if isinstance(message, dict) else dict(event)

    def text(self, text: str) -> list[Event]:
        events: list[Event] = []
        if self._open != "text":
            events.extend(self._close())
            events.append(self._begin("text", {"type": "text", "text": ""}))
        events.append(
            {"type": "content_block_delta", "index": self._index, "delta": {"type": "text_delta", "text": text}}
        )
        return events

    def call(self, position: int, delta: Mapping[str, Any]) -> list[Event]:
        index = delta.get("index")
        key = index if isinstance(index, int) else position
        events: list[Event] = []
        function = delta.get("function") or {}
        if key not in self._calls:
            events.extend(self._close())
            block: Event = {
                "type": "tool_use",
                "id": delta.get("id") or f"call_{key}",
                "name": function.get("name") or "",
                "input": {},
            }
            events.append(self._begin(f"call:{key}", block))
            self._calls[key] = self._index
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            events.append(
                {
                    "type": "content_block_delta",
                    "index": self._calls[key],
                    "delta": {"type": "input_json_delta", "partial_json": arguments},
                }
            )
        return events

    def _begin(self, kind: str, block: Event) -> Event:
        self._index += 1
        self._open = kind
        return {"type": "content_block_start", "index": self._index, "content_block": block}

    def _close(self) -> list[Event]:
        if self._open is None:
            return []
        self._open = None
        return [{"type": "content_block_stop", "index": self._index}]
