"""The conversation store: every message a tenant ever sent or received, as a content-addressed chain.

Storage model (tables in `proxy.store.migrations`): a row of `messages` is one node; its id hashes its parent's
id and its normalized content (`proxy.history.chain`), so a request's message list is a path from a root, and the path's
ids can be computed before touching the database. Reconciling a request is then one read — which of these
ids exist? since ids chain, the last stored one marks the longest stored prefix — and one write job with only
the new nodes (`INSERT OR IGNORE`, so a race between two requests cannot duplicate a node) and the session's
new head. An edit or a regeneration is a different id at the first changed message, i.e. a branch from the
shared prefix; nothing is ever deleted, so every branch stays readable.

Token counts live in `message_tokens`, one row per (message, encoding), counted when the node is first seen
for that encoding and read back afterwards: a re-sent history costs hashing and one query, never tiktoken.
Within a process it costs less still: each active session's last path is kept (`caches.RecentPaths`), and a
re-sent prefix is compared with it message by message instead of being hashed and read (~0.7 ms vs ~16 ms for
1,000 messages here). Answers join the chain through `proxy.history.answers`, inside the journal's seal.

A session (`sessions`, keyed by tenant and id) is a named line of conversation pointing at its head. Every
query filters by tenant, and a foreign or unknown session id reads as None; two tenants sending the same
`X-Session-Id` get two sessions, and their message ids differ from the root on.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from proxy import tokens
from proxy.errors import InvalidRequest
from proxy.history import chain
from proxy.history.caches import CachedMessage, RecentPaths, SessionLocks, json_copy
from proxy.history.messages import Reconciled, Session, SessionInfo, StoredMessage
from proxy.store.database import Database
from proxy.tokens import DEFAULT_ENCODING
from proxy.types import Clock, Message

TokenCounter = Callable[[Mapping[str, Any], str], int]

_SESSION_COLUMNS = "tenant, id, head_id, model, settings, created_at, updated_at"

_KNOWN_SQL = """
SELECT m.id, m.created_at, t.tokens
FROM messages AS m
LEFT JOIN message_tokens AS t ON t.message_id = m.id AND t.encoding = ?
WHERE m.id IN (SELECT value FROM json_each(?))
"""

_PATH_SQL = """
WITH RECURSIVE path(id, parent_id, depth, role, body, created_at) AS (
    SELECT id, parent_id, depth, role, body, created_at FROM messages WHERE id = ?
    UNION ALL
    SELECT m.id, m.parent_id, m.depth, m.role, m.body, m.created_at
    FROM messages AS m JOIN path ON m.id = path.parent_id
)
SELECT path.id, path.parent_id, path.depth, path.role, path.body, path.created_at, t.tokens
FROM path
LEFT JOIN message_tokens AS t ON t.message_id = path.id AND t.encoding = ?
ORDER BY path.depth
"""

_UPSERT_SESSION_SQL = f"""
INSERT INTO sessions (tenant, id, head_id, model, settings, created_at, updated_at)
VALUES (?, ?, ?, ?, '{{}}', ?, ?)
ON CONFLICT (tenant, id) DO UPDATE
    SET head_id = excluded.head_id, model = excluded.model, updated_at = excluded.updated_at
RETURNING {_SESSION_COLUMNS}
"""

_WALK_HEADS = """
WITH RECURSIVE
heads(session_id, head_id) AS (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?1)
),
walk(session_id, message_id, parent_id) AS (
    SELECT heads.session_id, m.id, m.parent_id FROM heads JOIN messages AS m ON m.id = heads.head_id
    UNION ALL
    SELECT walk.session_id, m.id, m.parent_id FROM walk JOIN messages AS m ON m.id = walk.parent_id
)"""

_SESSION_STATS_SQL = (
    _WALK_HEADS
    + """
SELECT walk.session_id,
    COUNT(*) AS messages,
    COUNT(t.tokens) AS counted,
    COALESCE(SUM(t.tokens), 0) AS tokens,
    SUM((SELECT COUNT(*) FROM summaries AS s
         WHERE s.end_id = walk.message_id AND s.tenant = ?2 AND s.orphaned_at IS NULL)) AS summaries
FROM walk
LEFT JOIN message_tokens AS t ON t.message_id = walk.message_id AND t.encoding = ?3
GROUP BY walk.session_id
"""
)


_UNCOUNTED_SQL = (
    _WALK_HEADS
    + """
SELECT DISTINCT m.id, m.body
FROM walk
JOIN messages AS m ON m.id = walk.message_id
LEFT JOIN message_tokens AS t ON t.message_id = m.id AND t.encoding = ?2
WHERE t.tokens IS NULL
"""
)


def _count_with_tiktoken(message: Mapping[str, Any], encoding: str) -> int:
    # Looked up at call time, so the one implementation in proxy.tokens stays the one used.
    return tokens.count_message(message, encoding)


class History:
    """The store of sessions and messages on top of `Database`.

    `reconcile` is safe without the session lock (one write job of idempotent inserts); hold `lock()` around a
    longer section (reconcile + settings + compaction) to order the requests of one session.
    """

    def __init__(self, db: Database, *, clock: Clock = time.time, count: TokenCounter | None = None) -> None:
        self._db = db
        self.clock = clock
        self.count = count or _count_with_tiktoken
        """Tokens of one normalized message in one encoding; also what `answers` counts an answer with."""
        self.recent = RecentPaths()
        """The paths this process reconciled last; `answers` extends them with each sealed answer."""
        self._locks = SessionLocks()

    def lock(self, tenant: str, session_id: str) -> asyncio.Lock:
        return self._locks.get(tenant, session_id)

    async def reconcile(
        self,
        tenant: str,
        session_id: str | None,
        messages: list[Message],
        model: str,
        encoding: str,
    ) -> Reconciled:
        """Map a request's messages onto the chain, store what is new, and move the session head to the last.

        Without `session_id`, the session is derived from the opening (`chain.derive_session_id`).
        """
        if not messages:
            raise InvalidRequest("messages must contain at least one message", param="messages")
        if session_id is None:
            session_id = chain.derive_session_id(tenant, messages)
        key = (tenant, session_id, encoding)
        reused = self.recent.match(key, messages)
        after = reused[-1].stored.id if reused else None
        normals = [chain.normalize(message) for message in messages[len(reused) :]]
        ids = chain.chain_ids(tenant, normals, after)
        known = await self._known(ids, encoding)
        stored_before = len(reused) + next((i + 1 for i in range(len(ids) - 1, -1, -1) if ids[i] in known), 0)

        now = self.clock()
        fresh: list[CachedMessage] = []
        new_messages: list[tuple[str, str | None, int, str, str, float]] = []
        new_tokens: list[tuple[str, str, int]] = []
        parent, depth = after, len(reused)
        for node_id, normal in zip(ids, normals, strict=True):
            role = str(normal["role"])
            created_at, count = known.get(node_id, (now, None))
            if depth >= stored_before:
                created_at = now
                new_messages.append((node_id, parent, depth, role, chain.canonical_json(normal), now))
            if count is None:
                count = self.count(normal, encoding)
                new_tokens.append((node_id, encoding, count))
            stored = StoredMessage(node_id, parent, depth, role, normal, count, created_at)
            fresh.append(CachedMessage(stored, json_copy(normal)))
            parent, depth = node_id, depth + 1

        session_row = (tenant, session_id, parent, model, now, now)

        def write(connection: sqlite3.Connection) -> Session:
            if new_messages:
                connection.executemany(
                    "INSERT OR IGNORE INTO messages (id, parent_id, depth, role, body, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    new_messages,
                )
            if new_tokens:
                insert_tokens(connection, new_tokens)
            row = connection.execute(_UPSERT_SESSION_SQL, session_row).fetchone()
            if row is None:
                raise sqlite3.IntegrityError(f"session {session_id!r} was not written")
            return _session(row)

        # A job of one statement needs no savepoint: SQLite rolls a failing statement back by itself.
        session = await self._db.write(write, atomic=bool(new_messages or new_tokens))
        # Only what is committed enters the cache: a cached node is one the next request may build on.
        entries = reused + fresh
        self.recent.put(key, entries)
        return Reconciled(session, [entry.stored for entry in entries], stored_before)

    async def _known(self, ids: list[str], encoding: str) -> dict[str, tuple[float, int | None]]:
        """Which of `ids` are stored, with their created_at and token count for `encoding`: one query."""
        if not ids:
            return {}
        async with self._db.reader.execute(_KNOWN_SQL, (encoding, json.dumps(ids))) as cursor:
            cursor.row_factory = None  # plain tuples: measurably cheaper than sqlite3.Row for long paths
            rows = await cursor.fetchall()
        return {row[0]: (row[1], row[2]) for row in rows}

    async def session(self, tenant: str, session_id: str) -> Session | None:
        row = await self._db.fetchone(
            f"SELECT {_SESSION_COLUMNS} FROM sessions WHERE tenant = ? AND id = ?", (tenant, session_id)
        )
        return None if row is None else _session(row)

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
            stat_rows = await self._db.fetchall(_SESSION_STATS_SQL, (heads, tenant, DEFAULT_ENCODING))
            if any(row["counted"] < row["messages"] for row in stat_rows):
                # Messages stored under another encoding only: count them all at once, then read again.
                await self._count_missing(heads)
                stat_rows = await self._db.fetchall(_SESSION_STATS_SQL, (heads, tenant, DEFAULT_ENCODING))
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

    async def path_to(self, message_id: str, encoding: str = DEFAULT_ENCODING) -> list[StoredMessage]:
        """The path from the root to `message_id` in one query; tokens missing for `encoding` are counted
        now and stored, once. Not tenant-checked: callers pass ids they got from a tenant's session."""
        rows = await self._db.fetchall(_PATH_SQL, (message_id, encoding))
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
        await self._store_counts(counted)
        return path

    async def _count_missing(self, heads: str) -> None:
        rows = await self._db.fetchall(_UNCOUNTED_SQL, (heads, DEFAULT_ENCODING))
        await self._store_counts(
            [(row[0], DEFAULT_ENCODING, self.count(json.loads(row[1]), DEFAULT_ENCODING)) for row in rows]
        )

    async def _store_counts(self, counted: Sequence[tuple[str, str, int]]) -> None:
        if not counted:
            return

        def write(connection: sqlite3.Connection) -> None:
            insert_tokens(connection, counted)

        await self._db.write(write, atomic=False)

    async def update_settings(self, tenant: str, session_id: str, settings: dict[str, Any]) -> Session | None:
        """Merge `settings` into the session's (a None value removes the key); None if no such session."""

        def write(connection: sqlite3.Connection) -> Session | None:
            row = connection.execute(
                "SELECT settings FROM sessions WHERE tenant = ? AND id = ?", (tenant, session_id)
            ).fetchone()
            if row is None:
                return None
            merged = {**json.loads(row[0]), **settings}
            merged = {key: value for key, value in merged.items() if value is not None}
            updated = connection.execute(
                f"UPDATE sessions SET settings = ? WHERE tenant = ? AND id = ? RETURNING {_SESSION_COLUMNS}",
                (json.dumps(merged, sort_keys=True), tenant, session_id),
            ).fetchone()
            return None if updated is None else _session(updated)

        return await self._db.write(write)


def insert_tokens(connection: sqlite3.Connection, rows: Sequence[tuple[str, str, int]]) -> None:
    connection.executemany("INSERT OR IGNORE INTO message_tokens (message_id, encoding, tokens) VALUES (?, ?, ?)", rows)


def _session(row: sqlite3.Row) -> Session:
    settings = json.loads(row["settings"])
    return Session(
        tenant=row["tenant"],
        id=row["id"],
        head_id=row["head_id"],
        model=row["model"],
        settings=settings if isinstance(settings, dict) else {},
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )
