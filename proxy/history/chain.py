"""Content addressing for the message chain: what a message *means*, and the id that follows from it.

A client re-sends its whole history on every request, and the OpenAI SDK echoes stored answers back with extra
fields (`"refusal": null`, `"annotations": []`, `"audio": null`, ...). For a re-sent history to land on the
rows already stored, every message is first reduced to its meaning — role, content, name, tool calls,
tool_call_id — and its id is the sha256 of its parent's id and that normal form as canonical JSON. Ids chain:
a message's id fixes its whole prefix, so an edit anywhere starts a new branch, and the root's parent is the
tenant, so two tenants never share a node. Pure functions only: the store lives in `proxy.history`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from proxy.types import Message

ROOT_PARENT_PREFIX = "tenant:"
SESSION_ID_PREFIX = "s-"
SESSION_ID_HEX_CHARS = 24
SYSTEM_ROLES = ("system", "developer")

_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)
_TOOL_CALL_TRANSIENT_KEYS = frozenset({"index"})
"""`index` only orders stream deltas; a finished tool call is the same call without it."""


def canonical_json(value: Any) -> str:
    return _CANONICAL.encode(value)


def _digest(text: str) -> str:
    # surrogatepass: a lone surrogate in client JSON is still data we must hash, not a reason to fail.
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _drop_nulls(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _drop_nulls(item) for key, item in value.items() if item is not None}
    if isinstance(value, list):
        return [_drop_nulls(item) for item in value]
    return value


def _tool_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    normal = {key: _drop_nulls(item) for key, item in call.items() if item is not None}
    for key in _TOOL_CALL_TRANSIENT_KEYS:
        normal.pop(key, None)
    normal.setdefault("type", "function")
    return normal


def normalize(message: Mapping[str, Any]) -> Message:
    """The message as stored and sent upstream: only fields that carry meaning, no nulls.

    A content list stays a list (a list of text parts is not the plain string; providers treat them
    differently); its parts lose their null keys. An assistant turn's empty content and missing content are
    the same thing: absent when it carries tool calls, `""` otherwise (so it stays a valid message upstream).
    """
    role = message.get("role")
    normal: Message = {"role": role}
    content = message.get("content")
    if isinstance(content, list):
        content = [_drop_nulls(part) for part in content]
    calls = message.get("tool_calls")
    tool_calls = [_tool_call(call) for call in calls] if isinstance(calls, list) else []
    function_call = message.get("function_call")
    if role == "assistant" and (content is None or content == ""):
        content = None if tool_calls or function_call else ""
    if content is not None:
        normal["content"] = content
    for key in ("name", "tool_call_id"):
        value = message.get(key)
        if value is not None:
            normal[key] = value
    if tool_calls:
        normal["tool_calls"] = tool_calls
    if isinstance(function_call, Mapping):
        normal["function_call"] = _drop_nulls(function_call)
    return normal


def root_parent(tenant: str) -> str:
    """The virtual parent of a tenant's roots: it makes every id tenant-specific."""
    return ROOT_PARENT_PREFIX + tenant


def message_id(parent: str, normal: Message) -> str:
    """The id of an already-normalized message under `parent` (a message id, or `root_parent(tenant)`)."""
    return _digest(parent + "\n" + canonical_json(normal))


def chain_ids(tenant: str, normals: Iterable[Message], after: str | None = None) -> list[str]:
    """Ids of a path of normalized messages: children of the message `after`, or roots of `tenant`'s chain."""
    ids: list[str] = []
    parent = root_parent(tenant) if after is None else after
    for normal in normals:
        parent = message_id(parent, normal)
        ids.append(parent)
    return ids


def derive_session_id(tenant: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """A session id for a request without `X-Session-Id`: the tenant plus the conversation's opening.

    The opening is the first system (or developer) message and the first user message, normalized, so every
    later request of the same conversation — however long, however edited after its first turn — finds it.
    """
    system = next((m for m in messages if m.get("role") in SYSTEM_ROLES), None)
    user = next((m for m in messages if m.get("role") == "user"), None)
    opening = {
        "tenant": tenant,
        "system": normalize(system) if system is not None else None,
        "user": normalize(user) if user is not None else None,
    }
    return SESSION_ID_PREFIX + _digest(canonical_json(opening))[:SESSION_ID_HEX_CHARS]
