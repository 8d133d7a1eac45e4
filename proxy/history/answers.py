"""Sealing an answer into history: the one place an assistant answer becomes a node of the chain.

An answer is linked when its journal step ends (`proxy.journal.writer`), inside the step's own transaction, so
there is no moment where the answer is sealed but missing from the conversation, or the reverse. The journal
asks for a `PendingAnswer` (everything computed before the write: normal form, id, token count), runs its
`write` in the seal's write job, and reports the committed node back with `Answers.committed`, which lets the
client's next request find the answer in the session's cached path instead of hashing it again.

The write is idempotent (the node is content-addressed) and runs in its own savepoint: if the parent is not
stored or the session is gone, only the link is missing — the step is still sealed and keeps the answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from proxy.canonical.types import Message
from proxy.history import chain
from proxy.history.messages import StoredMessage
from proxy.history.queries import insert_tokens
from proxy.history.store import History
from proxy.offload import Lane, usable_cpus
from proxy.store.connection import Connection
from proxy.tokens import rough_size

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PendingAnswer:
    """An answer ready to be linked under `parent_id` as the session's new head."""

    tenant: str
    session_id: str
    encoding: str
    parent_id: str
    id: str
    normal: Message
    tokens: int
    created_at: float

    def write(self, connection: Connection) -> StoredMessage | None:
        """Inside the caller's transaction: the node, its token count and the session head, in a savepoint.

        None (logged, rolled back to the savepoint) when the answer cannot be linked.
        """
        connection.execute("SAVEPOINT answer")
        try:
            stored = self._link(connection)
        except LookupError as exc:
            connection.execute("ROLLBACK TO answer")
            connection.execute("RELEASE answer")
            log.error("answer %s not linked into history: %s", self.id, exc)
            return None
        connection.execute("RELEASE answer")
        return stored

    def _link(self, connection: Connection) -> StoredMessage:
        role = str(self.normal["role"])
        connection.execute(
            "INSERT OR IGNORE INTO messages (id, parent_id, depth, role, body, created_at) "
            "SELECT ?, id, depth + 1, ?, ?, ? FROM messages WHERE id = ?",
            (self.id, role, chain.canonical_json(self.normal), self.created_at, self.parent_id),
        )
        row = connection.execute("SELECT depth, created_at FROM messages WHERE id = ?", (self.id,)).fetchone()
        if row is None:
            raise LookupError(f"parent message {self.parent_id} is not stored")
        insert_tokens(connection, [(self.id, self.encoding, self.tokens)])
        cursor = connection.execute(
            "UPDATE sessions SET head_id = ?, updated_at = ? WHERE tenant = ? AND id = ?",
            (self.id, self.created_at, self.tenant, self.session_id),
        )
        if cursor.rowcount == 0:
            raise LookupError(f"no session {self.session_id!r} for this tenant")
        return StoredMessage(self.id, self.parent_id, row[0], role, self.normal, self.tokens, row[1])


class Answers:
    """Prepares answers for linking and keeps the history's caches in step with what was committed."""

    def __init__(self, history: History) -> None:
        self._history = history
        self._counting = Lane(usable_cpus())
        """Long answers are hashed and counted as many at a time as there are processors: tiktoken releases the
        GIL, but forty 4 MB answers sealed at once kept six threads busy on two processors."""

    async def prepare(
        self, tenant: str, session_id: str, parent_id: str, message: Message, encoding: str
    ) -> PendingAnswer:
        """Hashing and counting a long answer takes a while: in a thread then (`proxy.offload`), in the lane."""
        size = rough_size(message)
        return await self._counting.compute(size, self._pending, tenant, session_id, parent_id, message, encoding)

    def _pending(self, tenant: str, session_id: str, parent_id: str, message: Message, encoding: str) -> PendingAnswer:
        normal = chain.normalize(message)
        return PendingAnswer(
            tenant=tenant,
            session_id=session_id,
            encoding=encoding,
            parent_id=parent_id,
            id=chain.message_id(parent_id, normal),
            normal=normal,
            tokens=self._history.count(normal, encoding),
            created_at=self._history.clock(),
        )

    def committed(self, pending: PendingAnswer, stored: StoredMessage) -> None:
        """After the write committed: the client re-sends the answer with its next turn, so it joins the
        session's cached path and that request hashes only what is really new."""
        self._history.recent.extend(
            (pending.tenant, pending.session_id, pending.encoding),
            pending.parent_id,
            stored,
        )
