"""Who is calling: the proxy key, from where the caller's API sends it (`KeyPlace`: `Authorization: Bearer`,
Anthropic's `x-api-key`, Google's `x-goog-api-key` or `?key=`; each door declares its places), reduced to an
opaque tenant id.

Sessions and journal entries are scoped by tenant, so one key never sees another's data. The tenant id is a
hash of the key: the key itself is never stored, logged or forwarded (the upstream gets the model entry's key).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from proxy.config.schema import AuthConfig
from proxy.errors import AuthenticationFailed, Forbidden

OPEN_TENANT = "open"
"""The tenant of every caller when no keys are configured."""


@dataclass(frozen=True)
class Caller:
    tenant: str


@dataclass(frozen=True)
class KeyPlace:
    """Where a client API sends its key: the bearer token, a header of its own, or a query parameter."""

    source: Literal["bearer", "header", "query"]
    name: str
    shown: str
    """How the place is named in the error that asks for a key."""

    def key(self, headers: Mapping[str, str], query: Mapping[str, str]) -> str:
        if self.source == "bearer":
            return _bearer(headers)
        values = headers if self.source == "header" else query
        return values.get(self.name, "").strip()


BEARER = KeyPlace("bearer", "authorization", "an Authorization header using Bearer auth")
X_API_KEY = KeyPlace("header", "x-api-key", "an x-api-key header")
X_GOOG_API_KEY = KeyPlace("header", "x-goog-api-key", "an x-goog-api-key header")
QUERY_KEY = KeyPlace("query", "key", "the key query parameter")
NO_QUERY: Mapping[str, str] = {}


def tenant_of(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


def authenticate_admin(headers: Mapping[str, str], auth: AuthConfig) -> None:
    """The operator's routes (`/admin/...`) take one of `auth.admin_keys`, never a client's key: what they change
    binds every tenant."""
    if not auth.admin_keys:
        raise Forbidden("The proxy's admin routes are off: set auth.admin_keys in its config to use them.")
    if not _matches(_bearer(headers), auth.admin_keys):
        raise AuthenticationFailed("Incorrect admin key provided (Authorization: Bearer ADMIN_KEY).")


def authenticate(
    headers: Mapping[str, str],
    auth: AuthConfig,
    *,
    places: tuple[KeyPlace, ...] = (BEARER,),
    query: Mapping[str, str] = NO_QUERY,
) -> Caller:
    """The key from the first of `places` that has one (a door's own: a key sent where its API does not send one
    is a client mistake, answered as a missing key)."""
    if not auth.enabled:
        return Caller(OPEN_TENANT)
    key = next((found for found in (place.key(headers, query) for place in places) if found), "")
    if not key:
        raise AuthenticationFailed(_missing_key(places))
    if not _matches(key, auth.keys):
        raise AuthenticationFailed("Incorrect API key provided.")
    return Caller(tenant_of(key))


def _missing_key(places: tuple[KeyPlace, ...]) -> str:
    if places[0] == BEARER:
        return (
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    return "You didn't provide an API key. Pass it in " + " or ".join(place.shown for place in places) + "."


def _bearer(headers: Mapping[str, str]) -> str:
    scheme, _, key = headers.get("authorization", "").partition(" ")
    return key.strip() if scheme.lower() == "bearer" else ""


def _matches(key: str, known: tuple[str, ...]) -> bool:
    """Compared with every key, in constant time, so timing reveals neither which nor how much matched."""
    supplied = key.encode("utf-8")
    matched = False
    for candidate in known:
        matched |= hmac.compare_digest(supplied, candidate.encode("utf-8"))
    return matched and bool(key)
