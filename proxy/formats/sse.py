"""Server-sent events, both ways: the framing the doors write (OpenAI's `data: <json>` blocks and `data: [DONE]`
last; named events for Responses and Messages) and the one decoder the upstream clients read with.

It lies below the doors and the upstream clients (as `proxy.formats`' other codecs do) so that both use the same
framing; the responses that carry the doors' events are `proxy.doors.sse`. The decoder takes lines (httpx's
`aiter_lines`) and yields one typed `SSEEvent` per event: its `data:` lines joined, and its `event:` name.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

SSE_DONE = b"data: [DONE]\n\n"
DONE = "[DONE]"
"""The data of OpenAI's last event."""


def sse_event(payload: Mapping[str, Any]) -> bytes:
    return sse_data(json.dumps(payload, ensure_ascii=False, separators=(",", ":")))


def sse_data(text: str) -> bytes:
    """One event from JSON text already encoded (the journal's stored copy of a chunk)."""
    return b"data: " + text.encode("utf-8") + b"\n\n"


def sse_named(kind: str, payload: Mapping[str, Any]) -> bytes:
    """An event with its type on an `event:` line, as the Responses API frames its stream."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return b"event: " + kind.encode() + b"\ndata: " + data.encode("utf-8") + b"\n\n"


@dataclass(slots=True)
class SSEEvent:
    """One event as it arrived: what a client reads it for is its data (JSON, or `[DONE]`). Not frozen: one is made
    per streamed chunk on the hot path, and a frozen one is made in nearly three times as long."""

    data: str
    """Its `data:` lines, joined by newlines."""
    event: str | None = None
    """Its `event:` line (Responses and Messages repeat the JSON's own `type` there), if it had one."""

    def json(self) -> Any:
        return json.loads(self.data)


async def sse_events(lines: AsyncIterable[str]) -> AsyncIterator[SSEEvent]:
    """The events of a stream of lines: each ends at a blank line, or with the stream. An event with no data
    (a comment, a lone `event:` line) is none; a line of another field (`id:`, `retry:`) is not read."""
    data: list[str] = []
    event: str | None = None
    async for line in lines:
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif not line:
            if data:
                yield SSEEvent("\n".join(data), event)
                data = []
            event = None
        elif line.startswith("event:"):
            event = line[6:].strip()
    if data:
        yield SSEEvent("\n".join(data), event)
