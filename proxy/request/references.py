"""References to stored conversations that the proxy gives clients in place of the turns they stand for.

A client that compacts its own context keeps something short instead of its turns: Codex a `compaction` item,
Claude Code and Codex's local compaction a summary message. When the proxy writes that thing, it puts in a
reference to the stored conversation (the id of its last message), and a later request that carries it is
expanded back to that conversation (`proxy.request.continuations`): the session keeps every original. A message id is a
content address under the tenant's root, so a changed reference names nothing, and another tenant's names
nothing of theirs.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.canonical.sharing import shared_prefix
from proxy.tokens import content_text

TOKEN_PREFIX = "ctxinf1."
"""Marks the proxy's own references (and their format's version)."""
_TOKEN = re.compile(re.escape(TOKEN_PREFIX) + r"[A-Za-z0-9_-]{20,200}")
RECENT_SCANS = 8
"""The last scans a request is compared with (a tenant's sessions' requests interleave, and tenants')."""


def reference(message_id: str) -> str:
    payload = json.dumps({"m": message_id}, separators=(",", ":")).encode()
    return TOKEN_PREFIX + base64.urlsafe_b64encode(payload).decode().rstrip("=")


def referenced(token: Any) -> str | None:
    """The stored message a reference names; None for anything the proxy did not write."""
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX):
        return None
    encoded = token[len(TOKEN_PREFIX) :]
    try:
        payload = json.loads(base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)))
    except (binascii.Error, ValueError):
        return None
    message_id = payload.get("m") if isinstance(payload, dict) else None
    if not isinstance(message_id, str) or len(message_id) != 64 or not message_id.isalnum():
        return None
    return message_id


def reference_in(messages: Sequence[dict[str, Any]], start: int = 0) -> tuple[int, str] | None:
    """The last user message (at `start` or after) that carries a reference in its text (a client summary the
    proxy wrote), and the stored message it names."""
    for index in range(len(messages) - 1, start - 1, -1):
        message = messages[index]
        if message.get("role") != "user":
            continue
        text = content_text(message.get("content"))
        if TOKEN_PREFIX not in text:  # every request is looked through: a plain search first, no pattern
            continue
        for match in reversed(_TOKEN.findall(text)):
            message_id = referenced(match)
            if message_id is not None:
                return index, message_id
    return None


@dataclass(frozen=True)
class _Scan:
    tenant: str
    messages: Sequence[dict[str, Any]]
    """The request's very list (nothing changes it): the next one, made from it, shares it without a pass."""
    found: tuple[int, str] | None


class References:
    """`reference_in` for a tenant's requests, each looked through only past what it shares with one of the
    tenant's scans among the last `RECENT_SCANS` (as the doors keep their last requests: the messages a scan
    holds are theirs) as the very same message objects (`proxy.canonical.sharing`): what the shared part holds is known
    from that scan. Process memory, correct to lose."""

    def __init__(self, scans: int = RECENT_SCANS) -> None:
        self._max_scans = scans
        self._scans: list[_Scan] = []
        """The most recent last."""

    def find(self, tenant: str, messages: Sequence[dict[str, Any]]) -> tuple[int, str] | None:
        best, shared = None, 0
        # The most recent first, and none that cannot share more: one pass over a growing conversation.
        for scan in reversed(self._scans):
            if shared == len(messages):
                break
            if (
                scan.tenant == tenant
                and len(scan.messages) > shared
                and (length := shared_prefix(messages, scan.messages)) > shared
            ):
                best, shared = scan, length
        found = reference_in(messages, shared)
        if found is None and best is not None:
            before = best.found
            # Found in the part that changed: the shared part is looked through again.
            found = reference_in(messages[:shared]) if before is not None and before[0] >= shared else before
        kept = [scan for scan in self._scans if scan is not best]
        self._scans = [*kept[len(kept) - self._max_scans + 1 :], _Scan(tenant, messages, found)]
        return found
