"""OpenAI's Responses API itself, for models configured `api: responses`: the Responses door's native route.

The shared plumbing (httpx, SSE, errors, why not LiteLLM) is `proxy.upstream.native_client`. Here: each Responses
event becomes a canonical chunk that keeps it whole beside the chat delta it amounts to (text, tool call fragments),
and the closing event carries the output items as the answer message (`proxy.formats.responses_items`), with its
reasoning and ids: what the client will echo next turn.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from proxy.canonical.types import Chunk, JSONObject, Message, NativeRequest
from proxy.canonical.vocabulary import ANSWER, EVENT, RESPONSE, Origin, origin
from proxy.config.models import RESPONSES_API, ModelEntry
from proxy.errors import UpstreamError
from proxy.formats.responses_items import CUSTOM_INPUT, assistant_message, input_items, qualified_name
from proxy.upstream.native_client import NativeClient, model_id
from proxy.upstream.redaction import NO_SECRETS, Redactor

OPENAI_BASE = "https://api.openai.com/v1"
ENDING_EVENTS = frozenset({"response.completed", "response.incomplete"})
FAILING_EVENTS = frozenset({"response.failed", "error"})
_LENGTH_REASONS = frozenset({"max_output_tokens"})


class ResponsesClient(NativeClient):
    api = RESPONSES_API
    key_variables = ("OPENAI_API_KEY",)
    ending_events = ENDING_EVENTS

    def url(self, entry: ModelEntry) -> str:
        return (entry.api_base or OPENAI_BASE).rstrip("/") + "/responses"

    def headers(self, entry: ModelEntry, request: NativeRequest) -> dict[str, str]:
        key = self.key(entry)
        return {"Authorization": f"Bearer {key}"} if key else {}

    def body(self, entry: ModelEntry, request: NativeRequest, context: list[Message], stream: bool) -> JSONObject:
        items = input_items(responses_context(context))
        return {**request.body, "input": items, "model": model_id(entry, "openai"), "stream": stream}

    def completion(self, answer: Mapping[str, Any]) -> Chunk:
        return completion(answer)

    def converter(self) -> EventChunks:
        return EventChunks(self._redactor)


def responses_context(messages: list[Message]) -> list[Message]:
    """The working context as a Responses model takes it: a summary or a marker is a developer message where it
    stands (the Responses API has no turn order to keep, so the acknowledgements that keep chat turns alternating
    go)."""
    context: list[Message] = []
    for message in messages:
        kind = origin(message)
        if kind in (Origin.SUMMARY, Origin.MARKER):
            context.append({**message, "role": "developer"})
        elif kind != Origin.ACKNOWLEDGEMENT:
            context.append(message)
    return context


def completion(response: Mapping[str, Any]) -> Chunk:
    """A non-stream `response` as the canonical chat.completion (the response itself under `response`)."""
    output = list(response.get("output") or [])
    message = assistant_message(output)
    return {
        "object": "chat.completion",
        "id": response.get("id"),
        "model": response.get("model"),
        "choices": [
            {"index": 0, "message": {**message, ANSWER: message}, "finish_reason": finish_reason(response, message)}
        ],
        "usage": chat_usage(response.get("usage")),
        RESPONSE: dict(response),
    }


def finish_reason(response: Mapping[str, Any], message: Mapping[str, Any]) -> str:
    reason = (response.get("incomplete_details") or {}).get("reason")
    if response.get("status") == "incomplete" and reason in _LENGTH_REASONS:
        return "length"
    if response.get("status") == "incomplete":
        return "content_filter"
    return "tool_calls" if message.get("tool_calls") else "stop"


def chat_usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    return {
        "prompt_tokens": usage.get("input_tokens", 0),
        "completion_tokens": usage.get("output_tokens", 0),
        "total_tokens": usage.get("total_tokens", 0),
        "prompt_tokens_details": {"cached_tokens": (usage.get("input_tokens_details") or {}).get("cached_tokens", 0)},
        "completion_tokens_details": {
            "reasoning_tokens": (usage.get("output_tokens_details") or {}).get("reasoning_tokens", 0)
        },
    }


class EventChunks:
    """Native events in, canonical chunks out: each event kept whole, with the chat delta it amounts to."""

    def __init__(self, redactor: Redactor = NO_SECRETS) -> None:
        self._redactor = redactor
        self._calls: dict[str, int] = {}
        """Output item id → the chat tool call index it became."""

    def chunk(self, event: Mapping[str, Any]) -> Chunk:
        kind = event.get("type")
        if kind in FAILING_EVENTS:
            raise _failure(event, self._redactor)
        choice: dict[str, Any] = {"index": 0, "delta": self._delta(event)}
        chunk: Chunk = {"object": "chat.completion.chunk", EVENT: dict(event), "choices": [choice]}
        if kind in ENDING_EVENTS:
            response = event.get("response") or {}
            output = list(response.get("output") or [])
            answer = assistant_message(output)
            choice["delta"] = {ANSWER: answer}
            choice["finish_reason"] = finish_reason(response, answer)
            usage = chat_usage(response.get("usage"))
            if usage is not None:
                chunk["usage"] = usage
        return chunk

    def _delta(self, event: Mapping[str, Any]) -> dict[str, Any]:
        kind = event.get("type")
        if kind == "response.output_text.delta":
            return {"content": str(event.get("delta") or "")}
        item = event.get("item") or {}
        if kind == "response.output_item.added" and item.get("type") in ("function_call", "custom_tool_call"):
            started = self._calls.setdefault(str(item.get("id")), len(self._calls))
            function = {"name": qualified_name(item), "arguments": ""}
            call = {"index": started, "id": item.get("call_id"), "type": "function", "function": function}
            return {"tool_calls": [call]}
        if kind == "response.function_call_arguments.delta":
            return self._arguments(str(event.get("item_id")), str(event.get("delta") or ""))
        if kind == "response.output_item.done" and item.get("type") == "custom_tool_call":
            return self._arguments(str(item.get("id")), json.dumps({CUSTOM_INPUT: item.get("input", "")}))
        return {}

    def _arguments(self, item_id: str, fragment: str) -> dict[str, Any]:
        index = self._calls.get(item_id)
        if index is None:
            return {}
        return {"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}


def _failure(event: Mapping[str, Any], redactor: Redactor) -> UpstreamError:
    """`response.failed` (or an `error` event) as the failure the relay journals and the door renders."""
    error = (event.get("response") or {}).get("error") or event
    code = error.get("code")
    return UpstreamError(
        redactor.redact(str(error.get("message") or "The upstream response failed.")),
        status=502,
        error_type="upstream_error",
        code=None if code is None else str(code),
    )
