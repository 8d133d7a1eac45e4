"""What `History.locate` finds of a request before anything is written, and what `History.save` says when the
stored messages it was located on are gone since.

A request is located first (its session, its nodes, what is new: `Located`), then saved under its session's
lock. A deletion (`proxy.lifecycle`, maybe by another process) may fall in between: the request is refused whole
(`SessionDeleted`), except when its locate read nothing of the store because it added nothing to a cached path
(`Located.checked`): the save's own check is then the first to see that path gone (`CachedPathGone`), and the
request is located afresh from the store, as it would have been had its locate read the store itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.canonical.types import Message
from proxy.errors import Conflict
from proxy.history.path_match import NO_MATCH, CachedMessage, PathMatch


@dataclass(frozen=True)
class Located:
    """A request's messages mapped onto the chain, before anything is written (`History.locate`)."""

    tenant: str
    session_id: str
    derived: bool
    """No `X-Session-Id` named the session."""
    anchor_id: str | None
    """Set when the request starts a derived session: the message later requests will find it by."""
    encoding: str
    entries: list[CachedMessage]
    """The request's messages as this request sent them (a variant's own text and tokens), in order, with the
    settings in force after each: what the recent-path cache will hold once they are stored."""
    stored_before: int
    new_messages: list[tuple[str, str | None, int, str, str, float]]
    new_tokens: list[tuple[str, str, int]]
    variants: list[tuple[str, str, str, float]]
    """(message id, digest, body, created_at) of forms not stored yet."""
    messages: Sequence[Message] = ()
    """The request's messages, which `entries` were made from: the recent-path cache holds them (`RecentPaths`).
    With the opening turns it left out put back (`PathMatch.restored`): what the stages after it work on."""
    matched: PathMatch = NO_MATCH
    """The cached entries `entries` start with (`RecentPaths.match`)."""
    checked: bool = True
    """False when the request adds nothing to the cached path it was located on, so its locate read nothing: that
    the path's last node is still stored is known only from `save`, which checks it anyway."""


@dataclass(frozen=True)
class KnownNode:
    """A stored node as `locate` needs it."""

    created_at: float
    tokens: int | None
    body: str
    settings: dict[str, Any] | None
    """The setting changes attached to it, if any."""


class SessionDeleted(Conflict):
    """The stored messages a request was located on were deleted before it was saved (`proxy.lifecycle`, maybe by
    another replica): the request is refused whole, and its client's next one is stored anew."""

    code = "session_deleted"

    def __init__(self) -> None:
        super().__init__(
            "The session this request continues was deleted while the request was on its way; nothing of it was "
            "stored. Send it again to start a new session."
        )


class CachedPathGone(SessionDeleted):
    """A request located without a read (`Located.checked` False) on a cached path found gone when it was saved,
    by another process's deletion (this process's own forgets the path): nothing was written, and the request is
    located afresh (`History.stored`) instead of refused."""
