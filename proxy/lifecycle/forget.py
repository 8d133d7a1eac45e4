"""Deleting what sessions (or a whole tenant) stored, in one write job: one transaction on either engine, so a
crash or a failure leaves the session whole or gone, never half.

Messages are shared by content address (`proxy.history.chain`): a session's path may begin with nodes another
session of the same tenant also reaches (a system root, a common opening). Nothing else marks which session a node
belongs to, so the job works it out from what refers to nodes: a session's head and anchor, its journal steps'
request and answer nodes, its pins. The doomed sessions' nodes are every ancestor of their references; of those, the
ones another reference names or reaches (a branch below holds one) stay, with their ancestors; what remains goes,
with every branch hanging below it (one a doomed session left behind: no reference reaches below a node that none
reaches). A branch no reference reaches that hangs below a node that stays goes when it is met on the way (`_kept`
stops at the first branch that holds a reference). Then every row holding that content goes with it: spans ending on
those nodes, settings attached to them, their other forms and token counts, their recall index entries (FTS5's
contentless index is told each document's text to forget), and the sessions' own journal steps and events, pins,
compaction events and summarizer calls. A tenant's purge is the same with nothing kept.

Other processes notice through the store: the tenant's span epoch moves past a clearing (`span_epochs.cleared`),
so a replica's spans read before are read again and recall's indexed ids are forgotten; a path a replica cached is
found gone when a request is located on it (`History.locate`), and a request it located before the deletion is
refused when it is saved (`History.save`) rather than building on nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from proxy.compaction.excerpts import message_text
from proxy.store.connection import Connection
from proxy.store.database import id_array

_UP = """
WITH RECURSIVE up(id, parent_id, depth) AS (
    SELECT id, parent_id, depth FROM messages WHERE id IN (SELECT value FROM json_each(?1))
    UNION
    SELECT m.id, m.parent_id, m.depth FROM messages AS m JOIN up ON m.id = up.parent_id
)
SELECT id, parent_id, depth FROM up
"""

_CHILDREN = "SELECT id, parent_id FROM messages WHERE parent_id IN (SELECT value FROM json_each(?))"

_DOWN = """
WITH RECURSIVE down(id) AS (
    SELECT id FROM messages WHERE parent_id IN (SELECT value FROM json_each(?1))
    UNION
    SELECT m.id FROM messages AS m JOIN down ON m.parent_id = down.id
)
SELECT id FROM down
"""

_SESSION_REFERENCES = """
SELECT head_id FROM sessions WHERE tenant = ?1 AND id IN (SELECT value FROM json_each(?2))
UNION SELECT anchor_id FROM sessions WHERE tenant = ?1 AND id IN (SELECT value FROM json_each(?2))
UNION SELECT parent_message_id FROM journal_steps WHERE tenant = ?1 AND session_id IN (SELECT value FROM json_each(?2))
UNION SELECT message_id FROM journal_steps WHERE tenant = ?1 AND session_id IN (SELECT value FROM json_each(?2))
UNION SELECT message_id FROM pins WHERE tenant = ?1 AND session_id IN (SELECT value FROM json_each(?2))
"""

_OTHER_REFERENCES = """
SELECT head_id FROM sessions WHERE tenant = ?1 AND NOT (id IN (SELECT value FROM json_each(?2)))
UNION SELECT anchor_id FROM sessions WHERE tenant = ?1 AND NOT (id IN (SELECT value FROM json_each(?2)))
UNION SELECT parent_message_id FROM journal_steps
    WHERE tenant = ?1 AND (session_id IS NULL OR NOT (session_id IN (SELECT value FROM json_each(?2))))
UNION SELECT message_id FROM journal_steps
    WHERE tenant = ?1 AND (session_id IS NULL OR NOT (session_id IN (SELECT value FROM json_each(?2))))
UNION SELECT message_id FROM pins WHERE tenant = ?1 AND NOT (session_id IN (SELECT value FROM json_each(?2)))
"""

_TENANT_REFERENCES = """
SELECT head_id FROM sessions WHERE tenant = ?1
UNION SELECT anchor_id FROM sessions WHERE tenant = ?1
UNION SELECT parent_message_id FROM journal_steps WHERE tenant = ?1
UNION SELECT message_id FROM journal_steps WHERE tenant = ?1
UNION SELECT message_id FROM pins WHERE tenant = ?1
UNION SELECT end_id FROM summaries WHERE tenant = ?1
UNION SELECT message_id FROM context_settings WHERE tenant = ?1
UNION SELECT message_id FROM recall_messages WHERE tenant = ?1
"""
"""Every node a tenant's rows name (a purge keeps none of them)."""

_FORGET_DOCUMENT = "INSERT INTO recall_index (recall_index, rowid, text) VALUES ('delete', ?, ?)"
"""SQLite's FTS5 contentless index forgets a document only when told its text again (`m009_recall`); PostgreSQL's
rows are deleted by id."""

LOOKED_AT_CHILDREN = 16
"""A node with at most this many children outside the doomed ones has each looked at (a dead branch below it goes);
one with more (a tenant's shared root) only until one holding a reference is found."""
MAX_BRANCH_NODES = 10_000
"""Nodes of a branch read in search of a reference before it is taken to hold one (and kept)."""

_SESSION_ROWS = ("pins", "compaction_events", "summarizer_calls")
"""Tables of a session's own rows (tenant, session_id), deleted with it."""


@dataclass(frozen=True)
class Forgotten:
    """What one deletion removed: the sessions, and rows per table."""

    sessions: tuple[str, ...]
    rows: dict[str, int] = field(default_factory=dict)

    @property
    def messages(self) -> int:
        return self.rows.get("messages", 0)

    def as_json(self) -> dict[str, object]:
        return {"sessions": len(self.sessions), "rows": dict(sorted(self.rows.items()))}


def forget(
    connection: Connection,
    *,
    dialect: str,
    tenant: str,
    session_ids: Sequence[str] | None,
    idle_before: float | None = None,
) -> Forgotten:
    """Delete the tenant's sessions `session_ids` (those that exist, and with `idle_before` those not updated
    since), or everything the tenant stored (None).

    A write job: it runs in the writer's transaction, so every row goes or none does."""
    if session_ids is None:
        sessions = tuple(row[0] for row in connection.execute("SELECT id FROM sessions WHERE tenant = ?", (tenant,)))
        doomed = _ancestors(connection, _ids(connection, _TENANT_REFERENCES, (tenant,)))
        nodes = _below(connection, set(doomed))
    else:
        sessions = tuple(
            row[0]
            for row in connection.execute(
                "SELECT id FROM sessions WHERE tenant = ? AND id IN (SELECT value FROM json_each(?)) "
                "AND updated_at < ?",
                (tenant, json.dumps(list(session_ids)), float("inf") if idle_before is None else idle_before),
            )
        )
        if not sessions:
            return Forgotten(())
        listed = json.dumps(list(sessions))
        doomed = _ancestors(connection, _ids(connection, _SESSION_REFERENCES, (tenant, listed)))
        kept, dead = _kept(connection, doomed, set(_ids(connection, _OTHER_REFERENCES, (tenant, listed))))
        nodes = _below(connection, {node for node in doomed if node not in kept} | dead)
    rows = _delete(connection, dialect, tenant, None if session_ids is None else sessions, sorted(nodes))
    _clear_spans(connection, tenant, purge=session_ids is None)
    return Forgotten(sessions, rows)


def _delete(
    connection: Connection, dialect: str, tenant: str, sessions: Sequence[str] | None, nodes: Sequence[str]
) -> dict[str, int]:
    """Every row of the sessions (all of the tenant's: None) and of the nodes, in an order the foreign keys take."""
    rows: dict[str, int] = {}
    listed = id_array(nodes)
    params: tuple[str, ...]
    if sessions is None:
        scope, params = "tenant = ?", (tenant,)
    else:
        scope, params = "tenant = ? AND session_id IN (SELECT value FROM json_each(?))", (tenant, json.dumps(sessions))
    rows["journal_events"] = connection.execute(
        f"DELETE FROM journal_events WHERE step_id IN (SELECT id FROM journal_steps WHERE {scope})", params
    ).rowcount
    last = connection.execute(f"SELECT MAX(id) FROM journal_steps WHERE {scope}", params).fetchone()[0]
    rows["journal_steps"] = connection.execute(f"DELETE FROM journal_steps WHERE {scope}", params).rowcount
    if dialect == "sqlite" and last is not None:
        _keep_step_id(connection, int(last))
    for table in _SESSION_ROWS:
        rows[table] = connection.execute(f"DELETE FROM {table} WHERE {scope}", params).rowcount
    indexed = connection.execute(
        "SELECT r.id, m.body FROM recall_messages AS r JOIN messages AS m ON m.id = r.message_id "
        "WHERE r.tenant = ? AND r.message_id IN (SELECT value FROM json_each(?))",
        (tenant, listed),
    ).fetchall()
    if indexed:
        documents = json.dumps([row[0] for row in indexed])
        if dialect == "sqlite":
            connection.executemany(_FORGET_DOCUMENT, [(row[0], message_text(json.loads(row[1]))) for row in indexed])
        else:
            connection.execute("DELETE FROM recall_index WHERE id IN (SELECT value FROM json_each(?))", (documents,))
        rows["recall_messages"] = connection.execute(
            "DELETE FROM recall_messages WHERE id IN (SELECT value FROM json_each(?))", (documents,)
        ).rowcount
    for table, column in (("summaries", "end_id"), ("context_settings", "message_id")):
        rows[table] = connection.execute(
            f"DELETE FROM {table} WHERE tenant = ? AND {column} IN (SELECT value FROM json_each(?))", (tenant, listed)
        ).rowcount
    for table in ("message_variants", "message_tokens"):
        rows[table] = connection.execute(
            f"DELETE FROM {table} WHERE message_id IN (SELECT value FROM json_each(?))", (listed,)
        ).rowcount
    if sessions is None:
        rows["sessions"] = connection.execute("DELETE FROM sessions WHERE tenant = ?", (tenant,)).rowcount
    else:
        rows["sessions"] = connection.execute(
            "DELETE FROM sessions WHERE tenant = ? AND id IN (SELECT value FROM json_each(?))",
            (tenant, json.dumps(sessions)),
        ).rowcount
    rows["messages"] = connection.execute(
        "DELETE FROM messages WHERE id IN (SELECT value FROM json_each(?))", (listed,)
    ).rowcount
    return {table: count for table, count in rows.items() if count > 0}


def _keep_step_id(connection: Connection, last: int) -> None:
    """SQLite gives a new row the largest id plus one, so deleting the newest steps would hand their ids, and the
    Responses ids made of them (`resp_<step hex>`), to the next steps. A husk (no tenant's, no content, failed)
    keeps the largest id past them: one past, so a stream still appending to the deleted step is refused by its
    foreign key rather than writing under the husk. The husk before it is no longer needed. (PostgreSQL's
    sequences never give an id twice.)"""
    newest = connection.execute("SELECT MAX(id) FROM journal_steps").fetchone()[0]
    if newest is None or int(newest) < last:
        connection.execute("DELETE FROM journal_steps WHERE tenant = '' AND status = 'failed' AND created_at = 0")
        connection.execute(
            "INSERT INTO journal_steps (id, tenant, model, fingerprint, stream, status, created_at) "
            "VALUES (?, '', '', '', 0, 'failed', 0)",
            (last + 1,),
        )


def _clear_spans(connection: Connection, tenant: str, *, purge: bool) -> None:
    """Move the tenant's span epoch past a clearing: every process then reads the tenant's spans afresh
    (`SpanStore.in_force_on`), so no span deleted here is carried over from a read before. A purge leaves no row."""
    if purge:
        connection.execute("DELETE FROM span_epochs WHERE tenant = ?", (tenant,))
        return
    connection.execute(
        "INSERT INTO span_epochs (tenant, epoch, cleared) VALUES (?, 1, 1) "
        "ON CONFLICT (tenant) DO UPDATE SET epoch = span_epochs.epoch + 1, cleared = span_epochs.epoch + 1",
        (tenant,),
    )


def _ids(connection: Connection, sql: str, params: Sequence[object]) -> list[str]:
    return [row[0] for row in connection.execute(sql, params) if row[0] is not None]


def _ancestors(connection: Connection, ids: Iterable[str]) -> dict[str, tuple[str | None, int]]:
    """Every ancestor of `ids` (themselves included), with its parent and depth."""
    listed = list(ids)
    if not listed:
        return {}
    return {row[0]: (row[1], int(row[2])) for row in connection.execute(_UP, (id_array(listed),))}


def _kept(
    connection: Connection, doomed: dict[str, tuple[str | None, int]], others: set[str]
) -> tuple[set[str], set[str]]:
    """The doomed nodes that stay (those another reference names or reaches, and their ancestors), and the branches
    hanging below doomed nodes that no reference reaches (to go with them).

    A doomed node with a child outside the doomed ones stays if that child's branch holds another reference
    (`_holds_reference`). Deepest nodes first (an ancestor of a node that stays stays); of many children only until
    a branch holding one is found: the shared root of a tenant's 10,000 sessions costs a look at one of them, not a
    walk through all."""
    kept: set[str] = set()

    def keep(node: str | None) -> None:
        while node is not None and node not in kept:
            kept.add(node)
            node = doomed[node][0]

    for node in others:
        if node in doomed:
            keep(node)
    outside: dict[str, list[str]] = {}
    for row in connection.execute(_CHILDREN, (id_array(doomed),)):
        if row[0] not in doomed:
            outside.setdefault(row[1], []).append(row[0])
    dead: set[str] = set()
    for parent in sorted(outside, key=lambda node: doomed[node][1], reverse=True):
        children = outside[parent]
        every = len(children) <= LOOKED_AT_CHILDREN  # a few: each looked at, so a dead one goes
        if parent in kept and not every:
            continue
        for child in children:
            if _holds_reference(connection, child, others):
                keep(parent)
                if not every:
                    break
            else:
                dead.add(child)
    return kept, dead


def _holds_reference(connection: Connection, branch: str, others: set[str]) -> bool:
    """Whether the branch from `branch` down holds another reference: read a level at a time, stopping at the first
    (a session's steps name a node every turn or two); past `MAX_BRANCH_NODES` it is taken to hold one."""
    level, seen = [branch], 0
    while level:
        if any(node in others for node in level):
            return True
        seen += len(level)
        if seen > MAX_BRANCH_NODES:
            return True
        level = [row[0] for row in connection.execute(_CHILDREN, (id_array(level),))]
    return False


def _below(connection: Connection, nodes: set[str]) -> set[str]:
    """`nodes` and every node below them: walked down only from their children that are not among them already."""
    if not nodes:
        return nodes
    outside = [row[0] for row in connection.execute(_CHILDREN, (id_array(nodes),)) if row[0] not in nodes]
    return nodes | set(outside) | _descendants(connection, outside)


def _descendants(connection: Connection, ids: Sequence[str]) -> set[str]:
    if not ids:
        return set()
    return {row[0] for row in connection.execute(_DOWN, (id_array(ids),))}
