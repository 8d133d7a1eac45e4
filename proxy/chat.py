"""`POST /v1/chat/completions`: one request along the path DESIGN.md draws.

    inbound      auth, body within its limit, validation, context headers      (nothing stored yet)
    history      under the session lock: reconcile the re-sent messages, remember budget settings
    budget       model limits → effective input budget (request max_tokens, session cap, corrections)
    compaction   the working context, summarizing first when it does not fit
    forward      LiteLLM; a `context_length_exceeded` the budget should have prevented is healed once
    journal      the step begins beside the upstream call; streams go through `StreamRelay`
    outbound     JSON or SSE, with the X-Context-* headers

Bad input (malformed body or headers, unknown model, an impossible max_tokens) is refused before the first
write, so it changes nothing in the store. A valid request whose recent messages cannot fit the model is
stored first and then refused: what a client sent is never discarded.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from proxy import chain
from proxy.auth import authenticate
from proxy.compactor import Compactor, Prepared
from proxy.compactor import Request as CompactionRequest
from proxy.config import Config, ModelEntry
from proxy.corrections import TokenCorrections
from proxy.errors import ContextTooLarge, NotFound, UpstreamError, openai_error
from proxy.forward import Upstream
from proxy.history import History, Reconciled
from proxy.inbound import ChatRequest, ContextOptions, context_options, parse_chat_request, read_body
from proxy.journal import Journal, Step, StepRecord, chunks_from_record, completion_from_record
from proxy.limits import Budget, ModelLimits, effective_budget
from proxy.outbound import SSE_DONE, SSE_HEADERS, ContextReport, sse_event
from proxy.relay import StreamRelay
from proxy.tokens import count_prompt, encoding_for_model

log = logging.getLogger(__name__)

T = TypeVar("T")

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"


@dataclass(frozen=True)
class Plan:
    """What one request sends upstream, and the numbers its response headers report."""

    entry: ModelEntry
    reconciled: Reconciled
    budget: int
    prepared: Prepared
    encoding: str

    def report(self) -> ContextReport:
        return ContextReport(
            session_id=self.reconciled.session.id,
            prompt_tokens=self.prepared.tokens,
            budget=self.budget,
            history_tokens=count_prompt(m.tokens for m in self.reconciled.path),
            summaries=self.prepared.summaries,
        )


class ChatCompletions:
    def __init__(
        self,
        config: Config,
        history: History,
        journal: Journal,
        upstream: Upstream,
        compactor: Compactor,
        limits: Callable[[ModelEntry], ModelLimits],
        background: set[asyncio.Task[None]],
    ) -> None:
        self._config = config
        self._history = history
        self._journal = journal
        self._upstream = upstream
        self._compactor = compactor
        self._background = background
        self._corrections = TokenCorrections()
        self.limits = limits

    async def __call__(self, request: Request) -> Response:
        caller = authenticate(request.headers, self._config.auth)
        raw = await read_body(
            request.stream(), request.headers.get("content-length"), self._config.limits.max_body_bytes
        )
        chat = parse_chat_request(raw)
        options = context_options(request.headers)
        entry = self._config.model(chat.model)
        if entry is None:
            raise NotFound(
                f"The model `{chat.model}` does not exist or you do not have access to it.",
                param="model",
                code="model_not_found",
            )
        # A max_tokens that leaves no input room is bad input: refuse it before reconcile writes the messages.
        self._budget(entry, chat, {}, options)
        # Only a keyed request is ever compared with another: hashing a long body costs ~1.5 ms per 500 messages.
        fingerprint = "" if options.idempotency_key is None else _fingerprint(caller.tenant, chat)
        if options.idempotency_key is not None:
            replay = await self._journal.replay(caller.tenant, options.idempotency_key, fingerprint)
            if replay is not None:
                return _replay_response(chat, *replay)

        plan = await self._plan(caller.tenant, chat, options, entry)
        step_begun = asyncio.create_task(
            self._journal.begin(
                tenant=caller.tenant,
                session_id=plan.reconciled.session.id,
                model=chat.model,
                fingerprint=fingerprint,
                idempotency_key=options.idempotency_key,
                stream=chat.stream,
                parent_message_id=plan.reconciled.path[-1].id,
                encoding=plan.encoding,
            )
        )
        if options.idempotency_key is not None:
            await step_begun  # a conflicting key must be refused before the upstream is paid
        try:
            if chat.stream:
                return await self._stream(chat, options, plan, step_begun)
            return await self._complete(chat, options, plan, step_begun)
        except Exception as exc:
            # Until a stream's relay owns the step, any failure ends it here, so no step is left open.
            await self._journal.fail(await step_begun, openai_error(exc)[1]["error"])
            raise

    async def _plan(self, tenant: str, chat: ChatRequest, options: ContextOptions, entry: ModelEntry) -> Plan:
        encoding = encoding_for_model(entry.model)
        session_id = options.session_id or chain.derive_session_id(tenant, chat.messages)
        async with self._history.lock(tenant, session_id):
            reconciled = await self._history.reconcile(tenant, session_id, chat.messages, chat.model, encoding)
            reconciled = await self._remember_settings(tenant, reconciled, options)
            budget = self._budget(entry, chat, reconciled.session.settings, options)
            prepared = await self._prepare(tenant, chat, options, entry, reconciled, budget.input_budget, encoding)
        return Plan(entry, reconciled, budget.input_budget, prepared, encoding)

    async def _remember_settings(self, tenant: str, reconciled: Reconciled, options: ContextOptions) -> Reconciled:
        settings = dict(reconciled.session.settings)
        if options.reset_budget:
            if "budget" in settings:
                settings["budget"] = None  # update_settings merges: only a None value removes the key
        elif options.budget is not None:
            settings["budget"] = options.budget
        if settings == reconciled.session.settings:
            return reconciled
        session = await self._history.update_settings(tenant, reconciled.session.id, settings)
        return replace(reconciled, session=session or reconciled.session)

    def _budget(
        self, entry: ModelEntry, chat: ChatRequest, settings: Mapping[str, Any], options: ContextOptions
    ) -> Budget:
        cap = settings.get("budget")
        budget = effective_budget(
            self.limits(entry),
            chat.max_output,
            self._config.context.safety_margin,
            cap if isinstance(cap, int) else None,
        )
        corrected = self._corrections.apply(entry.name, budget.input_budget)
        if corrected <= 0:
            limits = budget.limits
            raise ContextTooLarge(
                f"max_tokens={budget.reserved_output} leaves no room for input in the {limits.context_window}-token "
                f"context window of model '{entry.name}'.",
                param="max_completion_tokens" if "max_completion_tokens" in chat.body else "max_tokens",
            )
        return replace(budget, input_budget=corrected)

    async def _prepare(
        self,
        tenant: str,
        chat: ChatRequest,
        options: ContextOptions,
        entry: ModelEntry,
        reconciled: Reconciled,
        budget: int,
        encoding: str,
    ) -> Prepared:
        if options.mode == "off":
            tokens = count_prompt(m.tokens for m in reconciled.path)
            return Prepared(list(chat.messages), tokens, summaries=0, written=0)
        return await self._compactor.prepare(
            CompactionRequest(
                tenant=tenant,
                session_id=reconciled.session.id,
                messages=chat.messages,
                path=reconciled.path,
                entry=entry,
                encoding=encoding,
                budget=budget,
                preserve_recent=(
                    self._config.context.preserve_recent if options.preserve_recent is None else options.preserve_recent
                ),
            )
        )

    async def _forward(
        self,
        chat: ChatRequest,
        options: ContextOptions,
        plan: Plan,
        call: Callable[[Plan], Awaitable[T]],
    ) -> tuple[Plan, T]:
        """Call the upstream with the plan; heal once if it counted more tokens than we did.

        A `context_length_exceeded` that our budget should have prevented means the upstream's tokenizer
        differs from ours: the ratio is learned for the model, the context compacted to the smaller budget, and
        the call made once more.
        """
        try:
            return plan, await call(plan)
        except UpstreamError as exc:
            if exc.code != CONTEXT_LENGTH_EXCEEDED or options.mode == "off":
                raise
            factor = self._corrections.learn(plan.entry.name, plan.prepared.tokens, exc.message)
            log.warning(
                "upstream rejected %d tokens for %s; budget factor now %.3f, compacting again",
                plan.prepared.tokens,
                plan.entry.name,
                factor,
            )
            plan = await self._plan(plan.reconciled.session.tenant, chat, options, plan.entry)
            return plan, await call(plan)

    async def _complete(
        self, chat: ChatRequest, options: ContextOptions, plan: Plan, step_begun: asyncio.Task[Step]
    ) -> Response:
        params = chat.params()

        async def complete(plan: Plan) -> dict[str, Any]:
            return await self._upstream.complete(plan.entry, plan.prepared.messages, params)

        plan, response = await self._forward(chat, options, plan, complete)
        await self._journal.seal(await step_begun, response)
        return JSONResponse(response, headers=plan.report().headers())

    async def _stream(
        self, chat: ChatRequest, options: ContextOptions, plan: Plan, step_begun: asyncio.Task[Step]
    ) -> Response:
        params = chat.params()

        async def open_stream(plan: Plan) -> AsyncIterator[dict[str, Any]]:
            return await self._upstream.open_stream(plan.entry, plan.prepared.messages, params)

        plan, chunks = await self._forward(chat, options, plan, open_stream)
        relay = StreamRelay(
            self._journal,
            await step_begun,
            chunks,
            finish_on_disconnect=self._config.journal.finish_on_disconnect,
            background=self._background,
        )
        return StreamingResponse(
            relay.events(), media_type="text/event-stream", headers={**SSE_HEADERS, **plan.report().headers()}
        )


_DELIVERY_PARAMS = ("stream", "stream_options")
"""How the answer is delivered, not what is asked: a retry may replay a stream as JSON or the reverse."""


def _fingerprint(tenant: str, chat: ChatRequest) -> str:
    """Same tenant and same body (key order and delivery aside) → same fingerprint; what Idempotency-Key
    replays check."""
    body = {key: value for key, value in chat.body.items() if key not in _DELIVERY_PARAMS}
    return hashlib.sha256(f"{tenant}\n{chain.canonical_json(body)}".encode()).hexdigest()


def _replay_response(chat: ChatRequest, record: StepRecord, chunks: list[dict[str, Any]]) -> Response:
    headers = {"X-Context-Replay": "true"}
    if record.session_id:
        headers["X-Session-Id"] = record.session_id
    if not chat.stream:
        stored = chunks[0] if chunks and not record.stream else completion_from_record(record)
        return JSONResponse(stored, headers=headers)
    events = chunks if chunks and record.stream else chunks_from_record(record)

    async def replay() -> AsyncIterator[bytes]:
        for chunk in events:
            yield sse_event(chunk)
        yield SSE_DONE

    return StreamingResponse(replay(), media_type="text/event-stream", headers={**SSE_HEADERS, **headers})
