"""Writing the span a strategy names: a summary (by the summarizer model while a request's allowance lasts, else
the extractive fallback), a sliding-window marker, or a tool-results mask; stored once however many requests
need it at the same moment, and reported as compaction events.

A span is needed in the middle of a user's request (or ahead of it, by pre-compaction), so a broken, slow or
verbose summarizer must never fail that request or make it worse: the summarizer model is called at most
`max_summarizer_calls` times and waited for at most `summarizer_deadline_s` per request (an `Allowance`), and a
summary that does not shrink what it stands for is not used. In each case the extractive fallback is written
instead, at once and cut until it shrinks its range; it stays marked `fallback`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.canonical.types import Clock, Message
from proxy.compaction.events import CompactionEvent, CompactionEvents, EventKind
from proxy.compaction.extractive import fallback_summary
from proxy.compaction.layout import Span, SpanNeeded
from proxy.compaction.prose import date_before
from proxy.compaction.span_store import SpanStore, StoredSpan
from proxy.compaction.stubs import marker_message, marker_text
from proxy.compaction.summarizer import EPISODE_INSTRUCTION, FALLBACK_MODEL, Summarizer, WrittenSummary
from proxy.compaction.summary_text import summary_message
from proxy.config.models import ModelEntry
from proxy.config.schema import GOAL_BATCH, SLIDING_WINDOW, TOOL_RESULTS, ContextConfig
from proxy.history.messages import StoredPath
from proxy.history.settings import session_strategies
from proxy.offload import compute
from proxy.store.database import Database, lock_name
from proxy.tokens import count_message, rough_size

log = logging.getLogger(__name__)

SpanKey = tuple[str, int, str, str, str]
"""(tenant, start depth, end message id, encoding, strategy): one span being written, whichever spans the requests
that need it would have it replace (what each of them read of the spans may be older than another's)."""
RULE_MODEL = "none"
"""The `model` of a span no model wrote (a marker, a mask)."""


@dataclass(frozen=True)
class CompactionRequest:
    """What the compactor needs to know about one request."""

    tenant: str
    session_id: str
    messages: Sequence[Message]
    """The client's messages, sent verbatim wherever the working context keeps an original."""
    path: StoredPath
    """The same messages as stored: path[i] is messages[i], with its token count."""
    entry: ModelEntry
    encoding: str
    budget: int
    preserve_recent: int
    allowance: Allowance | None = None
    """The summarizer work this request may still wait for, shared by its compactions (a healed call compacts
    again); None gives this compaction a fresh `Compactor.allowance()`."""
    strategies: tuple[str, ...] | None = None
    """The session's compaction strategies (X-Context-Strategy); None: `context.strategies`."""
    tools: bool = True
    """The request declares tools, so its turn may go on in tool steps that re-send its recall (`recall_room`);
    false for a chat's request, whose turn is that one request."""

    @classmethod
    def for_session(
        cls,
        tenant: str,
        path: StoredPath,
        settings: Mapping[str, Any],
        *,
        session_id: str,
        messages: Sequence[Message],
        entry: ModelEntry,
        encoding: str,
        budget: int,
        preserve_recent: int,
        allowance: Allowance | None = None,
        tools: bool = True,
    ) -> CompactionRequest:
        """A request on a session's path, with what the session remembered (`settings`: its strategies)."""
        return cls(
            tenant,
            session_id,
            messages,
            path,
            entry,
            encoding,
            budget,
            preserve_recent,
            allowance,
            session_strategies(settings),
            tools,
        )


class Allowance:
    """The summarizer work one request may still wait for: a number of calls and a span of wall time, counted
    from its first summary (or from when it began to wait for the session's pre-compaction)."""

    def __init__(self, calls: int, seconds: float) -> None:
        self.calls = calls
        self.seconds = seconds
        self.made = 0
        self.started: float | None = None
        self.reported = False
        """Whether running out was logged (once per request)."""

    def left(self, now: float) -> float:
        """The seconds still allowed, starting the clock."""
        if self.started is None:
            self.started = now
        return self.started + self.seconds - now

    def next_call(self, now: float) -> float | None:
        """The seconds the next summarizer call may take, counted as made; None when the allowance is used up."""
        left = self.left(now)
        if self.made >= self.calls or left <= 0:
            return None
        self.made += 1
        return left

    def exhaust(self) -> None:
        self.made = self.calls

    def elapsed(self, now: float) -> float:
        return 0.0 if self.started is None else now - self.started


Render = Callable[[SpanNeeded, Mapping[int, StoredSpan]], list[Message]]
"""The messages a span's parts stand for, as the model saw them (stubs and markers included)."""


class SpanWriter:
    def __init__(
        self,
        config: ContextConfig,
        summaries: SpanStore,
        summarizer: Summarizer,
        events: CompactionEvents | None = None,
        clock: Clock = time.monotonic,
        locks: Database | None = None,
    ) -> None:
        """`locks`: the store shared with other replicas, under whose lock a span's range is written once among
        them (none: this process is the only one)."""
        self._config = config
        self._summaries = summaries
        self._summarizer = summarizer
        self._events = events
        self._clock = clock
        self._locks = locks
        self._running: dict[SpanKey, asyncio.Future[StoredSpan]] = {}
        """Spans being written now, by range: what a second request needing one waits for."""

    async def write(
        self,
        request: CompactionRequest,
        need: SpanNeeded,
        stored: Mapping[int, StoredSpan],
        allowance: Allowance,
        render: Render,
        *,
        original: int,
        held: int = 0,
    ) -> StoredSpan:
        """The span `need` names, written once however many requests need it at the same moment. `original`:
        what its range's messages count (the caller has the path's running sums: a long path is not summed).

        Two sessions can be one chain (the same conversation sent under two ids, two clients in step, sessions
        continuing one `compaction` item), and a request can need what its session's pre-compaction is writing:
        the second waits for the first one's span instead of paying the summarizer for the same range. The work
        is shielded: a request that goes away does not waste it for the others.
        """
        key = (
            request.tenant,
            request.path[need.start].depth,
            request.path[need.end - 1].id,
            request.encoding,
            need.strategy,
        )
        running = self._running.get(key)
        if running is None:
            running = asyncio.ensure_future(self._write_once(request, need, stored, allowance, render, original, held))
            self._running[key] = running
            running.add_done_callback(functools.partial(self._finished, key))
        return await asyncio.shield(running)

    def _finished(self, key: SpanKey, task: asyncio.Future[StoredSpan]) -> None:
        del self._running[key]
        if not task.cancelled():
            task.exception()  # retrieved here: every waiter may have gone away

    async def _write_once(
        self,
        request: CompactionRequest,
        need: SpanNeeded,
        stored: Mapping[int, StoredSpan],
        allowance: Allowance,
        render: Render,
        original: int,
        held: int,
    ) -> StoredSpan:
        """The span, unless another request (or replica: under the store's lock on the range) wrote one over the
        same range since this one read the spans."""
        start, end = request.path[need.start].depth, request.path[need.end - 1].id
        name = lock_name("span", request.tenant, start, end, request.encoding, need.strategy)
        async with contextlib.nullcontext() if self._locks is None else self._locks.lock(name):
            return await self._written_since(request, need, stored) or await self._new(
                request, need, stored, allowance, render, original, held
            )

    async def _written_since(
        self, request: CompactionRequest, need: SpanNeeded, stored: Mapping[int, StoredSpan]
    ) -> StoredSpan | None:
        """A span over `need`'s range that this request did not read: one in use if there is one, else one a wider
        span has orphaned since (a summary of the range all the same; the compactor then finds the wider one)."""
        mask = need.strategy == TOOL_RESULTS
        start, end = request.path[need.start].depth, request.path[need.end - 1].id
        found = [
            summary
            for summary in await self._summaries.on_range(request.tenant, start, end)
            if summary.id not in stored and summary.id not in need.replaces and summary.span.is_mask == mask
        ]
        return max(found, key=lambda summary: (summary.orphaned_at is None, summary.id), default=None)

    async def _new(
        self,
        request: CompactionRequest,
        need: SpanNeeded,
        stored: Mapping[int, StoredSpan],
        allowance: Allowance,
        render: Render,
        original: int,
        held: int,
    ) -> StoredSpan:
        started = self._clock()
        event = CompactionEvent(
            session_id=request.session_id,
            event="start",
            strategy=need.strategy,
            range_start=need.start,
            range_end=need.end,
            tokens_before=original,
            background=held > 0,
        )
        await self._record(request.tenant, event)
        try:
            rendered = render(need, stored)
            replaced = sum(
                part.tokens
                if isinstance(part, Span)
                else count_message(message, request.encoding)
                if part in need.stubbed
                else request.path[part].tokens
                for part, message in zip(need.parts, rendered, strict=True)
            )
            written, tokens = await self._content(request, need, rendered, replaced, allowance, started)
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
                strategy=need.strategy,
                held=held,
            )
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"[:500]
            await self._record(request.tenant, _ended(event, "error", self._clock() - started, detail=detail))
            raise
        duration = self._clock() - started
        log.info(
            "compaction session=%s strategy=%s generated_by=%s range=[%d,%d) replaces=%s tokens=%d->%d "
            "duration_ms=%.0f model=%s background=%s",
            request.session_id,
            need.strategy,
            written.generated_by,
            need.start,
            need.end,
            list(need.replaces),
            original,
            tokens,
            duration * 1000,
            written.model,
            held > 0,
        )
        await self._record(request.tenant, _ended(event, "complete", duration, summary=summary))
        return summary

    async def _content(
        self,
        request: CompactionRequest,
        need: SpanNeeded,
        rendered: Sequence[Message],
        replaced: int,
        allowance: Allowance,
        now: float,
    ) -> tuple[WrittenSummary, int]:
        """The span's content and what its message costs as sent."""
        if need.strategy == TOOL_RESULTS:
            # A mask has no message: its stubs are computed from their outputs wherever they are shown.
            return WrittenSummary("", "rule", RULE_MODEL), 0
        if need.strategy == SLIDING_WINDOW:
            content = marker_text([stored.role for stored in request.path], need.start, need.end)
            return WrittenSummary(content, "rule", RULE_MODEL), count_message(marker_message(content), request.encoding)
        written = await self._summary(request, need, rendered, replaced, allowance, now)
        return written, count_message(summary_message(written.content), request.encoding)

    async def _summary(
        self,
        request: CompactionRequest,
        need: SpanNeeded,
        rendered: Sequence[Message],
        replaced: int,
        allowance: Allowance,
        now: float,
    ) -> WrittenSummary:
        """The summary of `rendered`: by the summarizer model while the request's allowance lasts, provided that it
        costs fewer than the `replaced` tokens it stands for; else the extractive fallback, cut until it does."""
        # An open breaker (`summarizer.available`) means the fallback at once, the allowance untouched.
        available = self._summarizer.available(request.entry)
        wait = allowance.next_call(now) if available else None
        if available and wait is None:
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
        elif wait is not None:
            instruction = EPISODE_INSTRUCTION if need.strategy == GOAL_BATCH else None
            try:
                async with asyncio.timeout(wait):
                    session = (request.tenant, request.session_id)
                    written = await self._summarizer.summarize(
                        rendered, need.target, request.entry, instruction, session
                    )
            except TimeoutError:
                self._summarizer.timed_out(request.entry)
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
        date = date_before(request.path, need.start)
        content = await compute(size, fallback_summary, rendered, need.target, replaced, request.encoding, date)
        return WrittenSummary(content, "fallback", FALLBACK_MODEL)

    async def _record(self, tenant: str, event: CompactionEvent) -> None:
        if self._events is not None:
            await self._events.record(tenant, event)


def _ended(
    event: CompactionEvent,
    kind: EventKind,
    seconds: float,
    *,
    summary: StoredSpan | None = None,
    detail: str | None = None,
) -> CompactionEvent:
    ended = replace(event, event=kind, duration_ms=round(seconds * 1000, 1), detail=detail)
    if summary is None:
        return ended
    return replace(
        ended,
        tokens_after=summary.tokens,
        summary_id=summary.id,
        generated_by=summary.generated_by,
        model=summary.model,
    )
