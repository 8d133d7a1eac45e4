"""The dashboard's routes: the page and its assets (no key needed: they hold no data) and its JSON views
(the caller's tenant only, like `/sessions`; with auth on, the page asks for the key and sends it)."""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from proxy.auth import authenticate
from proxy.doors.paging import page_params
from proxy.errors import InvalidRequest
from proxy.numbers import parse_integer
from proxy.serving.services import Services
from proxy.ui.views import Dashboard

STATIC = Path(__file__).parent / "static"
NO_STORE = {"Cache-Control": "no-store"}
"""The views change with every request the proxy serves."""


def ui_routes() -> list[BaseRoute]:
    return [
        Route("/ui", _to_page, methods=["GET", "HEAD"]),
        Route("/ui/", _page, methods=["GET", "HEAD"]),
        Mount("/ui/static", app=StaticFiles(directory=STATIC), name="ui-static"),
        Route("/ui/api/sessions/{session_id}", _session, methods=["GET"]),
        Route("/ui/api/sessions/{session_id}/rows", _rows, methods=["GET"]),
        Route("/ui/api/sessions/{session_id}/spans/{span_id}", _span, methods=["GET"]),
        Route("/ui/api/sessions/{session_id}/turns", _turns, methods=["GET"]),
        Route("/ui/api/streams", _streams, methods=["GET"]),
    ]


async def _to_page(request: Request) -> Response:
    return RedirectResponse("/ui/")


async def _page(request: Request) -> Response:
    return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})


def _dashboard(request: Request) -> tuple[Dashboard, str]:
    services: Services = request.app.state.services
    caller = authenticate(request.headers, services.config.auth)
    return Dashboard(services.inspector, services.inspector.journal, services.events), caller.tenant


async def _session(request: Request) -> Response:
    dashboard, tenant = _dashboard(request)
    return JSONResponse(await dashboard.session(tenant, request.path_params["session_id"]), headers=NO_STORE)


async def _rows(request: Request) -> Response:
    dashboard, tenant = _dashboard(request)
    limit, offset = page_params(request.query_params.get("limit"), request.query_params.get("offset"))
    view = await dashboard.rows(tenant, request.path_params["session_id"], limit, offset)
    return JSONResponse(view, headers=NO_STORE)


async def _span(request: Request) -> Response:
    dashboard, tenant = _dashboard(request)
    text = request.path_params["span_id"]
    span_id = parse_integer(text)
    if span_id is None:
        raise InvalidRequest(f"Span ids are whole numbers below 2^63, got '{text[:40]}'.", param="span_id")
    limit, offset = page_params(request.query_params.get("limit"), request.query_params.get("offset"))
    view = await dashboard.span(tenant, request.path_params["session_id"], span_id, limit, offset)
    return JSONResponse(view, headers=NO_STORE)


async def _turns(request: Request) -> Response:
    dashboard, tenant = _dashboard(request)
    return JSONResponse(await dashboard.turns(tenant, request.path_params["session_id"]), headers=NO_STORE)


async def _streams(request: Request) -> Response:
    dashboard, tenant = _dashboard(request)
    return JSONResponse(await dashboard.streams(tenant), headers=NO_STORE)
