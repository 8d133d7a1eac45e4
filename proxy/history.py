"""The conversation store: every message a tenant ever sent or received, as a content-addressed chain.

Storage model (tables in `proxy.migrations`): a row of `messages` is one node; its id hashes its parent's id
and its normalized content (`proxy.chain`), so a request's message list is a path from a root, and the path's
ids can be computed before touching the database. Reconciling a request is then one read — which of these
ids exist? since ids chain, the last stored one marks the longest stored prefix — and one write job with only
the new nodes (`INSERT OR IGNORE`, so a race between two requests cannot duplicate a node) and the session's
new head. An edit or a regeneration is a different id at the first changed message, i.e. a branch from the
shared prefix; nothing is ever deleted, so every branch stays readable.

Token counts live in `message_tokens`, one row per (message, encoding), counted when the node is first seen
for that encoding and read back afterwards: a re-sent history costs hashing and one query, never tiktoken.
Within a process it costs less still: each active session's last path is kept (`RecentPaths`), and a re-sent
prefix is compared with it message by message instead of being hashed and read (~0.7 ms vs ~16 ms for 1,000
messages here).

A session (`sessions`, keyed by tenant and id) is a named line of conversation pointing at its head. Every
query filters by tenant, and a foreign or unknown session id reads as None; two tenants sending the same
`X-Session-Id` get two sessions, and their message ids differ from the root on.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from dataclasses import dataclass, replace
from typing import Any

from proxy import chain, tokens
from proxy.database import Database
from proxy.errors import InvalidRequest
from proxy.tokens import DEFAULT_ENCODING

TokenCounter = Callable[[Mapping[str, Any], str], int]
Clock = Callable[[], float]
WriteFunction = Callable[[sqlite3.Connection], None]

KNOWN_DEPTHS = 4096
"""How many recent heads' depths to remember, so an answer's depth is known without a read."""
RECENT_PATH_MESSAGES = 100_000
"""How many messages the recent-path cache holds in all; the least recent sessions' paths go first."""

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

_SESSION_STATS_SQL = """
WITH RECURSIVE
heads(session_id, head_id) AS (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?1)
),
walk(session_id, message_id, parent_id) AS (
    SELECT heads.session_id, m.id, m.parent_id FROM heads JOIN messages AS m ON m.id = heads.head_id
    UNION ALL
    SELECT walk.session_id, m.id, m.parent_id FROM walk JOIN messages AS m ON m.id = walk.parent_id
)
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


@dataclass(frozen=True)
class StoredMessage:
    id: str
    parent_id: str | None
    depth: int
    """0 for the root."""
    role: str
    message: dict[str, Any]
    """The normalized message: what gets sent upstream."""
    tokens: int
    """The token count for the encoding asked for."""
    created_at: float


@dataclass(frozen=True)
class Session:
    tenant: str
    id: str
    head_id: str | None
    model: str | None
    settings: dict[str, Any]
    created_at: float
    updated_at: float


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
class Reconciled:
    session: Session
    """After the update: its head is the request's last message."""
    path: list[StoredMessage]
    """The request's messages in order, as stored, with token counts."""
    stored_before: int
    """How many of them were already stored (the reused prefix)."""


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
class _Cached:
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
        self._paths: OrderedDict[tuple[str, str, str], list[_Cached]] = OrderedDict()
        self._max_messages = max_messages
        self._size = 0

    def match(self, key: tuple[str, str, str], messages: Sequence[Mapping[str, Any]]) -> list[_Cached]:
        """The cached entries equal to a prefix of `messages`, in order."""
        entries = self._paths.get(key)
        if entries is None:
            return []
        self._paths.move_to_end(key)
        matched: list[_Cached] = []
        for message, entry in zip(messages, entries, strict=False):
            if message != entry.private and chain.normalize(message) != entry.private:
                break
            if entry.stored.message != entry.private:
                entry = _Cached(replace(entry.stored, message=_json_copy(entry.private)), entry.private)
            matched.append(entry)
        return matched

    def put(self, key: tuple[str, str, str], entries: list[_Cached]) -> None:
        self._size -= len(self._paths.pop(key, ()))
        if len(entries) > self._max_messages:
            return
        self._paths[key] = entries
        self._size += len(entries)
        while self._size > self._max_messages:
            _, evicted = self._paths.popitem(last=False)
            self._size -= len(evicted)

    def extend(self, key: tuple[str, str, str], parent_id: str, entry: _Cached) -> None:
        """Append an answer to a cached path that ends at its parent."""
        entries = self._paths.get(key)
        if entries and entries[-1].stored.id == parent_id:
            self.put(key, [*entries, entry])


def _json_copy(value: Any) -> Any:
    if type(value) is dict and all(type(item) is str for item in value.values()):
        return dict(value)  # the common message: role and text content, nothing nested to copy
    if isinstance(value, dict):
        return {key: _json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_copy(item) for item in value]
    return value


def _count_with_tiktoken(message: Mapping[str, Any], encoding: str) -> int:
    # Looked up at call time, so the one implementation in proxy.tokens stays the one used.
    return tokens.count_message(message, encoding)


class History:
    """The store of sessions and messages on top of `Database`.

    `reconcile` and `append_answer` are safe without the session lock (each is one write job of idempotent
    inserts); hold `lock()` around a longer section (reconcile + compaction + answer) to order requests.
    """

    def __init__(self, db: Database, *, clock: Clock = time.time, count: TokenCounter | None = None) -> None:
        self._db = db
        self._clock = clock
        self._count = count or _count_with_tiktoken
        self._locks = SessionLocks()
        self._depths: OrderedDict[str, int] = OrderedDict()
        self._recent = RecentPaths()

    def lock(self, tenant: str, session_id: str) -> asyncio.Lock:
        return self._locks.get(tenant, session_id)

    async def reconcile(
        self,
        tenant: str,
        session_id: str | None,
        messages: list[dict[str, Any]],
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
        reused = self._recent.match(key, messages)
        after = reused[-1].stored.id if reused else None
        normals = [chain.normalize(message) for message in messages[len(reused) :]]
        ids = chain.chain_ids(tenant, normals, after)
        known = await self._known(ids, encoding)
        stored_before = len(reused) + next((i + 1 for i in range(len(ids) - 1, -1, -1) if ids[i] in known), 0)

        now = self._clock()
        fresh: list[_Cached] = []
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
                count = self._count(normal, encoding)
                new_tokens.append((node_id, encoding, count))
            stored = StoredMessage(node_id, parent, depth, role, normal, count, created_at)
            fresh.append(_Cached(stored, _json_copy(normal)))
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
                _insert_tokens(connection, new_tokens)
            row = connection.execute(_UPSERT_SESSION_SQL, session_row).fetchone()
            if row is None:
                raise sqlite3.IntegrityError(f"session {session_id!r} was not written")
            return _session(row)

        # A job of one statement needs no savepoint: SQLite rolls a failing statement back by itself.
        session = await self._db.write(write, atomic=bool(new_messages or new_tokens))
        # Only what is committed enters the cache: a cached node is one the next request may build on.
        entries = reused + fresh
        self._recent.put(key, entries)
        self._remember_depth(entries[-1].stored.id, entries[-1].stored.depth)
        return Reconciled(session, [entry.stored for entry in entries], stored_before)

    async def _known(self, ids: list[str], encoding: str) -> dict[str, tuple[float, int | None]]:
        """Which of `ids` are stored, with their created_at and token count for `encoding`: one query."""
        if not ids:
            return {}
        async with self._db.reader.execute(_KNOWN_SQL, (encoding, json.dumps(ids))) as cursor:
            cursor.row_factory = None  # plain tuples: measurably cheaper than sqlite3.Row for long paths
            rows = await cursor.fetchall()
        return {row[0]: (row[1], row[2]) for row in rows}

    def answer_writer(
        self,
        tenant: str,
        session_id: str,
        parent_id: str,
        message: dict[str, Any],
        encoding: str,
    ) -> tuple[StoredMessage, WriteFunction]:
        """The stored form of an assistant answer, and the write that stores it and moves the session head.

        Split from `append_answer` so the journal can run the write inside its own seal transaction. The
        write is idempotent (the node is content-addressed) and fails, rolling back its job, if the parent
        is not stored or the session is not this tenant's.
        """
        normal = chain.normalize(message)
        node_id = chain.message_id(parent_id, normal)
        depth = self._parent_depth(parent_id) + 1
        count = self._count(normal, encoding)
        now = self._clock()
        stored = StoredMessage(node_id, parent_id, depth, str(normal["role"]), normal, count, now)
        body = chain.canonical_json(normal)

        def write(connection: sqlite3.Connection) -> None:
            cursor = connection.execute(
                "INSERT OR IGNORE INTO messages (id, parent_id, depth, role, body, created_at) "
                "SELECT ?, id, depth + 1, ?, ?, ? FROM messages WHERE id = ? AND depth = ?",
                (node_id, stored.role, body, now, parent_id, depth - 1),
            )
            inserted = cursor.rowcount > 0
            if (
                not inserted
                and connection.execute("SELECT 1 FROM messages WHERE id = ?", (node_id,)).fetchone() is None
            ):
                raise LookupError(f"parent message {parent_id} is not stored at depth {depth - 1}")
            _insert_tokens(connection, [(node_id, encoding, count)])
            cursor = connection.execute(
                "UPDATE sessions SET head_id = ?, updated_at = ? WHERE tenant = ? AND id = ?",
                (node_id, now, tenant, session_id),
            )
            if cursor.rowcount == 0:
                raise LookupError(f"no session {session_id!r} for this tenant")
            self._remember_depth(node_id, depth)

        return stored, write

    async def append_answer(
        self,
        tenant: str,
        session_id: str,
        parent_id: str,
        message: dict[str, Any],
        encoding: str,
    ) -> StoredMessage:
        """Store an assistant answer as the child of `parent_id` and make it the session head; idempotent."""
        if parent_id not in self._depths:
            await self._load_depth(parent_id)
        stored, write = self.answer_writer(tenant, session_id, parent_id, message, encoding)
        await self._db.write(write)
        self.remember_answer(tenant, session_id, encoding, stored)
        return stored

    def remember_answer(self, tenant: str, session_id: str, encoding: str, stored: StoredMessage) -> None:
        """After an answer's write has committed: the client will re-send it with its next turn, so it joins the
        session's cached path and that request only hashes what is really new."""
        if stored.parent_id is not None:
            self._recent.extend(
                (tenant, session_id, encoding), stored.parent_id, _Cached(stored, _json_copy(stored.message))
            )

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
        heads = [[row["id"], row["head_id"]] for row in rows if row["head_id"] is not None]
        stats: dict[str, tuple[int, int, int]] = {}
        if heads:
            stat_rows = await self._db.fetchall(_SESSION_STATS_SQL, (json.dumps(heads), tenant, DEFAULT_ENCODING))
            for row in stat_rows:
                history_tokens = row["tokens"]
                if row["counted"] < row["messages"]:
                    head = next(head_id for sid, head_id in heads if sid == row["session_id"])
                    history_tokens = sum(m.tokens for m in await self.path_to(head, DEFAULT_ENCODING))
                stats[row["session_id"]] = (row["messages"], history_tokens, row["summaries"] or 0)
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
                count = self._count(normal, encoding)
                counted.append((row["id"], encoding, count))
            path.append(
                StoredMessage(row["id"], row["parent_id"], row["depth"], row["role"], normal, count, row["created_at"])
            )
        if counted:

            def write(connection: sqlite3.Connection) -> None:
                _insert_tokens(connection, counted)

            await self._db.write(write, atomic=False)
        if path:
            self._remember_depth(path[-1].id, path[-1].depth)
        return path

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

    def _remember_depth(self, message_id: str, depth: int) -> None:
        self._depths[message_id] = depth
        self._depths.move_to_end(message_id)
        while len(self._depths) > KNOWN_DEPTHS:
            self._depths.popitem(last=False)

    async def _load_depth(self, message_id: str) -> None:
        row = await self._db.fetchone("SELECT depth FROM messages WHERE id = ?", (message_id,))
        if row is not None:
            self._remember_depth(message_id, row[0])

    def _parent_depth(self, parent_id: str) -> int:
        depth = self._depths.get(parent_id)
        if depth is not None:
            return depth
        # Only a parent this process has not seen (journal recovery after a restart) gets here: one point
        # read on a short-lived connection, since this function cannot await the async reader.
        with closing(sqlite3.connect(f"{self._db.path.resolve().as_uri()}?mode=ro", uri=True)) as connection:
            row = connection.execute("SELECT depth FROM messages WHERE id = ?", (parent_id,)).fetchone()
        if row is None:
            raise LookupError(f"parent message {parent_id} is not stored")
        self._remember_depth(parent_id, int(row[0]))
        return int(row[0])


def _insert_tokens(connection: sqlite3.Connection, rows: Sequence[tuple[str, str, int]]) -> None:
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
