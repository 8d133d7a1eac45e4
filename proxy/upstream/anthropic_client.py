"""Anthropic's Messages API itself, for models configured `api: messages`: the Messages door's native route.

Like the Responses route (`proxy.upstream.responses_client`), one POST of JSON and its SSE answer over httpx, so
the blocks reach the model as the client sent them (thinking with its signature, `cache_control` where it
stands) and its events come back whole: every event is kept in the canonical chunk the journal stores
(`chunk["event"]`), beside the chat delta it amounts to, and the last chunk carries the whole answer (its blocks,
assembled from the deltas, as `proxy.blocks` maps them), which becomes the history node the client will echo.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from proxy.blocks import assistant_from_blocks
from proxy.config import ModelEntry, UpstreamConfig
from proxy.conversation import NATIVE_HEADERS
from proxy.errors import UpstreamError
from proxy.journal.assembly import ANSWER
from proxy.types import Chunk
from proxy.upstream.failures import UpstreamRefusal, upstream_error
from proxy.upstream.redaction import NO_SECRETS, Redactor
from proxy.upstream.responses_client import NATIVE_EVENT, NATIVE_RESPONSE, sse_events

ANTHROPIC_BASE = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
FINISH_REASONS = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length", "stop_sequence": "stop"}


class AnthropicClient:
    def __init__(self, config: UpstreamConfig, redactor: Redactor = NO_SECRETS) -> None:
        self._config = config
        self._redactor = redactor
        self._http: httpx.AsyncClient | None = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=httpx.Timeout(self._config.timeout_s))
        return self._http

    async def aclose(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def create(self, entry: ModelEntry, body: Mapping[str, Any]) -> Chunk:
        try:
            answer = await self._client().post(
                _url(entry), json=_body(entry, body, False), headers=_headers(entry, body)
            )
        except httpx.HTTPError as exc:
            raise self._error(entry, exc) from exc
        if answer.status_code >= 400:
            raise self._error(entry, UpstreamRefusal(answer.status_code, answer.text))
        try:
            return completion(answer.json())
        except ValueError as exc:
            raise self._error(entry, exc) from exc

    async def open_stream(self, entry: ModelEntry, body: Mapping[str, Any]) -> AsyncIterator[Chunk]:
        client = self._client()
        request = client.build_request(
            "POST", _url(entry), json=_body(entry, body, True), headers=_headers(entry, body)
        )
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
        converter = BlockChunks(self._redactor)
        try:
            async for event in sse_events(answer):
                yield converter.chunk(event)
                if event.get("type") == "message_stop":
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
    base = (entry.api_base or ANTHROPIC_BASE).rstrip("/")
    return base + ("/messages" if base.endswith("/v1") else "/v1/messages")


def _headers(entry: ModelEntry, body: Mapping[str, Any]) -> dict[str, str]:
    """The API's own headers: its version, the model entry's key, and the client's betas (`anthropic-beta`),
    which the fields it sent may need (`context_management`, interleaved thinking)."""
    headers = {"anthropic-version": ANTHROPIC_VERSION, **(body.get(NATIVE_HEADERS) or {})}
    key = entry.api_key or os.environ.get("ANTHROPIC_API_KEY")
    if key:
        headers["x-api-key"] = key
    return headers


def _body(entry: ModelEntry, body: Mapping[str, Any], stream: bool) -> dict[str, Any]:
    model = entry.model.split("/", 1)[1] if entry.model.startswith("anthropic/") else entry.model
    sent = {key: value for key, value in body.items() if key != NATIVE_HEADERS}
    return {**sent, "model": model, "stream": stream}


def chat_usage(usage: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not usage:
        return None
    prompt = int(usage.get("input_tokens") or 0)
    cached = int(usage.get("cache_read_input_tokens") or 0)
    created = int(usage.get("cache_creation_input_tokens") or 0)
    completion_tokens = int(usage.get("output_tokens") or 0)
    return {
        "prompt_tokens": prompt + cached + created,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt + cached + created + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached},
    }


def completion(message: Mapping[str, Any]) -> Chunk:
    """A non-stream `message` as the canonical chat.completion (the message itself under `response`)."""
    answer = assistant_from_blocks(list(message.get("content") or []))
    return {
        "object": "chat.completion",
        "id": message.get("id"),
        "model": message.get("model"),
        "choices": [
            {
                "index": 0,
                "message": {**answer, ANSWER: answer},
                "finish_reason": FINISH_REASONS.get(str(message.get("stop_reason")), "stop"),
            }
        ],
        "usage": chat_usage(message.get("usage")),
        NATIVE_RESPONSE: dict(message),
    }


class BlockChunks:
    """Anthropic events in, canonical chunks out: each event kept whole, the answer's blocks assembled."""

    def __init__(self, redactor: Redactor = NO_SECRETS) -> None:
        self._redactor = redactor
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, list[str]] = {}
        self._calls: dict[int, int] = {}
        self._usage: dict[str, Any] = {}
        self._stop: str | None = None

    def chunk(self, event: Mapping[str, Any]) -> Chunk:
        kind = event.get("type")
        if kind == "error":
            error = event.get("error") or {}
            raise UpstreamError(
                self._redactor.redact(str(error.get("message") or "The upstream failed.")),
                status=529 if error.get("type") == "overloaded_error" else 502,
                error_type=str(error.get("type") or "api_error"),
            )
        choice: dict[str, Any] = {"index": 0, "delta": self._delta(event)}
        chunk: Chunk = {"object": "chat.completion.chunk", NATIVE_EVENT: dict(event), "choices": [choice]}
        if kind == "message_stop":
            blocks = [self._blocks[index] for index in sorted(self._blocks)]
            choice["delta"] = {ANSWER: assistant_from_blocks(blocks)}
            choice["finish_reason"] = FINISH_REASONS.get(self._stop or "end_turn", "stop")
            usage = chat_usage(self._usage)
            if usage is not None:
                chunk["usage"] = usage
        return chunk

    def _delta(self, event: Mapping[str, Any]) -> dict[str, Any]:
        kind = event.get("type")
        if kind == "message_start":
            self._usage.update((event.get("message") or {}).get("usage") or {})
            return {}
        if kind == "message_delta":
            self._stop = (event.get("delta") or {}).get("stop_reason") or self._stop
            self._usage.update(event.get("usage") or {})
            return {}
        index = event.get("index")
        if not isinstance(index, int):
            return {}
        if kind == "content_block_start":
            started = dict(event.get("content_block") or {})
            self._blocks[index] = started
            if started.get("type") == "tool_use":
                self._json[index] = []
                self._calls[index] = len(self._calls)
                function = {"name": started.get("name"), "arguments": ""}
                call = {"index": self._calls[index], "id": started.get("id"), "type": "function", "function": function}
                return {"tool_calls": [call]}
            return {}
        block = self._blocks.get(index)
        if block is None:
            return {}
        if kind == "content_block_stop" and index in self._json:
            text = "".join(self._json.pop(index))
            block["input"] = json.loads(text) if text else {}
            return {}
        delta = event.get("delta") or {}
        change = delta.get("type")
        if change == "text_delta":
            block["text"] = block.get("text", "") + str(delta.get("text", ""))
            return {"content": str(delta.get("text", ""))}
        if change == "thinking_delta":
            block["thinking"] = block.get("thinking", "") + str(delta.get("thinking", ""))
        elif change == "signature_delta":
            block["signature"] = delta.get("signature")
        elif change == "input_json_delta" and index in self._json:
            fragment = str(delta.get("partial_json", ""))
            self._json[index].append(fragment)
            return {"tool_calls": [{"index": self._calls[index], "function": {"arguments": fragment}}]}
        return {}
