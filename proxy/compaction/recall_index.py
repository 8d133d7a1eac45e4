"""Recall's full-text index (`proxy.compaction.recall`), filled lazily: a message is indexed the first time it is
hidden and recall asks for it, once, since messages are content-addressed and immutable. It is contentless (the
text lives in `messages` and in the path at hand), so it stores no second copy of anything.

What a process knows indexed (message ids, and how far each session's path is) spares a long session's hidden
history a query on every request; a deletion forgets it (`forget_tenant`, or, by another process, the tenant's
span epoch moved past a clearing: `forget_if_cleared`), so the same messages sent again are indexed again.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Iterable, Sequence, Set
from dataclasses import dataclass

from proxy.compaction.excerpts import message_text
from proxy.errors import StorageFull
from proxy.history.messages import StoredMessage
from proxy.offload import compute
from proxy.store.connection import Connection
from proxy.store.database import Database, id_array
from proxy.tokens import rough_size

log = logging.getLogger(__name__)

MAX_INDEX_CHARS = 8 * 1024 * 1024
"""Text indexed by one call at most (one message always): the rest is indexed by the next calls."""

_INSERT_DOCUMENT = {
    "sqlite": "INSERT INTO recall_index (rowid, text) VALUES (?, ?)",
    "postgresql": "INSERT INTO recall_index (id, document) VALUES (?, to_tsvector('simple', ?))",
}


INDEXED_IDS = 200_000
"""Messages this process knows are indexed (~150 bytes each): a long session's hidden history is not asked
about again on every request."""


@dataclass(frozen=True)
class _Checked:
    """How far a session's path is known indexed, as of its last request: every message before `end` (the path
    from depth `first` to `end_id`) is indexed but those at `shown` (sent verbatim then, perhaps never hidden)."""

    first: int
    end: int
    end_id: str
    shown: frozenset[int]


SESSIONS_CHECKED = 4096
"""Sessions whose indexed prefix a process remembers (`_Checked`: ~100 bytes and their shown positions)."""


class RecallIndex:
    """The index over a tenant's hidden messages, and what this process knows it holds."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._indexed: OrderedDict[tuple[str, str], None] = OrderedDict()
        """(tenant, message id) of messages known to be in the index: an indexed message stays indexed until its
        session or tenant is deleted (`forget_tenant`)."""
        self._checked: OrderedDict[tuple[str, str], _Checked] = OrderedDict()
        self._epochs: OrderedDict[str, tuple[int, int]] = OrderedDict()
        """Tenant → its span epoch and last clearing as of this process's last look (`forget_if_cleared`)."""

    def forget_tenant(self, tenant: str) -> None:
        """After a deletion of the tenant's rows (`proxy.lifecycle`): the index entries of what it remembers may
        be gone, and the same messages sent again (the same ids) must be indexed again."""
        for key in [key for key in self._indexed if key[0] == tenant]:
            del self._indexed[key]
        for key in [key for key in self._checked if key[0] == tenant]:
            del self._checked[key]
        self._epochs.pop(tenant, None)

    async def forget_if_cleared(self, tenant: str) -> None:
        """A deletion by another process (a replica, the CLI) moves the tenant's span epoch past a clearing, or
        takes its row with a purge (`proxy.lifecycle.forget`): what this process remembers of the tenant's index
        is then forgotten. One read by key, when recall looks something up."""
        row = await self._db.fetchone("SELECT epoch, cleared FROM span_epochs WHERE tenant = ?", (tenant,))
        now = (0, 0) if row is None else (int(row[0]), int(row[1]))
        seen = self._epochs.get(tenant)
        if seen is not None and (now[1] > seen[1] or now[0] < seen[0]):
            self.forget_tenant(tenant)
        self._epochs[tenant] = now
        self._epochs.move_to_end(tenant)
        while len(self._epochs) > SESSIONS_CHECKED:
            self.forget_tenant(next(iter(self._epochs)))  # a tenant no longer watched keeps nothing

    async def index_hidden(self, tenant: str, session_id: str, path: Sequence[StoredMessage], shown: Set[int]) -> None:
        """Index the hidden messages not indexed yet. What the session's last request left indexed carries over
        when `path` extends its path (a node's id hashes its ancestors', so one id says so): only the messages
        past it, and those it showed that are hidden now, are looked at, not a long path's every message."""
        await self.forget_if_cleared(tenant)
        key = (tenant, session_id)
        checked = self._checked.pop(key, None)
        if (
            checked is not None
            and path[0].depth == checked.first
            and len(path) >= checked.end
            and path[checked.end - 1].id == checked.end_id
        ):
            unhidden = (position for position in sorted(checked.shown) if position not in shown)
            looked = [*unhidden, *(position for position in range(checked.end, len(path)) if position not in shown)]
        else:
            looked = [position for position in range(len(path)) if position not in shown]
        known = self._indexed
        unknown = [position for position in looked if (tenant, path[position].id) not in known]
        left = await self.index_messages(tenant, [path[position] for position in unknown]) if unknown else set()
        end = min((position for position in unknown if path[position].id in left), default=len(path))
        if end:
            below = frozenset(position for position in shown if position < end)
            self._checked[key] = _Checked(path[0].depth, end, path[end - 1].id, below)
            while len(self._checked) > SESSIONS_CHECKED:
                self._checked.popitem(last=False)

    async def index_messages(self, tenant: str, unknown: Sequence[StoredMessage]) -> set[str]:
        """Index those of `unknown` not in the index yet, the newest first, within `MAX_INDEX_CHARS`; the ids of
        those still not indexed (left for the next call, or not written)."""
        rows = await self._db.fetchall(
            "SELECT message_id FROM recall_messages WHERE tenant = ? "
            "AND message_id IN (SELECT value FROM json_each(?))",
            (tenant, id_array(message.id for message in unknown)),
        )
        indexed = {row[0] for row in rows}
        self._remember(tenant, indexed)
        batch: list[StoredMessage] = []
        size = 0
        # Newest first: what was hidden last is what a question most likely reaches back for.
        for message in reversed(unknown):
            if message.id in indexed:
                continue
            if batch and size + rough_size(message.message) > MAX_INDEX_CHARS:
                break
            batch.append(message)
            size += rough_size(message.message)
        left = {message.id for message in unknown} - indexed
        if not batch:
            return left
        documents = await compute(size, _documents, batch)

        insert_document = _INSERT_DOCUMENT[self._db.dialect]

        def write(connection: Connection) -> None:
            for message_id, text in documents:
                row = connection.execute(
                    "INSERT OR IGNORE INTO recall_messages (tenant, message_id) VALUES (?, ?) RETURNING id",
                    (tenant, message_id),
                ).fetchone()
                if row is not None:  # not indexed meanwhile by a concurrent request
                    connection.execute(insert_document, (row[0], text))

        failures: tuple[type[Exception], ...] = (*self._db.errors, StorageFull)
        try:
            await self._db.write(write, bulk=True)
        except failures as exc:
            log.warning("recall: indexing %d message(s) failed, recalling from the index as it is: %s", len(batch), exc)
            return left
        self._remember(tenant, [message_id for message_id, _ in documents])
        return left - {message_id for message_id, _ in documents}

    def _remember(self, tenant: str, message_ids: Iterable[str]) -> None:
        for message_id in message_ids:
            self._indexed[(tenant, message_id)] = None
        while len(self._indexed) > INDEXED_IDS:
            self._indexed.popitem(last=False)


def _documents(messages: Sequence[StoredMessage]) -> list[tuple[str, str]]:
    return [(message.id, message_text(message.message)) for message in messages]
