"""Server-sent events as OpenAI frames them: `data: <json>` blocks, `data: [DONE]` last.

A failure after the first byte is a `data: {"error": ...}` event: the status line is gone by then, and the
OpenAI SDK raises `APIError` on such an event.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

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
