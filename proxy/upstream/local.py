"""An answer the proxy writes itself, delivered the way an upstream's is: journaled, relayed and rendered by every
door like any other (a client's compaction request, answered from the proxy's own history).

Its usage is what an upstream billed for it: nothing. Every place that shows cost reads the step's usage
(`proxy.cost`: the session's cost view, `/metrics`, X-Context-Cached-Tokens), so a local answer reporting the
conversation it stands for as its prompt would count it as sent and uncached, once per client summary request."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from proxy.canonical.types import Chunk
from proxy.config.models import ModelEntry
from proxy.upstream.protocol import UpstreamCall

LOCAL_ID_PREFIX = "chatcmpl-proxy-"


class LocalAnswer:
    """`proxy.upstream.protocol.Upstream` for one fixed text: no model is called."""

    def __init__(self, text: str) -> None:
        self._text = text
        self._created = int(time.time())

    async def complete(self, call: UpstreamCall) -> Chunk:
        return {
            "id": f"{LOCAL_ID_PREFIX}{self._created}",
            "object": "chat.completion",
            "created": self._created,
            "model": call.entry.name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self._text}, "finish_reason": "stop"}],
            "usage": self._usage(),
        }

    async def open_stream(self, call: UpstreamCall) -> AsyncIterator[Chunk]:
        return self._chunks(call.entry)

    async def _chunks(self, entry: ModelEntry) -> AsyncIterator[Chunk]:
        common = {"id": f"{LOCAL_ID_PREFIX}{self._created}", "object": "chat.completion.chunk", "model": entry.name}
        created = {"created": self._created}
        delta = {"role": "assistant", "content": self._text}
        yield {**common, **created, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        yield {**common, **created, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        yield {**common, **created, "choices": [], "usage": self._usage()}

    @staticmethod
    def _usage() -> dict[str, int]:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
