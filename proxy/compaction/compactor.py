"""The compaction stage: the working context one request sends upstream, compacting first when it must.

It runs the pure builder in a loop: the builder either accepts a working context, names one span to write
(a strategy's: a tool-results mask, a summary, an episode, a sliding-window marker — written by `spans`, stored
and fed back in), or says the kept and recent messages alone cannot fit. Because the builder compacts in big
steps (down to `compact_to` of the budget) and existing spans are reused, the requests between two compactions
send prompts that extend each other (docs/architecture.md, invariant 6).

Off the critical path, the spans the next crossing of the budget will need are written ahead of it, held back
until then (`precompaction`); a crossing request first waits for them.

After the context is laid out, archived originals the latest user message refers to are recalled into it
(`question_recall`).
"""

from __future__ import annotations

import functools
import itertools
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace

from proxy.canonical.types import Clock, Message
from proxy.compaction.builder import PINNED_ROLES, ContextLayout, Policy, RecentTooLarge, Span, SpanNeeded, build
from proxy.compaction.events import CompactionEvents
from proxy.compaction.path_items import PathReader, PathState
from proxy.compaction.plans import PlanCache, planned
from proxy.compaction.precompaction import CLOSE_GRACE_S, Precompactions
from proxy.compaction.question_recall import QuestionRecall, latest_question
from proxy.compaction.recall import Recall
from proxy.compaction.refusals import not_converging, too_large
from proxy.compaction.span_store import SpanStore, StoredSpan
from proxy.compaction.spans import Allowance, CompactionRequest, SpanWriter
from proxy.compaction.stubs import stubbed_message
from proxy.compaction.summarizer import Summarizer
from proxy.compaction.summary_text import acknowledgement_message
from proxy.compaction.working_context import (
    ContextView,
    WorkingContext,
    rendered,
    span_message,
)
from proxy.config.schema import SLIDING_WINDOW, SUMMARIZE, TOOL_RESULTS, ContextConfig
from proxy.errors import ContextTooLarge
from proxy.history.messages import StoredMessage, token_counts
from proxy.history.pins import Pins
from proxy.store.database import Database
from proxy.tokens import DEFAULT_ENCODING, count_message, count_prompt

__all__ = ["Allowance", "CompactionRequest", "Compactor"]

FORCE_RATIO = 1e-9
"""Trigger and target of a forced compaction: nothing fits, so the builder picks the oldest eligible range."""
WITHOUT_MODEL = frozenset({TOOL_RESULTS, SLIDING_WINDOW})
"""Strategies whose spans are written without a model call: a crossing writes them at once."""
ROUNDS_PER_MESSAGE = 3
"""Each round covers messages no span covered with one, merges two blocks or more into one, or stubs tool outputs
no mask stubbed: a path of n messages is compacted in fewer than 3n rounds."""
AHEAD_ROUNDS = 32
"""Spans one pre-compaction run may write: the crossing writes what more it needs."""


class Compactor:
    def __init__(
        self,
        config: ContextConfig,
        summaries: SpanStore,
        summarizer: Summarizer,
        clock: Clock = time.monotonic,
        *,
        events: CompactionEvents | None = None,
        pins: Pins | None = None,
        recall: Recall | None = None,
        locks: Database | None = None,
    ) -> None:
        """`locks`: the store shared with other replicas, whose pre-compaction of a session this one must not
        repeat (none: this process is the only one)."""
        self._config = config
        self._summaries = summaries
        self._summarizer = summarizer
        self._writer = SpanWriter(config, summaries, summarizer, events, clock, locks)
        self._paths = PathReader(config, pins)
        self._plans = PlanCache()
        self._ahead = Precompactions(config, self._write_ahead, clock, locks)
        self._acknowledgements: dict[str, int] = {}
        """Encoding → what an acknowledgement costs: every request's policy asks."""
        self._recalls = QuestionRecall(config, recall, self._acknowledgement_tokens)

    def policy(
        self,
        budget: int,
        preserve_recent: int,
        summarizer_input: int | None = None,
        encoding: str = DEFAULT_ENCODING,
        strategies: tuple[str, ...] | None = None,
    ) -> Policy:
        """The builder's policy; `summarizer_input` caps what one summarization may read (None: no cap)."""
        return Policy(
            budget=budget,
            preserve_recent=preserve_recent,
            trigger_ratio=self._config.trigger_ratio,
            compact_to=self._config.compact_to,
            headroom_turns=self._config.headroom_turns,
            summary_share=self._config.summary_share,
            target_ratio=self._config.target_ratio,
            max_summary_input=summarizer_input,
            acknowledgement_tokens=self._acknowledgement_tokens(encoding),
            strategies=strategies or self._config.strategies,
            keep_turns=self._config.tool_results_keep_turns,
            recall_room=self._config.recall_tokens if self._config.recall_fill else 0,
        )

    def _acknowledgement_tokens(self, encoding: str) -> int:
        tokens = self._acknowledgements.get(encoding)
        if tokens is None:
            tokens = self._acknowledgements[encoding] = count_message(acknowledgement_message(), encoding)
        return tokens

    async def spans_on(self, tenant: str, path: Sequence[StoredMessage]) -> list[StoredSpan]:
        """Every span written on `path` (`SpanStore.on_path`)."""
        return await self._summaries.on_path(tenant, path)

    def allowance(self) -> Allowance:
        """A fresh allowance of summarizer work, for one request."""
        return Allowance(self._config.max_summarizer_calls, self._config.summarizer_deadline_s)

    async def prepare(self, request: CompactionRequest) -> WorkingContext:
        everything = request.path.tokens
        floor = _floor(request.path)
        if everything <= self._request_policy(request).level(self._config.trigger_ratio, floor):
            # The builder's first rule, taken before any summary is read: whole conversations that fit are sent
            # as they are (and a bigger model gets its originals back). This is every request of a short chat.
            messages = list(request.messages)  # shared, never changed in place (docs/architecture.md)
            self._recalls.sent_unrecalled(request, latest_question(request))
            return WorkingContext(messages, everything, summaries=0, written=0, floor=floor)
        allowance = request.allowance or self.allowance()
        state = await self._paths.read(request)
        stored = await self._in_force(request)
        known = set(stored)
        """Every span this request has planned with: one it did not is another request's, written since."""
        asked: set[SpanNeeded] = set()
        policy = self._request_policy(request)
        waited = False
        written = 0
        replanned = 0
        session = (request.tenant, request.session_id)
        rounds = most_rounds(len(state.items))
        while written + replanned < rounds:
            result = await self._plans.plan(session, state, list(stored.values()), policy, compacting=written > 0)
            if isinstance(result, RecentTooLarge):
                raise too_large(result, request)
            if isinstance(result, SpanNeeded) and result.strategy not in WITHOUT_MODEL:
                # A crossing never waits for a model while what is written (its masks, the batches written ahead,
                # a summary it had to write) fits the budget: the summaries that would take it deeper are written
                # in the background and join at the next crossing. Else it waits for the session's pre-compaction
                # (it is writing them), then writes what is still missing itself.
                shallow = replace(policy, compact_to=policy.trigger_ratio)
                fitting = await planned(state, [s.span for s in stored.values()], shallow, compacting=True)
                if isinstance(fitting, ContextLayout):
                    result = fitting
                elif not waited:
                    waited = True
                    await self._ahead.wait(request, allowance)
                    stored = await self._in_force(request)
                    known.update(stored)
                    continue
            if isinstance(result, ContextLayout):
                joined = [] if result.held_back else [span.id for span in stored.values() if span.held]
                if joined:
                    await self._summaries.release(request.tenant, joined)
                context = rendered(request.messages, result, stored, state.stubs, written)
                crossed = replace(context, crossed=bool(written or joined))
                return await self._recalls.recalled(request, result, state, crossed)
            fresh = await self._in_force(request)
            if not fresh.keys() <= known:
                # Others compacting this path (sessions continuing one conversation, replicas) wrote spans since
                # this request read them, maybe the very span it needs, or a wider one orphaning it: plan again
                # with theirs rather than write around them.
                stored = fresh
                known.update(fresh)
                replanned += 1
                continue
            if result in asked:
                raise not_converging(result, request)
            asked.add(result)
            summary = await self._write(request, state, result, stored, allowance)
            known.add(summary.id)
            stored = _superseded(stored, result, summary)
            written += 1
        raise ContextTooLarge(
            f"The conversation could not be compacted to fit {request.budget} tokens in {rounds} rounds.",
            param="messages",
        )

    async def view(self, request: CompactionRequest) -> ContextView:
        """The working context `prepare` would build from what is stored now, with the same pins and stubs,
        without a summarizer call, a write or a wait."""
        everything = request.path.tokens
        floor = _floor(request.path)
        if everything <= self._request_policy(request).level(self._config.trigger_ratio, floor):
            return ContextView((), {}, everything)
        state = await self._paths.read(request)
        stored = await self._in_force(request)
        result = build(state.items, [s.span for s in stored.values()], self._request_policy(request), cuts=state.cuts)
        if not isinstance(result, ContextLayout):
            waiting = tuple(s for s in stored.values() if not s.held and s.strategy != TOOL_RESULTS)
            return ContextView(waiting, {}, everything, compacts=True)
        spans = tuple(stored[part.id] for part in result.parts if isinstance(part, Span))
        return ContextView(spans, {p: state.stubs[p] for p in result.stubbed}, result.tokens)

    async def force(self, request: CompactionRequest) -> StoredSpan | None:
        """Summarize the oldest eligible range now (`POST /sessions/{id}/summarize`); None if there is none.

        The builder is asked as if any context were too large, so it names the oldest unsummarized range older
        than the recent messages (or, once all of that is summarized, the oldest summaries to merge).
        """
        state = await self._paths.read(request)
        stored = await self._in_force(request)
        policy = replace(
            self._request_policy(request),
            trigger_ratio=FORCE_RATIO,
            compact_to=FORCE_RATIO,
            headroom_turns=0,
            strategies=(SUMMARIZE,),
            past_room=False,
        )
        result = build(state.items, [s.span for s in stored.values()], policy, compacting=True, cuts=state.cuts)
        if not isinstance(result, SpanNeeded):
            return None
        return await self._write(request, state, result, stored, request.allowance or self.allowance())

    def precompact(self, request: CompactionRequest, prepared: WorkingContext) -> None:
        """Start writing, in the background, the spans the session's next crossing of the budget will need, when
        this request leaves it past `context.precompact_ratio` (at most one task per session)."""
        policy = self._request_policy(request)
        grown = prepared.tokens - prepared.recall_tokens
        self._ahead.start(request, policy, grown, prepared.floor, ahead=prepared.ahead, summaries=prepared.summaries)

    async def settled(self) -> None:
        """Until no pre-compaction is running (what a test or a benchmark waits for)."""
        await self._ahead.settled()

    async def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop the pre-compactions (shutdown): see `Precompactions.close`."""
        await self._ahead.close(grace_s)

    async def _write_ahead(self, request: CompactionRequest, policy: Policy) -> int:
        """The pre-compaction's spans (`ahead_policy`), held back until the crossing (`Span.held`), and how many
        it wrote. A summarizer allowance of its own; when it is used up the task stops, and the crossing request
        writes what is missing."""
        state = await self._paths.read(request)
        stored = await self._in_force(request)
        allowance = self.allowance()
        batch = time.time_ns()  # increasing from run to run: the order in which batches join (`Span.held`)
        written = 0
        while written < AHEAD_ROUNDS:
            result = await planned(state, [s.span for s in stored.values()], policy, compacting=True)
            if not isinstance(result, SpanNeeded):
                break
            if result.strategy not in WITHOUT_MODEL and allowance.made >= allowance.calls:
                break
            summary = await self._write(request, state, result, stored, allowance, held=batch)
            stored = _superseded(stored, result, summary)
            written += 1
        return written

    async def _write(
        self,
        request: CompactionRequest,
        state: PathState,
        need: SpanNeeded,
        stored: Mapping[int, StoredSpan],
        allowance: Allowance,
        held: int = 0,
    ) -> StoredSpan:
        """The span `need` names, from what `state` read: the messages its parts stand for, and what its range's
        originals count (`Cuts.prefix`)."""
        render = functools.partial(self._read, request, state)
        original = state.cuts.prefix[need.end] - state.cuts.prefix[need.start]
        return await self._writer.write(request, need, stored, allowance, render, original=original, held=held)

    async def _in_force(self, request: CompactionRequest) -> dict[int, StoredSpan]:
        return {s.id: s for s in await self._summaries.in_force_on(request.tenant, request.path, request.session_id)}

    def _request_policy(self, request: CompactionRequest) -> Policy:
        capacity = self._summarizer.input_capacity(request.entry)
        return self.policy(request.budget, request.preserve_recent, capacity, request.encoding, request.strategies)

    @staticmethod
    def _read(
        request: CompactionRequest, state: PathState, need: SpanNeeded, stored: Mapping[int, StoredSpan]
    ) -> list[Message]:
        """The messages a span's parts stand for, as the model saw them: what the summarizer reads."""
        return [
            span_message(stored[part.id])
            if isinstance(part, Span)
            else stubbed_message(request.path[part].message, state.stubs[part])
            if part in need.stubbed
            else dict(request.path[part].message)
            for part in need.parts
        ]


def most_rounds(messages: int) -> int:
    """The rounds one request's compaction of a path of `messages` may take (spans written, and plans made again
    with spans other requests wrote meanwhile) before it is taken as not converging.

    A path that was never compacted (a conversation sent whole, or continued from a `compaction` item) needs a
    first summary per summarizer input's worth of it and then merges: ~40 rounds at 3,000 messages of ~100
    tokens. A fixed number refused long conversations that compact well (issue 41); a round that changes nothing
    is caught as it happens (`not_converging`)."""
    return max(AHEAD_ROUNDS, ROUNDS_PER_MESSAGE * messages)


def _floor(path: Sequence[StoredMessage]) -> int:
    """What the path's leading system messages count: what every request sends verbatim (`leading_system`)."""
    return count_prompt(token_counts(itertools.takewhile(_is_system, path)))


def _is_system(stored: StoredMessage) -> bool:
    return stored.role in PINNED_ROLES


def _superseded(stored: Mapping[int, StoredSpan], need: SpanNeeded, summary: StoredSpan) -> dict[int, StoredSpan]:
    """The spans in force once `summary` (written for `need`) replaced the ones it covers."""
    return {**{key: value for key, value in stored.items() if key not in need.replaces}, summary.id: summary}
