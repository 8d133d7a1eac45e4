"""Who is calling: the proxy key from `Authorization: Bearer` (or, on the Messages door, Anthropic's `x-api-key`),
reduced to an opaque tenant id.

Sessions and journal entries are scoped by tenant, so one key never sees another's data. The tenant id is a
hash of the key: the key itself is never stored, logged or forwarded (the upstream gets the model entry's key).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from proxy.config.schema import AuthConfig
from proxy.errors import AuthenticationFailed, Forbidden

OPEN_TENANT = "open"
"""The tenant of every caller when no keys are configured."""


@dataclass(frozen=True)
class Caller:
    tenant: str


def tenant_of(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


def authenticate_admin(headers: Mapping[str, str], auth: AuthConfig) -> None:
    """The operator's routes (`/admin/...`) take one of `auth.admin_keys`, never a client's key: what they change
    binds every tenant."""
    if not auth.admin_keys:
        raise Forbidden("The proxy's admin routes are off: set auth.admin_keys in its config to use them.")
    if not _matches(_bearer(headers), auth.admin_keys):
        raise AuthenticationFailed("Incorrect admin key provided (Authorization: Bearer ADMIN_KEY).")


def authenticate(headers: Mapping[str, str], auth: AuthConfig, *, api_key_header: bool = False) -> Caller:
    """`api_key_header`: also take the key from `x-api-key`, as Anthropic's clients send it (the Messages door
    only: on OpenAI's doors a key there is a client mistake, answered as a missing key)."""
    if not auth.enabled:
        return Caller(OPEN_TENANT)
    key = _bearer(headers)
    if api_key_header and not key:
        key = headers.get("x-api-key", "").strip()
    if not key:
        raise AuthenticationFailed(
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    if not _matches(key, auth.keys):
        raise AuthenticationFailed("Incorrect API key provided.")
    return Caller(tenant_of(key))


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
