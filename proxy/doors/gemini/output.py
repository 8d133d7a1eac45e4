"""A canonical answer as the Gemini API gives it: a `GenerateContentResponse`, its stream, its errors.

Rendered from the journal's chat chunks, deterministically (`responseId` is the journal step's id), so a stream,
its Idempotency-Key replay and a JSON answer agree. Text becomes `text` parts, a chat model's reasoning `thought`
parts, each tool call a `functionCall` part (its JSON arguments as `args`, its id kept: Gemini CLI echoes it in
its `functionResponse`). A stream is one response per text delta (`data: {...}` events with `alt=sse`, else
the elements of one JSON array), the function calls whole in the last one with the `finishReason` and the
`usageMetadata`; a failure after the start is a last `{"error": {...}}` element. Errors before it are Google's
`{"error": {"code", "message", "status"}}` with the status.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.canonical.types import Chunk
from proxy.cost import TokenCost
from proxy.doors.event_streams import ChunkRenderer, Event
from proxy.errors import ProxyError

FINISH_REASONS = {"stop": "STOP", "tool_calls": "STOP", "length": "MAX_TOKENS", "content_filter": "SAFETY"}
STATUSES = {
    400: "INVALID_ARGUMENT",
    401: "UNAUTHENTICATED",
    403: "PERMISSION_DENIED",
    404: "NOT_FOUND",
    408: "DEADLINE_EXCEEDED",
    409: "ABORTED",
    413: "INVALID_ARGUMENT",
    429: "RESOURCE_EXHAUSTED",
    499: "CANCELLED",
    500: "INTERNAL",
    501: "UNIMPLEMENTED",
    502: "UNAVAILABLE",
    503: "UNAVAILABLE",
    504: "DEADLINE_EXCEEDED",
}
"""Google's canonical status names (google.rpc.Code) by HTTP status."""


def google_error(exc: BaseException) -> tuple[int, Event, dict[str, str]]:
    """Status, Google's error body and extra headers for any exception that reaches this door."""
    if isinstance(exc, ProxyError):
        return exc.status, error_body(exc.status, exc.message), dict(exc.headers)
    message = f"The proxy failed unexpectedly ({type(exc).__name__}); the failure was logged."
    return 500, error_body(500, message), {}


def error_body(status: int, message: str | None) -> Event:
    name = STATUSES.get(status, "INTERNAL" if status >= 500 else "FAILED_PRECONDITION")
    return {"error": {"code": status, "message": message or "error", "status": name}}


@dataclass(frozen=True)
class ResponseShape:
    step_id: int
    model: str
    prompt_tokens: int
    """The proxy's count of what it sent, reported until the upstream's usage is known."""

    @property
    def id(self) -> str:
        return f"{self.step_id:016x}"

    def response(self, parts: list[Event], finish: str | None, usage: Mapping[str, Any] | None) -> Event:
        candidate: Event = {"index": 0}
        if parts:
            candidate["content"] = {"role": "model", "parts": parts}
        if finish is not None:
            candidate["finishReason"] = FINISH_REASONS.get(finish, "OTHER")
        response: Event = {"candidates": [candidate], "modelVersion": self.model, "responseId": self.id}
        if usage is not None or finish is not None:
            response["usageMetadata"] = usage_metadata(usage, self.prompt_tokens)
        return response


def usage_metadata(usage: Mapping[str, Any] | None, prompt_tokens: int = 0) -> Event:
    """Gemini's usage: `promptTokenCount` is the whole input, `cachedContentTokenCount` the part read from the
    prompt cache; `candidatesTokenCount` leaves out the thoughts, which `thoughtsTokenCount` counts."""
    cost = TokenCost.from_usage(usage)
    prompt = cost.sent if usage is not None else prompt_tokens
    details = (usage or {}).get("completion_tokens_details")
    thoughts = details.get("reasoning_tokens") if isinstance(details, dict) else None
    thoughts = thoughts if isinstance(thoughts, int) and 0 < thoughts <= cost.completion else 0
    metadata: Event = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": cost.completion - thoughts,
        "totalTokenCount": prompt + cost.completion,
        "cachedContentTokenCount": cost.cached,
    }
    if thoughts:
        metadata["thoughtsTokenCount"] = thoughts
    return metadata


def function_call(call: Mapping[str, Any]) -> Event:
    """A chat tool call as a `functionCall` part: its arguments parsed (a model's invalid JSON kept as text)."""
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError:
        args = {"arguments": arguments}
    if not isinstance(args, dict):
        args = {"value": args}
    return {"functionCall": {"id": call.get("id") or "", "name": function.get("name") or "", "args": args}}


def completed_response(shape: ResponseShape, completion: Chunk) -> Event:
    """A chat completion (a stream's chunks assembled, or a non-stream answer) as one response."""
    choices = completion.get("choices") or [{}]
    message = choices[0].get("message") or {}
    parts: list[Event] = []
    reasoning = message.get("reasoning_content")
    if isinstance(reasoning, str) and reasoning:
        parts.append({"text": reasoning, "thought": True})
    content = message.get("content")
    if isinstance(content, str) and content:
        parts.append({"text": content})
    parts.extend(function_call(call) for call in message.get("tool_calls") or ())
    if not parts:
        parts.append({"text": ""})
    finish = choices[0].get("finish_reason") or "stop"
    return shape.response(parts, finish, completion.get("usage"))


class ResponseStream(ChunkRenderer):
    """Chat chunks in, Gemini stream responses out: a response per text delta, the calls whole at the end."""

    def __init__(self, shape: ResponseShape) -> None:
        super().__init__()
        self.shape = shape
        self.calls: dict[int, dict[str, Any]] = {}

    def start(self) -> list[Event]:
        return []

    def feed(self, chunks: Iterable[Chunk]) -> list[Event]:
        """A chat model's reasoning deltas (`reasoning_content`, as LiteLLM names every provider's) as thought
        parts, in their place among the text."""
        events: list[Event] = []
        for chunk in chunks:
            for choice in chunk.get("choices") or ():
                reasoning = (
                    (choice.get("delta") or {}).get("reasoning_content") if choice.get("index", 0) == 0 else None
                )
                if isinstance(reasoning, str) and reasoning:
                    events.append(self.shape.response([{"text": reasoning, "thought": True}], None, None))
            events.extend(super().feed([chunk]))
        return events

    def text(self, content: str) -> list[Event]:
        return [self.shape.response([{"text": content}], None, None)]

    def call(self, position: int, delta: Mapping[str, Any]) -> list[Event]:
        index = delta.get("index", position)
        call = self.calls.setdefault(index, {"id": "", "function": {"name": "", "arguments": ""}})
        if delta.get("id"):
            call["id"] = delta["id"]
        function = delta.get("function") or {}
        if function.get("name"):
            call["function"]["name"] += function["name"]
        if function.get("arguments"):
            call["function"]["arguments"] += function["arguments"]
        return []

    def finish(self) -> list[Event]:
        parts = [function_call(self.calls[index]) for index in sorted(self.calls)]
        return [self.shape.response(parts, self.finish_reason or "stop", self.usage)]

    def fail(self, exc: BaseException) -> list[Event]:
        return [google_error(exc)[1]]

    def native(self, event: Mapping[str, Any]) -> Event:
        return dict(event)
