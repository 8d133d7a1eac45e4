"""The compaction stage: the working context one request sends upstream, summarizing first when it must.

It runs the pure builder in a loop: the builder either accepts a working context, names one range to
summarize (which is written, stored and fed back in), or says the recent messages alone cannot fit. Because
the builder compacts in big steps (down to `compact_to` of the budget) and existing summaries are reused,
the requests between two compactions send prompts that extend each other (docs/architecture.md, invariant 6).

A weak or slow summarizer must not make a request worse: the summarizer model is called at most
`max_summarizer_calls` times and waited for at most `summarizer_deadline_s` per request (an `Allowance`), and a
summary that does not shrink what it stands for is not used. In each case the extractive fallback is written
instead, at once and cut until it shrinks its range; it stays marked `fallback`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.compaction.builder import Item, NeedsSummary, Policy, RecentTooLarge, Span, WorkingContext, build
from proxy.compaction.summaries import StoredSummary, Summaries, in_force
from proxy.compaction.summarizer import FALLBACK_MODEL, Summarizer, WrittenSummary
from proxy.compaction.summary_text import acknowledgement_message, fallback_summary, summary_message
from proxy.config import ContextConfig, ModelEntry
from proxy.errors import ContextTooLarge
from proxy.history.messages import StoredMessage
from proxy.offload import compute
from proxy.tokens import DEFAULT_ENCODING, count_message, count_prompt, rough_size
from proxy.types import Clock, Message

log = logging.getLogger(__name__)

SummaryKey = tuple[str, int, str, tuple[int, ...], str]
"""(tenant, start depth, end message id, summaries replaced, encoding): one summary being written."""

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
    allowance: Allowance | None = None
    """The summarizer work this request may still wait for, shared by its compactions (a healed call compacts
    again); None gives this compaction a fresh `Compactor.allowance()`."""


class Allowance:
    """The summarizer work one request may still wait for: a number of calls and a span of wall time, counted
    from its first summary."""

    def __init__(self, calls: int, seconds: float) -> None:
        self.calls = calls
        self.seconds = seconds
        self.made = 0
        self.started: float | None = None
        self.reported = False
        """Whether running out was logged (once per request)."""

    def next_call(self, now: float) -> float | None:
        """The seconds the next summarizer call may take, counted as made; None when the allowance is used up."""
        if self.started is None:
            self.started = now
        left = self.started + self.seconds - now
        if self.made >= self.calls or left <= 0:
            return None
        self.made += 1
        return left

    def elapsed(self, now: float) -> float:
        return 0.0 if self.started is None else now - self.started


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
        self._running: dict[SummaryKey, asyncio.Future[StoredSummary]] = {}
        """Summaries being written now, by range: what a second request needing one waits for."""

    def policy(
        self, budget: int, preserve_recent: int, summarizer_input: int | None = None, encoding: str = DEFAULT_ENCODING
    ) -> Policy:
        """The builder's policy; `summarizer_input` caps what one summarization may read (None: no cap)."""
        return Policy(
            budget=budget,
            preserve_recent=preserve_recent,
            trigger_ratio=self._config.trigger_ratio,
            compact_to=self._config.compact_to,
            target_ratio=self._config.target_ratio,
            max_summary_input=summarizer_input,
            acknowledgement_tokens=count_message(acknowledgement_message(), encoding),
        )

    def allowance(self) -> Allowance:
        """A fresh allowance of summarizer work, for one request."""
        return Allowance(self._config.max_summarizer_calls, self._config.summarizer_deadline_s)

    async def prepare(self, request: CompactionRequest) -> Prepared:
        everything = count_prompt(stored.tokens for stored in request.path)
        if everything <= self._config.trigger_ratio * request.budget:
            # The builder's first rule, taken before any summary is read: whole conversations that fit are sent
            # as they are (and a bigger model gets its originals back). This is every request of a short chat.
            return Prepared([dict(message) for message in request.messages], everything, summaries=0, written=0)
        items = [builder_item(stored) for stored in request.path]
        stored = {s.id: s for s in in_force(await self._summaries.on_path(request.tenant, request.path))}
        policy = self._request_policy(request)
        allowance = request.allowance or self.allowance()
        for written in range(MAX_ROUNDS):
            result = build(items, [s.span() for s in stored.values()], policy, compacting=written > 0)
            if isinstance(result, WorkingContext):
                return self._render(request, result, stored, written)
            if isinstance(result, RecentTooLarge):
                raise _too_large(result, request)
            summary = await self._summarize(request, result, stored, allowance)
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
        policy = replace(self._request_policy(request), trigger_ratio=FORCE_RATIO, compact_to=FORCE_RATIO)
        result = build(items, [s.span() for s in stored.values()], policy, compacting=True)
        if not isinstance(result, NeedsSummary):
            return None
        return await self._summarize(request, result, stored, request.allowance or self.allowance())

    def _request_policy(self, request: CompactionRequest) -> Policy:
        capacity = self._summarizer.input_capacity(request.entry)
        return self.policy(request.budget, request.preserve_recent, capacity, request.encoding)

    async def _summarize(
        self,
        request: CompactionRequest,
        need: NeedsSummary,
        stored: Mapping[int, StoredSummary],
        allowance: Allowance,
    ) -> StoredSummary:
        """The summary `need` names, written once however many requests need it at the same moment.

        Two sessions can be one chain (the same conversation sent under two ids, or two clients in step): their
        session locks do not order them, so the second waits for the first one's summary instead of paying the
        summarizer for the same range. The work is shielded: a request that goes away does not waste it for
        the others.
        """
        key = (
            request.tenant,
            request.path[need.start].depth,
            request.path[need.end - 1].id,
            need.replaces,
            request.encoding,
        )
        running = self._running.get(key)
        if running is None:
            running = asyncio.ensure_future(self._summarize_once(request, need, stored, allowance))
            self._running[key] = running
            running.add_done_callback(functools.partial(self._finished, key))
        return await asyncio.shield(running)

    def _finished(self, key: SummaryKey, task: asyncio.Future[StoredSummary]) -> None:
        del self._running[key]
        if not task.cancelled():
            task.exception()  # retrieved here: every waiter may have gone away

    async def _summarize_once(
        self,
        request: CompactionRequest,
        need: NeedsSummary,
        stored: Mapping[int, StoredSummary],
        allowance: Allowance,
    ) -> StoredSummary:
        written_since = [
            summary
            for summary in await self._summaries.on_path(request.tenant, request.path)
            if summary.orphaned_at is None
            and summary.id not in stored
            and (summary.start_depth, summary.end_id) == (request.path[need.start].depth, request.path[need.end - 1].id)
        ]
        if written_since:  # another request wrote it after this one read the summaries
            return written_since[-1]
        started = self._clock()
        rendered = [
            summary_message(stored[part.id].content) if isinstance(part, Span) else dict(request.path[part].message)
            for part in need.parts
        ]
        original = sum(message.tokens for message in request.path[need.start : need.end])
        replaced = sum(part.tokens if isinstance(part, Span) else request.path[part].tokens for part in need.parts)
        written = await self._write(request, need, rendered, replaced, allowance, started)
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

    async def _write(
        self,
        request: CompactionRequest,
        need: NeedsSummary,
        rendered: Sequence[Mapping[str, Any]],
        replaced: int,
        allowance: Allowance,
        now: float,
    ) -> WrittenSummary:
        """The summary of `rendered`: by the summarizer model while the request's allowance lasts, provided that it
        costs fewer than the `replaced` tokens it stands for; else the extractive fallback, cut until it does."""
        wait = allowance.next_call(now)
        if wait is None:
            if not allowance.reported:
                allowance.reported = True
                log.warning(
                    "compaction session=%s: this request's summarizer allowance is used up after %d summarizer "
                    "calls and %.1f s (context.max_summarizer_calls=%d, summarizer_deadline_s=%.1f); its remaining "
                    "summaries are extractive",
                    request.session_id,
                    allowance.made,
                    allowance.elapsed(now),
                    allowance.calls,
                    allowance.seconds,
                )
        else:
            try:
                async with asyncio.timeout(wait):
                    written = await self._summarizer.summarize(rendered, need.target, request.entry)
            except TimeoutError:
                log.warning(
                    "compaction session=%s: summarizer %s did not answer within the %.1f s left to this request; "
                    "using the extractive fallback",
                    request.session_id,
                    self._summarizer.entry_for(request.entry).name,
                    wait,
                )
            else:
                tokens = count_message(summary_message(written.content), request.encoding)
                if tokens < replaced:
                    return written
                log.warning(
                    "compaction session=%s: the summary of [%d,%d) by %s has %d tokens and does not shrink the %d it "
                    "replaces; using the extractive fallback",
                    request.session_id,
                    need.start,
                    need.end,
                    written.model,
                    tokens,
                    replaced,
                )
        size = sum(map(rough_size, rendered))
        content = await compute(size, fallback_summary, rendered, need.target, replaced, request.encoding)
        return WrittenSummary(content, "fallback", FALLBACK_MODEL)

    @staticmethod
    def _render(
        request: CompactionRequest, context: WorkingContext, stored: Mapping[int, StoredSummary], written: int
    ) -> Prepared:
        messages: list[Message] = []
        summaries = 0
        for index, part in enumerate(context.parts):
            if index in context.acknowledgements:
                messages.append(acknowledgement_message())
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
