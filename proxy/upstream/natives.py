"""The native APIs the proxy speaks to upstreams besides chat: one client each, declared once here.

Each client names its API (one of `proxy.config.models.UPSTREAM_APIS`, which config validates `models[].api`
against) and the environment variables its key is read from; this one list feeds the router (which client a
model's calls go to) and the credentials check (which keys a keyless model reads, for the redactor), as `DOORS`
(`proxy.doors.registry`) feeds the app. A new native API is one client and one entry here, and its name in config.
"""

from __future__ import annotations

from proxy.upstream.anthropic_client import AnthropicClient
from proxy.upstream.native_client import NativeClient
from proxy.upstream.responses_client import ResponsesClient

NATIVE_CLIENTS: tuple[type[NativeClient], ...] = (ResponsesClient, AnthropicClient)


def native_client(api: str) -> type[NativeClient] | None:
    """The client of a native API, or None (chat)."""
    return next((client for client in NATIVE_CLIENTS if client.api == api), None)
