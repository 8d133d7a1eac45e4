"""The `Upstream` the proxy runs with: each call routed to the client that speaks to its model.

A request in the client's own API (`NativeRequest`: Responses, Messages) goes to a model configured with the same
`api` in that API, through its client (`ResponsesClient`, `AnthropicClient`), which puts the working context in
that API's form; every other call goes as chat completions through LiteLLM (`LiteLLMUpstream`). The pipeline
never builds a provider's body: it hands over the working context and the request as it came.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from proxy.canonical.types import Chunk, Message, NativeRequest, RawList
from proxy.config.schema import DEFAULT_MAX_ANSWER_CHARS, ModelEntry, UpstreamConfig
from proxy.upstream.anthropic_client import AnthropicClient
from proxy.upstream.litellm_client import LiteLLMUpstream
from proxy.upstream.native_client import NativeClient
from proxy.upstream.redaction import NO_SECRETS, Redactor
from proxy.upstream.responses_client import ResponsesClient


class UpstreamRouter:
    def __init__(
        self,
        config: UpstreamConfig,
        models: tuple[ModelEntry, ...],
        redactor: Redactor = NO_SECRETS,
        max_answer_chars: int = DEFAULT_MAX_ANSWER_CHARS,
    ) -> None:
        self.chat = LiteLLMUpstream(config, models, redactor, max_answer_chars)
        self._natives: dict[str, NativeClient] = {
            "responses": ResponsesClient(config, redactor, max_answer_chars),
            "messages": AnthropicClient(config, redactor, max_answer_chars),
        }
        """By the API a model entry's `api` names."""

    async def complete(
        self,
        entry: ModelEntry,
        messages: list[Message],
        params: Mapping[str, Any],
        native: NativeRequest | None = None,
        raw: RawList | None = None,
    ) -> Chunk:
        client = self._native(entry, native)
        if client is None or native is None:
            return await self.chat.complete(entry, messages, params, raw)
        return await client.create(entry, native, messages)

    async def open_stream(
        self,
        entry: ModelEntry,
        messages: list[Message],
        params: Mapping[str, Any],
        native: NativeRequest | None = None,
        raw: RawList | None = None,
    ) -> AsyncIterator[Chunk]:
        client = self._native(entry, native)
        if client is None or native is None:
            return await self.chat.open_stream(entry, messages, params, raw)
        return await client.open_stream(entry, native, messages)

    def model_info(self, model: str) -> Mapping[str, Any] | None:
        return self.chat.model_info(model)

    def warn_missing_keys(self) -> None:
        self.chat.warn_missing_keys()

    async def aclose(self) -> None:
        for client in self._natives.values():
            await client.aclose()
        await self.chat.aclose()

    def _native(self, entry: ModelEntry, native: NativeRequest | None) -> NativeClient | None:
        """The client of the request's own API, when its model speaks it (`models[].api`)."""
        if native is None or entry.api != native.api:
            return None
        return self._natives.get(native.api)
