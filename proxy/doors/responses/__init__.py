"""The OpenAI Responses door: `POST /v1/responses`, for Codex CLI, the Agents SDK and `client.responses.create`.

The request is parsed into the canonical conversation (`proxy.doors.responses.input`), answered by the same
pipeline as chat — history, budget, compaction, journal — and rendered back as a `response` object or its event
stream (`proxy.doors.responses.output`). Errors before a stream starts are OpenAI's error bodies with the
upstream's status, as on the chat door; once it has started, a failure is a `response.failed` event.

The session is `X-Session-Id`, else the session of the `previous_response_id`, else the client's own
conversation key — Codex's `session-id` header, else `prompt_cache_key` — else derived from the conversation, as
for chat. Keys that could not be served back by `/sessions/{id}` are not used as session ids. A
`previous_response_id` continues the stored conversation (`proxy.doors.responses.stored`), whatever the upstream.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from proxy.auth import authenticate
from proxy.config import Config
from proxy.conversation import Answer, Completed, ContextOptions, Replayed
from proxy.doors.body import parse_off_loop, read_body
from proxy.doors.chat import RelayedStream
from proxy.doors.context_headers import context_options, is_session_id, replay_headers, report_headers, whole_number
from proxy.doors.event_streams import Event, relayed, replayed
from proxy.doors.responses.input import ResponsesRequest, check_pairs, parse_responses_request
from proxy.doors.responses.output import (
    EventStream,
    ResponseShape,
    completed_response,
    native_response,
)
from proxy.doors.responses.stored import DEFAULT_ITEMS_PAGE, MAX_ITEMS_PAGE, StoredResponses
from proxy.doors.sse import SSE_HEADERS, SSE_MEDIA_TYPE
from proxy.errors import InvalidRequest
from proxy.observability.requests import observe_model
from proxy.pipeline import Pipeline
from proxy.types import Chunk
from proxy.vocabulary import RESPONSE

CLIENT_SESSION_HEADER = "session-id"
"""Codex CLI's conversation id, stable for a whole thread."""


class Responses:
    def __init__(self, config: Config, pipeline: Pipeline) -> None:
        self._config = config
        self._pipeline = pipeline
        self.stored = StoredResponses(pipeline.reader, pipeline.journal, pipeline.history)

    async def __call__(self, request: Request) -> Response:
        caller = authenticate(request.headers, self._config.auth)
        limits = self._config.request_limits
        raw = await read_body(
            request.stream(),
            request.headers.get("content-length"),
            limits.max_body_bytes,
            self._config.server.body_timeout_s,
        )
        parsed = await parse_off_loop(raw, lambda raw: parse_responses_request(raw, limits))
        options = context_options(request.headers)
        previous_session = None
        if parsed.previous_response_id is not None:
            parsed, previous_session = await self._continue(caller.tenant, parsed)
        options = _session(options, request.headers, parsed, previous_session)
        observe_model(request.scope, parsed.conversation.model)
        answer = await self._pipeline.answer(caller.tenant, parsed.conversation, options)
        return render(answer, parsed)

    async def retrieve(self, request: Request) -> Response:
        """`GET /v1/responses/{id}`."""
        caller = authenticate(request.headers, self._config.auth)
        return JSONResponse(await self.stored.get(caller.tenant, request.path_params["response_id"]))

    async def delete(self, request: Request) -> Response:
        """`DELETE /v1/responses/{id}`: hidden from this API; the conversation keeps it."""
        caller = authenticate(request.headers, self._config.auth)
        return JSONResponse(await self.stored.delete(caller.tenant, request.path_params["response_id"]))

    async def input_items(self, request: Request) -> Response:
        """`GET /v1/responses/{id}/input_items?after=&limit=&order=`."""
        caller = authenticate(request.headers, self._config.auth)
        query = request.query_params
        limit_text = query.get("limit")
        limit = DEFAULT_ITEMS_PAGE if limit_text is None else whole_number(limit_text)
        if limit is None or not 1 <= limit <= MAX_ITEMS_PAGE:
            raise InvalidRequest(
                f"Query parameter 'limit' must be a whole number between 1 and {MAX_ITEMS_PAGE}.", param="limit"
            )
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise InvalidRequest("Query parameter 'order' must be 'asc' or 'desc'.", param="order")
        page = await self.stored.input_items(
            caller.tenant, request.path_params["response_id"], after=query.get("after"), limit=limit, order=order
        )
        return JSONResponse(page)

    async def _continue(self, tenant: str, parsed: ResponsesRequest) -> tuple[ResponsesRequest, str | None]:
        """The request with the conversation up to its previous response put before its own input."""
        assert parsed.previous_response_id is not None
        earlier, session_id = await self.stored.continuation(tenant, parsed.previous_response_id)
        conversation = parsed.conversation
        own = conversation.messages[len(parsed.instructions) :]
        messages = [*parsed.instructions, *earlier, *own]
        check_pairs(messages)
        wire = {**conversation.wire, "input_from": len(parsed.instructions) + len(earlier)}
        return replace(parsed, conversation=replace(conversation, messages=messages, wire=wire)), session_id


def _session(
    options: ContextOptions, headers: Mapping[str, str], parsed: ResponsesRequest, previous_session: str | None
) -> ContextOptions:
    """X-Session-Id; else the session of the previous response; else the client's own conversation key."""
    if options.session_id is not None:
        return options
    for key in (previous_session, headers.get(CLIENT_SESSION_HEADER), parsed.session_key):
        if key is not None and is_session_id(key):
            return replace(options, session_id=key)
    return options


def render(answer: Answer, parsed: ResponsesRequest) -> Response:
    stream = parsed.conversation.stream
    if isinstance(answer, Replayed):
        shape = _shape(parsed, answer.record.id, answer.record.created_at)
        headers = replay_headers(answer.record.session_id)
        if not stream:
            return JSONResponse(_response_object(shape, answer.chunks[0]), headers=headers)
        return StreamingResponse(
            replayed(EventStream(shape), answer.chunks), media_type=SSE_MEDIA_TYPE, headers={**SSE_HEADERS, **headers}
        )
    shape = _shape(parsed, answer.step.id, answer.step.created_at)
    headers = report_headers(answer.report)
    if isinstance(answer, Completed):
        return JSONResponse(_response_object(shape, answer.response), headers=headers)
    events = relayed(EventStream(shape), answer.groups)
    return RelayedStream(answer.groups, events, {**SSE_HEADERS, **headers})


def _response_object(shape: ResponseShape, completion: Chunk) -> Event:
    """The `response` a non-stream answer is: the native upstream's own, or rendered from chat."""
    native = completion.get(RESPONSE)
    return native_response(shape, native) if isinstance(native, dict) else completed_response(shape, completion)


def _shape(parsed: ResponsesRequest, step_id: int, created_at: float) -> ResponseShape:
    return ResponseShape(step_id, created_at, parsed.conversation.model, parsed.body, parsed.tools)
