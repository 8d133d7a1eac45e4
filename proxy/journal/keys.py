"""Idempotency-Key: a retried request is answered from the step that already answered it.

A key is held by the live or successful step only (see `m003_journal`), so a request that failed or was
interrupted can be retried under the same key. The same key with another body is a client bug: 409.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from proxy.errors import Conflict
from proxy.history import chain
from proxy.journal.steps import StepStatus

KEY_PARAM = "Idempotency-Key"
KEY_REUSED = "This Idempotency-Key was already used with a different request body; use a new key."
KEY_IN_PROGRESS = "A request with this Idempotency-Key is still in progress."
KEY_DONE = "A request with this Idempotency-Key has already completed; replay it instead."


def check_key(stored_fingerprint: str, status: str, fingerprint: str) -> None:
    """Conflict unless the step holding the key was made by the same body and is no longer running."""
    if stored_fingerprint != fingerprint:
        raise Conflict(KEY_REUSED, param=KEY_PARAM)
    if status == StepStatus.OPEN:
        raise Conflict(KEY_IN_PROGRESS, param=KEY_PARAM)


def request_fingerprint(tenant: str, identity: Mapping[str, Any]) -> str:
    """Same tenant and same identifying fields (key order aside) → same fingerprint: what Idempotency-Key
    replays compare."""
    return hashlib.sha256(f"{tenant}\n{chain.canonical_json(identity)}".encode()).hexdigest()
