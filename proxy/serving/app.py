"""The Starlette application: the doors' routes, the inspection views, health and metrics.

Handlers are thin: each delegates to one part and returns JSON. The routes that need a proxy key get the caller
from one wrapper (`_authenticated`), which runs before anything else they do. Every error — ours, Starlette's
(unknown route, wrong method) or an unexpected one — leaves in the shape of the door whose routes it falls under
(`proxy.doors.door.error_response`): Anthropic's under `/v1/messages`, Google's under Gemini's paths, OpenAI's
everywhere else.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route, WebSocketRoute
from starlette.websockets import WebSocket

from proxy.auth import Caller, authenticate, authenticate_admin
from proxy.config.schema import Config
from proxy.doors.body import parse_json_object, parse_off_loop, request_body
from proxy.doors.door import Doors, DoorType, error_response
from proxy.doors.paging import page_params
from proxy.doors.registry import DOORS
from proxy.errors import InvalidRequest, NotFound, ProxyError, StoreUnavailable
from proxy.inspection.pinning import checked_ids
from proxy.lifecycle.retention import SWEPT_CHARS
from proxy.numbers import parse_integer
from proxy.observability.metrics import CONTENT_TYPE, Metrics
from proxy.observability.requests import ObservedRequests
from proxy.offload import Lane, compute, json_pieces
from proxy.serving.heap import freeze_loaded
from proxy.serving.services import Services, open_services
from proxy.tokens import encoding_for_model, load_encoding
from proxy.ui.routes import ui_routes

log = logging.getLogger(__name__)

Handler = Callable[[Request], Awaitable[Response]]
CallerHandler = Callable[[Request, Caller], Awaitable[Response]]

MAX_PINS_BODY_BYTES = 256 * 1024
"""A pin request names at most `pinning.MAX_PIN_IDS` ids: far below this."""


def create_app(config: Config, *, serving: bool = False) -> Starlette:
    """`serving`: the process is `serve`'s, which this app has to itself (`heap.freeze_loaded` at startup)."""
    metrics = Metrics(entry.name for entry in config.models)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with open_services(config, metrics=metrics) as services:
            app.state.services = services
            lane = Lane()
            doors = {door.name: door(config, services.pipeline, lane) for door in DOORS}
            app.state.doors = Doors(config, services.pipeline, services.metrics, doors)
            app.state.started = int(time.time())
            services.upstream.warn_missing_keys()
            for encoding in {encoding_for_model(entry.model) for entry in config.models}:
                load_encoding(encoding)  # ~100,000 objects: loaded before they are frozen, not in a first request
            if serving:
                freeze_loaded()
            log.info("serving models %s from store %s", [m.name for m in config.models], config.store.location)
            yield

    routes: list[BaseRoute] = [
        *door_routes(DOORS),
        Route("/v1/models", _authenticated(_models), methods=["GET"]),
        Route("/v1/models/{model_id:path}", _authenticated(_model), methods=["GET"]),
        Route("/healthz", _health, methods=["GET"]),
        Route("/", _health, methods=["GET", "HEAD"]),
        Route("/sessions", _authenticated(_sessions), methods=["GET"]),
        Route("/sessions/{session_id}", _authenticated(_session), methods=["GET", "DELETE"]),
        Route("/sessions/{session_id}/summarize", _authenticated(_summarize), methods=["POST"]),
        Route("/sessions/{session_id}/pins", _authenticated(_pins), methods=["GET", "POST", "DELETE"]),
        Route("/sessions/{session_id}/pins/{message_id}", _authenticated(_pin), methods=["DELETE"]),
        Route("/sessions/{session_id}/events", _authenticated(_events), methods=["GET"]),
        Route("/journal", _authenticated(_journal), methods=["GET"]),
        Route("/journal/{step_id}", _authenticated(_journal_step), methods=["GET"]),
        Route("/admin/corrections", _corrections, methods=["GET", "DELETE"]),
        Route("/admin/corrections/{model:path}", _corrections, methods=["DELETE"]),
        Route("/admin/tenants/{tenant}", _tenant, methods=["DELETE"]),
        Route("/admin/retention", _retention, methods=["POST"]),
    ]
    if config.observability.metrics:
        routes.append(Route("/metrics", _metrics, methods=["GET"]))
    if config.observability.ui:
        routes.extend(ui_routes())
    return Starlette(
        routes=routes,
        lifespan=lifespan,
        middleware=[Middleware(ObservedRequests, metrics=metrics)],
        exception_handlers={
            ProxyError: _proxy_error,
            HTTPException: _http_error,
            ClientDisconnect: _client_gone,
            Exception: _unexpected_error,
        },
    )


def door_routes(doors: tuple[DoorType, ...]) -> list[BaseRoute]:
    """Each door's main routes and its own; a door's own routes come first, so that a fixed path of its own
    (`/v1/responses/compact`, Gemini's `:countTokens`) is never read as a parameter of another
    (`/v1/responses/{id}`, Gemini's `{model}:{method}`)."""
    routes: list[BaseRoute] = []
    for door in doors:
        for extra in door.routes:
            routes.append(Route(extra.path, _door_call(door.name, extra.handler), methods=list(extra.methods)))
        routes.extend(Route(path, _door_serve(door.name), methods=["POST"]) for path in door.paths)
        if door.socket:
            routes.append(WebSocketRoute(door.paths[0], _door_socket(door.name)))
    return routes


def _door_serve(name: str) -> Handler:
    async def serve(request: Request) -> Response:
        doors: Doors = request.app.state.doors
        return await doors.serve(name, request)

    return serve


def _door_socket(name: str) -> Callable[[WebSocket], Awaitable[None]]:
    async def socket(websocket: WebSocket) -> None:
        doors: Doors = websocket.app.state.doors
        await doors.serve_socket(name, websocket)

    return socket


def _door_call(name: str, handler: str) -> Handler:
    async def call(request: Request) -> Response:
        doors: Doors = request.app.state.doors
        return await doors.call(name, handler, request)

    return call


def _authenticated(handler: CallerHandler) -> Handler:
    """The route needs a proxy key (when auth is on): the caller is known before the handler runs."""

    async def guarded(request: Request) -> Response:
        return await handler(request, authenticate(request.headers, _services(request).config.auth))

    return guarded


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


async def _models(request: Request, caller: Caller) -> Response:
    services = _services(request)
    data = [_model_card(request, entry.name) for entry in services.config.models]
    return JSONResponse({"object": "list", "data": data})


async def _model(request: Request, caller: Caller) -> Response:
    """OpenAI's `GET /v1/models/{model}`: SDKs and tools call it to check a model before they use it."""
    services = _services(request)
    name = request.path_params["model_id"]
    if services.config.model(name) is None:
        raise NotFound(
            f"The model `{name}` does not exist or you do not have access to it.", param="model", code="model_not_found"
        )
    return JSONResponse(_model_card(request, name))


def _model_card(request: Request, name: str) -> dict[str, object]:
    """A model in OpenAI's shape; `created` is when the proxy started serving it."""
    created: int = request.app.state.started
    return {"id": name, "object": "model", "created": created, "owned_by": "context-infinity"}


async def _health(request: Request) -> Response:
    """200 while the store answers; 503 while it cannot be reached (a balancer then sends clients elsewhere),
    checked at most as often as the store's back-off lets a caller try it."""
    services = _services(request)
    with contextlib.suppress(StoreUnavailable):
        await services.db.fetchone("SELECT 1")
    models = len(services.config.models)
    if services.db.unreachable() is not None:
        return JSONResponse({"status": "unavailable", "store": "unreachable", "models": models}, status_code=503)
    return JSONResponse({"status": "ok", "store": "ok", "models": models})


async def _metrics(request: Request) -> Response:
    """Prometheus's text format; with auth on, a proxy key is needed unless `metrics.require_key` is false."""
    services = _services(request)
    if services.config.observability.metrics_require_key:
        authenticate(request.headers, services.config.auth)
    row = await services.db.fetchone("SELECT COUNT(*) FROM sessions")
    services.metrics.sessions.set(row[0] if row is not None else 0)
    stats = await services.stats.read()
    services.metrics.store_bytes.set(stats.bytes)
    services.metrics.store_free_bytes.set(stats.free_bytes)
    for table, count in stats.rows.items():
        services.metrics.store_rows.labels(table).set(count)
    return Response(services.metrics.exposition(), media_type=CONTENT_TYPE)


async def _sessions(request: Request, caller: Caller) -> Response:
    services = _services(request)
    limit, offset = page_params(request.query_params.get("limit"), request.query_params.get("offset"))
    return JSONResponse(await services.inspector.sessions(caller.tenant, limit, offset))


async def _session(request: Request, caller: Caller) -> Response:
    """The whole session: its JSON grows with it, so it is made in pieces off the event loop (`json_pieces`).
    `DELETE` removes everything it stored (`proxy.lifecycle`); another tenant's id is as unknown as any."""
    services = _services(request)
    if request.method == "DELETE":
        session_id = request.path_params["session_id"]
        forgotten = await services.deletions.delete_session(caller.tenant, session_id)
        return JSONResponse({"id": session_id, "object": "session.deleted", "deleted": True, **forgotten.as_json()})
    session = await services.inspector.session(caller.tenant, request.path_params["session_id"])
    return StreamingResponse(json_pieces(session), media_type="application/json")


async def _summarize(request: Request, caller: Caller) -> Response:
    services = _services(request)
    return JSONResponse(await services.inspector.summarize(caller.tenant, request.path_params["session_id"]))


async def _pins(request: Request, caller: Caller) -> Response:
    """`GET` the session's pins; `POST` / `DELETE` `{"message_ids": [...]}` to pin or unpin."""
    services = _services(request)
    session_id = request.path_params["session_id"]
    if request.method == "GET":
        return JSONResponse(await services.inspector.session_pins(caller.tenant, session_id))
    raw = await request_body(
        request, services.config, min(MAX_PINS_BODY_BYTES, services.config.request_limits.max_body_bytes)
    )
    max_values = services.config.request_limits.max_body_values
    body = await parse_off_loop(raw.body.tobytes(), lambda raw: parse_json_object(raw, max_values))
    ids = checked_ids(body.get("message_ids"))
    if request.method == "POST":
        return JSONResponse(await services.inspector.pin(caller.tenant, session_id, ids))
    return JSONResponse(await services.inspector.unpin(caller.tenant, session_id, ids))


async def _pin(request: Request, caller: Caller) -> Response:
    services = _services(request)
    ids = [request.path_params["message_id"]]
    return JSONResponse(await services.inspector.unpin(caller.tenant, request.path_params["session_id"], ids))


async def _events(request: Request, caller: Caller) -> Response:
    services = _services(request)
    limit, offset = page_params(request.query_params.get("limit"), request.query_params.get("offset"))
    session_id = request.path_params["session_id"]
    return JSONResponse(await services.inspector.session_events(caller.tenant, session_id, limit, offset))


async def _journal(request: Request, caller: Caller) -> Response:
    services = _services(request)
    limit, offset = page_params(request.query_params.get("limit"), request.query_params.get("offset"))
    status = request.query_params.get("status")
    session_id = request.query_params.get("session_id")
    return JSONResponse(await services.inspector.steps(caller.tenant, status, session_id, limit, offset))


async def _journal_step(request: Request, caller: Caller) -> Response:
    services = _services(request)
    text = request.path_params["step_id"]
    if not text.isascii() or not text.isdigit():
        raise InvalidRequest(f"Journal step ids are whole numbers, got '{text[:40]}'.", param="step_id")
    step_id = parse_integer(text)
    if step_id is None:  # past SQLite's integers: no step can have it
        raise NotFound(f"No journal step {text[:40]}….", code="step_not_found")
    return JSONResponse(await services.inspector.step(caller.tenant, step_id))


async def _corrections(request: Request) -> Response:
    """The operator's view of the budget corrections learned from upstream refusals; `DELETE` resets them (all,
    or one model's). They bind every tenant, so an admin key (`auth.admin_keys`) is needed, not a client's."""
    services = _services(request)
    authenticate_admin(request.headers, services.config.auth)
    if request.method == "GET":
        return JSONResponse(services.inspector.corrections())
    return JSONResponse(await services.inspector.forget_corrections(request.path_params.get("model")))


async def _tenant(request: Request) -> Response:
    """Everything one tenant stored, removed: its id is what `context-proxy tenants list` shows (`key-…`), so the
    route needs no key of that tenant, only an admin key (`auth.admin_keys`)."""
    services = _services(request)
    authenticate_admin(request.headers, services.config.auth)
    tenant = request.path_params["tenant"]
    forgotten = await services.deletions.purge_tenant(tenant)
    return JSONResponse({"id": tenant, "object": "tenant.purged", "purged": True, **forgotten.as_json()})


async def _retention(request: Request) -> Response:
    """A retention sweep now, in this process (`?dry_run=true`: what it would delete); an admin key's."""
    services = _services(request)
    authenticate_admin(request.headers, services.config.auth)
    if not services.retention.enabled:
        raise InvalidRequest(
            "No retention is configured: set store.retention_days (or store.tenant_retention_days).",
            code="retention_off",
        )
    dry_run = request.query_params.get("dry_run", "false").lower() in ("1", "true", "yes")
    sweep = await services.retention.sweep(dry_run=dry_run)
    # A sweep (a dry run above all) may list every session of a large store: listed and encoded off the loop.
    listed = await compute(len(sweep.sessions) * SWEPT_CHARS, sweep.as_json, time.time())
    return StreamingResponse(json_pieces(listed), media_type="application/json")


async def _proxy_error(request: Request, exc: Exception) -> Response:
    return error_response(request.url.path, exc, DOORS)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        error: ProxyError = NotFound(f"Invalid URL ({request.method} {request.url.path})", code="unknown_url")
    else:
        error = ProxyError(
            str(exc.detail),
            status=exc.status_code,
            error_type="invalid_request_error",
            code="method_not_allowed" if exc.status_code == 405 else None,
        )
    return await _proxy_error(request, error)


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client left while sending its request: nothing was done, and nobody is left to answer."""
    log.info("client left during its request body: %s %s", request.method, request.url.path)
    return Response(status_code=400)


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    log.error("unexpected failure on %s %s", request.method, request.url.path, exc_info=exc)
    return await _proxy_error(request, exc)
