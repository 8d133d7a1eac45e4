"""The SQL the history runs, and the rows it reads and writes: kept beside `proxy.history.store` and
`proxy.history.reads`, which hold the logic (locate, store, settings; sessions, paths), so that each reads on its own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from proxy.history import chain
from proxy.history.messages import Session
from proxy.store.connection import Connection, Row

SESSION_COLUMNS = "tenant, id, head_id, model, anchor_id, created_at, updated_at"

KNOWN_SQL = """
SELECT m.id, m.created_at, t.tokens, m.body, c.settings
FROM messages AS m
LEFT JOIN message_tokens AS t ON t.message_id = m.id AND t.encoding = ?
LEFT JOIN context_settings AS c ON c.tenant = ? AND c.message_id = m.id
WHERE m.id IN (SELECT value FROM json_each(?))
"""

BUILT_ON_SQL = "SELECT 1 FROM messages WHERE id = ?"
"""The deepest stored message a request builds on, still there (a deletion removes a node's descendants with it)."""

PATH_SQL = """
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

UPSERT_SESSION_SQL = f"""
INSERT INTO sessions (tenant, id, head_id, model, anchor_id, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (tenant, id) DO UPDATE
    SET head_id = excluded.head_id, model = excluded.model, updated_at = excluded.updated_at
RETURNING {SESSION_COLUMNS}
"""

WALK_HEADS = """
WITH RECURSIVE
heads(session_id, head_id) AS (
    SELECT json_extract(value, '$[0]'), json_extract(value, '$[1]') FROM json_each(?1)
),
walk(session_id, message_id, parent_id) AS (
    SELECT heads.session_id, m.id, m.parent_id FROM heads JOIN messages AS m ON m.id = heads.head_id
    UNION ALL
    SELECT walk.session_id, m.id, m.parent_id FROM walk JOIN messages AS m ON m.id = walk.parent_id
)"""

SESSION_STATS_SQL = (
    WALK_HEADS
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


UNCOUNTED_SQL = (
    WALK_HEADS
    + """
SELECT DISTINCT m.id, m.body
FROM walk
JOIN messages AS m ON m.id = walk.message_id
LEFT JOIN message_tokens AS t ON t.message_id = m.id AND t.encoding = ?2
WHERE t.tokens IS NULL
"""
)


def lost_races(
    connection: Connection, new_messages: Sequence[tuple[str, str | None, int, str, str, float]]
) -> list[tuple[str, str, str, float]]:
    """Nodes another request stored first, in another form (two concurrent requests with different system
    prompts at one place): this request's form becomes a variant, so it is stored all the same."""
    mine = {row[0]: (row[4], row[5]) for row in new_messages}
    rows = connection.execute(
        "SELECT id, body FROM messages WHERE id IN (SELECT value FROM json_each(?))", (json.dumps(list(mine)),)
    ).fetchall()
    return [
        (row[0], chain.body_digest(mine[row[0]][0]), mine[row[0]][0], mine[row[0]][1])
        for row in rows
        if row[1] != mine[row[0]][0]
    ]


def insert_tokens(connection: Connection, rows: Sequence[tuple[str, str, int]]) -> None:
    connection.executemany("INSERT OR IGNORE INTO message_tokens (message_id, encoding, tokens) VALUES (?, ?, ?)", rows)


def session_from_row(row: Row) -> Session:
    return Session(
        tenant=row["tenant"],
        id=row["id"],
        head_id=row["head_id"],
        model=row["model"],
        anchor_id=row["anchor_id"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
    )
