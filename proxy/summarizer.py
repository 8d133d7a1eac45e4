"""Writing one summary: the summarizer model through LiteLLM, or the extractive fallback when it fails.

A summary is needed in the middle of a user's request, so a broken, slow or empty summarizer must never fail
that request: any upstream error becomes a deterministic extractive summary marked `fallback`, which is
rewritten by the LLM at a later compaction.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.compaction import extractive_summary, summarizer_messages
from proxy.config import ModelEntry
from proxy.errors import UpstreamError
from proxy.forward import Upstream

log = logging.getLogger(__name__)

FALLBACK_MODEL = "extractive"
OUTPUT_ALLOWANCE = 2
"""The summarizer may write up to twice its target before it is cut off: targets are estimates."""
MIN_OUTPUT_TOKENS = 256


@dataclass(frozen=True)
class WrittenSummary:
    content: str
    generated_by: str
    """'llm' or 'fallback'."""
    model: str


class Summarizer:
    def __init__(self, upstream: Upstream, entry: ModelEntry | None) -> None:
        self._upstream = upstream
        self._entry = entry

    def entry_for(self, request_entry: ModelEntry) -> ModelEntry:
        """The configured summarizer, or else the request's own model."""
        return self._entry or request_entry

    async def summarize(
        self, messages: Sequence[Mapping[str, Any]], target: int, request_entry: ModelEntry
    ) -> WrittenSummary:
        entry = self.entry_for(request_entry)
        params = {"max_tokens": max(MIN_OUTPUT_TOKENS, OUTPUT_ALLOWANCE * target), "temperature": 0}
        try:
            response = await self._upstream.complete(entry, summarizer_messages(messages, target), params)
            content = _answer_text(response)
            if content:
                return WrittenSummary(content, "llm", entry.name)
            reason = "it returned an empty answer"
        except UpstreamError as exc:
            reason = f"{exc.status} {exc.message}"
        log.warning("summarizer %s failed (%s); using the extractive fallback", entry.name, reason)
        return WrittenSummary(extractive_summary(messages, target), "fallback", FALLBACK_MODEL)


def _answer_text(response: Mapping[str, Any]) -> str:
    choices = response.get("choices") or []
    if not choices:
        return ""
    message = choices[0].get("message") or {}
    content = message.get("content")
    return content.strip() if isinstance(content, str) else ""
