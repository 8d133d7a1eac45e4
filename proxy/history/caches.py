"""What a process keeps between requests so a re-sent history costs little: per-session locks and recent paths.

Both are process memory, correct to lose: a lock nobody holds is dropped, and a path not cached is hashed and
read from the store instead (the same nodes, found more slowly).
"""

from __future__ import annotations

import asyncio
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.history import chain
from proxy.history.messages import StoredMessage

RECENT_PATH_MESSAGES = 100_000
"""How many messages the recent-path cache holds in all; the least recent sessions' paths go first."""

PathKey = tuple[str, str, str]
"""(tenant, session id, encoding)."""


class SessionLocks:
    """One asyncio.Lock per (tenant, session): requests on one session reconcile one after the other.

    Locks are held weakly: a lock nobody holds or waits for is dropped, so the registry does not grow with
    every session ever seen.
    """

    def __init__(self) -> None:
        self._locks: weakref.WeakValueDictionary[tuple[str, str], asyncio.Lock] = weakref.WeakValueDictionary()

    def get(self, tenant: str, session_id: str) -> asyncio.Lock:
        key = (tenant, session_id)
        lock = self._locks.get(key)
        if lock is None:
            lock = asyncio.Lock()
            self._locks[key] = lock
        return lock

    def __len__(self) -> int:
        return len(self._locks)


@dataclass(frozen=True)
class CachedMessage:
    stored: StoredMessage
    private: dict[str, Any]
    """A copy of the normalized message no caller holds: what incoming messages are compared with."""


class RecentPaths:
    """The last path each recently active session reconciled, to skip hashing and reading it again.

    A client re-sends the conversation it sent a moment ago plus a turn or two. Comparing each incoming
    message with the cached one (dict equality) is an order of magnitude cheaper than hashing it and looking
    it up, and it is sound because stored nodes never change: the cached prefix is exactly what hashing would
    find. The comparison is against private copies, so a caller mutating a returned `StoredMessage.message`
    can neither make a different message match nor leak into the next request (it is handed out afresh).
    """

    def __init__(self, max_messages: int = RECENT_PATH_MESSAGES) -> None:
        self._paths: OrderedDict[PathKey, list[CachedMessage]] = OrderedDict()
        self._max_messages = max_messages
        self._size = 0

    def match(self, key: PathKey, messages: Sequence[Mapping[str, Any]]) -> list[CachedMessage]:
        """The cached entries equal to a prefix of `messages`, in order."""
        entries = self._paths.get(key)
        if entries is None:
            return []
        self._paths.move_to_end(key)
        matched: list[CachedMessage] = []
        for message, entry in zip(messages, entries, strict=False):
            if message != entry.private and chain.normalize(message) != entry.private:
                break
            if entry.stored.message != entry.private:
                entry = CachedMessage(replace(entry.stored, message=json_copy(entry.private)), entry.private)
            matched.append(entry)
        return matched

    def put(self, key: PathKey, entries: list[CachedMessage]) -> None:
        self._size -= len(self._paths.pop(key, ()))
        if len(entries) > self._max_messages:
            return
        self._paths[key] = entries
        self._size += len(entries)
        while self._size > self._max_messages:
            _, evicted = self._paths.popitem(last=False)
            self._size -= len(evicted)

    def extend(self, key: PathKey, parent_id: str, entry: CachedMessage) -> None:
        """Append an answer to a cached path that ends at its parent."""
        entries = self._paths.get(key)
        if entries and entries[-1].stored.id == parent_id:
            self.put(key, [*entries, entry])


def json_copy(value: Any) -> Any:
    if type(value) is dict and all(type(item) is str for item in value.values()):
        return dict(value)  # the common message: role and text content, nothing nested to copy
    if isinstance(value, dict):
        return {key: json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_copy(item) for item in value]
    return value
