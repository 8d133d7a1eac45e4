"""What the history hands out: stored messages, sessions and the result of reconciling a request."""

from __future__ import annotations

import functools
import itertools
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.canonical.sharing import Lineage
from proxy.canonical.vocabulary import SYSTEM_ROLES
from proxy.history import chain
from proxy.tokens import count_prompt


@dataclass(frozen=True)
class StoredMessage:
    """One node of the chain, as stored."""

    id: str
    """The sha256 of the parent's id and the normalized message (`chain.message_id`)."""
    parent_id: str | None
    depth: int
    """0 for the root."""
    role: str
    message: dict[str, Any]
    """The normalized message: what gets sent upstream. Shared with later requests (a session's cached path hands
    the same objects out again), so nothing changes it in place."""
    tokens: int
    """The token count for the encoding asked for."""
    created_at: float


@dataclass(frozen=True)
class Session:
    """A named line of conversation of one tenant."""

    tenant: str
    id: str
    """`X-Session-Id`, or derived from its first request (`chain.derived_session_id`)."""
    created_at: float
    updated_at: float
    head_id: str | None
    """Its latest message; None only for a session whose messages were never written."""
    model: str | None
    """The model its last request asked for."""
    anchor_id: str | None = None
    """A derived session's anchor (`chain.derived_session_id`); None for an `X-Session-Id` session."""


@dataclass(frozen=True)
class SessionInfo:
    """A line of `GET /sessions`: a session with its head path's size."""

    id: str
    model: str | None
    message_count: int
    history_tokens: int
    """Sum of the head path's tokens in the default encoding."""
    summaries: int
    """Summaries in force (not orphaned) that end on the head's path."""
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class PathTotals:
    """What a path's stages ask of it as a whole, known without walking it: the recent paths carry it from the
    path before over what the two share (`RecentPaths.put`)."""

    tokens: int
    """Its messages' counts summed (`StoredPath.tokens` less the reply priming)."""
    system: tuple[StoredMessage, ...]
    """Its system (and developer) messages."""


class StoredPath(tuple[StoredMessage, ...]):
    """A request's messages as stored, in order. A tuple: it cannot change once built, so what each stage of the
    request asks of it is worked out once (a long path is walked once, not once per stage), or not at all when
    its totals are known (`totalled`), and how much of it is an earlier path's is known where it is built
    (`lineage`)."""

    @classmethod
    def totalled(
        cls, messages: Iterable[StoredMessage], totals: PathTotals, base: StoredPath | None = None, shared: int = 0
    ) -> StoredPath:
        """The path of `messages`, whose totals are `totals`: its cached properties hold them from the start.
        `base`: the path whose first `shared` messages are its own first ones, as the very objects."""
        path = cls(messages)
        lineage = Lineage(None if base is None else base.lineage, shared)
        path.__dict__.update(tokens=count_prompt((totals.tokens,)), system=list(totals.system), lineage=lineage)
        return path

    @functools.cached_property
    def lineage(self) -> Lineage:
        """The paths it was made from, and how much of each it holds (`proxy.canonical.sharing.shared_prefix`)."""
        return Lineage()

    @functools.cached_property
    def tokens(self) -> int:
        """Its prompt total (`count_prompt`): what it costs sent whole."""
        return count_prompt(token_counts(self))

    @functools.cached_property
    def system(self) -> list[StoredMessage]:
        """Its system (and developer) messages (`system_messages`)."""
        return system_messages(self)


@dataclass(frozen=True)
class Reconciled:
    session: Session
    """After the update: its head is the request's last message."""
    path: StoredPath
    """The request's messages in order, as stored, with token counts."""
    stored_before: int
    """How many of them were already stored (the reused prefix)."""
    settings: Mapping[str, Any]
    """The settings in force at `end`: those attached on the path, the latest of each key winning."""
    end: int
    """Where answers and settings attach: the last message that is not a system message
    (`chain.conversation_end`)."""

    @property
    def end_id(self) -> str:
        return self.path[self.end].id

    def pinned_forms(self) -> dict[str, str]:
        """Which form of each system message this request sent (node id → `chain.body_digest`): nodes of system
        messages are shared by every prompt sent at that place, so a session's view needs this to show its
        own."""
        return {stored.id: chain.body_digest(chain.canonical_json(stored.message)) for stored in self.path.system}


_TOKENS = operator.attrgetter("tokens")
_ROLE = operator.attrgetter("role")
_IS_SYSTEM = frozenset(SYSTEM_ROLES).__contains__


def system_messages(path: Sequence[StoredMessage]) -> list[StoredMessage]:
    """The path's system (and developer) messages, picked at C speed: a long path's are counted on every request."""
    return list(itertools.compress(path, map(_IS_SYSTEM, map(_ROLE, path))))


def token_counts(path: Iterable[StoredMessage]) -> Iterator[int]:
    """Each message's count, for `count_prompt`: a C-speed map, since a long path is summed on every request."""
    return map(_TOKENS, path)
