"""Pinned messages: what a session keeps verbatim in every working context, never summarized.

A pin names a node of the chain (`pins`, migration `m007_pins`), so it holds on every request of the session
whose path contains that node, and a branch without it simply does not see it. Pins come from the API and the
CLI (`POST /sessions/{id}/pins`); tools that cannot call an API pin by `context.pin_patterns`, regexes matched
against a message's text as each request arrives (`pattern_pinned`), which stores nothing. Which pins are
valid (on the session's path, within its budget, whole tool groups) is checked by the caller before it writes.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from proxy.canonical.types import Clock
from proxy.store.connection import Connection
from proxy.store.database import Database
from proxy.tokens import content_text


class Pins:
    def __init__(self, db: Database, clock: Clock = time.time) -> None:
        self._db = db
        self._clock = clock

    async def on_session(self, tenant: str, session_id: str) -> frozenset[str]:
        """The ids of every message the session pinned, on its current path or not."""
        rows = await self._db.fetchall(
            "SELECT message_id FROM pins WHERE tenant = ? AND session_id = ?", (tenant, session_id)
        )
        return frozenset(row["message_id"] for row in rows)

    async def add(self, tenant: str, session_id: str, message_ids: Iterable[str]) -> None:
        """Pin stored messages; pinning one again changes nothing (it keeps its first `created_at`)."""
        now = self._clock()
        rows = [(tenant, session_id, message_id, now) for message_id in dict.fromkeys(message_ids)]
        if not rows:
            return

        def write(connection: Connection) -> None:
            connection.executemany(
                "INSERT OR IGNORE INTO pins (tenant, session_id, message_id, created_at) VALUES (?, ?, ?, ?)", rows
            )

        await self._db.write(write)

    async def remove(self, tenant: str, session_id: str, message_ids: Iterable[str]) -> int:
        """Unpin; returns how many of `message_ids` were pinned."""
        ids = json.dumps(list(dict.fromkeys(message_ids)))

        def write(connection: Connection) -> int:
            cursor = connection.execute(
                "DELETE FROM pins WHERE tenant = ? AND session_id = ? "
                "AND message_id IN (SELECT value FROM json_each(?))",
                (tenant, session_id, ids),
            )
            return cursor.rowcount

        return await self._db.write(write, atomic=False)


def pattern_pinned(patterns: Sequence[re.Pattern[str]], messages: Sequence[Mapping[str, Any]]) -> frozenset[int]:
    """Positions of the messages whose text (`content_text`: a string, or the text parts) matches one of
    `patterns` anywhere (`re.search`); a message without text (only tool calls, only images) matches none."""
    if not patterns:
        return frozenset()
    return frozenset(
        position
        for position, message in enumerate(messages)
        if (text := content_text(message.get("content")))
        and any(pattern.search(text) is not None for pattern in patterns)
    )
