"""Writing one summary: the summarizer model through LiteLLM, or the extractive fallback when it fails.

A summary is needed in the middle of a user's request, so a broken, slow or empty summarizer must never fail
that request: any upstream error becomes a deterministic extractive summary marked `fallback`, which a later
compaction merges into a summary by the LLM. How long and how often a request waits for the summarizer, and
whether its summary is short enough to use, is the compactor's decision.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.budget.budgets import Budgets
from proxy.compaction.breaker import SummarizerBreaker
from proxy.compaction.extractive import extractive_summary
from proxy.compaction.summarizer_calls import SummarizerCalls
from proxy.compaction.summary_text import summarizer_messages
from proxy.config.models import ModelEntry
from proxy.config.schema import ContextConfig
from proxy.cost import TokenCost
from proxy.errors import UpstreamError
from proxy.observability.metrics import Metrics
from proxy.offload import compute
from proxy.tokens import rough_size
from proxy.upstream.protocol import Upstream, UpstreamCall

log = logging.getLogger(__name__)

FALLBACK_MODEL = "extractive"
OUTPUT_ALLOWANCE = 2
"""The summarizer may write up to twice its target before it is cut off: targets are estimates."""
MIN_OUTPUT_TOKENS = 256
PROMPT_OVERHEAD = 256
"""Tokens of the summarizer's instruction and transcript labels, beyond the messages it reads."""
EPISODE_INSTRUCTION = """\
You summarize completed earlier episodes of a conversation between a user and an AI assistant (with tool \
calls) so that the assistant can continue from the summary alone. An episode is one user goal and everything \
done for it until the next user message.
For each episode, in order, in at most about {target} tokens in all: the goal; what was done (files, commands, \
identifiers, exact values); the outcome and any decision with its reason; what was left open. Keep every \
key=value fact, path, number and error message exactly. Earlier summaries in the transcript are episodes \
already summarized: merge them in order. No preamble, do not address the user, do not invent anything."""
"""The `goal-batch` strategy's instruction: ranges of whole user turns, each summarized as one episode."""


@dataclass(frozen=True)
class WrittenSummary:
    content: str
    generated_by: str
    """'llm' or 'fallback'."""
    model: str


class Summarizer:
    def __init__(
        self,
        upstream: Upstream,
        entry: ModelEntry | None,
        budgets: Budgets,
        config: ContextConfig,
        metrics: Metrics | None = None,
        calls: SummarizerCalls | None = None,
        breaker: SummarizerBreaker | None = None,
    ) -> None:
        self._upstream = upstream
        self._breaker = breaker or SummarizerBreaker(config.summarizer_failures, config.summarizer_cooldown_s)
        self._calls = calls
        self._entry = entry
        self._budgets = budgets
        self._config = config
        self._metrics = Metrics() if metrics is None else metrics

    def entry_for(self, request_entry: ModelEntry) -> ModelEntry:
        """The configured summarizer, or else the request's own model."""
        return self._entry or request_entry

    def available(self, request_entry: ModelEntry) -> bool:
        """Whether the summarizer may be called now: not while its breaker is open (`breaker`)."""
        return not self._breaker.is_open(self.entry_for(request_entry).name)

    def timed_out(self, request_entry: ModelEntry) -> None:
        """A call the request stopped waiting for: the summarizer is skipped for a cool-down from now."""
        name = self.entry_for(request_entry).name
        self._breaker.failed(name, timed_out=True)
        self._log_opened(name)

    def input_capacity(self, request_entry: ModelEntry) -> int:
        """The most tokens one summarization may read, so that the call fits the summarizer's own window.

        Its output (`OUTPUT_ALLOWANCE` times a target of `target_ratio` of what it reads, at least
        `MIN_OUTPUT_TOKENS`) counts against the same window: what it may read shrinks with what it may write.
        """
        room = self._budgets.budget(self.entry_for(request_entry), requested_output=0).input_budget - PROMPT_OVERHEAD
        per_token_read = 1 + OUTPUT_ALLOWANCE * self._config.target_ratio
        return max(1, min(math.floor(room / per_token_read), room - MIN_OUTPUT_TOKENS))

    async def summarize(
        self,
        messages: Sequence[Mapping[str, Any]],
        target: int,
        request_entry: ModelEntry,
        instruction: str | None = None,
        session: tuple[str, str] | None = None,
    ) -> WrittenSummary:
        """`instruction` (with a `{target}` field) replaces the default one: a strategy's own way to summarize.
        `session` (tenant, session id): whose cost the call is, in the summarizer's ledger."""
        entry = self.entry_for(request_entry)
        max_tokens = min(max(MIN_OUTPUT_TOKENS, OUTPUT_ALLOWANCE * target), self._budgets.limits(entry).max_output)
        params = {"max_tokens": max_tokens, "temperature": 0}
        size = sum(map(rough_size, messages))  # the prompt and the fallback count and cut every line of the range
        if self._breaker.is_open(entry.name):
            return WrittenSummary(await compute(size, extractive_summary, messages, target), "fallback", FALLBACK_MODEL)
        prompt = await compute(size, summarizer_messages, messages, target)
        if instruction is not None:
            prompt[0] = {"role": "system", "content": instruction.format(target=target)}
        started = time.monotonic()
        try:
            response = await self._upstream.complete(UpstreamCall(entry, prompt, params))
            await self._account(entry.name, response, session)
            content = _answer_text(response)
            if content:
                self._metrics.summarizer_seconds.labels("ok").observe(time.monotonic() - started)
                self._breaker.succeeded(entry.name)
                return WrittenSummary(content, "llm", entry.name)
            reason = "it returned an empty answer"
        except UpstreamError as exc:
            reason = f"{exc.status} {exc.message}"
        self._metrics.summarizer_seconds.labels("error").observe(time.monotonic() - started)
        log.warning("summarizer %s failed (%s); using the extractive fallback", entry.name, reason)
        if self._breaker.failed(entry.name):
            self._log_opened(entry.name)
        return WrittenSummary(await compute(size, extractive_summary, messages, target), "fallback", FALLBACK_MODEL)

    def _log_opened(self, name: str) -> None:
        log.warning(
            "summarizer %s is skipped for %.0f s after failing (context.summarizer_failures=%d): summaries are "
            "extractive meanwhile",
            name,
            self._config.summarizer_cooldown_s,
            self._config.summarizer_failures,
        )

    async def _account(self, model: str, response: Mapping[str, Any], session: tuple[str, str] | None) -> None:
        """The call's tokens as the summarizer reported them: to `/metrics`, and to the session's ledger."""
        usage = response.get("usage")
        cost = TokenCost.from_usage(usage if isinstance(usage, Mapping) else None)
        self._metrics.summarizer_usage(model, cost)
        if session is not None and self._calls is not None:
            await self._calls.record(*session, model, cost)


def _answer_text(response: Mapping[str, Any]) -> str:
    choices = response.get("choices") or []
    if not choices:
        return ""
    message = choices[0].get("message") or {}
    content = message.get("content")
    return content.strip() if isinstance(content, str) else ""
