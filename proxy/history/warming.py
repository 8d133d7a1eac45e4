"""The recent paths read back from the store, for sessions a process holds none of (after a restart, or on another
replica), so that a session's first request there lands where its requests before did.

A client may re-send a stored node in another form than it was stored in, and only the recent paths recognize it
(`match_path`), since a form hashes to another node: a tool output the client masked, the opening turns it left
out (Gemini CLI), the model's turns in its own encoding (Pi). Without its cached path, the first request of a session
after a restart would start a branch at such a node, or bring a conversation back in its stored forms once (a
prompt-cache break). So a request that extends no cached path first has its session's path read into the cache: a
named session's own, or, for a request naming none, the tenant's most recently updated derived sessions. Each once
per process: a miss after that is a new conversation or an edit, found through the chain's hashes as before.

A path read from the store holds no request's own messages; the forms a conversation was last sent in are then the
latest form stored of each node (`message_variants`, `last_forms`): a client's own encoding of the model's turns and
a cache breakpoint that moved on are newer than the form first stored.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.canonical.types import Message
from proxy.history import chain
from proxy.history.caches import ENTRY_OVERHEAD, RecentPaths
from proxy.history.messages import StoredMessage
from proxy.history.path_match import CachedMessage, json_copy
from proxy.history.reads import HistoryReads
from proxy.history.settings import fold
from proxy.offload import compute
from proxy.store.database import Database, id_array

WARM_SESSIONS = 8
"""A tenant's most recently updated derived sessions read into the recent paths at the first request of it a
process serves that extends none of its cached paths: the agents it was running before a restart."""
TRIED_MAX = 100_000
"""How many (tenant, session) warm-ups a process remembers having tried, oldest forgotten first."""

_RECENT_DERIVED_SQL = (
    "SELECT id, head_id, anchor_id FROM sessions WHERE tenant = ? AND anchor_id IS NOT NULL AND head_id IS NOT NULL "
    "ORDER BY updated_at DESC, id DESC LIMIT ?"
)


class Warming:
    """Reads sessions' paths into `recent` for requests that find none there (`History.locate`)."""

    def __init__(self, db: Database, reads: HistoryReads, recent: RecentPaths) -> None:
        self._db = db
        self._reads = reads
        self._recent = recent
        self._tried: OrderedDict[tuple[str, str | None], None] = OrderedDict()
        """(tenant, session id) warmed or tried; (tenant, None): the tenant's recent derived sessions."""

    async def warm(self, tenant: str, session_id: str | None, encoding: str) -> bool:
        """Read the paths a request of `session_id` (None: naming no session) may extend into the recent paths,
        unless tried before or cached already; whether any was read."""
        if not self._first_try(tenant, session_id):
            return False
        if session_id is not None:
            if self._recent.has_path((tenant, session_id, encoding)):
                return False
            session = await self._reads.session(tenant, session_id)
            if session is None or session.head_id is None:
                return False
            found = [(session_id, session.head_id, session.anchor_id)]
        else:
            rows = await self._db.fetch_tuples(_RECENT_DERIVED_SQL, (tenant, WARM_SESSIONS))
            found = [(str(row[0]), str(row[1]), str(row[2])) for row in rows]
        warmed = False
        for found_id, head_id, anchor_id in reversed(found):  # the most recent is put last: tried first
            key = (tenant, found_id, encoding)
            if self._recent.has_path(key):
                continue
            path = await self._reads.path_to(head_id, encoding)
            if not path:
                continue
            entries = await self._entries(tenant, path)
            self._recent.put(key, entries, derived=anchor_id is not None, anchor=anchor_id)
            warmed = True
        return warmed

    async def last_forms(self, path: Sequence[StoredMessage]) -> list[Message]:
        """`path`'s messages in the latest form stored of each (its newest variant, else as first stored)."""
        if not path:
            return []
        rows = await self._db.fetch_tuples(
            "SELECT message_id, body, created_at FROM message_variants WHERE message_id IN "
            "(SELECT value FROM json_each(?)) ORDER BY created_at, digest",
            (id_array(stored.id for stored in path),),
        )
        latest = {str(row[0]): str(row[1]) for row in rows}  # ordered by time: the newest is kept
        return [json.loads(latest[stored.id]) if stored.id in latest else stored.message for stored in path]

    def _first_try(self, tenant: str, session_id: str | None) -> bool:
        key = (tenant, session_id)
        if key in self._tried:
            return False
        self._tried[key] = None
        if len(self._tried) > TRIED_MAX:
            self._tried.popitem(last=False)
        return True

    async def _entries(self, tenant: str, path: list[StoredMessage]) -> list[CachedMessage]:
        """`path` as cached entries, with the settings in force after each."""
        rows = await self._db.fetch_tuples(
            "SELECT message_id, settings FROM context_settings "
            "WHERE tenant = ? AND message_id IN (SELECT value FROM json_each(?))",
            (tenant, id_array(stored.id for stored in path)),
        )
        attached = {str(row[0]): json.loads(row[1]) for row in rows}
        return await compute(sum(stored.tokens for stored in path) * 4, _cached, path, attached)


def _cached(path: Sequence[StoredMessage], attached: Mapping[str, Mapping[str, Any]]) -> list[CachedMessage]:
    entries: list[CachedMessage] = []
    settings: Mapping[str, Any] = {}
    for stored in path:
        if stored.id in attached:
            settings = fold(settings, attached[stored.id])
        weight = len(chain.canonical_json(stored.message)) + ENTRY_OVERHEAD
        entries.append(CachedMessage(stored, json_copy(stored.message), settings, weight))
    return entries
