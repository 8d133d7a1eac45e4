"""Event streams rendered from journaled chunks: what the Responses and Messages doors share.

Both doors name each SSE event (`event: <type>`), and both answer either from a chat upstream — their events
rendered from the chat chunks the journal holds, by a `ChunkRenderer` of their format — or from an upstream that
speaks their own API, whose events ride whole inside the journaled chunks (`EVENT`) and are relayed as
they came. Which one a stream is shows in its first chunk. A replay (Idempotency-Key) goes the same way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from proxy.canonical.answers import StreamGroups
from proxy.canonical.types import Chunk
from proxy.canonical.vocabulary import EVENT
from proxy.doors.sse import sse_named

Event = dict[str, Any]


class ChunkRenderer:
    """Chat chunks in, one format's events out, fed in order. A format fills in the hooks."""

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.usage: Mapping[str, Any] | None = None

    def start(self) -> list[Event]:
        raise NotImplementedError

    def finish(self) -> list[Event]:
        raise NotImplementedError

    def fail(self, exc: BaseException) -> list[Event]:
        """The events that end a stream whose relay failed after it started."""
        raise NotImplementedError

    def native(self, event: Mapping[str, Any]) -> Event:
        """An upstream's own event as the client gets it (under the proxy's ids)."""
        raise NotImplementedError

    def text(self, content: str) -> list[Event]:
        raise NotImplementedError

    def call(self, position: int, delta: Mapping[str, Any]) -> list[Event]:
        raise NotImplementedError

    def feed(self, chunks: Iterable[Chunk]) -> list[Event]:
        events: list[Event] = []
        for chunk in chunks:
            usage = chunk.get("usage")
            if isinstance(usage, dict):
                self.usage = usage
            for choice in chunk.get("choices") or ():
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta") or choice.get("message") or {}
                content = delta.get("content")
                if isinstance(content, str) and content:
                    events.extend(self.text(content))
                for position, call in enumerate(delta.get("tool_calls") or ()):
                    events.extend(self.call(position, call))
                if choice.get("finish_reason"):
                    self.finish_reason = choice["finish_reason"]
        return events


def frames(events: Iterable[Event]) -> bytes:
    return b"".join(sse_named(event["type"], event) for event in events)


def _natives(renderer: ChunkRenderer, chunks: Iterable[Chunk]) -> list[Event]:
    return [renderer.native(chunk[EVENT]) for chunk in chunks if isinstance(chunk.get(EVENT), dict)]


async def relayed(renderer: ChunkRenderer, groups: StreamGroups) -> AsyncIterator[bytes]:
    """A live answer's events as SSE, each group's as it becomes durable."""
    async for events in relayed_events(renderer, groups):
        if events:
            yield frames(events)


async def relayed_events(renderer: ChunkRenderer, groups: StreamGroups) -> AsyncIterator[list[Event]]:
    """A live answer's events, each group's as it becomes durable; a failure after the start ends them
    (`ChunkRenderer.fail`)."""
    native: bool | None = None
    try:
        async for group in groups:
            chunks = [item.chunk for item in group]
            if native is None:
                native = bool(chunks) and EVENT in chunks[0]
                if not native:
                    yield renderer.start()
            yield _natives(renderer, chunks) if native else renderer.feed(chunks)
    except Exception as exc:
        yield [*(renderer.start() if native is None else []), *renderer.fail(exc)]
        return
    if not native:
        yield [*(renderer.start() if native is None else []), *renderer.finish()]


async def replayed(renderer: ChunkRenderer, chunks: list[Chunk]) -> AsyncIterator[bytes]:
    """A journaled answer's events again as SSE, all at once."""
    yield frames(replayed_events(renderer, chunks))


def replayed_events(renderer: ChunkRenderer, chunks: list[Chunk]) -> list[Event]:
    """A journaled answer's events again."""
    if chunks and EVENT in chunks[0]:
        return _natives(renderer, chunks)
    return [*renderer.start(), *renderer.feed(chunks), *renderer.finish()]
