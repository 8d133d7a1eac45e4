"""The last stage: how answers and errors are written to the client.

Server-sent events follow OpenAI's wire format exactly (`data: <chunk json>` blocks, `data: [DONE]` last), and
a failure after the first byte becomes a `data: {"error": …}` event: the status line is gone by then, and the
OpenAI SDK raises `APIError` on such an event. Context headers (`X-Context-*`) are assembled here so stream
and non-stream answers carry the same ones.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.errors import openai_error

SSE_DONE = b"data: [DONE]\n\n"
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sse_event(payload: Mapping[str, Any]) -> bytes:
    return b"data: " + dumps(payload).encode("utf-8") + b"\n\n"


def sse_error(exc: BaseException) -> bytes:
    _status, body, _headers = openai_error(exc)
    return sse_event(body)


@dataclass(frozen=True)
class ContextReport:
    """What the proxy did with the context of one request, as response headers."""

    session_id: str
    prompt_tokens: int
    budget: int
    history_tokens: int
    summaries: int

    def headers(self) -> dict[str, str]:
        return {
            "X-Session-Id": self.session_id,
            "X-Context-Tokens": str(self.prompt_tokens),
            "X-Context-Budget": str(self.budget),
            "X-Context-History-Tokens": str(self.history_tokens),
            "X-Context-Summaries": str(self.summaries),
            "X-Context-Usage": usage_text(self.prompt_tokens, self.budget, self.summaries),
        }


def usage_text(tokens: int, budget: int, summaries: int) -> str:
    """The seeds' compact gauge: `2.1k / 129k (1%)`, `50k / 129k (39%) [2S]`."""
    percent = round(100 * tokens / budget) if budget > 0 else 100
    text = f"{compact_count(tokens)} / {compact_count(budget)} ({percent}%)"
    return f"{text} [{summaries}S]" if summaries else text


def compact_count(tokens: int) -> str:
    if tokens < 1000:
        return str(tokens)
    if tokens < 10_000:
        return f"{tokens / 1000:.1f}k".replace(".0k", "k")
    if tokens < 1_000_000:
        return f"{round(tokens / 1000)}k"
    return f"{tokens / 1_000_000:.1f}M".replace(".0M", "M")
