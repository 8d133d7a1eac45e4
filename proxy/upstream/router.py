"""The `Upstream` the proxy runs with: each call routed to the client that speaks to its model.

A request in the client's own API (`NativeRequest`: Responses, Messages) goes to a model configured with the same
`api` in that API, through its client (one per API, `proxy.upstream.natives`), which puts the working context in
that API's form; every other call goes as chat completions through LiteLLM (`LiteLLMUpstream`). The pipeline
never builds a provider's body: it hands over the working context and the request as it came.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from proxy.canonical.types import Chunk
from proxy.config.models import ModelEntry
from proxy.config.schema import DEFAULT_MAX_ANSWER_CHARS, UpstreamConfig
from proxy.upstream.litellm_client import LiteLLMUpstream
from proxy.upstream.native_client import NativeClient
from proxy.upstream.natives import NATIVE_CLIENTS
from proxy.upstream.protocol import Upstream, UpstreamCall
from proxy.upstream.redaction import NO_SECRETS, Redactor


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
            client.api: client(config, redactor, max_answer_chars) for client in NATIVE_CLIENTS
        }
        """By the API a model entry's `api` names."""

    async def complete(self, call: UpstreamCall) -> Chunk:
        return await self._client(call).complete(call)

    async def open_stream(self, call: UpstreamCall) -> AsyncIterator[Chunk]:
        return await self._client(call).open_stream(call)

    def model_info(self, model: str) -> Mapping[str, Any] | None:
        return self.chat.model_info(model)

    def warn_missing_keys(self) -> None:
        self.chat.warn_missing_keys()

    async def aclose(self) -> None:
        for client in self._natives.values():
            await client.aclose()
        await self.chat.aclose()

    def _client(self, call: UpstreamCall) -> Upstream:
        """The client of the request's own API when its model speaks it (`models[].api`), else chat."""
        native = call.native
        if native is None or call.entry.api != native.api:
            return self.chat
        return self._natives.get(native.api, self.chat)
