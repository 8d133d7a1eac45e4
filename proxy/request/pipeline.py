"""One request along the path, top to bottom, in the canonical form (docs/architecture.md, "The request path").

    door           (before this) auth, body within its limit, parse and validate into a `Conversation`
    budget         an output request fitted to the model (when the client asked for its own model's); an
                   impossible max_tokens is refused before the first write
    journal        an Idempotency-Key retry is answered from the journal
    continuation   a continued answer's conversation put before the request's own (`proxy.request.continuations`)
    history        under the session lock: reconcile the re-sent messages, remember budget settings
    budget         the effective input budget (request, session, learned corrections)
    compaction     the working context, summarizing first when it does not fit
    upstream       the call; a context-window refusal the budget should have prevented is healed once
    journal        the step begins beside the upstream call; streams go through `StreamRelay`
    door           (after this) renders the `Answer` with the X-Context-* headers

Bad input is refused before the first write, so it changes nothing in the store. A valid request whose recent
messages cannot fit the model is stored first and then refused: what a client sent is never discarded.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import TypeVar

from proxy.budget.budgets import Budgets
from proxy.budget.corrections import Refused
from proxy.canonical.answers import Answer, Completed, StepRef, Streaming
from proxy.canonical.conversation import ContextMode, ContextOptions, Conversation
from proxy.canonical.types import Chunk
from proxy.compaction.client_prompts import ClientCompaction, Shape, recognize
from proxy.compaction.compactor import Compactor
from proxy.config.models import ModelEntry
from proxy.config.schema import Config
from proxy.errors import AnswerTooLarge, StepKept, StoreUnavailable, UpstreamError, error_fields
from proxy.history.store import History
from proxy.journal.assembly import Assembly, assemble
from proxy.journal.keys import request_fingerprint
from proxy.journal.reader import JournalReader
from proxy.journal.relay import StreamRelay
from proxy.journal.replay import replayed
from proxy.journal.steps import Step
from proxy.journal.writer import Journal
from proxy.request import continuations
from proxy.request.budget import count_tokens, counted, fit_output, model_entry, request_budget
from proxy.request.client_compaction import StoredConversation, summarized_session, summary_off_loop
from proxy.request.plan import Plan, Planner
from proxy.request.references import References
from proxy.tokens import content_text
from proxy.upstream.context_window import unquoted
from proxy.upstream.deadlines import StreamDeadlines, deadline_exceeded
from proxy.upstream.local import LocalAnswer
from proxy.upstream.protocol import Upstream, UpstreamCall

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Pipeline:
    """The stages of the request path, wired once (`proxy.serving.services`)."""

    config: Config
    history: History
    journal: Journal
    reader: JournalReader
    upstream: Upstream
    compactor: Compactor
    budgets: Budgets
    background: set[asyncio.Task[None]]
    """Streams still being relayed: shutdown lets them seal (`proxy.serving.services`)."""
    references: References = field(default_factory=References)
    """Which message of a request carries a reference the proxy wrote (`proxy.request.continuations`)."""

    async def continued(self, tenant: str, conversation: Conversation) -> tuple[Conversation, str | None]:
        """The conversation with what it continues put in, and that answer's session (`proxy.request.continuations`)."""
        return await continuations.continued(self.reader, self.history, self.references, tenant, conversation)

    @functools.cached_property
    def planner(self) -> Planner:
        return Planner(self.history, self.budgets, self.compactor, self.config.context.preserve_recent)

    async def answer(self, tenant: str, conversation: Conversation, options: ContextOptions) -> Answer:
        received = time.monotonic()
        entry, conversation = await self._checked(conversation)
        key = options.idempotency_key
        # Only a keyed request is ever compared with another: hashing a long body costs ~1.5 ms per 500 messages.
        fingerprint = "" if key is None else request_fingerprint(tenant, conversation.identity)
        if key is not None:
            replay = await self.reader.replay(tenant, key, fingerprint)
            if replay is not None:
                record, stored = replay
                return replayed(record, stored, conversation.stream)
        asked = self._client_compaction(conversation)
        planned = None
        if asked is not None and asked.shape is Shape.SERIALIZED:
            # Answered for the stored session its text comes from; its own text is not expanded (it may quote an
            # earlier summary's reference) nor stored (it is no turn of any conversation).
            planned = await self._serialized_plan(tenant, conversation, options, entry, asked)
        if planned is None:
            conversation, continued_session = await self.continued(tenant, conversation)
            options = options.with_session(continued_session)
            if asked is not None and asked.shape is Shape.APPENDED:
                planned = await self._summary_plan(tenant, conversation, options, entry, asked)
        if planned is None:
            upstream = self.upstream
            plan = await self.planner.plan(tenant, conversation, options, entry, self.compactor.allowance())
        else:
            plan, upstream = planned
        step_begun = asyncio.create_task(
            self.journal.begin(
                tenant=tenant,
                session_id=plan.reconciled.session.id,
                model=conversation.model,
                fingerprint=fingerprint,
                idempotency_key=key,
                stream=conversation.stream,
                parent_message_id=plan.reconciled.end_id,
                encoding=plan.encoding,
                context=plan.context(),
            )
        )
        if key is not None:
            await step_begun  # a conflicting key must be refused before the upstream is paid
        try:
            if conversation.stream:
                return await self._stream(conversation, options, plan, step_begun, received, upstream)
            return await self._complete(conversation, options, plan, step_begun, received, upstream)
        except asyncio.CancelledError:
            # Until a stream's relay owns the step, any ending ends it here, so no step is left open (an open
            # step would hold its Idempotency-Key until the next restart).
            await asyncio.shield(self._interrupt(step_begun))
            raise
        except Exception as exc:
            told = await self._fail(step_begun, exc)
            if told is exc:
                raise
            raise told from exc

    async def compact(self, tenant: str, conversation: Conversation, options: ContextOptions) -> StoredConversation:
        """A client's request for its context compacted (the Responses door's compaction item): the proxy keeps
        every message and compacts by itself, so it stores what is new, with no model call and no journal step,
        and names the stored conversation, which the client sends back in its place. Bad input is refused as
        `answer` refuses it, before the first write. It holds no Idempotency-Key: asked again, it stores nothing
        more and names the same conversation."""
        entry, conversation = await self._checked(conversation)
        conversation, continued_session = await self.continued(tenant, conversation)
        conversation = await continuations.with_instructions(self.history, tenant, conversation)
        plan = await self.planner.saved(tenant, conversation, options.with_session(continued_session), entry)
        self.journal.metrics.client_compactions.labels("item").inc()
        kept = len(plan.reconciled.path)
        log.info("client compaction answered: session %s, %d messages kept", plan.reconciled.session.id, kept)
        return StoredConversation(plan.reconciled.end_id, replace(plan.report, prompt_tokens=0))

    async def _checked(self, conversation: Conversation) -> tuple[ModelEntry, Conversation]:
        """The request's model entry, and the request with its output fitted and its definitions counted; a
        max_tokens that leaves no input room is refused, before any write."""
        entry = model_entry(self.config, conversation.model)
        conversation = await fit_output(self.budgets, entry, await counted(entry, conversation))
        request_budget(self.budgets, entry, conversation, {})
        return entry, conversation

    def _client_compaction(self, conversation: Conversation) -> ClientCompaction | None:
        """The client's own compaction the request asks for (`proxy.compaction.client_prompts`), when the proxy
        answers those (`context.client_compaction`)."""
        if not self.config.context.client_compaction:
            return None
        return recognize(conversation.messages, tools=bool(conversation.params.get("tools")))

    async def _summary_plan(
        self,
        tenant: str,
        conversation: Conversation,
        options: ContextOptions,
        entry: ModelEntry,
        asked: ClientCompaction,
    ) -> tuple[Plan, Upstream]:
        """A client's request for a summary of its conversation (`proxy.request.client_compaction`): the conversation
        without the request's prompt is stored, and answered by the proxy from its own spans, with no model call."""
        plan = await self.planner.saved(
            tenant, replace(conversation, messages=conversation.messages[:-1]), options, entry
        )
        return plan, await self._summary(tenant, plan, asked)

    async def _serialized_plan(
        self,
        tenant: str,
        conversation: Conversation,
        options: ContextOptions,
        entry: ModelEntry,
        asked: ClientCompaction,
    ) -> tuple[Plan, Upstream] | None:
        """A summary request of its own holding the conversation as text (Pi, OpenCode): answered, with no model
        call, for the stored session whose path holds the last user turn that text shows; None when no session
        does (the request then goes to the model like any other)."""
        prompt = content_text(conversation.messages[-1].get("content"), "\n")
        found = await summarized_session(self.history, tenant, asked, prompt)
        if found is None:
            log.info("a %s summary request names no stored conversation: sent to the model", asked.recognizer.client)
            return None
        session_id, path = found
        stored = replace(conversation, messages=await self.history.sent_forms(tenant, path))
        plan = await self.planner.saved(tenant, stored, replace(options, session_id=session_id), entry)
        return plan, await self._summary(tenant, plan, asked)

    async def _summary(self, tenant: str, plan: Plan, asked: ClientCompaction) -> Upstream:
        path = plan.reconciled.path
        spans = await self.compactor.spans_on(tenant, path)
        text = await summary_off_loop(path, spans, plan.reconciled.end_id, asked.recognizer.tagged)
        self.journal.metrics.client_compactions.labels("summary").inc()
        log.info(
            "%s summary request answered: session %s, %d messages kept",
            asked.recognizer.client,
            plan.reconciled.session.id,
            len(path),
        )
        return LocalAnswer(text)

    async def count_tokens(self, conversation: Conversation) -> int:
        """What the proxy would send for `conversation` (`proxy.request.budget.count_tokens`)."""
        return await count_tokens(self.config, self.budgets, self.compactor, conversation)

    async def _interrupt(self, step_begun: asyncio.Task[Step]) -> None:
        await self.journal.interrupt(await step_begun)

    async def _fail(self, step_begun: asyncio.Task[Step], exc: Exception) -> Exception:
        """End the step with the request's failure, and return the error its client is told: the store's outage
        names the step, which kept no answer. A store that cannot write the ending must not hide the failure (the
        journal then knows the step ended without its row, and records it once the store is back:
        `Journal.close`)."""
        step = await step_begun
        told: Exception = exc
        if isinstance(exc, StoreUnavailable):
            told = exc.in_step(step.id, StepKept.NOTHING)
            step.assembly = Assembly()  # a failed seal's answer was never saved, whether or not the ending is
        try:
            await self.journal.fail(step, error_fields(told))
        except Exception as again:
            log.error("could not record step %d as failed: %s", step.id, again)
        return told

    async def _forward(
        self,
        conversation: Conversation,
        options: ContextOptions,
        plan: Plan,
        call: Callable[[Plan], Awaitable[T]],
        received: float,
    ) -> tuple[Plan, T]:
        """Call the upstream with the plan; heal once if it counted more tokens than we did.

        A context-window refusal (in any provider's wording: `upstream/context_window.py`) that our budget
        should have prevented means the upstream's tokenizer differs from ours, or its window is smaller than
        configured: what it reported is learned for the model, the context compacted to the smaller budget, and
        the call made once more.
        """
        metrics = self.journal.metrics
        metrics.added_seconds.labels(metrics.model(plan.entry.name)).observe(time.monotonic() - received)
        try:
            return plan, await self._timed(conversation, plan, call)
        except UpstreamError as exc:
            if exc.context_overflow is None or options.mode == ContextMode.OFF:
                raise
            native = conversation.native.body if conversation.native is not None else {}
            overflow = unquoted(exc.context_overflow, (plan.prepared.messages, conversation.params, native))
            if overflow is None:
                raise  # the upstream repeated the client's words: its own verdict is something else
            budget = plan.budget
            refused = Refused(plan.sent_tokens, budget.reserved_output, budget.input_budget)
            learned = await self.budgets.learn(plan.entry, refused, overflow)
            if learned is None:
                raise  # nothing learned: compacting again would send the same request
            log.warning(
                "upstream rejected %d tokens for %s; budget factor now %.3f, window %s, compacting again",
                plan.sent_tokens,
                plan.entry.name,
                learned.factor,
                learned.window or "as configured",
            )
            plan = await self.planner.plan(
                plan.reconciled.session.tenant, conversation, options, plan.entry, plan.allowance
            )
            return plan, await self._timed(conversation, plan, call)

    async def _timed(self, conversation: Conversation, plan: Plan, call: Callable[[Plan], Awaitable[T]]) -> T:
        """One upstream call, for the metrics: its latency and the context it carried, whatever the answer."""
        metrics = self.journal.metrics
        model = metrics.model(plan.entry.name)
        started = time.monotonic()
        try:
            return await call(plan)
        finally:
            metrics.upstream_seconds.labels(model, str(conversation.stream).lower()).observe(time.monotonic() - started)
            report = plan.report
            metrics.context_tokens.labels(model).inc(report.prompt_tokens)
            metrics.saved_tokens.labels(model).inc(max(0, report.history_tokens - report.prompt_tokens))

    async def _complete(
        self,
        conversation: Conversation,
        options: ContextOptions,
        plan: Plan,
        step_begun: asyncio.Task[Step],
        received: float,
        upstream: Upstream,
    ) -> Answer:
        async def complete(plan: Plan) -> Chunk:
            # The stream's total deadline bounds a whole call too: an upstream can drip a JSON body as slowly.
            total_s = self.config.upstream.stream_deadline_s
            try:
                async with asyncio.timeout(total_s) as call:
                    return await upstream.complete(upstream_call(conversation, plan))
            except TimeoutError as exc:
                if not call.expired():
                    raise
                raise deadline_exceeded(
                    f"The upstream did not answer within the proxy's deadline (upstream.stream_deadline_s={total_s})."
                ) from exc

        try:
            sent, response = await self._forward(conversation, options, plan, complete, received)
        except AnswerTooLarge as exc:  # its body passed the byte cap while it was read: nothing of it is kept
            raise AnswerTooLarge(exc.limit, (await step_begun).id) from exc
        step = await step_begun
        limit = self.config.request_limits.max_answer_chars
        assembly = assemble([response])
        if assembly.size > limit:
            step.assembly = assembly.cut(limit)  # failing the step keeps what was paid for, up to the limit
            raise AnswerTooLarge(limit, step.id)
        if sent is not plan:
            await self.journal.recontext(step, sent.context())
        await self.journal.seal(step, response)
        return Completed(response, sent.report, StepRef(step.id, step.created_at))

    async def _stream(
        self,
        conversation: Conversation,
        options: ContextOptions,
        plan: Plan,
        step_begun: asyncio.Task[Step],
        received: float,
        upstream: Upstream,
    ) -> Answer:
        async def open_stream(plan: Plan) -> tuple[AsyncIterator[Chunk], StreamDeadlines]:
            # Each attempt has its own deadlines; the first chunk's also bounds the wait for the stream to open.
            deadlines = StreamDeadlines.from_config(self.config.upstream)
            try:
                async with asyncio.timeout_at(deadlines.first_chunk) as opening:
                    chunks = await upstream.open_stream(upstream_call(conversation, plan))
            except TimeoutError as exc:
                if not opening.expired():
                    raise
                raise deadlines.exceeded(first_chunk_seen=False) from exc
            return chunks, deadlines

        sent, (chunks, deadlines) = await self._forward(conversation, options, plan, open_stream, received)
        step = await step_begun
        if sent is not plan:
            await self.journal.recontext(step, sent.context())
        relay = StreamRelay(
            self.journal,
            step,
            chunks,
            finish_on_disconnect=self.config.journal.finish_on_disconnect,
            background=self.background,
            deadlines=deadlines,
            max_answer_chars=self.config.request_limits.max_answer_chars,
            write_timeout_s=self.config.server.write_timeout_s,
        )
        return Streaming(relay.events(), sent.report, StepRef(step.id, step.created_at))


def upstream_call(conversation: Conversation, plan: Plan) -> UpstreamCall:
    """What the upstream is given for one attempt: the plan's working context, the request as it came."""
    return UpstreamCall(
        plan.entry, plan.prepared.messages, conversation.params, conversation.native, conversation.raw_messages
    )
