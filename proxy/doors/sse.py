"""Server-sent events for the doors: the responses that carry them, and the framing (`proxy.formats.sse`, where the
upstream clients' decoder lives beside it), which the doors take from here.

A failure after the first byte is an event of the door's API (on chat, `data: {"error": ...}`, which the OpenAI
SDK raises as `APIError`): the status line is gone by then.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.canonical.answers import StreamGroups
from proxy.formats.sse import SSE_DONE, sse_data, sse_event, sse_named

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_MEDIA_TYPE = "text/event-stream"

__all__ = [
    "SSE_DONE",
    "SSE_HEADERS",
    "SSE_MEDIA_TYPE",
    "RelayedStream",
    "sse_data",
    "sse_event",
    "sse_named",
    "sse_response",
]


def sse_response(events: AsyncIterator[bytes], headers: Mapping[str, str]) -> StreamingResponse:
    """A stream of events the proxy already has (an Idempotency-Key replay)."""
    return StreamingResponse(events, media_type=SSE_MEDIA_TYPE, headers={**SSE_HEADERS, **headers})


class RelayedStream(StreamingResponse):
    """SSE rendered from the relay's groups (`body` iterates them). However the response ends — sent whole,
    client gone before or during the body — the groups are closed, which tells the relay whether its consumer
    left (`finish_on_disconnect`)."""

    def __init__(self, groups: StreamGroups, body: AsyncIterator[bytes], headers: Mapping[str, str]) -> None:
        super().__init__(body, media_type=SSE_MEDIA_TYPE, headers={**SSE_HEADERS, **headers})
        self._groups = groups

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._groups.aclose()
