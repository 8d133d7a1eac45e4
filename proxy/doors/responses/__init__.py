"""The OpenAI Responses door: `POST /v1/responses`, for Codex CLI, the Agents SDK and `client.responses.create`.

The request is parsed into the canonical conversation (`proxy.doors.responses.input`), answered by the same
pipeline as chat — history, budget, compaction, journal — and rendered back as a `response` object or its event
stream (`proxy.doors.responses.output`). Errors before a stream starts are OpenAI's error bodies with the
upstream's status, as on the chat door; once it has started, a failure is a `response.failed` event.

The session is `X-Session-Id`, else the session of the `previous_response_id`, else the client's own
conversation key — Codex's `session-id` header, else `prompt_cache_key` — else derived from the conversation, as
for chat. Keys that could not be served back by `/sessions/{id}` are not used as session ids. A
`previous_response_id` continues the stored conversation (`proxy.request.continuations`), whatever the upstream; stored
responses are read back and deleted through this door's own routes (`proxy.doors.responses.stored`). A client's
compaction (`compaction_trigger`, `POST /v1/responses/compact`) is this door's alone: the pipeline stores the
conversation (`Pipeline.compact`) and the door answers with one compaction item (`proxy.doors.responses.compaction`).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import ClassVar

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.websockets import WebSocket

from proxy.auth import Caller
from proxy.canonical.answers import Answer, Completed, Replayed, Streaming
from proxy.canonical.pieces import Received
from proxy.canonical.types import Chunk
from proxy.canonical.vocabulary import RESPONSE
from proxy.config.schema import Config, RequestLimits
from proxy.doors.body import parse_off_loop, request_body
from proxy.doors.context_headers import answer_headers, report_headers
from proxy.doors.door import Door, DoorRequest, DoorRoute, RequestView, send_events
from proxy.doors.event_streams import Event, frames, relayed, relayed_events, replayed, replayed_events
from proxy.doors.responses.compaction import compaction_item
from proxy.doors.responses.fields import ToolNames
from proxy.doors.responses.ids import RESPONSE_ID_PREFIX
from proxy.doors.responses.input import ResponsesRequest, parse_responses_request, parse_socket_event
from proxy.doors.responses.output import EventStream, ResponseShape, completed_response, native_response
from proxy.doors.responses.stored import DEFAULT_ITEMS_PAGE, MAX_ITEMS_PAGE, StoredResponses
from proxy.doors.sse import RelayedStream, sse_response
from proxy.errors import InvalidRequest, JSONBody, openai_error
from proxy.numbers import parse_integer
from proxy.offload import Lane
from proxy.request.continuations import SocketContinuations
from proxy.request.pipeline import Pipeline


@dataclass(frozen=True)
class Echo:
    """What rendering a response needs of its request: the fields it repeats, and how tool names map back."""

    body: dict[str, object]
    tools: ToolNames
    generate: bool = True
    compact: bool = False
    """The input ends with a `compaction_trigger`: the answer is one compaction item (`Pipeline.compact`)."""


class Responses(Door[Echo]):
    name: ClassVar[str] = "responses"
    paths: ClassVar[tuple[str, ...]] = ("/v1/responses",)
    mounts: ClassVar[tuple[str, ...]] = ("/v1/responses",)
    session_header: ClassVar[str | None] = "session-id"
    """Codex CLI's conversation id, stable for a whole thread."""
    socket: ClassVar[bool] = True
    routes: ClassVar[tuple[DoorRoute, ...]] = (
        DoorRoute("/v1/responses/compact", ("POST",), "compact"),
        DoorRoute("/v1/responses/{response_id}", ("GET", "DELETE"), "stored_response"),
        DoorRoute("/v1/responses/{response_id}/input_items", ("GET",), "input_items"),
    )

    def __init__(self, config: Config, pipeline: Pipeline, lane: Lane | None = None) -> None:
        super().__init__(config, pipeline, lane)
        self.stored = StoredResponses(pipeline.reader, pipeline.journal, pipeline.history)

    def parse(self, request: RequestView, limits: RequestLimits, tenant: str) -> DoorRequest[Echo]:
        return _door_request(parse_responses_request(request.body, limits, self.resent.of(tenant)))

    def parse_event(self, raw: Received | bytes, limits: RequestLimits, tenant: str) -> DoorRequest[Echo]:
        return _door_request(parse_socket_event(raw, limits, self.resent.of(tenant)))

    async def respond(self, caller: Caller, parsed: DoorRequest[Echo], request: Request) -> Response:
        """An input ending in `compaction_trigger` is answered by its compaction item: a response object, or the
        events of a stream."""
        if not parsed.rendering.compact:
            return await super().respond(caller, parsed, request)
        events, headers = await self._compacted(caller, parsed, request)
        if not parsed.conversation.stream:
            return JSONResponse(events[-1]["response"], headers=headers)
        return sse_response(_frames(events), headers)

    async def respond_on_socket(
        self, caller: Caller, parsed: DoorRequest[Echo], websocket: WebSocket, socket: SocketContinuations
    ) -> None:
        """`generate: false`: the socket is warmed with the request (Codex sends one before each turn) and
        answered at once, with an id of its own that the next request continues. A compaction is answered at
        once too, by its item."""
        if not parsed.rendering.generate:
            reference, events = _warm_up(parsed)
            conversation, _ = await self.pipeline.continued(caller.tenant, parsed.conversation)
            socket.warm(reference, conversation)
            await send_events(websocket, events)
        elif parsed.rendering.compact:
            await send_events(websocket, (await self._compacted(caller, parsed, websocket))[0])
        else:
            await super().respond_on_socket(caller, parsed, websocket, socket)

    def render(self, answer: Answer, request: DoorRequest[Echo]) -> Response:
        conversation = request.conversation
        shape = _shape(answer, request)
        headers = answer_headers(answer)
        if isinstance(answer, Completed | Replayed):
            completion = answer.response if isinstance(answer, Completed) else answer.chunks[0]
            if isinstance(answer, Completed) or not conversation.stream:
                return JSONResponse(_response_object(shape, completion), headers=headers)
            return sse_response(replayed(EventStream(shape), answer.chunks), headers)
        return RelayedStream(answer.groups, relayed(EventStream(shape), answer.groups), headers)

    async def events(self, answer: Answer, request: DoorRequest[Echo]) -> AsyncIterator[list[JSONBody]]:
        shape = _shape(answer, request)
        renderer = EventStream(shape)
        if isinstance(answer, Streaming):
            async for events in relayed_events(renderer, answer.groups):
                yield events
        else:
            yield replayed_events(renderer, answer.chunks if isinstance(answer, Replayed) else [answer.response])

    def event_error(self, exc: BaseException) -> JSONBody:
        """OpenAI's `error` server event, read two ways: the SDK's (`code`, `message`, `param` at the top) and
        Codex's (`status` and a nested `error`; `previous_response_not_found` makes it resend the whole input)."""
        status, body, headers = openai_error(exc)
        fields = body["error"]
        event: JSONBody = {"status": status, **fields, "type": "error", "error": fields}
        if headers:
            event["headers"] = {name.lower(): value for name, value in headers.items()}
        return event

    async def stored_response(self, request: Request, caller: Caller) -> Response:
        """`GET /v1/responses/{id}`; `DELETE` hides it from this API (the conversation keeps it)."""
        response = request.path_params["response_id"]
        if request.method == "DELETE":
            return JSONResponse(await self.stored.delete(caller.tenant, response))
        return JSONResponse(await self.stored.get(caller.tenant, response))

    async def input_items(self, request: Request, caller: Caller) -> Response:
        """`GET /v1/responses/{id}/input_items?after=&limit=&order=`."""
        query = request.query_params
        limit_text = query.get("limit")
        limit = DEFAULT_ITEMS_PAGE if limit_text is None else parse_integer(limit_text)
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

    async def compact(self, request: Request, caller: Caller) -> Response:
        """`POST /v1/responses/compact`: the request's conversation, compacted into one `compaction` item, which
        the client sends in its place from now on. The proxy keeps every message and compacts by itself, so it
        stores what is new and answers at once (`proxy.doors.responses.compaction`)."""
        limits = self.config.request_limits
        raw = await request_body(request, self.config, earlier=self.resent.earlier(caller.tenant))
        parsed = await parse_off_loop(
            raw, lambda raw: self.parse(RequestView.of(request, raw), limits, caller.tenant), self.lane
        )
        events, headers = await self._compacted(caller, parsed, request)
        completed = events[-1]["response"]
        compacted = {key: completed[key] for key in ("id", "created_at", "output", "usage")}
        return JSONResponse({**compacted, "object": "response.compaction"}, headers=headers)

    async def _compacted(
        self, caller: Caller, parsed: DoorRequest[Echo], connection: HTTPConnection
    ) -> tuple[list[Event], dict[str, str]]:
        """A client's compaction, answered with no model call and no journal step (`Pipeline.compact`): the
        stored conversation as one `compaction` item, in the events of a response named after it (its time now),
        and the X-Context-* headers."""
        conversation, options = self.asked(parsed, connection)
        stored = await self.pipeline.compact(caller.tenant, conversation, options)
        name = f"cmp_{stored.message_id[:24]}"
        echo = parsed.rendering
        shape = ResponseShape(0, time.time(), conversation.model, echo.body, echo.tools, RESPONSE_ID_PREFIX + name)
        renderer = EventStream(shape)
        renderer.usage = {"prompt_tokens": stored.report.history_tokens, "completion_tokens": 0}
        return renderer.whole([compaction_item(stored.message_id, name)]), report_headers(stored.report)


def _door_request(parsed: ResponsesRequest) -> DoorRequest[Echo]:
    keys = () if parsed.session_key is None else (parsed.session_key,)
    echo = Echo(dict(parsed.body), parsed.tools, parsed.generate, parsed.compact)
    return DoorRequest(parsed.conversation, echo, keys)


def _shape(answer: Answer, request: DoorRequest[Echo]) -> ResponseShape:
    echo = request.rendering
    return ResponseShape(answer.step.id, answer.step.created_at, request.conversation.model, echo.body, echo.tools)


def _warm_up(request: DoorRequest[Echo]) -> tuple[str, list[JSONBody]]:
    """A warm-up's own id, which the next request on the socket may continue, and the events answering it."""
    reference = f"{RESPONSE_ID_PREFIX}warm_{secrets.token_hex(12)}"
    echo = request.rendering
    shape = ResponseShape(0, time.time(), request.conversation.model, echo.body, echo.tools, reference)
    renderer = EventStream(shape)
    return reference, [*renderer.start(), *renderer.finish()]


async def _frames(events: list[Event]) -> AsyncIterator[bytes]:
    yield frames(events)


def _response_object(shape: ResponseShape, completion: Chunk) -> Event:
    """The `response` a non-stream answer is: the native upstream's own, or rendered from chat."""
    native = completion.get(RESPONSE)
    return native_response(shape, native) if isinstance(native, dict) else completed_response(shape, completion)
