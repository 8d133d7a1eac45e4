"""The Gemini door: `POST /v1beta/models/{model}:generateContent`, `:streamGenerateContent` and `:countTokens`
(and the same under `/v1`), for Gemini CLI and the google-genai SDKs.

The model and the method are the path's; the key comes as `x-goog-api-key` (Google's SDKs, Gemini CLI), `?key=`
or `Authorization: Bearer`. The request is parsed into the canonical conversation (`proxy.doors.gemini.input`),
answered by the same pipeline as every door — any configured model, forwarded as chat completions — and rendered
back as a `GenerateContentResponse` or its stream (`proxy.doors.gemini.output`): server-sent events with
`?alt=sse` (what the SDKs ask for), else one JSON array whose elements come as they are answered. Every error
under `/v1beta` and on these paths under `/v1` leaves in Google's shape with its status.

`countTokens` reports what the proxy would send for the conversation (`Pipeline.count_tokens`), as the Messages
door's `count_tokens` does: a client that compresses its history by this number leaves the compaction to the proxy.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import ClassVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from proxy.auth import BEARER, QUERY_KEY, X_GOOG_API_KEY, Caller, KeyPlace
from proxy.canonical.answers import Answer, Completed, Replayed
from proxy.config.schema import RequestLimits
from proxy.doors.body import parse_json_object, parse_off_loop, request_body
from proxy.doors.context_headers import answer_headers
from proxy.doors.door import Door, DoorRequest, DoorRoute, ErrorReply, RequestView
from proxy.doors.event_streams import Event, relayed_events, replayed_events
from proxy.doors.gemini.input import count_request_conversation, parse_generate_request
from proxy.doors.gemini.output import ResponseShape, ResponseStream, completed_response, google_error
from proxy.doors.sse import SSE_HEADERS, SSE_MEDIA_TYPE, RelayedStream, sse_event
from proxy.observability.requests import observe_model

VERSIONS = ("v1beta", "v1")
GENERATE = "generateContent"
STREAM = "streamGenerateContent"
COUNT = "countTokens"
JSON_MEDIA_TYPE = "application/json"


@dataclass(frozen=True)
class Delivery:
    """How a stream is framed: server-sent events (`?alt=sse`), or the elements of one JSON array."""

    sse: bool


class Gemini(Door[Delivery]):
    name: ClassVar[str] = "gemini"
    paths: ClassVar[tuple[str, ...]] = tuple(
        f"/{version}/models/{{model:path}}:{method}" for version in VERSIONS for method in (GENERATE, STREAM)
    )
    mounts: ClassVar[tuple[str, ...]] = (
        "/v1beta",
        *(f"/v1/models/{{model:path}}:{method}" for method in (GENERATE, STREAM, COUNT)),
    )
    """Under `/v1` only its methods' paths: OpenAI's `/v1/models/{id}` keeps its errors (a fine-tuned model's id
    has colons too)."""
    keys: ClassVar[tuple[KeyPlace, ...]] = (X_GOOG_API_KEY, QUERY_KEY, BEARER)
    routes: ClassVar[tuple[DoorRoute, ...]] = tuple(
        DoorRoute(f"/{version}/models/{{model:path}}:{COUNT}", ("POST",), "count_tokens") for version in VERSIONS
    )

    def parse(self, request: RequestView, limits: RequestLimits, tenant: str) -> DoorRequest[Delivery]:
        model, stream = request.path_params["model"], request.path.endswith(f":{STREAM}")
        conversation = parse_generate_request(request.body, model, stream, limits, self.resent.of(tenant))
        return DoorRequest(conversation, Delivery(sse=request.query.get("alt") == "sse"))

    def render(self, answer: Answer, request: DoorRequest[Delivery]) -> Response:
        conversation = request.conversation
        shape = ResponseShape(answer.step.id, conversation.model, answer.report.prompt_tokens)
        headers = answer_headers(answer)
        sse = request.rendering.sse
        if isinstance(answer, Completed):
            return JSONResponse(completed_response(shape, answer.response), headers=headers)
        if isinstance(answer, Replayed):
            if not conversation.stream:
                return JSONResponse(completed_response(shape, answer.chunks[0]), headers=headers)
            events = replayed_events(ResponseStream(shape), answer.chunks)
            return StreamingResponse(
                _framed(_at_once(events), sse), media_type=_media_type(sse), headers={**SSE_HEADERS, **headers}
            )
        body = _framed(relayed_events(ResponseStream(shape), answer.groups), sse)
        return RelayedStream(answer.groups, body, headers, _media_type(sse))

    @staticmethod
    def error(exc: BaseException) -> ErrorReply:
        return google_error(exc)

    async def count_tokens(self, request: Request, caller: Caller) -> Response:
        """`POST .../models/{model}:countTokens`: what the proxy would send (see the module docstring)."""
        limits = self.config.request_limits
        model = request.path_params["model"]
        raw = await request_body(request, self.config)
        conversation = await parse_off_loop(
            raw.body.tobytes(),
            lambda raw: count_request_conversation(parse_json_object(raw, limits.max_body_values), model, limits),
            self.lane,
        )
        observe_model(request.scope, conversation.model)
        return JSONResponse({"totalTokens": await self.pipeline.count_tokens(conversation)})


def _media_type(sse: bool) -> str:
    return SSE_MEDIA_TYPE if sse else JSON_MEDIA_TYPE


async def _at_once(events: list[Event]) -> AsyncIterator[list[Event]]:
    yield events


async def _framed(groups: AsyncIterator[list[Event]], sse: bool) -> AsyncIterator[bytes]:
    """Events as SSE, or as the elements of one JSON array (`[`, elements separated by `,`, `]`), each group as
    it comes."""
    first = True
    async for events in groups:
        if not events:
            continue
        if sse:
            yield b"".join(sse_event(event) for event in events)
        else:
            yield _elements(events, first)
            first = False
    if not sse:
        yield b"[]" if first else b"]"


def _elements(events: Iterable[Event], first: bool) -> bytes:
    head = b"[" if first else b","
    return head + b",".join(json.dumps(event, ensure_ascii=False).encode() for event in events)
