"""What a process keeps between requests so a re-sent history costs little: the recent paths.

Process memory, correct to lose: a path not cached is hashed and read from the store instead (the same nodes,
found more slowly).
"""

from __future__ import annotations

import itertools
import operator
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from proxy.canonical.sharing import shared_prefix
from proxy.canonical.types import Message
from proxy.canonical.vocabulary import SYSTEM_ROLES
from proxy.history import chain
from proxy.history.messages import PathTotals, StoredMessage, StoredPath, system_messages
from proxy.history.path_match import NO_MATCH, CachedMessage, PathMatch, json_copy, match_path

RECENT_PATH_BYTES = 64 * 1024 * 1024
"""About how much memory the recent-path cache holds in all; the least recent sessions' paths go first."""
ENTRY_OVERHEAD = 600
"""Bytes a cached message costs beyond its text: the objects that hold it (measured roughly, CPython 3.11)."""

DERIVED_CANDIDATES = 32
"""How many of a tenant's most recent paths a request without `X-Session-Id` is compared with."""

_WEIGHT = operator.attrgetter("weight")
_STORED = operator.attrgetter("stored")
_TOKENS = operator.attrgetter("stored.tokens")

PathKey = tuple[str, str, str]
"""(tenant, session id, encoding)."""


class RecentPaths:
    """The last path each recently active session reconciled, to skip hashing and reading it again.

    A client re-sends the conversation it sent a moment ago plus a turn or two. Comparing each incoming
    message with the cached one (dict equality) is an order of magnitude cheaper than hashing it and looking
    it up, and it is sound because stored nodes never change: the cached prefix is exactly what hashing would
    find. A message that differs only where its identity does not look (a rewritten system prompt, changed
    whitespace: `chain.identity`) still matches, as a variant. The comparison is against private copies, so a
    caller mutating a returned `StoredMessage.message` can neither make a different message match nor leak into
    the next request (it is handed out afresh).

    A request without `X-Session-Id` does not know its session yet: the tenant's most recent paths are tried
    and the longest match wins.

    Each path also holds the messages of the request that stored it: the ones the next request re-sends as the
    very same objects (`proxy.canonical.sharing`) match without a comparison.
    """

    def __init__(self, max_bytes: int = RECENT_PATH_BYTES) -> None:
        self._paths: OrderedDict[PathKey, list[CachedMessage]] = OrderedDict()
        self._sent: dict[PathKey, tuple[Sequence[Message], int]] = {}
        """The messages of the request that stored each path (its very list), and how many of them the path's
        first entries were made from, position for position."""
        self._by_tenant: dict[tuple[str, str], OrderedDict[str, None]] = {}
        self._max_bytes = max_bytes
        self._bytes = 0
        self._running: dict[PathKey, list[int]] = {}
        """Each cached path's entries' weights summed up to each entry (carried over a shared prefix)."""
        self._weights: dict[PathKey, int] = {}
        self._anchors: dict[PathKey, tuple[str, int | None]] = {}
        """A derived session's anchor, by its cached path, and its position there (None: not on it)."""
        self._totals: dict[PathKey, PathTotals] = {}
        """Each cached path's totals (carried over a shared prefix, as the weights are)."""
        self._stored: dict[PathKey, StoredPath] = {}
        """Each cached path as a `StoredPath` (its shared prefix is the next one's, copied as one block)."""

    @property
    def bytes(self) -> int:
        """What the cached paths weigh now (`CachedMessage.weight`)."""
        return self._bytes

    def match(
        self, tenant: str, encoding: str, session_id: str | None, messages: Sequence[Mapping[str, Any]]
    ) -> PathMatch:
        if session_id is not None:
            candidates: list[str] = [session_id]
        else:
            recent = self._by_tenant.get((tenant, encoding))
            candidates = [] if recent is None else list(itertools.islice(reversed(recent), DERIVED_CANDIDATES))
        best = PathMatch(None, [], {}, whole=False)
        for candidate in candidates:
            key = (tenant, candidate, encoding)
            entries = self._paths.get(key)
            if entries is None:
                continue
            found = match_path(entries, messages, candidate, self._sent.get(key, ((), 0)))
            if len(found.entries) > len(best.entries):
                best = found
        if best.session_id is not None:
            key = (tenant, best.session_id, encoding)
            self._touch(key)
            anchor, at = self._anchors.get(key, (None, None))
            if at is not None and at < len(best.entries) and best.entries[at].stored.id == anchor:
                best = replace(best, anchored=True)
        return best

    def put(
        self,
        key: PathKey,
        entries: list[CachedMessage],
        *,
        derived: bool,
        anchor: str | None = None,
        sent: tuple[Sequence[Message], int] = ((), 0),
        matched: PathMatch = NO_MATCH,
    ) -> StoredPath:
        """Cache a session's path; a `derived` session's is also tried for requests without `X-Session-Id`
        (only those: such a request never joins an `X-Session-Id` session, with or without this cache).
        `sent`: the request's messages and how many of them the first entries were made from, which the cache
        then holds; `matched`: what `match` found them to start with (for an answer: the cached path it
        extends). Returns the path, its totals worked out past what it shares with the path cached before."""
        before = self._paths.get(key, [])
        # A derived session stays one when a request names it (one continuing an answer of it, by its id).
        derived = derived or self._is_derived(key)
        shared = matched.reused if matched.base is before else shared_prefix(entries, before)
        running = _running_weights(entries, shared, self._running.get(key, []))
        totals = _totals(entries, before, shared, self._totals.get(key))
        previous = self._stored.get(key)
        head = previous[:shared] if previous is not None else tuple(map(_STORED, entries[:shared]))
        path = StoredPath.totalled(head + tuple(map(_STORED, entries[shared:])), totals, previous, shared)
        anchored = self._anchors.get(key)
        self._drop(key)
        sent = (sent[0], min(sent[1], len(sent[0]), len(entries)))
        # A request's message is weighed as its entry: what it holds beyond the entry's text (another API's
        # parts) is not shared with it.
        weight = (running[-1] if running else 0) + (running[sent[1] - 1] if sent[1] else 0)
        if weight > self._max_bytes:
            return path
        self._paths[key] = entries
        self._sent[key] = sent
        self._running[key] = running
        self._weights[key] = weight
        self._totals[key] = totals
        self._stored[key] = path
        tenant, session_id, encoding = key
        if derived:
            self._by_tenant.setdefault((tenant, encoding), OrderedDict())[session_id] = None
            if anchor is not None:
                # Where it is on the path (a node's place on every path through it), as before when it still is.
                at = anchored[1] if anchored is not None and anchored[0] == anchor else None
                if at is None or at >= len(entries) or entries[at].stored.id != anchor:
                    at = next((i for i, entry in enumerate(entries) if entry.stored.id == anchor), None)
                self._anchors[key] = (anchor, at)
        self._bytes += weight
        while self._bytes > self._max_bytes:
            self._drop(next(iter(self._paths)))
        return path

    def has_path(self, key: PathKey) -> bool:
        """Whether any path of `key` is cached (warming reads one from the store only when none is)."""
        return key in self._paths

    def sent_forms(self, tenant: str, path: Sequence[StoredMessage]) -> list[Message] | None:
        """`path`'s messages in the form the tenant's last request through its end sent them (the request's own
        objects, which went upstream as they were), where a cached path holds that request's; else None (the
        store's latest forms are the next best: `History.sent_forms`). A conversation brought back from the store
        (a client's summary standing for it) then reads as it was sent: the upstream's cached prompt still holds."""
        if not path:
            return []
        end = len(path) - 1
        for key in reversed(self._paths):
            entries = self._paths[key]
            if key[0] != tenant or len(entries) <= end or entries[end].stored.id != path[end].id:
                continue
            sent, count = self._sent.get(key, ((), 0))
            if not count:
                continue  # read from the store (`proxy.history.warming`): no request of this process sent it
            return [sent[at] if at < count else stored.message for at, stored in enumerate(path)]
        return None

    def sent_path(self, tenant: str, message_id: str) -> tuple[list[StoredMessage], list[Message]] | None:
        """The path to `message_id` and its messages as `sent_forms` gives them, when one of the tenant's cached
        paths that a request of this process sent holds it (searched from the end: an answer a client continues
        by its id is its path's last node); else None."""
        for key in reversed(self._paths):
            sent, count = self._sent.get(key, ((), 0))
            if key[0] != tenant or not count:
                continue
            entries = self._paths[key]
            end = next((at for at in range(len(entries) - 1, -1, -1) if entries[at].stored.id == message_id), None)
            if end is not None:
                path = list(self._stored[key][: end + 1])
                return path, [sent[at] if at < count else stored.message for at, stored in enumerate(path)]
        return None

    def extend(self, key: PathKey, parent_id: str, stored: StoredMessage) -> None:
        """Append an answer to a cached path whose conversation ends at its parent.

        System messages after the parent (a reminder the tool appends to each request) are dropped: the
        tool's next request has the answer right after the parent.
        """
        entries = self._paths.get(key)
        if not entries:
            return
        for end in range(len(entries) - 1, -1, -1):
            parent = entries[end]
            if parent.stored.id == parent_id:
                weight = len(chain.canonical_json(stored.message)) + ENTRY_OVERHEAD
                answer = CachedMessage(stored, json_copy(stored.message), parent.settings, weight)
                extended = entries[: end + 1]
                extended.append(answer)
                self.put(
                    key,
                    extended,
                    derived=self._is_derived(key),
                    anchor=self._anchors.get(key, (None, None))[0],
                    sent=(sent[0], min(sent[1], end + 1)) if (sent := self._sent.get(key)) else ((), 0),
                    matched=PathMatch(key[1], [], {}, whole=False, base=entries, reused=end + 1),
                )
                return
            if entries[end].stored.role not in SYSTEM_ROLES:
                return

    def holds(self, key: PathKey, entries: list[CachedMessage] | None) -> bool:
        """Whether `key`'s cached path is still `entries` (the very list `match` found it as)."""
        return entries is not None and self._paths.get(key) is entries

    def forget_tenant(self, tenant: str) -> None:
        """After a setting changed: the settings folded into the tenant's cached paths may be stale."""
        for key in [key for key in self._paths if key[0] == tenant]:
            self._drop(key)

    def _is_derived(self, key: PathKey) -> bool:
        tenant, session_id, encoding = key
        return session_id in self._by_tenant.get((tenant, encoding), ())

    def _touch(self, key: PathKey) -> None:
        self._paths.move_to_end(key)
        tenant, session_id, encoding = key
        sessions = self._by_tenant.get((tenant, encoding))
        if sessions is not None and session_id in sessions:
            sessions.move_to_end(session_id)

    def _drop(self, key: PathKey) -> None:
        if self._paths.pop(key, None) is None:
            return
        self._bytes -= self._weights.pop(key)
        self._running.pop(key, None)
        self._totals.pop(key, None)
        self._stored.pop(key, None)
        self._sent.pop(key, None)
        self._anchors.pop(key, None)
        tenant, session_id, encoding = key
        sessions = self._by_tenant.get((tenant, encoding))
        if sessions is not None:
            sessions.pop(session_id, None)
            if not sessions:
                del self._by_tenant[(tenant, encoding)]


def _running_weights(entries: list[CachedMessage], shared: int, running: list[int]) -> list[int]:
    """The entries' weights summed up to each, those of the `shared` first as they were summed before: `running`
    itself, which only the cache holds, cut back and extended (a copy would touch every sum of a long path)."""
    del running[shared:]
    total = running[-1] if running else 0
    running.extend(map(total.__add__, itertools.accumulate(map(_WEIGHT, entries[shared:]))))
    return running


def _totals(
    entries: list[CachedMessage], before: list[CachedMessage], shared: int, totals: PathTotals | None
) -> PathTotals:
    """The totals of `entries`, whose `shared` first entries are `before`'s, from `before`'s `totals`: only what
    differs is walked."""
    if totals is None or not shared:
        return PathTotals(sum(map(_TOKENS, entries)), tuple(system_messages(list(map(_STORED, entries)))))
    tokens = totals.tokens - sum(map(_TOKENS, before[shared:])) + sum(map(_TOKENS, entries[shared:]))
    end = entries[0].stored.depth + shared  # a path's depths are consecutive
    kept = tuple(stored for stored in totals.system if stored.depth < end)
    return PathTotals(tokens, kept + tuple(system_messages(list(map(_STORED, entries[shared:])))))
