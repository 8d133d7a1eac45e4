"""The Anthropic Messages door: `POST /v1/messages` (and `/count_tokens`), for Claude Code and the Anthropic SDKs.

The request is parsed into the canonical conversation (`proxy.doors.messages.input`), answered by the same
pipeline as the other doors, and rendered back as a `message` or its event stream
(`proxy.doors.messages.output`). Every error on this door leaves in Anthropic's shape with its status. The key may
come as `x-api-key` (Anthropic's SDKs) or `Authorization: Bearer`; `?beta=true` (Claude Code) is accepted.

The session is `X-Session-Id`, else Claude Code's `X-Claude-Code-Session-Id`, else derived as for chat.
`max_tokens` is lowered to what the configured model can give (its output limit, a quarter of its window at most):
Anthropic clients ask for their Claude model's limit, whatever the model behind the proxy.

`count_tokens` reports what the proxy would send for the conversation, by its own count: the request as it
stands while it fits, else about the share the proxy compacts to (`context.compact_to` of the model's input
budget). A client that auto-compacts by this number (Claude Code does, near its model's window) thus leaves the
compaction to the proxy, which keeps the whole history, instead of rewriting its own.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from proxy.auth import authenticate
from proxy.config import Config
from proxy.conversation import NATIVE_HEADERS, Answer, Completed, ContextOptions, Replayed
from proxy.doors.body import parse_off_loop, read_body
from proxy.doors.chat import RelayedStream
from proxy.doors.context_headers import context_options, is_session_id, replay_headers, report_headers
from proxy.doors.event_streams import Event, relayed, replayed
from proxy.doors.messages.input import MessagesRequest, parse_messages_request
from proxy.doors.messages.output import MessageEvents, MessageShape, anthropic_error, completed_message
from proxy.doors.sse import SSE_HEADERS, SSE_MEDIA_TYPE
from proxy.errors import NotFound, ProxyError
from proxy.observability.requests import observe_model
from proxy.offload import compute
from proxy.pipeline import Pipeline
from proxy.tokens import count_message, count_prompt, encoding_for_model, rough_size
from proxy.types import Chunk
from proxy.vocabulary import RESPONSE

log = logging.getLogger(__name__)

CLIENT_SESSION_HEADER = "x-claude-code-session-id"
BETA_HEADER = "anthropic-beta"
OUTPUT_SHARE = 4
"""At most a quarter of a model's window is kept for the answer when a client asks for more."""


class Messages:
    def __init__(self, config: Config, pipeline: Pipeline) -> None:
        self._config = config
        self._pipeline = pipeline

    async def __call__(self, request: Request) -> Response:
        try:
            caller = authenticate(request.headers, self._config.auth, api_key_header=True)
            parsed = _with_betas(self._fit_output(await self._parse(request, counting=False)), request.headers)
            options = _session(context_options(request.headers), request.headers)
            observe_model(request.scope, parsed.conversation.model)
            answer = await self._pipeline.answer(caller.tenant, parsed.conversation, options)
        except ProxyError as exc:
            return _error_response(exc)
        return render(answer, parsed)

    async def count_tokens(self, request: Request) -> Response:
        """`POST /v1/messages/count_tokens`: what the proxy would send (see the module docstring)."""
        try:
            authenticate(request.headers, self._config.auth, api_key_header=True)
            parsed = await self._parse(request, counting=True)
            conversation = parsed.conversation
            observe_model(request.scope, conversation.model)
            entry = self._config.model(conversation.model)
            if entry is None:
                raise NotFound(f"model: {conversation.model}", param="model", code="model_not_found")
            encoding = encoding_for_model(entry.model)
            size = sum(map(rough_size, conversation.messages))
            counts = await compute(size, lambda: [count_message(m, encoding) for m in conversation.messages])
            tokens = count_prompt(counts)
            budget = self._pipeline.budgets.budget(entry, None, {}).input_budget
            context = self._config.context
            if tokens > context.trigger_ratio * budget:
                tokens = int(context.compact_to * budget)
        except ProxyError as exc:
            return _error_response(exc)
        return JSONResponse({"input_tokens": tokens})

    def _fit_output(self, parsed: MessagesRequest) -> MessagesRequest:
        """`max_tokens` within the configured model's output limit and a quarter of its window: Claude Code asks
        for its Claude model's limit (32k and more), which would leave a 32k local model no room for input (its own
        system prompt and tools are ~7k tokens)."""
        conversation = parsed.conversation
        entry = self._config.model(conversation.model)
        if entry is None or conversation.max_output is None:
            return parsed
        limits = self._pipeline.budgets.limits(entry)
        fitted = min(conversation.max_output, limits.max_output, limits.context_window // OUTPUT_SHARE)
        if fitted == conversation.max_output:
            return parsed
        params = {**conversation.params, "max_tokens": fitted}
        return replace(parsed, conversation=replace(conversation, max_output=fitted, params=params))

    async def _parse(self, request: Request, *, counting: bool) -> MessagesRequest:
        limits = self._config.request_limits
        raw = await read_body(
            request.stream(),
            request.headers.get("content-length"),
            limits.max_body_bytes,
            self._config.server.body_timeout_s,
        )
        return await parse_off_loop(raw, lambda raw: parse_messages_request(raw, limits, counting=counting))


def _with_betas(parsed: MessagesRequest, headers: Mapping[str, str]) -> MessagesRequest:
    """The client's `anthropic-beta`, for an Anthropic upstream (the fields it sent may depend on it)."""
    beta = headers.get(BETA_HEADER)
    native = parsed.conversation.native
    if beta is None or native is None:
        return parsed
    native = {**native, NATIVE_HEADERS: {BETA_HEADER: beta}}
    return replace(parsed, conversation=replace(parsed.conversation, native=native))


def _error_response(exc: ProxyError) -> Response:
    status, body = anthropic_error(exc)
    return JSONResponse(body, status_code=status, headers=dict(exc.headers))


def _session(options: ContextOptions, headers: Mapping[str, str]) -> ContextOptions:
    if options.session_id is not None:
        return options
    key = headers.get(CLIENT_SESSION_HEADER)
    if key is not None and is_session_id(key):
        return replace(options, session_id=key)
    return options


def render(answer: Answer, parsed: MessagesRequest) -> Response:
    stream = parsed.conversation.stream
    model = parsed.conversation.model
    if isinstance(answer, Replayed):
        prompt = int((answer.record.context or {}).get("prompt_tokens") or 0)
        shape = MessageShape(answer.record.id, model, prompt)
        headers = replay_headers(answer.record.session_id)
        if not stream:
            return JSONResponse(_message_object(shape, answer.chunks[0]), headers=headers)
        return StreamingResponse(
            replayed(MessageEvents(shape), answer.chunks),
            media_type=SSE_MEDIA_TYPE,
            headers={**SSE_HEADERS, **headers},
        )
    shape = MessageShape(answer.step.id, model, answer.report.prompt_tokens)
    headers = report_headers(answer.report)
    if isinstance(answer, Completed):
        return JSONResponse(_message_object(shape, answer.response), headers=headers)
    events = relayed(MessageEvents(shape), answer.groups)
    return RelayedStream(answer.groups, events, {**SSE_HEADERS, **headers})


def _message_object(shape: MessageShape, completion: Chunk) -> Event:
    """The `message` a non-stream answer is: an Anthropic upstream's own (under the proxy's id), or rendered."""
    native = completion.get(RESPONSE)
    return {**native, "id": shape.id} if isinstance(native, dict) else completed_message(shape, completion)
