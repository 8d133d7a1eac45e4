"""The door mechanism: how every client API is served, in one place.

A *door* adapts one client API to the canonical form and back: it parses a body into a `DoorRequest`, renders an
`Answer`, and renders an error in its API's shape. Everything else a request goes through is done once, here,
for every door (`serve`): authenticate, read the body within its limit, parse it off the event loop, read the
X-Context-* options and the client's own names for its conversation, name the model for the metrics, forward the
client's API headers to a native upstream, ask the pipeline, render. A door may add routes of its own
(`Door.routes`: stored responses, `count_tokens`); their handlers get the caller already authenticated.

Which door's shape an error leaves in is chosen by route (`error_response`): every path under a door's `prefix`
answers in its shape — its own failures, unknown paths and methods below it, unexpected exceptions alike — and
every other path in OpenAI's (invariant 8).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from proxy.auth import Caller, authenticate
from proxy.config import Config, RequestLimits
from proxy.conversation import Answer, Conversation
from proxy.doors.body import parse_off_loop, request_body
from proxy.doors.context_headers import context_options, is_session_id
from proxy.errors import JSONBody, openai_error
from proxy.observability.requests import observe_model
from proxy.pipeline import Pipeline

R = TypeVar("R")

ErrorReply = tuple[int, JSONBody, dict[str, str]]
"""Status, body and headers of an error in one API's shape."""
Handler = Callable[[Request, Caller], Awaitable[Response]]


@dataclass(frozen=True)
class DoorRequest(Generic[R]):
    """What a door parsed: the canonical conversation, and what only the door reads back when it renders."""

    conversation: Conversation
    rendering: R
    session_keys: tuple[str, ...] = ()
    """The client's own names for its conversation found in the body (Responses' `prompt_cache_key`), after
    the door's session header."""


@dataclass(frozen=True)
class DoorRoute:
    """A route a door adds beside its main one; `handler` names a method of the door taking (request, caller)."""

    path: str
    methods: tuple[str, ...]
    handler: str


class Door(Generic[R]):
    """One client API. A door declares, as a class, where it is served and how its errors look; its instance
    (built once when serving starts) parses requests and renders answers."""

    name: ClassVar[str]
    """The door's API, as `Conversation.wire["door"]` and a model entry's `api` name it."""
    path: ClassVar[str]
    """The route its requests come to (POST)."""
    prefix: ClassVar[str]
    """Errors of every path under it leave in this door's shape."""
    api_key_header: ClassVar[bool] = False
    """The key may also come as `x-api-key` (Anthropic's clients)."""
    session_header: ClassVar[str | None] = None
    """The client's own header naming its conversation (Codex's `session-id`), used when X-Session-Id is absent."""
    native_headers: ClassVar[tuple[str, ...]] = ()
    """The client's headers of its API that a native upstream needs (`anthropic-beta`)."""
    routes: ClassVar[tuple[DoorRoute, ...]] = ()
    """Routes of its own beside `path`, served by its methods of the same name (for an authenticated caller)."""

    def __init__(self, config: Config, pipeline: Pipeline) -> None:
        self.config = config
        self.pipeline = pipeline

    def parse(self, raw: bytes, limits: RequestLimits) -> DoorRequest[R]:
        """The body as the canonical conversation; `InvalidRequest` naming the field for anything invalid. Pure:
        it runs off the event loop for big bodies."""
        raise NotImplementedError

    def render(self, answer: Answer, request: DoorRequest[R]) -> Response:
        raise NotImplementedError

    @staticmethod
    def error(exc: BaseException) -> ErrorReply:
        """Any exception as this API's error (an unknown one as an opaque internal error): OpenAI's, unless the
        door's API has its own."""
        return openai_error(exc)


DoorType = type[Door[Any]]


@dataclass(frozen=True)
class Doors:
    """The served doors, built once when serving starts."""

    config: Config
    pipeline: Pipeline
    by_name: dict[str, Door[Any]] = field(default_factory=dict)

    async def serve(self, name: str, request: Request) -> Response:
        door = self.by_name[name]
        config = self.config
        caller = authenticate(request.headers, config.auth, api_key_header=door.api_key_header)
        limits = config.request_limits
        raw = await request_body(request, config)
        parsed = await parse_off_loop(raw, lambda raw: door.parse(raw, limits))
        conversation = _with_native_headers(parsed.conversation, door.native_headers, request.headers)
        options = context_options(request.headers)
        if options.session_id is None:
            header = request.headers.get(door.session_header) if door.session_header else None
            hints = tuple(key for key in (header, *parsed.session_keys) if key is not None and is_session_id(key))
            options = replace(options, session_hints=hints)
        observe_model(request.scope, conversation.model)
        answer = await self.pipeline.answer(caller.tenant, conversation, options)
        return door.render(answer, replace(parsed, conversation=conversation))

    async def call(self, name: str, handler: str, request: Request) -> Response:
        """A door's own route (`DoorRoute`), for an authenticated caller."""
        door = self.by_name[name]
        caller = authenticate(request.headers, self.config.auth, api_key_header=door.api_key_header)
        method: Handler = getattr(door, handler)
        return await method(request, caller)


def _with_native_headers(conversation: Conversation, names: Sequence[str], headers: Any) -> Conversation:
    native = conversation.native
    if native is None or not names:
        return conversation
    forwarded = {name: headers[name] for name in names if name in headers}
    return replace(conversation, native=replace(native, headers=forwarded)) if forwarded else conversation


def error_door(path: str, doors: Sequence[DoorType]) -> DoorType | None:
    """The door whose shape errors on `path` take: the one with the longest prefix it lies under."""
    under = [door for door in doors if path == door.prefix or path.startswith(door.prefix.rstrip("/") + "/")]
    return max(under, key=lambda door: len(door.prefix), default=None)


def error_response(path: str, exc: BaseException, doors: Sequence[DoorType]) -> Response:
    door = error_door(path, doors)
    status, body, headers = (door.error if door is not None else openai_error)(exc)
    return JSONResponse(body, status_code=status, headers=headers)
