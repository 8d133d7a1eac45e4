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

import contextlib
import json
import operator
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import replace
from typing import Any

from proxy import tokens
from proxy.canonical.types import Clock, Message
from proxy.canonical.vocabulary import ITEMS
from proxy.errors import InvalidRequest
from proxy.history import chain
from proxy.history.caches import ENTRY_OVERHEAD, RecentPaths
from proxy.history.located import CachedPathGone, KnownNode, Located, SessionDeleted
from proxy.history.locks import SessionLocks
from proxy.history.messages import Reconciled, Session, StoredMessage
from proxy.history.path_match import CachedMessage, PathMatch, json_copy
from proxy.history.queries import (
    BUILT_ON_SQL,
    KNOWN_SQL,
    UPSERT_SESSION_SQL,
    insert_tokens,
    lost_races,
    session_from_row,
)
from proxy.history.reads import HistoryReads, TokenCounter
from proxy.history.settings import fold
from proxy.history.warming import Warming
from proxy.offload import OFF_LOOP_CHARS, compute
from proxy.store.connection import Connection
from proxy.store.database import Database, id_array, lock_name

_STORED = operator.attrgetter("stored")

BULK_ROWS = 64
"""A request writing more messages than this is stored on the writer thread (a first request of 20,000
messages held the event loop ~0.3 s inline)."""


def _encode(parent: str, messages: Sequence[Message]) -> list[tuple[str, str, Message]]:
    """(id, body, normal form) of each message, chained from `parent`."""
    encoded: list[tuple[str, str, Message]] = []
    for message in messages:
        normal = chain.normalize(message)
        node_id, body = chain.encode(parent, normal)
        encoded.append((node_id, body, normal))
        parent = node_id
    return encoded


def _without_items(message: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in message.items() if key != ITEMS}


def _count_with_tiktoken(message: Mapping[str, Any], encoding: str) -> int:
    # Looked up at call time, so the one implementation in proxy.tokens stays the one used.
    return tokens.count_message(message, encoding)


class History(HistoryReads):
    """The store of sessions and messages on top of `Database`: the write path here, the reads in `HistoryReads`.

    A request is reconciled in two halves: `locate` (hashing, reading, counting; no write) finds its session,
    and `store` writes what is new. Hold `lock()` of the located session around `store` and whatever must see
    the session's requests one at a time (settings, compaction); `reconcile` runs both halves, for callers that
    need no lock.
    """

    def __init__(self, db: Database, *, clock: Clock = time.time, count: TokenCounter | None = None) -> None:
        super().__init__(db, count or _count_with_tiktoken)
        self.clock = clock
        self.recent = RecentPaths()
        """The paths this process reconciled last; `answers` extends them with each sealed answer."""
        self._locks = SessionLocks()
        self._warming = Warming(db, self, self.recent)

    async def sent_forms(self, tenant: str, path: Sequence[StoredMessage]) -> list[Message]:
        """`path`'s messages in the form the tenant last sent them (`RecentPaths.sent_forms`); when no request
        this process served sent them (after a restart), in the latest form the store holds of each."""
        forms = self.recent.sent_forms(tenant, path)
        return forms if forms is not None else await self._warming.last_forms(path)

    async def sent_path(self, tenant: str, message_id: str) -> tuple[list[StoredMessage], list[Message]] | None:
        """The path to one of the tenant's messages and its messages as `sent_forms` gives them; None when it is no
        message of the tenant's. From the recent paths when they hold it: nothing is read or decoded, and the
        messages are the very objects its request sent, which a request continuing it then shares
        (`proxy.canonical.sharing`); else from the store (`owned_path`)."""
        cached = self.recent.sent_path(tenant, message_id)
        if cached is not None:
            return cached
        path = await self.owned_path(tenant, message_id)
        return None if path is None else (path, await self.sent_forms(tenant, path))

    @contextlib.asynccontextmanager
    async def lock(self, tenant: str, session_id: str) -> AsyncIterator[None]:
        """The session's requests one at a time: in this process first (waiting there costs nothing), then
        across every process sharing the store (`Database.lock`: an advisory lock on PostgreSQL)."""
        async with self._locks.get(tenant, session_id), self._db.lock(lock_name("session", tenant, session_id)):
            yield

    async def reconcile(
        self,
        tenant: str,
        session_id: str | None,
        messages: list[Message],
        model: str,
        encoding: str,
    ) -> Reconciled:
        """Map a request's messages onto the chain, store what is new, and move the session head to the last."""
        try:
            return await self.save(await self.locate(tenant, session_id, messages, encoding), model)
        except CachedPathGone:  # located afresh, from the store (`stored`)
            return await self.save(await self.locate(tenant, session_id, messages, encoding), model)

    @contextlib.asynccontextmanager
    async def stored(
        self, tenant: str, session_id: str | None, messages: list[Message], model: str, encoding: str
    ) -> AsyncIterator[tuple[Located, Reconciled]]:
        """`reconcile` under the located session's lock, held for the block: a request located without a read on a
        cached path found gone when saved (`CachedPathGone`) is located afresh, from the store (the path forgotten),
        and saved under its new session's lock."""
        located = await self.locate(tenant, session_id, messages, encoding)
        async with self.lock(tenant, located.session_id):
            try:
                reconciled = await self.save(located, model)
            except CachedPathGone:
                pass
            else:
                yield located, reconciled
                return
        located = await self.locate(tenant, session_id, messages, encoding)  # read from the store: checked
        async with self.lock(tenant, located.session_id):
            yield located, await self.save(located, model)

    async def locate(self, tenant: str, session_id: str | None, messages: list[Message], encoding: str) -> Located:
        """Which stored nodes the request's messages are, which session it belongs to, what must be written.

        Without `session_id` the session is the derived one whose anchor lies deepest on the request's path;
        a request that contains no anchor starts a session anchored at its own conversation end.
        """
        if not messages:
            raise InvalidRequest("messages must contain at least one message", param="messages")
        now = self.clock()
        found = self.recent.match(tenant, encoding, session_id, messages)
        if not found.whole and await self._warming.warm(tenant, session_id, encoding):
            found = self.recent.match(tenant, encoding, session_id, messages)
        messages = found.restored(messages)  # the opening turns a client left out, back in place (`match_path`)
        rest = messages[len(found.entries) :]
        # What is new or changed is hashed and counted: in a thread when that is a lot of text (proxy.offload).
        size = sum(map(tokens.rough_size, rest)) + sum(map(tokens.rough_size, found.variants.values()))
        entries, variants = await compute(size, self._reused, found, messages, encoding, now)
        after = entries[-1].stored.id if entries else None
        encoded = await compute(size, _encode, chain.root_parent(tenant) if after is None else after, rest)
        # The cached path's last node is looked up with the new ones (no query more): gone, the session was
        # deleted since it was cached, maybe by another process (`proxy.lifecycle`), and the request is located
        # afresh from the store, as on the process that deleted it. Only a request located before a deletion is
        # refused (`save`). A request that adds nothing to the cached path reads nothing: `save` checks that node
        # anyway, and a path found gone there is located afresh then (`stored`).
        ids = [node_id for node_id, _, _ in encoded]
        checked = bool(ids)
        known = await self._known(tenant, [*ids, after] if checked and after else ids, encoding)
        if checked and after is not None and after not in known and await self._gone(after):
            self.recent.forget_tenant(tenant)
            return await self.locate(tenant, session_id, messages, encoding)
        stored_before = len(entries) + next(
            (i + 1 for i in range(len(encoded) - 1, -1, -1) if encoded[i][0] in known), 0
        )
        new_messages, new_tokens = await compute(
            size, self._extend, entries, variants, encoded, rest, known, stored_before, encoding, now
        )

        anchor_id = None
        derived = session_id is None
        if session_id is None:
            # The cached session, when the request extends its path, or repeats part of it holding its anchor and
            # adds only new nodes (a regenerated answer); else the store says which anchor lies deepest.
            cached = found.whole or (found.anchored and stored_before == len(found.entries))
            session_id = found.session_id if cached else None
            if session_id is None:
                path = list(map(_STORED, entries))
                session_id = await self._derived(tenant, path)
                if session_id is None:
                    anchor_id = path[chain.conversation_end(path)].id
                    session_id = chain.derived_session_id(tenant, anchor_id)
        return Located(
            tenant,
            session_id,
            derived,
            anchor_id,
            encoding,
            entries,
            stored_before,
            new_messages,
            new_tokens,
            variants,
            messages,
            found,
            checked,
        )

    def _extend(
        self,
        entries: list[CachedMessage],
        variants: list[tuple[str, str, str, float]],
        encoded: Sequence[tuple[str, str, Message]],
        sent: Sequence[Message],
        known: Mapping[str, KnownNode],
        stored_before: int,
        encoding: str,
        now: float,
    ) -> tuple[list[tuple[str, str | None, int, str, str, float]], list[tuple[str, str, int]]]:
        """Append the located nodes to `entries` (and forms not stored yet to `variants`); returns the messages
        and token counts to write."""
        in_force = entries[-1].settings if entries else {}
        new_messages: list[tuple[str, str | None, int, str, str, float]] = []
        new_tokens: list[tuple[str, str, int]] = []
        parent_id, depth = (entries[-1].stored.id, len(entries)) if entries else (None, 0)
        for (node_id, body, normal), message in zip(encoded, sent, strict=True):
            role = str(normal["role"])
            row = known.get(node_id)
            if depth >= stored_before or row is None:
                created_at, count = now, None
                if depth >= stored_before:
                    new_messages.append((node_id, parent_id, depth, role, body, now))
            else:
                created_at, count = row.created_at, row.tokens
                if body != row.body:
                    kept = chain.variant_body(message, normal)
                    variants.append((node_id, chain.body_digest(kept), kept, now))
                    count = None  # the stored count is the first form's
                elif count is None:
                    count = self.count(normal, encoding)
                    new_tokens.append((node_id, encoding, count))
                if row.settings is not None:
                    in_force = fold(in_force, row.settings)
            if count is None:
                count = self.count(normal, encoding)
                if depth >= stored_before:
                    new_tokens.append((node_id, encoding, count))
            stored = StoredMessage(node_id, parent_id, depth, role, normal, count, created_at)
            entries.append(CachedMessage(stored, json_copy(normal), in_force, len(body) + ENTRY_OVERHEAD))
            parent_id, depth = node_id, depth + 1
        return new_messages, new_tokens

    def _reused(
        self, found: PathMatch, messages: Sequence[Message], encoding: str, now: float
    ) -> tuple[list[CachedMessage], list[tuple[str, str, str, float]]]:
        """The cached entries as this request sent them: a variant gets its own form and token count, and is
        stored (the forms not stored yet are returned beside). `found.entries` itself, which is the request's."""
        entries = found.entries
        variants: list[tuple[str, str, str, float]] = []
        for position, variant in found.variants.items():
            entry = entries[position]
            body = chain.canonical_json(variant)
            kept = chain.variant_body(messages[position], variant)
            variants.append((entry.stored.id, chain.body_digest(kept), kept, now))
            # Another API's parts alone (a moved cache breakpoint) cost no tokens: the count stands.
            same = _without_items(variant) == _without_items(entry.private)
            stored = replace(
                entry.stored, message=variant, tokens=entry.stored.tokens if same else self.count(variant, encoding)
            )
            entries[position] = CachedMessage(stored, json_copy(variant), entry.settings, len(body) + ENTRY_OVERHEAD)
        return entries, variants

    async def save(self, located: Located, model: str) -> Reconciled:
        """Write what `locate` found new, and move the session's head to the request's last message."""
        tenant, session_id = located.tenant, located.session_id
        now = self.clock()
        session_row = (tenant, session_id, located.entries[-1].stored.id, model, located.anchor_id, now, now)

        built_on = located.entries[located.stored_before - 1].stored.id if located.stored_before else None

        def write(connection: Connection) -> Session:
            if built_on is not None and connection.execute(BUILT_ON_SQL, (built_on,)).fetchone() is None:
                raise SessionDeleted()
            variants = located.variants
            new_tokens = located.new_tokens
            if located.new_messages:
                inserted = connection.executemany(
                    "INSERT OR IGNORE INTO messages (id, parent_id, depth, role, body, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?)",
                    located.new_messages,
                ).rowcount
                if inserted < len(located.new_messages):
                    lost = lost_races(connection, located.new_messages)
                    variants = [*variants, *lost]
                    new_tokens = [row for row in new_tokens if row[0] not in {variant[0] for variant in lost}]
            if new_tokens:
                insert_tokens(connection, new_tokens)
            if variants:
                connection.executemany(
                    "INSERT OR IGNORE INTO message_variants (message_id, digest, body, created_at) VALUES (?, ?, ?, ?)",
                    variants,
                )
            row = connection.execute(UPSERT_SESSION_SQL, session_row).fetchone()
            if row is None:
                raise RuntimeError(f"session {session_id!r} was not written")
            return session_from_row(row)

        # A job of one statement needs no savepoint: SQLite rolls a failing statement back by itself.
        atomic = bool(located.new_messages or located.new_tokens or located.variants or built_on)
        # Many rows or long bodies go to the writer thread, not inline on the event loop (`Database.write`).
        written = sum(len(row[4]) for row in located.new_messages) + sum(len(row[2]) for row in located.variants)
        bulk = len(located.new_messages) + len(located.variants) > BULK_ROWS or written > OFF_LOOP_CHARS
        try:
            session = await self._db.write(write, atomic=atomic, bulk=bulk)
        except SessionDeleted:
            # Unchecked, on a path the cache still holds as it was found: no deletion in this process came between
            # (its own forgets the path), so the request is taken as located after another process's.
            key = (tenant, located.matched.session_id or "", located.encoding)
            unchecked = not located.checked and self.recent.holds(key, located.matched.base)
            self.recent.forget_tenant(tenant)  # what this process remembers of the tenant's paths may be gone too
            if unchecked:
                raise CachedPathGone() from None
            raise
        # Only what is committed enters the cache: a cached node is one the next request may build on.
        path = self.recent.put(
            (tenant, session_id, located.encoding),
            located.entries,
            derived=located.derived,
            anchor=session.anchor_id,
            sent=(located.messages, len(located.messages)),
            matched=located.matched,
        )
        end = chain.conversation_end(path)
        return Reconciled(session, path, located.stored_before, located.entries[end].settings, end)

    async def attach_settings(self, reconciled: Reconciled, changes: Mapping[str, Any]) -> Reconciled:
        """Attach setting changes (a None value removes the key) to the request's conversation end: they hold
        for every request that continues from there, and for no other conversation (docs/architecture.md,
        "Glossary": session)."""
        tenant = reconciled.session.tenant
        message_id = reconciled.end_id
        now = self.clock()

        def write(connection: Connection) -> None:
            row = connection.execute(
                "SELECT settings FROM context_settings WHERE tenant = ? AND message_id = ?", (tenant, message_id)
            ).fetchone()
            merged = {**(json.loads(row[0]) if row is not None else {}), **changes}
            connection.execute(
                "INSERT INTO context_settings (tenant, message_id, settings, created_at) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (tenant, message_id) DO UPDATE SET settings = excluded.settings",
                (tenant, message_id, json.dumps(merged, sort_keys=True), now),
            )

        await self._db.write(write)
        self.recent.forget_tenant(tenant)
        return replace(reconciled, settings=fold(reconciled.settings, changes))

    async def _derived(self, tenant: str, path: Sequence[StoredMessage]) -> str | None:
        """The derived session whose anchor lies deepest on `path` (the most recently updated on a tie)."""
        rows = await self._db.fetchall(
            "SELECT id, anchor_id FROM sessions WHERE tenant = ? AND anchor_id IN (SELECT value FROM json_each(?)) "
            "ORDER BY updated_at DESC, id",
            (tenant, id_array(stored.id for stored in path)),
        )
        if not rows:
            return None
        depth = {stored.id: stored.depth for stored in path}
        deepest = max(rows, key=lambda row: depth[row[1]])  # max keeps the first of equals: the most recent
        return str(deepest[0])

    async def _gone(self, node_id: str) -> bool:
        """Whether a node a read did not find is really gone: asked of the writer, which sees every commit (a read
        may run in an older snapshot, that of another request's statement still open on SQLite's reader)."""

        def gone(connection: Connection) -> bool:
            return connection.execute(BUILT_ON_SQL, (node_id,)).fetchone() is None

        return await self._db.write(gone, atomic=False)

    async def _known(self, tenant: str, ids: list[str], encoding: str) -> dict[str, KnownNode]:
        """Which of `ids` are stored, with what the request needs of them: one query."""
        if not ids:
            return {}
        rows = await self._db.fetch_tuples(KNOWN_SQL, (encoding, tenant, id_array(ids)))
        return {
            row[0]: KnownNode(row[1], row[2], row[3], None if row[4] is None else json.loads(row[4])) for row in rows
        }
