"""The compaction stage: the working context one request sends upstream, summarizing first when it must.

It runs the pure builder in a loop: the builder either accepts a working context, names one range to
summarize (which is written, stored and fed back in), or says the recent messages alone cannot fit. Because
the builder compacts in big steps (down to `compact_to` of the budget) and existing summaries are reused,
the requests between two compactions send prompts that extend each other (docs/architecture.md, invariant 6).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.compaction.builder import Item, NeedsSummary, Policy, RecentTooLarge, Span, WorkingContext, build
from proxy.compaction.summaries import StoredSummary, Summaries, in_force
from proxy.compaction.summarizer import Summarizer
from proxy.compaction.summary_text import summary_message
from proxy.config import ContextConfig, ModelEntry
from proxy.errors import ContextTooLarge
from proxy.history.messages import StoredMessage
from proxy.tokens import count_message, count_prompt
from proxy.types import Clock, Message

log = logging.getLogger(__name__)

FORCE_RATIO = 1e-9
"""Trigger and target of a forced compaction: nothing fits, so the builder picks the oldest eligible range."""
MAX_ROUNDS = 32
"""Summaries one request may write; each round shrinks the context, so this is never reached in practice."""


@dataclass(frozen=True)
class Prepared:
    """The messages to send upstream and what they cost."""

    messages: list[Message]
    tokens: int
    summaries: int
    """Summaries in the working context."""
    written: int
    """Summaries written by this request."""


@dataclass(frozen=True)
class CompactionRequest:
    """What the compactor needs to know about one request."""

    tenant: str
    session_id: str
    messages: Sequence[Mapping[str, Any]]
    """The client's messages, sent verbatim wherever the working context keeps an original."""
    path: Sequence[StoredMessage]
    """The same messages as stored: path[i] is messages[i], with its token count."""
    entry: ModelEntry
    encoding: str
    budget: int
    preserve_recent: int


class Compactor:
    def __init__(
        self,
        config: ContextConfig,
        summaries: Summaries,
        summarizer: Summarizer,
        clock: Clock = time.monotonic,
    ) -> None:
        self._config = config
        self._summaries = summaries
        self._summarizer = summarizer
        self._clock = clock

    def policy(self, budget: int, preserve_recent: int, summarizer_input: int | None = None) -> Policy:
        """The builder's policy; `summarizer_input` caps what one summarization may read (None: no cap)."""
        return Policy(
            budget=budget,
            preserve_recent=preserve_recent,
            trigger_ratio=self._config.trigger_ratio,
            compact_to=self._config.compact_to,
            target_ratio=self._config.target_ratio,
            max_summary_input=summarizer_input,
        )

    async def prepare(self, request: CompactionRequest) -> Prepared:
        everything = count_prompt(stored.tokens for stored in request.path)
        if everything <= self._config.trigger_ratio * request.budget:
            # The builder's first rule, taken before any summary is read: whole conversations that fit are sent
            # as they are (and a bigger model gets its originals back). This is every request of a short chat.
            return Prepared([dict(message) for message in request.messages], everything, summaries=0, written=0)
        items = [builder_item(stored) for stored in request.path]
        stored = {s.id: s for s in in_force(await self._summaries.on_path(request.tenant, request.path))}
        policy = self.policy(request.budget, request.preserve_recent, self._summarizer.input_capacity(request.entry))
        for written in range(MAX_ROUNDS):
            result = build(items, [s.span() for s in stored.values()], policy, compacting=written > 0)
            if isinstance(result, WorkingContext):
                return self._render(request, result, stored, written)
            if isinstance(result, RecentTooLarge):
                raise _too_large(result, request)
            summary = await self._summarize(request, result, stored)
            stored = {key: value for key, value in stored.items() if key not in result.replaces}
            stored[summary.id] = summary
        raise ContextTooLarge(
            f"The conversation could not be compacted to fit {request.budget} tokens in {MAX_ROUNDS} rounds.",
            param="messages",
        )

    async def force(self, request: CompactionRequest) -> StoredSummary | None:
        """Summarize the oldest eligible range now (`POST /sessions/{id}/summarize`); None if there is none.

        The builder is asked as if any context were too large, so it names the oldest unsummarized range older
        than the recent messages (or, once all of that is summarized, the oldest summaries to merge).
        """
        items = [builder_item(stored) for stored in request.path]
        stored = {s.id: s for s in in_force(await self._summaries.on_path(request.tenant, request.path))}
        policy = replace(
            self.policy(request.budget, request.preserve_recent, self._summarizer.input_capacity(request.entry)),
            trigger_ratio=FORCE_RATIO,
            compact_to=FORCE_RATIO,
        )
        result = build(items, [s.span() for s in stored.values()], policy, compacting=True)
        if not isinstance(result, NeedsSummary):
            return None
        return await self._summarize(request, result, stored)

    async def _summarize(
        self, request: CompactionRequest, need: NeedsSummary, stored: Mapping[int, StoredSummary]
    ) -> StoredSummary:
        started = self._clock()
        rendered = [
            summary_message(stored[part.id].content) if isinstance(part, Span) else dict(request.path[part].message)
            for part in need.parts
        ]
        original = sum(message.tokens for message in request.path[need.start : need.end])
        written = await self._summarizer.summarize(rendered, need.target, request.entry)
        tokens = count_message(summary_message(written.content), request.encoding)
        summary = await self._summaries.add(
            request.tenant,
            start_depth=request.path[need.start].depth,
            end=request.path[need.end - 1],
            content=written.content,
            tokens=tokens,
            original_tokens=original,
            model=written.model,
            generated_by=written.generated_by,
            replaces=need.replaces,
        )
        log.info(
            "compaction session=%s strategy=%s range=[%d,%d) replaces=%s tokens=%d->%d duration_ms=%.0f model=%s",
            request.session_id,
            ("hierarchical-" if need.replaces else "") + written.generated_by,
            need.start,
            need.end,
            list(need.replaces),
            original,
            tokens,
            (self._clock() - started) * 1000,
            written.model,
        )
        return summary

    @staticmethod
    def _render(
        request: CompactionRequest, context: WorkingContext, stored: Mapping[int, StoredSummary], written: int
    ) -> Prepared:
        messages: list[Message] = []
        summaries = 0
        for part in context.parts:
            if isinstance(part, Span):
                messages.append(summary_message(stored[part.id].content))
                summaries += 1
            else:
                messages.append(dict(request.messages[part]))
        return Prepared(messages, context.tokens, summaries, written)


def builder_item(stored: StoredMessage) -> Item:
    message = stored.message
    calls = message.get("tool_calls") or ()
    call_ids = tuple(str(call.get("id")) for call in calls if isinstance(call, Mapping) and call.get("id"))
    tool_call_id = message.get("tool_call_id")
    return Item(
        role=stored.role,
        tokens=stored.tokens,
        tool_call_ids=call_ids,
        tool_call_id=tool_call_id if isinstance(tool_call_id, str) else None,
    )


def _too_large(result: RecentTooLarge, request: CompactionRequest) -> ContextTooLarge:
    return ContextTooLarge(
        f"The system messages and the {request.preserve_recent} most recent messages need {result.needed} tokens, "
        f"but the input budget for model '{request.entry.name}' is {result.budget} tokens. Shorten the latest "
        "messages, lower X-Context-Preserve-Recent, or use a model with a larger context window.",
        param="messages",
    )
