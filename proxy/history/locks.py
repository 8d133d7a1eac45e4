"""The per-session locks under which a session's requests store what is new, one after the other (process memory,
correct to lose: a lock nobody holds is dropped)."""

from __future__ import annotations

import asyncio
import weakref


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
