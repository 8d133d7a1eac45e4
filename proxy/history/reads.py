"""The history's reads: a tenant's sessions (with their statistics), a session's path, stored forms, and the
settings in force on a path. Token counts a path lacks for the asked encoding are counted once and stored.

`History` (`proxy.history.store`) adds the write path on top; every query here filters by tenant, except
those given ids that came from a tenant's session (`path_to`, `message`, `forms`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxy.canonical.types import Message
from proxy.history import chain
from proxy.history.messages import Session, SessionInfo, StoredMessage
from proxy.history.queries import (
    PATH_SQL,
    SESSION_COLUMNS,
    SESSION_STATS_SQL,
    UNCOUNTED_SQL,
    insert_tokens,
    session_from_row,
)
from proxy.history.settings import fold
from proxy.offload import compute
from proxy.store.connection import Connection, Row
from proxy.store.database import Database, id_array
from proxy.tokens import DEFAULT_ENCODING

TokenCounter = Callable[[Mapping[str, Any], str], int]


class HistoryReads:
    def __init__(self, db: Database, count: TokenCounter) -> None:
        self._db = db
        self.count = count
        """Tokens of one normalized message in one encoding; also what `answers` counts an answer with."""

    async def session(self, tenant: str, session_id: str) -> Session | None:
        row = await self._db.fetchone(
            f"SELECT {SESSION_COLUMNS} FROM sessions WHERE tenant = ? AND id = ?", (tenant, session_id)
        )
        return None if row is None else session_from_row(row)

    async def sessions(self, tenant: str, limit: int = 50, offset: int = 0) -> tuple[list[SessionInfo], bool]:
        """A page of the tenant's sessions, most recently updated first, and whether more follow."""
        rows = await self._db.fetchall(
            "SELECT id, head_id, model, created_at, updated_at FROM sessions WHERE tenant = ? "
            "ORDER BY updated_at DESC, id DESC LIMIT ? OFFSET ?",
            (tenant, limit + 1, offset),
        )
        has_more = len(rows) > limit
        rows = rows[:limit]
        heads = json.dumps([[row["id"], row["head_id"]] for row in rows if row["head_id"] is not None])
        stats: dict[str, tuple[int, int, int]] = {}
        if rows:
            stat_rows = await self._db.fetchall(SESSION_STATS_SQL, (heads, tenant, DEFAULT_ENCODING))
            if any(row["counted"] < row["messages"] for row in stat_rows):
                # Messages stored under another encoding only: count them all at once, then read again.
                await self._count_missing(heads)
                stat_rows = await self._db.fetchall(SESSION_STATS_SQL, (heads, tenant, DEFAULT_ENCODING))
            stats = {row["session_id"]: (row["messages"], row["tokens"], row["summaries"] or 0) for row in stat_rows}
        page = [
            SessionInfo(
                row["id"],
                row["model"],
                *stats.get(row["id"], (0, 0, 0)),
                row["created_at"],
                row["updated_at"],
            )
            for row in rows
        ]
        return page, has_more

    async def path(self, tenant: str, session_id: str, encoding: str = DEFAULT_ENCODING) -> list[StoredMessage] | None:
        """The session head's path, root first; None if the tenant has no such session."""
        session = await self.session(tenant, session_id)
        if session is None:
            return None
        if session.head_id is None:
            return []
        return await self.path_to(session.head_id, encoding)

    async def owned_path(
        self, tenant: str, message_id: str, encoding: str = DEFAULT_ENCODING
    ) -> list[StoredMessage] | None:
        """The path to `message_id` if it is one of `tenant`'s messages, else None. Ids are content addresses
        from the tenant's root, so the root's id, computed again under the tenant, says whose it is."""
        path = await self.path_to(message_id, encoding)
        if not path or path[-1].id != message_id:
            return None
        root = path[0]
        return path if chain.message_id(chain.root_parent(tenant), root.message) == root.id else None

    async def path_to(self, message_id: str, encoding: str = DEFAULT_ENCODING) -> list[StoredMessage]:
        """The path from the root to `message_id` in one query; tokens missing for `encoding` are counted
        now and stored, once. Not tenant-checked: callers pass ids they got from a tenant's session."""
        rows = await self._db.fetchall(PATH_SQL, (message_id, encoding))
        # Decoding a long session's path is ~40 MB of JSON after 1,000 agent turns: not on the event loop.
        path, counted = await compute(sum(len(row["body"]) for row in rows), self._stored, rows, encoding)
        await self._store_counts(counted)
        return path

    def _stored(self, rows: Sequence[Row], encoding: str) -> tuple[list[StoredMessage], list[tuple[str, str, int]]]:
        """The path's rows as messages, and the token counts they lacked for `encoding`, counted here."""
        path: list[StoredMessage] = []
        counted: list[tuple[str, str, int]] = []
        for row in rows:
            normal = json.loads(row["body"])
            count = row["tokens"]
            if count is None:
                count = self.count(normal, encoding)
                counted.append((row["id"], encoding, count))
            path.append(
                StoredMessage(row["id"], row["parent_id"], row["depth"], row["role"], normal, count, row["created_at"])
            )
        return path, counted

    async def _count_missing(self, heads: str) -> None:
        rows = await self._db.fetchall(UNCOUNTED_SQL, (heads, DEFAULT_ENCODING))
        await self._store_counts(
            [(row[0], DEFAULT_ENCODING, self.count(json.loads(row[1]), DEFAULT_ENCODING)) for row in rows]
        )

    async def _store_counts(self, counted: Sequence[tuple[str, str, int]]) -> None:
        if not counted:
            return

        def write(connection: Connection) -> None:
            insert_tokens(connection, counted)

        await self._db.write(write, atomic=False)

    async def settings_on(self, tenant: str, path: Sequence[StoredMessage]) -> dict[str, Any]:
        """The settings in force at the end of `path`."""
        if not path:
            return {}
        rows = await self._db.fetchall(
            "SELECT message_id, settings FROM context_settings "
            "WHERE tenant = ? AND message_id IN (SELECT value FROM json_each(?))",
            (tenant, id_array(stored.id for stored in path)),
        )
        attached = {row[0]: json.loads(row[1]) for row in rows}
        in_force: Mapping[str, Any] = {}
        for stored in path[: chain.conversation_end(path) + 1]:
            if stored.id in attached:
                in_force = fold(in_force, attached[stored.id])
        return dict(in_force)

    async def message(self, message_id: str) -> Message | None:
        """One stored node's message (its first form), or None. Not tenant-checked, as `path_to`."""
        row = await self._db.fetchone("SELECT body FROM messages WHERE id = ?", (message_id,))
        return None if row is None else dict(json.loads(row[0]))

    async def forms(self, wanted: Mapping[str, str]) -> dict[str, Message]:
        """The stored forms named by `wanted` (node id → digest, as `Reconciled.pinned_forms`), where found."""
        if not wanted:
            return {}
        rows = await self._db.fetchall(
            "SELECT message_id, digest, body FROM message_variants "
            "WHERE message_id IN (SELECT value FROM json_each(?))",
            (json.dumps(list(wanted)),),
        )
        return {row[0]: json.loads(row[2]) for row in rows if wanted[row[0]] == row[1]}
