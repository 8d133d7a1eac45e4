"""Anthropic's Messages API itself, for models configured `api: messages`: the Messages door's native route.

The shared plumbing (httpx, SSE, errors) is `proxy.upstream.native_client`. Here: the blocks reach the model as the
client sent them (thinking with its signature, `cache_control` where it stands), each event becomes a canonical
chunk that keeps it whole beside the chat delta it amounts to, and the last chunk carries the whole answer (its
blocks, assembled from the deltas, as `proxy.formats.anthropic_blocks` maps them): the history node the client will
echo.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from proxy.canonical.types import Chunk, JSONObject, Message, NativeRequest
from proxy.canonical.vocabulary import ANSWER, EVENT, RESPONSE
from proxy.config.models import MESSAGES_API, ModelEntry
from proxy.errors import UpstreamError
from proxy.formats.anthropic_blocks import anthropic_request, assistant_from_blocks
from proxy.upstream.native_client import NativeClient, model_id
from proxy.upstream.redaction import NO_SECRETS, Redactor

ANTHROPIC_BASE = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
FINISH_REASONS = {"end_turn": "stop", "tool_use": "tool_calls", "max_tokens": "length", "stop_sequence": "stop"}


class AnthropicClient(NativeClient):
    api = MESSAGES_API
    key_variables = ("ANTHROPIC_API_KEY",)
    ending_events = frozenset({"message_stop"})

    def url(self, entry: ModelEntry) -> str:
        base = (entry.api_base or ANTHROPIC_BASE).rstrip("/")
        return base + ("/messages" if base.endswith("/v1") else "/v1/messages")

    def headers(self, entry: ModelEntry, request: NativeRequest) -> dict[str, str]:
        """The API's own headers: its version, the model entry's key, and the client's betas (`anthropic-beta`),
        which the fields it sent may need (`context_management`, interleaved thinking)."""
        headers = {"anthropic-version": ANTHROPIC_VERSION, **request.headers}
        key = self.key(entry)
        if key:
            headers["x-api-key"] = key
        return headers

    def body(self, entry: ModelEntry, request: NativeRequest, context: list[Message], stream: bool) -> JSONObject:
        system, messages = anthropic_request(context, request.body.get("tools") or ())
        body = {**request.body, **({"system": system} if system else {}), "messages": messages}
        return {**body, "model": model_id(entry, "anthropic"), "stream": stream}

    def completion(self, answer: Mapping[str, Any]) -> Chunk:
        return completion(answer)

    def converter(self) -> BlockChunks:
        return BlockChunks(self._redactor)


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
        "prompt_tokens_details": {"cached_tokens": cached, "cache_write_tokens": created},
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
        RESPONSE: dict(message),
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
        chunk: Chunk = {"object": "chat.completion.chunk", EVENT: dict(event), "choices": [choice]}
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
