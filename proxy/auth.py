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

from proxy.config import AuthConfig
from proxy.errors import AuthenticationFailed

OPEN_TENANT = "open"
"""The tenant of every caller when no keys are configured."""


@dataclass(frozen=True)
class Caller:
    tenant: str


def tenant_of(key: str) -> str:
    return "key-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]


def authenticate(headers: Mapping[str, str], auth: AuthConfig, *, api_key_header: bool = False) -> Caller:
    """`api_key_header`: also take the key from `x-api-key`, as Anthropic's clients send it (the Messages door
    only: on OpenAI's doors a key there is a client mistake, answered as a missing key)."""
    if not auth.enabled:
        return Caller(OPEN_TENANT)
    header = headers.get("authorization", "")
    scheme, _, key = header.partition(" ")
    key = key.strip() if scheme.lower() == "bearer" else ""
    if api_key_header and not key:
        key = headers.get("x-api-key", "").strip()
    if not key:
        raise AuthenticationFailed(
            "You didn't provide an API key. You need to provide your API key in an Authorization header "
            "using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)."
        )
    supplied = key.encode("utf-8")
    matched = False
    for known in auth.keys:
        # Compare with every key, in constant time, so timing reveals neither which nor how much matched.
        matched |= hmac.compare_digest(supplied, known.encode("utf-8"))
    if not matched:
        raise AuthenticationFailed("Incorrect API key provided.")
    return Caller(tenant_of(key))
