"""The seam at the upstream: what the pipeline and the summarizer call, and what unit tests replace.

Two calls, both in the canonical form (`proxy.canonical.types`): a non-stream completion, and a stream whose first byte
has been received. `native` is the request in the client's own API when it came through a native door: a model
that speaks that API gets it in that API, with the working context in its form, and answers canonical chunks
that carry its events whole (`proxy.canonical.vocabulary.EVENT`). A failure is always an `UpstreamError` carrying the
upstream's status — raised by `open_stream` when the upstream refuses before its first byte (a status the client
can still receive), and by the returned iterator once the stream has started. `proxy.upstream.router` is the
implementation; tests plug in an in-process fake (`tests/support/scripted_upstream.py`) the way httpx tests plug
in `MockTransport`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from proxy.canonical.types import Chunk, Message, NativeRequest, RawList
from proxy.config.schema import ModelEntry


class Upstream(Protocol):
    async def complete(
        self,
        entry: ModelEntry,
        messages: list[Message],
        params: Mapping[str, Any],
        native: NativeRequest | None = None,
        raw: RawList | None = None,
    ) -> Chunk:
        """A `chat.completion` for `messages`; `params` are the client's other fields, forwarded as sent. `raw`:
        the client's own bytes of messages it re-sends as they were."""
        ...

    async def open_stream(
        self,
        entry: ModelEntry,
        messages: list[Message],
        params: Mapping[str, Any],
        native: NativeRequest | None = None,
        raw: RawList | None = None,
    ) -> AsyncIterator[Chunk]:
        """Start a stream of `chat.completion.chunk` objects; returns once the upstream has accepted it."""
        ...
