"""The spans of a chain: what compaction wrote over its older parts (summaries, markers, tool-output masks), and by
whom, in the table the schema calls `summaries`.

A span covers the contiguous chain range from depth `start_depth` to the message `end_id` (inclusive), so
it is valid on every branch whose path contains `end_id`: an edit after the range keeps it, an edit inside it
does not see it. A wider (hierarchical) summary marks the ones it replaces `orphaned_at`; they stay, and a
branch that does not contain the wider summary's end still uses them (the builder prefers the widest span
that applies). Re-summarizing a fallback range with the LLM likewise orphans the fallback.
"""

from __future__ import annotations

import functools
import json
import operator
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.canonical.types import Clock
from proxy.compaction.layout import Span
from proxy.config.schema import SUMMARIZE, TOOL_RESULTS
from proxy.history.messages import StoredMessage
from proxy.store.connection import Connection, Row
from proxy.store.database import Database, id_array

_ID = operator.attrgetter("id")

_SELECT = (
    "SELECT id, start_depth, end_depth, end_id, content, tokens, original_tokens, model, generated_by, "
    "replaces, orphaned_at, created_at, strategy, held FROM summaries"
)
ENDING_ON_SQL = f"{_SELECT} WHERE tenant = ? AND end_id IN (SELECT value FROM json_each(?)) ORDER BY id"
"""A tenant's spans ending on the messages of a JSON list of ids (by `summaries_by_end`: end, tenant)."""


@dataclass(frozen=True)
class StoredSpan:
    id: int
    start_depth: int
    end_depth: int
    end_id: str
    content: str
    tokens: int
    """What the summary costs as sent: the whole summary message, header and overhead included."""
    original_tokens: int
    model: str
    generated_by: str
    """'llm', or 'fallback' for the extractive summary written when the summarizer failed."""
    replaces: tuple[int, ...]
    orphaned_at: float | None
    created_at: float
    strategy: str = SUMMARIZE
    """The compaction strategy that wrote it (`proxy.compaction.strategies`): a `tool-results` row is a mask."""
    held: int = 0
    """Written ahead of need, by the pre-compaction run with this number (`Span.held`); 0: when it was needed."""

    @functools.cached_property
    def span(self) -> Span:
        """The span the builder plans with: made once per row read (every compacting request plans with all)."""
        return Span(
            id=self.id,
            start=self.start_depth,
            end=self.end_depth + 1,
            tokens=self.tokens,
            strategy=self.strategy,
            held=self.held,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "range": [self.start_depth, self.end_depth + 1],
            "tokens": self.tokens,
            "original_tokens": self.original_tokens,
            "ratio": round(self.tokens / self.original_tokens, 3) if self.original_tokens else None,
            "model": self.model,
            "generated_by": self.generated_by,
            "strategy": self.strategy,
            "held": self.held,
            "replaces": list(self.replaces),
            "orphaned": self.orphaned_at is not None,
            "created_at": self.created_at,
            "content": self.content,
        }


SPAN_CACHE_ENTRIES = 50_000
"""Spans remembered as read (~200 bytes each without their content's text, which is shared with the row)."""
SESSIONS_READ = 4096
"""Sessions whose spans as last read a process remembers (`_Read`: a few hundred bytes and its spans each)."""


@dataclass(frozen=True)
class _Read:
    """A session's spans in force as last read: on its path of `length` messages from depth `first` to `end_id`,
    as of the tenant's span `epoch`."""

    epoch: int
    first: int
    length: int
    end_id: str
    spans: tuple[StoredSpan, ...]


class SpanStore:
    def __init__(self, db: Database, clock: Clock = time.time) -> None:
        self._db = db
        self._clock = clock
        self._read: OrderedDict[tuple[int, float | None, int, str, float], StoredSpan] = OrderedDict()
        """(id, orphaned_at, held, end_id, created_at) → the span: a row never changes but for orphaned_at and held,
        and a long session's path has a span per crossing, each read again by every request. The end and the time
        tell a row from one written later under the id of a deleted one (SQLite reuses the largest ids)."""
        self._sessions: OrderedDict[tuple[str, str], _Read] = OrderedDict()

    async def on_path(self, tenant: str, path: Sequence[StoredMessage]) -> list[StoredSpan]:
        """Every summary (orphaned ones too) whose range lies on `path`, oldest first."""
        return self._lying_on(path, await self._ending_on(tenant, path)) if path else []

    async def in_force_on(self, tenant: str, path: Sequence[StoredMessage], session_id: str) -> tuple[StoredSpan, ...]:
        """The spans in force on `path` (`in_force`), for the session whose request it is.

        What was in force for its previous request carries over when `path` extends that one's (a node's id
        hashes its ancestors', so one id says so): only the spans ending on the new part, and the tenant's span
        rows written since (by any process: `m013_span_epochs`), are read and joined with it, not the spans of a
        long path's every message again."""
        if not path:
            return ()
        key = (tenant, session_id)
        before = self._sessions.get(key)
        # Read before the spans: a write after it shows as a later epoch at the next read.
        row = await self._db.fetchone("SELECT epoch, cleared FROM span_epochs WHERE tenant = ?", (tenant,))
        epoch, cleared = (0, 0) if row is None else (int(row["epoch"]), int(row["cleared"]))
        if before is not None and (before.epoch < cleared or epoch < before.epoch):
            before = None  # spans were deleted since (`proxy.lifecycle`): none read before is carried over
        if before is None or not _extends(path, before):
            spans = in_force(self._lying_on(path, await self._ending_on(tenant, path)))
        else:
            rows = await self._ending_on(tenant, path[before.length :]) if len(path) > before.length else []
            if epoch != before.epoch:
                rows += await self._db.fetchall(f"{_SELECT} WHERE tenant = ? AND epoch > ?", (tenant, before.epoch))
            spans = before.spans
            if rows:
                found = {span.id: span for span in spans}
                found.update((span.id, span) for span in self._lying_on(path, rows))
                spans = in_force(found.values())
        self._sessions[key] = _Read(epoch, path[0].depth, len(path), path[-1].id, spans)
        self._sessions.move_to_end(key)
        if len(self._sessions) > SESSIONS_READ:
            self._sessions.popitem(last=False)
        return spans

    async def on_range(self, tenant: str, start_depth: int, end_id: str) -> list[StoredSpan]:
        """Every span (orphaned ones too) from depth `start_depth` to the message `end_id`, oldest first: on every
        path that holds `end_id`."""
        rows = await self._db.fetchall(
            f"{_SELECT} WHERE tenant = ? AND end_id = ? AND start_depth = ? ORDER BY id", (tenant, end_id, start_depth)
        )
        return [self._span(row) for row in rows]

    async def _ending_on(self, tenant: str, messages: Sequence[StoredMessage]) -> list[Row]:
        ids = id_array(message.id for message in messages)
        return await self._db.fetchall(ENDING_ON_SQL, (tenant, ids))

    def _lying_on(self, path: Sequence[StoredMessage], rows: Sequence[Row]) -> list[StoredSpan]:
        first = path[0].depth  # a path's depths are consecutive: its node at depth d is path[d - first]
        return [
            summary
            for summary in map(self._span, rows)
            if 0 <= summary.end_depth - first < len(path)
            and path[summary.end_depth - first].id == summary.end_id
            and summary.start_depth <= summary.end_depth
        ]

    def _span(self, row: Row) -> StoredSpan:
        key = (row["id"], row["orphaned_at"], row["held"], row["end_id"], row["created_at"])
        span = self._read.get(key)
        if span is None:
            span = self._read[key] = _summary(row)
            if len(self._read) > SPAN_CACHE_ENTRIES:
                self._read.popitem(last=False)
        return span

    async def release(self, tenant: str, ids: Sequence[int]) -> None:
        """Spans written ahead of need (`held`) are in use from now on: the crossing they joined at has come, and
        they stay in the working context like spans written when needed (were they held back again once the
        context fits without them, the prompt would change back and forth)."""
        await self._db.write(
            lambda connection: connection.execute(
                "UPDATE summaries SET held = 0, epoch = ? WHERE tenant = ? AND id IN (SELECT value FROM json_each(?))",
                (_next_epoch(connection, tenant), tenant, json.dumps(list(ids))),
            )
        )

    async def add(
        self,
        tenant: str,
        *,
        start_depth: int,
        end: StoredMessage,
        content: str,
        tokens: int,
        original_tokens: int,
        model: str,
        generated_by: str,
        replaces: Sequence[int] = (),
        strategy: str = SUMMARIZE,
        held: int = 0,
    ) -> StoredSpan:
        summary = StoredSpan(
            id=0,  # known once inserted
            start_depth=start_depth,
            end_depth=end.depth,
            end_id=end.id,
            content=content,
            tokens=tokens,
            original_tokens=original_tokens,
            model=model,
            generated_by=generated_by,
            replaces=tuple(replaces),
            orphaned_at=None,
            created_at=self._clock(),
            strategy=strategy,
            held=held,
        )

        def write(connection: Connection) -> int:
            epoch = _next_epoch(connection, tenant)
            cursor = connection.execute(
                "INSERT INTO summaries (tenant, start_depth, end_depth, end_id, content, tokens, original_tokens, "
                "model, generated_by, replaces, created_at, strategy, held, epoch) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                (tenant, *_columns(summary), epoch),
            )
            new_id: int = cursor.fetchone()[0]
            if replaces:
                connection.execute(
                    "UPDATE summaries SET orphaned_at = ?, epoch = ? WHERE tenant = ? AND orphaned_at IS NULL "
                    "AND id IN (SELECT value FROM json_each(?))",
                    (summary.created_at, epoch, tenant, json.dumps(list(replaces))),
                )
            return new_id

        return replace(summary, id=await self._db.write(write))


def _extends(path: Sequence[StoredMessage], before: _Read) -> bool:
    """Whether `path` starts with the one `before` was read on."""
    return path[0].depth == before.first and len(path) >= before.length and path[before.length - 1].id == before.end_id


def _next_epoch(connection: Connection, tenant: str) -> int:
    """The tenant's span epoch, bumped for a write to its spans: the epoch the rows it writes are written at. In
    the write's transaction, so a reader that sees the epoch sees the rows."""
    row = connection.execute(
        "INSERT INTO span_epochs (tenant, epoch) VALUES (?, 1) "
        "ON CONFLICT (tenant) DO UPDATE SET epoch = span_epochs.epoch + 1 RETURNING epoch",
        (tenant,),
    ).fetchone()
    return int(row[0])


def _columns(summary: StoredSpan) -> tuple[Any, ...]:
    """The insert's values after `tenant`, in the column order of `add`."""
    return (
        summary.start_depth,
        summary.end_depth,
        summary.end_id,
        summary.content,
        summary.tokens,
        summary.original_tokens,
        summary.model,
        summary.generated_by,
        json.dumps(list(summary.replaces)),
        summary.created_at,
        summary.strategy,
        summary.held,
    )


def in_force(summaries: Iterable[StoredSpan]) -> tuple[StoredSpan, ...]:
    """One summary per range (the newest: an LLM rewrite of a fallback wins), and one mask per range, for the
    builder to choose from, in path order. Of the masks in use (not held), none that another one in use covers:
    the builder stubs what the masks cover together, so it would change nothing, and a long agent session writes
    a mask from the path's start at nearly every crossing. A held span stays: it says what was written ahead.

    A span out of force stays out as its path grows (what put it out stays on the path, and `held` only ever goes
    to 0), so the spans in force for a longer path are those of what was in force and what is new."""
    newest: dict[tuple[int, str, bool], StoredSpan] = {}
    for summary in summaries:
        key = (summary.start_depth, summary.end_id, summary.strategy == TOOL_RESULTS)
        if key not in newest or summary.id > newest[key].id:
            newest[key] = summary
    kept = [summary for summary in newest.values() if summary.strategy != TOOL_RESULTS or summary.held]
    reach = -1  # the furthest end of the masks in use starting no later
    masks = [summary for summary in newest.values() if summary.strategy == TOOL_RESULTS and not summary.held]
    for mask in sorted(masks, key=lambda s: (s.start_depth, -s.end_depth)):
        if mask.end_depth > reach:
            kept.append(mask)
            reach = mask.end_depth
    return tuple(sorted(kept, key=lambda s: (s.start_depth, s.end_depth)))


def _summary(row: Row) -> StoredSpan:
    return StoredSpan(
        id=row["id"],
        start_depth=row["start_depth"],
        end_depth=row["end_depth"],
        end_id=row["end_id"],
        content=row["content"],
        tokens=row["tokens"],
        original_tokens=row["original_tokens"],
        model=row["model"],
        generated_by=row["generated_by"],
        replaces=() if row["replaces"] == "[]" else tuple(json.loads(row["replaces"])),
        orphaned_at=row["orphaned_at"],
        created_at=row["created_at"],
        strategy=row["strategy"],
        held=row["held"],
    )
