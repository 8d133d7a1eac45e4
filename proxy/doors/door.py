"""The door mechanism: how every client API is served, in one place.

A *door* adapts one client API to the canonical form and back: it parses the matched request (`RequestView`: path
parameters, query, headers, body) into a `DoorRequest`, renders an `Answer`, and renders an error in its API's
shape. It declares, as a class, its paths (Starlette patterns: Gemini's model and method are in its path), where
its key arrives (`proxy.auth.KeyPlace`) and its mounts. Everything else a request goes through is done once,
here, for every door (`serve`): authenticate, read the body within its limit, parse it off the event loop, read
the X-Context-* options and the client's own names for its conversation, name the model for the metrics, forward
the client's API headers to a native upstream, ask the pipeline, render. A door that answers some requests by
itself (Responses' socket warm-ups and compactions) takes them first (`respond`, `respond_on_socket`), so no
other door, and no canonical answer, knows of them. A door may add routes of its own (`Door.routes`: stored
responses, `count_tokens`); their handlers get the caller already authenticated.

A door refuses, before anything is written, what its API refuses and the proxy can see — a number that is not
finite, a content part of a type the role does not take, a tool output that answers no call, a call the
conversation goes on past unanswered (one at the very end is the client's to answer) — as a 400 in its API's shape
naming the field. What the proxy cannot see is the upstream's to refuse.

A door is mounted as a Starlette `Mount` with its own exception handler would be: the shape an error leaves in is
chosen by route (`error_response`): every path under one of a door's `mounts` answers in its shape — its own
failures, unknown paths and methods below it, unexpected exceptions alike — and every other path in OpenAI's
(invariant 8).
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Generic, TypeVar

from starlette.requests import HTTPConnection, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import compile_path
from starlette.websockets import WebSocket, WebSocketDisconnect

from proxy.auth import BEARER, NO_QUERY, Caller, KeyPlace, authenticate
from proxy.canonical.answers import Answer, Streaming
from proxy.canonical.conversation import ContextOptions, Conversation
from proxy.canonical.pieces import Reading, Received
from proxy.config.schema import Config, RequestLimits
from proxy.doors.body import parse_off_loop, request_body
from proxy.doors.context_headers import context_options, is_session_id
from proxy.doors.resent import ResentLists
from proxy.errors import JSONBody, PayloadTooLarge, ProxyError, TooManySockets, openai_error
from proxy.observability.metrics import Metrics
from proxy.observability.requests import observe_model, observe_socket_request, sent_on_socket
from proxy.offload import Lane
from proxy.request.continuations import SocketContinuations
from proxy.request.pipeline import Pipeline

log = logging.getLogger(__name__)

R = TypeVar("R")

ErrorReply = tuple[int, JSONBody, dict[str, str]]
"""Status, body and headers of an error in one API's shape."""
Handler = Callable[[Request, Caller], Awaitable[Response]]


@dataclass(frozen=True)
class RequestView:
    """The matched request a door parses: its path and what its route's pattern took from it, the query, the
    headers (lower-case names) and the body."""

    body: Received | bytes
    path: str = ""
    path_params: Mapping[str, str] = field(default_factory=dict)
    query: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, connection: HTTPConnection, body: Received | bytes) -> RequestView:
        """Read from the ASGI scope: Starlette's `url` parses the Host header into a URL and `dict(headers)` scans
        the header list once per name, on every request, for what the scope holds as it is. A repeated header
        keeps its first value, as `connection.headers[name]` would give."""
        scope = connection.scope
        headers: dict[str, str] = {}
        for name, value in scope["headers"]:
            headers.setdefault(name.decode("latin-1"), value.decode("latin-1"))
        query = dict(connection.query_params) if scope.get("query_string") else {}
        return cls(body, scope["path"], dict(connection.path_params), query, headers)


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
    """The door's API, as `Conversation.door_state["door"]` and a model entry's `api` name it."""
    paths: ClassVar[tuple[str, ...]]
    """The routes its requests come to (POST; Starlette path patterns, whose parameters `parse` gets)."""
    mounts: ClassVar[tuple[str, ...]]
    """Errors of every path under one of these (or matching one, for a pattern) leave in this door's shape."""
    keys: ClassVar[tuple[KeyPlace, ...]] = (BEARER,)
    """Where its clients send their key, in the order looked at."""
    session_header: ClassVar[str | None] = None
    """The client's own header naming its conversation (Codex's `session-id`), used when X-Session-Id is absent."""
    native_headers: ClassVar[tuple[str, ...]] = ()
    """The client's headers of its API that a native upstream needs (`anthropic-beta`)."""
    routes: ClassVar[tuple[DoorRoute, ...]] = ()
    """Routes of its own beside `paths`, served by its methods of the same name (for an authenticated caller);
    matched before them."""
    socket: ClassVar[bool] = False
    """Its API also runs over a WebSocket on its first path (`parse_event`, `events`, `event_error`)."""

    def __init__(self, config: Config, pipeline: Pipeline, lane: Lane | None = None) -> None:
        self.config = config
        self.pipeline = pipeline
        self.lane = Lane() if lane is None else lane
        """Where its large bodies are parsed, one at a time: the same for every door (`proxy.offload.Lane`)."""
        self.resent = ResentLists()
        """Its last requests, so that what a client re-sends is parsed and converted once (`proxy.doors.resent`)."""

    def parse(self, request: RequestView, limits: RequestLimits, tenant: str) -> DoorRequest[R]:
        """The request as the canonical conversation; `InvalidRequest` naming the field for anything invalid. Pure
        but for the door's kept requests (`resent`, the tenant's): it runs off the event loop for big bodies."""
        raise NotImplementedError

    @classmethod
    def authenticate(cls, connection: HTTPConnection, config: Config) -> Caller:
        """The caller, by the key found in the door's `keys` places."""
        query = connection.query_params if any(place.source == "query" for place in cls.keys) else NO_QUERY
        return authenticate(connection.headers, config.auth, places=cls.keys, query=query)

    def render(self, answer: Answer, request: DoorRequest[R]) -> Response:
        raise NotImplementedError

    def parse_event(self, raw: Received | bytes, limits: RequestLimits, tenant: str) -> DoorRequest[R]:
        """A client event on the door's socket as a request (pure but for the door's kept requests, like `parse`:
        a client re-sends its conversation on a new socket as it would in a new request)."""
        raise NotImplementedError

    def events(self, answer: Answer, request: DoorRequest[R]) -> AsyncIterator[list[JSONBody]]:
        """An answer as the events its socket sends, a group at a time as each becomes durable."""
        raise NotImplementedError

    def event_error(self, exc: BaseException) -> JSONBody:
        """A failure as the event its socket sends; the socket stays open for the next request."""
        raise NotImplementedError

    async def respond(self, caller: Caller, parsed: DoorRequest[R], request: Request) -> Response:
        """An HTTP request answered: the pipeline's answer, rendered. A door that answers some of its requests
        otherwise (Responses' compaction) takes those here first."""
        answer, parsed = await self.answer(caller, parsed, request)
        return self.render(answer, parsed)

    async def respond_on_socket(
        self, caller: Caller, parsed: DoorRequest[R], websocket: WebSocket, socket: SocketContinuations
    ) -> None:
        """A socket request answered: the pipeline's answer, its events sent a group at a time as each becomes
        durable. A door that answers some of its socket requests otherwise (Responses' warm-up and compaction)
        takes those here first."""
        answer, parsed = await self.answer(caller, parsed, websocket)
        socket.answered.add(answer.step.id)
        try:
            async for events in self.events(answer, parsed):
                await send_events(websocket, events)
        finally:
            if isinstance(answer, Streaming):
                await answer.groups.aclose()

    async def answer(
        self, caller: Caller, parsed: DoorRequest[R], connection: HTTPConnection
    ) -> tuple[Answer, DoorRequest[R]]:
        """The pipeline's answer to a parsed request (`asked`), and the request as it was asked."""
        conversation, options = self.asked(parsed, connection)
        answer = await self.pipeline.answer(caller.tenant, conversation, options)
        return answer, replace(parsed, conversation=conversation)

    def asked(self, parsed: DoorRequest[R], connection: HTTPConnection) -> tuple[Conversation, ContextOptions]:
        """What every door does with a parsed request before the pipeline, on HTTP and on a socket alike: the
        client's API headers kept for a native upstream, the X-Context-* options and the client's own names for
        its conversation, the model named for the metrics."""
        headers = connection.headers
        conversation = _with_native_headers(parsed.conversation, self.native_headers, headers)
        options = context_options(headers)
        if options.session_id is None:
            header = headers.get(self.session_header) if self.session_header else None
            hints = tuple(key for key in (header, *parsed.session_keys) if key is not None and is_session_id(key))
            options = replace(options, session_hints=hints)
        observe_model(connection.scope, conversation.model)
        return conversation, options

    @staticmethod
    def error(exc: BaseException) -> ErrorReply:
        """Any exception as this API's error (an unknown one as an opaque internal error): OpenAI's, unless the
        door's API has its own."""
        return openai_error(exc)


DoorType = type[Door[Any]]


class OpenSockets:
    """The WebSockets each tenant holds open, held against `server.max_sockets_per_key`: one key cannot take
    every connection of the proxy, however long its sockets last."""

    def __init__(self) -> None:
        self._open: Counter[str] = Counter()

    @contextmanager
    def slot(self, tenant: str, limit: int) -> Iterator[None]:
        if self._open[tenant] >= limit:
            raise TooManySockets(
                f"This key already holds {limit} WebSockets (server.max_sockets_per_key); close one, or use HTTP."
            )
        self._open[tenant] += 1
        try:
            yield
        finally:
            self._open[tenant] -= 1
            if not self._open[tenant]:
                del self._open[tenant]

    def count(self, tenant: str) -> int:
        return self._open[tenant]


@dataclass(frozen=True)
class Doors:
    """The served doors, built once when serving starts."""

    config: Config
    pipeline: Pipeline
    metrics: Metrics
    by_name: dict[str, Door[Any]] = field(default_factory=dict)
    sockets: OpenSockets = field(default_factory=OpenSockets)

    async def serve(self, name: str, request: Request) -> Response:
        door = self.by_name[name]
        caller = door.authenticate(request, self.config)
        limits = self.config.request_limits
        raw = await request_body(request, self.config, earlier=door.resent.earlier(caller.tenant))
        parsed = await parse_off_loop(
            raw, lambda raw: door.parse(RequestView.of(request, raw), limits, caller.tenant), door.lane
        )
        return await door.respond(caller, parsed, request)

    async def serve_socket(self, name: str, websocket: WebSocket) -> None:
        """A door's API over a WebSocket: the handshake authenticated like a request and counted against the
        key's `server.max_sockets_per_key` (refused with the door's HTTP error), then one request at a time,
        each answered by its events; a failed request is an error event and the socket stays open; the client
        closes it (or the server, idle: `proxy.serving.sockets`)."""
        door = self.by_name[name]
        with ExitStack() as held:
            try:
                caller = door.authenticate(websocket, self.config)
                held.enter_context(self.sockets.slot(caller.tenant, self.config.server.max_sockets_per_key))
            except ProxyError as exc:
                status, body, headers = door.error(exc)
                await websocket.send_denial_response(JSONResponse(body, status_code=status, headers=headers))
                return
            await websocket.accept()
            await self._serve_events(door, caller, websocket)

    async def _serve_events(self, door: Door[Any], caller: Caller, websocket: WebSocket) -> None:
        socket = SocketContinuations()
        try:
            while True:
                raw = await _receive(websocket, self.config.request_limits.max_body_bytes)
                started, status = time.monotonic(), 200
                try:
                    await self._answer_event(door, caller, raw, websocket, socket)
                except WebSocketDisconnect:
                    raise
                except Exception as exc:
                    if not isinstance(exc, ProxyError):
                        log.error("unexpected failure on a %s socket", door.name, exc_info=exc)
                    status = door.error(exc)[0]
                    await websocket.send_text(_json(door.event_error(exc)))
                finally:
                    observe_socket_request(self.metrics, websocket.scope, status, started)
        except WebSocketDisconnect:
            return

    async def _answer_event(
        self, door: Door[R], caller: Caller, raw: bytes, websocket: WebSocket, socket: SocketContinuations
    ) -> None:
        limits = self.config.request_limits
        reading = Reading(door.resent.earlier(caller.tenant))
        reading.add(raw)
        parsed = await parse_off_loop(
            reading.received(), lambda raw: door.parse_event(raw, limits, caller.tenant), door.lane
        )
        parsed = replace(parsed, conversation=socket.resolve(parsed.conversation))
        await door.respond_on_socket(caller, parsed, websocket, socket)

    async def call(self, name: str, handler: str, request: Request) -> Response:
        """A door's own route (`DoorRoute`), for an authenticated caller."""
        door = self.by_name[name]
        caller = door.authenticate(request, self.config)
        method: Handler = getattr(door, handler)
        return await method(request, caller)


async def _receive(websocket: WebSocket, max_bytes: int) -> bytes:
    message = await websocket.receive()
    if message["type"] == "websocket.disconnect":
        raise WebSocketDisconnect(message.get("code", 1000))
    data: bytes = message["bytes"] if message.get("bytes") is not None else message.get("text", "").encode()
    if len(data) > max_bytes:
        raise PayloadTooLarge(f"A client event is {len(data)} bytes; the limit is {max_bytes} bytes.")
    return data


async def send_events(websocket: WebSocket, events: Sequence[JSONBody]) -> None:
    sent_on_socket(websocket.scope)
    for event in events:
        await websocket.send_text(_json(event))


def _json(event: JSONBody) -> str:
    return json.dumps(event, ensure_ascii=False, separators=(",", ":"))


def _with_native_headers(conversation: Conversation, names: Sequence[str], headers: Any) -> Conversation:
    native = conversation.native
    if native is None or not names:
        return conversation
    forwarded = {name: headers[name] for name in names if name in headers}
    return replace(conversation, native=replace(native, headers=forwarded)) if forwarded else conversation


def error_door(path: str, doors: Sequence[DoorType]) -> DoorType | None:
    """The door whose shape errors on `path` take: the one with the longest mount it lies under (a pattern it
    matches is as long as the path)."""
    best: tuple[int, DoorType | None] = (-1, None)
    for door in doors:
        for mount in door.mounts:
            length = _mounted(path, mount)
            if length > best[0]:
                best = (length, door)
    return best[1]


def _mounted(path: str, mount: str) -> int:
    if "{" in mount:
        return len(path) if compile_path(mount)[0].match(path) else -1
    if path == mount or path.startswith(mount.rstrip("/") + "/"):
        return len(mount)
    return -1


def error_response(path: str, exc: BaseException, doors: Sequence[DoorType]) -> Response:
    door = error_door(path, doors)
    status, body, headers = (door.error if door is not None else openai_error)(exc)
    return JSONResponse(body, status_code=status, headers=headers)
