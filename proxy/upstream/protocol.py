"""The seam at the upstream: what the pipeline and the summarizer call, and what unit tests replace.

Two calls, both in the canonical form (`proxy.canonical.types`), each taking one `UpstreamCall` (as httpx's
transport takes one request: a new need widens that dataclass, not every implementation's signature): a non-stream
completion, and a stream whose first byte has been received. `UpstreamCall.native` is the request in the client's
own API when it came through a native door: a model that speaks that API gets it in that API, with the working
context in its form, and answers canonical chunks that carry its events whole (`proxy.canonical.vocabulary.EVENT`).
A failure is always an `UpstreamError` carrying the upstream's status — raised by `open_stream` when the upstream
refuses before its first byte (a status the client can still receive), and by the returned iterator once the
stream has started. `proxy.upstream.router` is the implementation (its chat and native clients each implement the
same two calls); tests plug in an in-process fake (`tests/support/scripted_upstream.py`) the way httpx tests
plug in `MockTransport`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.canonical.types import Chunk, Message, NativeRequest, RawList
from proxy.config.models import ModelEntry


@dataclass(frozen=True)
class UpstreamCall:
    """One call to a model: everything an upstream is given, in one value."""

    entry: ModelEntry
    """The model entry called (its `api` says which client speaks to it)."""
    messages: list[Message]
    """The working context, in the canonical form."""
    params: Mapping[str, Any]
    """The client's other fields, forwarded as sent."""
    native: NativeRequest | None = None
    """The request in the client's own API, when it came through a native door."""
    raw: RawList | None = None
    """The client's own bytes of messages it re-sends as they were (`proxy.upstream.json_body`)."""


class Upstream(Protocol):
    async def complete(self, call: UpstreamCall) -> Chunk:
        """A `chat.completion` for the call."""
        ...

    async def open_stream(self, call: UpstreamCall) -> AsyncIterator[Chunk]:
        """Start a stream of `chat.completion.chunk` objects; returns once the upstream has accepted it."""
        ...
