"""Content addressing for the message chain: what a message *means*, and the id that follows from it.

A client re-sends its whole history on every request, and the OpenAI SDK echoes stored answers back with extra
fields (`"refusal": null`, `"annotations": []`, `"audio": null`, ...). For a re-sent history to land on the
rows already stored, every message is first reduced to its normal form — role, content, name, tool calls,
tool_call_id, and the items of another wire format it stands for — which is what is stored. Its id hashes its
parent's id and its *identity*, the part of the normal form that says which message it is (docs/architecture.md,
"Glossary"):

- a system (or developer) message is identified by its role at its position, not its text: agents rewrite
  their system prompt every turn (a clock, the working directory, a repo map), and the conversation after it
  is still the same conversation, with the same summaries;
- text is compared without trailing whitespace on its lines and without blank lines at either end, which is
  what tools change when they restore a chat history; tool call arguments that are JSON are compared in
  canonical form, and a message's items (another wire format's form of it) not at all.

What the client sent is still what is stored: the first form a node was seen in is its body, later forms are
its variants. Ids chain: a message's id fixes its whole prefix, so an edit anywhere starts a new branch, and
the root's parent is the tenant, so two tenants never share a node. Pure functions only: the store lives in
`proxy.history`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from proxy.canonical.types import Message
from proxy.canonical.vocabulary import ITEMS, SYSTEM_ROLES

if TYPE_CHECKING:
    from proxy.history.messages import StoredMessage

ROOT_PARENT_PREFIX = "tenant:"
SESSION_ID_PREFIX = "s-"
SESSION_ID_HEX_CHARS = 24

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
    items = message.get(ITEMS)
    if isinstance(items, list):
        normal[ITEMS] = items  # the client's own form, kept whole (ids, encrypted reasoning, unknown fields)
    return normal


def variant_body(message: Mapping[str, Any], normal: Message) -> str:
    """What a form a node was re-sent in is kept as (`message_variants`): its normal form with the fields the client
    sent as null, which `normalize` drops but which went upstream as they were (Pi's `"content": null` beside its
    tool calls), so that the conversation read back from the store after a restart is sent as before
    (`proxy.history.warming`). A system message's is its normal form, which a session's view finds it by
    (`Reconciled.pinned_forms`)."""
    if normal.get("role") in SYSTEM_ROLES:
        return canonical_json(normal)
    nulls = {key: None for key, value in message.items() if value is None and key not in normal}
    return canonical_json({**normal, **nulls} if nulls else normal)


CLIENT_MASKS = ("<tool_output_masked>",)
"""What a client writes in place of an old tool output it masks to save its own window, kept in the same call's
message: Gemini CLI 0.61.0's `ToolOutputMaskingService` (`<tool_output_masked>`, a preview and the path of the
file it saved the output to), once its history holds ~80k tokens of tool outputs."""


def is_masked_form(normal: Message, stored: Message) -> bool:
    """Whether `normal` is a client's masked form of the stored tool output `stored` (the same call): then it is
    that node sent in another form, a variant, and the conversation stays one path (`caches.RecentPaths`)."""
    if normal.get("role") != "tool" or stored.get("role") != "tool":
        return False
    if normal.get("tool_call_id") != stored.get("tool_call_id"):
        return False
    content = normal.get("content")
    text = content if isinstance(content, str) else json.dumps(content)
    return any(mask in text for mask in CLIENT_MASKS)


def identity(normal: Message) -> Message:
    """The part of a normalized message its id hashes (see the module docstring); `normal` itself when
    nothing is left out, so the common message is encoded once."""
    role = normal.get("role")
    if role in SYSTEM_ROLES:
        return {"role": role}
    key = normal
    if ITEMS in key:
        key = {name: value for name, value in key.items() if name != ITEMS}
    content = key.get("content")
    if isinstance(content, str):
        trimmed = trim(content)
        if trimmed != content:
            key = {**key, "content": trimmed}
    elif isinstance(content, list):
        parts = [_trimmed_part(part) for part in content]
        if any(new is not old for new, old in zip(parts, content, strict=True)):
            key = {**key, "content": parts}
    calls = key.get("tool_calls")
    if isinstance(calls, list):
        canonical = [_canonical_arguments(call) for call in calls]
        if any(new is not old for new, old in zip(canonical, calls, strict=True)):
            key = {**key, "tool_calls": canonical}
    return key


def _canonical_arguments(call: Any) -> Any:
    """A tool call whose arguments are JSON, with them in canonical form: clients re-serialize the arguments they
    got (other spacing, key order, or a door that rebuilds them from a custom tool's input)."""
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping):
        return call
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        return call
    try:
        canonical = canonical_json(json.loads(arguments))
    except (ValueError, RecursionError):
        return call
    if canonical == arguments:
        return call
    return {**call, "function": {**function, "arguments": canonical}}


def trim(text: str) -> str:
    """Text as tools may re-send it: no trailing whitespace on any line, no blank lines at either end."""
    lines = text.replace("\r\n", "\n").split("\n")
    return "\n".join(line.rstrip() for line in lines).strip("\n")


def _trimmed_part(part: Any) -> Any:
    text = part.get("text") if isinstance(part, Mapping) else None
    if not isinstance(text, str):
        return part
    trimmed = trim(text)
    return part if trimmed == text else {**part, "text": trimmed}


def conversation_end(path: Sequence[StoredMessage]) -> int:
    """Index of the last message that is not a system (or developer) message; the last one if all are.

    Answers and settings attach there: a system reminder a tool appends after the latest turn is not re-sent
    at that place next time, so what hangs below it would not be found again.
    """
    for index in range(len(path) - 1, -1, -1):
        if path[index].role not in SYSTEM_ROLES:
            return index
    return len(path) - 1


def root_parent(tenant: str) -> str:
    """The virtual parent of a tenant's roots: it makes every id tenant-specific."""
    return ROOT_PARENT_PREFIX + tenant


def message_id(parent: str, normal: Message) -> str:
    """The id of an already-normalized message under `parent` (a message id, or `root_parent(tenant)`)."""
    return encode(parent, normal)[0]


def encode(parent: str, normal: Message) -> tuple[str, str]:
    """The id of `normal` under `parent`, and its body as stored (canonical JSON): for most messages the
    identity is the normal form, and one encoding serves both."""
    key = identity(normal)
    text = canonical_json(key)
    return _digest(parent + "\n" + text), text if key is normal else canonical_json(normal)


def body_digest(body: str) -> str:
    """Names one stored form of a message among its variants."""
    return _digest(body)


def chain_ids(tenant: str, normals: Iterable[Message], after: str | None = None) -> list[str]:
    """Ids of a path of normalized messages: children of the message `after`, or roots of `tenant`'s chain."""
    ids: list[str] = []
    parent = root_parent(tenant) if after is None else after
    for normal in normals:
        parent = message_id(parent, normal)
        ids.append(parent)
    return ids


def derived_session_id(tenant: str, anchor_id: str) -> str:
    """The session of a request without `X-Session-Id` that continues no known conversation.

    Its anchor is the last message of its first request (`conversation_end`): later requests of the same
    conversation contain it, and two conversations that open alike (the same system prompt and example turns,
    as every chat of one tool does) differ there.
    """
    return SESSION_ID_PREFIX + _digest(f"{tenant}\n{anchor_id}")[:SESSION_ID_HEX_CHARS]
