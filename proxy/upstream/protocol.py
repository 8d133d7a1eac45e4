"""The seam at the upstream: what the pipeline and the summarizer call, and what unit tests replace.

Two calls, both in the canonical form (`proxy.types`): a non-stream completion, and a stream whose first byte
has been received; and the same two for an upstream that speaks OpenAI's Responses API natively (models with
`api: responses`), which take a Responses body and answer canonical chunks that carry its events whole. A
failure is always an `UpstreamError` carrying the upstream's status — raised by `open_stream` when the upstream
refuses before its first byte (a status the client can still receive), and by the returned iterator once the
stream has started. `proxy.upstream.litellm_client` is the implementation; tests plug in an in-process fake
(`tests/support/scripted_upstream.py`) the way httpx tests plug in `MockTransport`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from proxy.config import ModelEntry
from proxy.types import Chunk, Message


class Upstream(Protocol):
    async def complete(self, entry: ModelEntry, messages: list[Message], params: Mapping[str, Any]) -> Chunk:
        """A `chat.completion` for `messages`; `params` are the client's other fields, forwarded as sent."""
        ...

    async def open_stream(
        self, entry: ModelEntry, messages: list[Message], params: Mapping[str, Any]
    ) -> AsyncIterator[Chunk]:
        """Start a stream of `chat.completion.chunk` objects; returns once the upstream has accepted it."""
        ...

    async def respond(self, entry: ModelEntry, body: Mapping[str, Any]) -> Chunk:
        """A Responses-native call: a `chat.completion` with the upstream's `response` inside."""
        ...

    async def open_response_stream(self, entry: ModelEntry, body: Mapping[str, Any]) -> AsyncIterator[Chunk]:
        """A Responses-native stream: chunks that each carry one upstream event under `event`."""
        ...
