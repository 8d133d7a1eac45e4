"""OpenAI's Responses API itself, for models configured `api: responses`: the Responses door's native route.

Why not LiteLLM here: its Responses entry point imports its MCP gateway on every call (`mcp` is not a dependency
of ours), rewrites response ids, fakes streaming for models it does not know and raises on `response.failed`
instead of passing it on (docs/research/responses.md, 1.1-1.4). The route is one POST of JSON to `/responses`
and its SSE answer, so httpx (already a dependency) carries it, and the proxy's own error boundary
(`proxy.upstream.failures`) converts its failures as it does LiteLLM's.

Every upstream event is kept whole in the canonical chunk the journal stores (`chunk["event"]`), beside the chat
delta it amounts to (text, tool call fragments), so the journal, its replays and recovery assemble the answer as
for any stream, and the door relays the events as they came. The closing event carries the output items, which
become the answer's message (`proxy.items`) with its reasoning and ids: what the client will echo next turn.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from proxy.config import ModelEntry, UpstreamConfig
from proxy.errors import UpstreamError
from proxy.items import CUSTOM_INPUT, assistant_message, qualified_name
from proxy.journal.assembly import ANSWER
from proxy.types import Chunk
from proxy.upstream.failures import UpstreamRefusal, upstream_error
from proxy.upstream.redaction import NO_SECRETS, Redactor

OPENAI_BASE = "https://api.openai.com/v1"
NATIVE_EVENT = "event"
"""The key under which a canonical chunk carries the upstream event it came from, whole."""
NATIVE_RESPONSE = "response"
"""The key under which a non-stream answer carries the upstream's `response` object, whole."""
ENDING_EVENTS = frozenset({"response.completed", "response.incomplete"})
FAILING_EVENTS = frozenset({"response.failed", "error"})
_LENGTH_REASONS = frozenset({"max_output_tokens"})


class ResponsesClient:
    def __init__(self, config: UpstreamConfig, redactor: Redactor = NO_SECRETS) -> None:
        self._config = config
        self._redactor = redactor
        self._http: httpx.AsyncClient | None = None

    def _client(self) -> httpx.AsyncClient:
        # Made on first use, inside the event loop that uses it.
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(self._config.timeout_s))
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def create(self, entry: ModelEntry, body: Mapping[str, Any]) -> Chunk:
        """A non-stream call: the canonical chat.completion, the upstream's `response` whole inside it."""
        try:
            answer = await self._client().post(_url(entry), json=_body(entry, body, False), headers=_headers(entry))
        except httpx.HTTPError as exc:
            raise self._error(entry, exc) from exc
        if answer.status_code >= 400:
            raise self._error(entry, UpstreamRefusal(answer.status_code, answer.text))
        try:
            response = answer.json()
        except ValueError as exc:
            raise self._error(entry, exc) from exc
        return completion(response)

    async def open_stream(self, entry: ModelEntry, body: Mapping[str, Any]) -> AsyncIterator[Chunk]:
        """Start a stream; a refusal before its first byte is raised here, with the upstream's status."""
        client = self._client()
        request = client.build_request("POST", _url(entry), json=_body(entry, body, True), headers=_headers(entry))
        try:
            answer = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise self._error(entry, exc) from exc
        if answer.status_code >= 400:
            text = (await answer.aread()).decode("utf-8", "replace")
            await answer.aclose()
            raise self._error(entry, UpstreamRefusal(answer.status_code, text))
        return self._chunks(entry, answer)

    async def _chunks(self, entry: ModelEntry, answer: httpx.Response) -> AsyncIterator[Chunk]:
        converter = EventChunks(self._redactor)
        try:
            async for event in sse_events(answer):
                yield converter.chunk(event)
                if event.get("type") in ENDING_EVENTS:
                    return
        except UpstreamError:
            raise
        except (httpx.HTTPError, ValueError) as exc:
            raise self._error(entry, exc, mid_stream=True) from exc
        finally:
            await answer.aclose()

    def _error(self, entry: ModelEntry, exc: BaseException, mid_stream: bool = False) -> UpstreamError:
        return upstream_error(exc, mid_stream, model=entry.name, redactor=self._redactor)


def _url(entry: ModelEntry) -> str:
    return (entry.api_base or OPENAI_BASE).rstrip("/") + "/responses"


def _headers(entry: ModelEntry) -> dict[str, str]:
    key = entry.api_key or os.environ.get("OPENAI_API_KEY")
    return {"Authorization": f"Bearer {key}"} if key else {}


def _body(entry: ModelEntry, body: Mapping[str, Any], stream: bool) -> dict[str, Any]:
    model = entry.model.split("/", 1)[1] if entry.model.startswith("openai/") else entry.model
    return {**body, "model": model, "stream": stream}


async def sse_events(answer: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """The JSON of each SSE event (its `data:` lines); the `event:` line repeats the JSON's own `type`."""
    data: list[str] = []
    async for line in answer.aiter_lines():
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif not line and data:
            text = "\n".join(data)
            data = []
            if text == "[DONE]":
                return
            event = json.loads(text)
            if isinstance(event, dict):
                yield event
    if data and data != ["[DONE]"]:
        event = json.loads("\n".join(data))
        if isinstance(event, dict):
            yield event


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
        NATIVE_RESPONSE: dict(response),
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
        chunk: Chunk = {"object": "chat.completion.chunk", NATIVE_EVENT: dict(event), "choices": [choice]}
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
