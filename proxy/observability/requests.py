"""Timing every request for the metrics: an ASGI middleware around the whole app for HTTP, and each request on a
WebSocket as the door's socket loop answers it (`observe_socket_request`), under the same names.

The middleware sees what no single route does: the status the client got (an error handler's included), when the
first byte of a stream's body left, and when the last did. The route label is the matched route's template
(`/sessions/{session_id}`, never the id itself); the model label is what a front door found in the body and
put in the scope (`observe_model`), or `none` for routes that name no model. A socket request is a stream whose
first byte is its first event (`sent_on_socket`) and whose status is its error event's, or 200.
"""

from __future__ import annotations

import time
from collections.abc import MutableMapping
from typing import Any

from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from proxy.observability.metrics import OTHER, Metrics

MODEL_SCOPE_KEY = "context_proxy.model"
FIRST_EVENT_SCOPE_KEY = "context_proxy.first_event"
NO_MODEL = "none"
SSE_MEDIA_TYPE = b"text/event-stream"


def observe_model(scope: MutableMapping[str, Any], model: str) -> None:
    """A front door names the request's model for its metrics once it has parsed the body."""
    scope[MODEL_SCOPE_KEY] = model


class ObservedRequests:
    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self._app = app
        self._metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = time.monotonic()
        status = 500  # what the server answers when the app fails before it starts a response
        streaming = False
        first_byte: float | None = None

        async def observed_send(message: Message) -> None:
            nonlocal status, streaming, first_byte
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = dict(message.get("headers") or [])
                streaming = headers.get(b"content-type", b"").startswith(SSE_MEDIA_TYPE)
            elif message["type"] == "http.response.body" and first_byte is None and message.get("body"):
                first_byte = time.monotonic()
            await send(message)

        try:
            await self._app(scope, receive, observed_send)
        finally:
            route = _route(scope)
            model = self._metrics.model(scope[MODEL_SCOPE_KEY]) if MODEL_SCOPE_KEY in scope else NO_MODEL
            self._metrics.requests.labels(route, model, str(status)).inc()
            self._metrics.request_seconds.labels(route).observe(time.monotonic() - started)
            if streaming and first_byte is not None:
                self._metrics.first_byte_seconds.labels(route, model).observe(first_byte - started)


def sent_on_socket(scope: MutableMapping[str, Any]) -> None:
    """An answer's events are leaving on a socket: the first marks the request's first byte."""
    scope.setdefault(FIRST_EVENT_SCOPE_KEY, time.monotonic())


def observe_socket_request(metrics: Metrics, scope: MutableMapping[str, Any], status: int, started: float) -> None:
    """One request on a socket answered (`status`: 200, or its error event's), timed from its event's arrival;
    what it put in the connection's scope is taken out for the next."""
    route = _route(scope)
    model = metrics.model(scope.pop(MODEL_SCOPE_KEY)) if MODEL_SCOPE_KEY in scope else NO_MODEL
    first_event = scope.pop(FIRST_EVENT_SCOPE_KEY, None)
    metrics.requests.labels(route, model, str(status)).inc()
    metrics.request_seconds.labels(route).observe(time.monotonic() - started)
    if first_event is not None:
        metrics.first_byte_seconds.labels(route, model).observe(first_event - started)


def _route(scope: Scope) -> str:
    route = scope.get("route")
    path = getattr(route, "path", None) if isinstance(route, BaseRoute) else None
    return path if isinstance(path, str) and path else OTHER
