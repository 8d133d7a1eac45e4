"""Server-sent events: OpenAI's framing (`data: <json>` blocks, `data: [DONE]` last), named events (Responses,
Messages), and the responses that carry them.

A failure after the first byte is an event of the door's API (on chat, `data: {"error": ...}`, which the OpenAI
SDK raises as `APIError`): the status line is gone by then.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from proxy.canonical.answers import StreamGroups

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
SSE_MEDIA_TYPE = "text/event-stream"


def sse_event(payload: Mapping[str, Any]) -> bytes:
    return sse_data(json.dumps(payload, ensure_ascii=False, separators=(",", ":")))


def sse_data(text: str) -> bytes:
    """One event from JSON text already encoded (the journal's stored copy of a chunk)."""
    return b"data: " + text.encode("utf-8") + b"\n\n"


def sse_named(kind: str, payload: Mapping[str, Any]) -> bytes:
    """An event with its type on an `event:` line, as the Responses API frames its stream."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"event: " + kind.encode() + b"\ndata: " + data.encode("utf-8") + b"\n\n"


def sse_response(events: AsyncIterator[bytes], headers: Mapping[str, str]) -> StreamingResponse:
    """A stream of events the proxy already has (an Idempotency-Key replay)."""
    return StreamingResponse(events, media_type=SSE_MEDIA_TYPE, headers={**SSE_HEADERS, **headers})


class RelayedStream(StreamingResponse):
    """SSE rendered from the relay's groups (`body` iterates them). However the response ends — sent whole,
    client gone before or during the body — the groups are closed, which tells the relay whether its consumer
    left (`finish_on_disconnect`)."""

    def __init__(
        self,
        groups: StreamGroups,
        body: AsyncIterator[bytes],
        headers: Mapping[str, str],
        media_type: str = SSE_MEDIA_TYPE,
    ) -> None:
        """`media_type`: another framing of a live answer (Gemini's stream as one JSON array)."""
        super().__init__(body, media_type=media_type, headers={**SSE_HEADERS, **headers})
        self._groups = groups

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._groups.aclose()
