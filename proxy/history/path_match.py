"""Matching a request's messages with a cached path: which of its nodes they re-send, in which form (a variant),
and which opening turns they left out (Gemini CLI resumed). The cache that holds the paths is `caches`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.canonical.sharing import shared_prefix
from proxy.canonical.types import Message
from proxy.canonical.vocabulary import SYSTEM_ROLES
from proxy.history import chain
from proxy.history.messages import StoredMessage


@dataclass(frozen=True)
class CachedMessage:
    stored: StoredMessage
    private: dict[str, Any]
    """A copy of the normal form last sent for this node, which no caller holds: what incoming messages are
    compared with."""
    settings: Mapping[str, Any]
    """The settings in force after this message (folded along the path; shared between entries)."""
    weight: int
    """What it costs the cache: its stored form's length plus `ENTRY_OVERHEAD` (the text is shared, not copied)."""


@dataclass(frozen=True)
class PathMatch:
    """The cached entries a request's messages start with, and which of them it re-sent in another form."""

    session_id: str | None
    entries: list[CachedMessage]
    """A new list: the request's own (`History` makes its path's entries of it, in place)."""
    variants: dict[int, Message]
    """Position → the normal form sent this time, for entries whose node was sent differently before."""
    whole: bool
    """The request extends the cached path entirely (it is that session's next turn)."""
    anchored: bool = False
    """The matched entries hold the cached session's anchor (a derived session's: `Session.anchor_id`)."""
    base: list[CachedMessage] | None = None
    """The cached path matched: its first `reused` entries are the very first objects of `entries` (so that
    caching the request's path after it needs no identity pass over them: `RecentPaths.put`)."""
    reused: int = 0
    left_out: tuple[int, int] = (0, 0)
    """(where, how many): the opening user turns the request left out of the cached path it otherwise re-sends
    whole, which `entries` holds in their place (`_left_out`)."""

    def restored(self, messages: list[Message]) -> list[Message]:
        """The request's messages with those it left out put back, as `entries` holds them (a new list)."""
        at, count = self.left_out
        if not count:
            return messages
        kept = [json_copy(entry.private) for entry in self.entries[at : at + count]]
        return [*messages[:at], *kept, *messages[at:]]


NO_MATCH = PathMatch(None, [], {}, whole=False)


def match_path(
    entries: list[CachedMessage],
    messages: Sequence[Mapping[str, Any]],
    session_id: str,
    sent: tuple[Sequence[Message], int],
) -> PathMatch:
    """How much of the cached path `entries` the request's `messages` re-send, and in which forms."""
    # The messages the previous request sent again as the same objects: their entries were made from them (or,
    # for a variant, from their normal form), and neither changed since.
    shared = min(shared_prefix(messages, sent[0]), sent[1])
    matched = entries[:shared]
    variants: dict[int, Message] = {}
    reused = shared  # leading entries that are the cached ones, neither a variant nor replaced
    at = skipped = 0  # the opening user turns the request left out: where, how many
    position = shared  # in `entries`; the request's message there is `position - skipped`
    while position < len(entries) and position - skipped < len(messages):
        message, entry = messages[position - skipped], entries[position]
        same, variant = _same(message, entry)
        if not same:
            left_out = 0 if skipped else _left_out(entries, position, message)
            if not left_out:
                break
            at, skipped = position, left_out
            for omitted in entries[position : position + left_out]:
                if reused == len(matched):
                    reused += 1
                matched.append(omitted)
            position += left_out
            continue
        if variant is not None:
            variants[position] = variant
        if entry.stored.message != entry.private:
            entry = replace(entry, stored=replace(entry.stored, message=json_copy(entry.private)))
        if reused == position and entry is entries[position] and position not in variants:
            reused += 1
        matched.append(entry)
        position += 1
    if skipped and len(matched) < len(entries):
        # Left out, but the rest is not the cached path whole: an edit, matched up to where it starts.
        matched = matched[:at]
        variants = {place: form for place, form in variants.items() if place < at}
        reused, skipped = min(reused, at), 0
    return PathMatch(
        session_id,
        matched,
        variants,
        whole=len(matched) == len(entries),
        base=entries,
        reused=reused,
        left_out=(at, skipped),
    )


def _same(message: Mapping[str, Any], entry: CachedMessage) -> tuple[bool, Message | None]:
    """Whether `message` is the cached entry's node, and its normal form when it was sent in another form (a
    variant: `chain.identity`, `chain.is_masked_form`)."""
    if message == entry.private:
        return True, None
    normal = chain.normalize(message)
    if normal == entry.private:
        return True, None
    if chain.identity(normal) == chain.identity(entry.private) or chain.is_masked_form(normal, entry.private):
        return True, normal
    return False, None


def _left_out(entries: Sequence[CachedMessage], position: int, message: Mapping[str, Any]) -> int:
    """How many of the cached path's opening user turns, from `position`, a request left out when `message` is
    the node after them, else 0.

    Only there, right after the system messages: Gemini CLI 0.61.0, once it has masked old tool outputs, merges
    its record of the first user turn into its `<session_context>`, which a resumed session skips, so every later
    request lacks that turn (and the fact it gave). The request is still that session's next turn when it re-sends
    the rest of the path whole (`match_path` checks); what it left out stays on the path, in its place. A message
    dropped further on is an edit, and starts a branch as before."""
    opening = next((i for i, entry in enumerate(entries) if entry.stored.role not in SYSTEM_ROLES), len(entries))
    if position != opening:
        return 0
    end = position
    while end < len(entries) and entries[end].stored.role == "user":
        end += 1
    for count in range(1, end - position + 1):
        if position + count < len(entries) and _same(message, entries[position + count])[0]:
            return count
    return 0


def json_copy(value: Any) -> Any:
    if type(value) is dict and all(type(item) is str for item in value.values()):
        return dict(value)  # the common message: role and text content, nothing nested to copy
    if isinstance(value, dict):
        return {key: json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_copy(item) for item in value]
    return value
