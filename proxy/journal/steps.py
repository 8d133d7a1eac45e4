"""A journal step and how it is stored: statuses, event kinds, the in-memory handle and the record read back.

Storage model (`journal_steps`, `journal_events` in `proxy.store.migrations`): one *step* per response, one
*event* per upstream chunk (the chunk's JSON, verbatim), numbered by `seq`. A step's lifecycle:

    begin ──▶ open ──append*──▶ seal ──▶ sealed           the answer is also a history node (one transaction)
                    │    └────▶ fail ──▶ failed            upstream error; partial answer and error kept
                    └─────────▶ interrupt ▶ interrupted    cancelled on purpose; partial answer kept
    (crash) open ── recover ──▶ complete | failed | interrupted

Events are the upstream's chunks in the canonical form (`proxy.canonical.types.Chunk`), whatever wire format the client
spoke, so replay and recovery never depend on a client's format.
"""

from __future__ import annotations

import asyncio
import enum
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.canonical.types import Chunk
from proxy.journal.assembly import Assembly, assemble
from proxy.store.connection import Row
from proxy.store.database import Database
from proxy.tokens import DEFAULT_ENCODING


class StepStatus(enum.StrEnum):
    OPEN = "open"
    SEALED = "sealed"
    COMPLETE = "complete"
    """Sealed by recovery: the answer had ended when its process died."""
    INTERRUPTED = "interrupted"
    FAILED = "failed"


class EventType(enum.StrEnum):
    TEXT = "text"
    TOOL_CALL = "tool_call"
    USAGE = "usage"
    DONE = "done"
    ERROR = "error"


ENDED = (StepStatus.SEALED, StepStatus.COMPLETE)
"""Statuses of a step whose answer is whole and can be replayed."""
PRUNABLE = (StepStatus.SEALED, StepStatus.COMPLETE, StepStatus.FAILED)
"""Statuses whose events expire after `keep_events_s`; interrupted steps keep theirs."""
CHUNK_EVENTS = (EventType.TEXT, EventType.TOOL_CALL, EventType.USAGE)

STEP_COLUMNS = """s.id, s.tenant, s.session_id, s.model, s.fingerprint, s.stream, s.status,
    s.parent_message_id, s.message_id, s.content, s.tool_calls, s.finish_reason, s.usage, s.error,
    s.created_at, s.sealed_at, s.encoding, s.context,
    (SELECT COUNT(*) FROM journal_events AS e WHERE e.step_id = s.id) AS events"""

StoredEvent = tuple[int, str, str]
"""(seq, type, content) of one stored event."""

JSON_ENCODER = json.JSONEncoder(separators=(",", ":"))
DOOR_STATE = "wire"
"""The key of a step's `context` under which its door's state is kept (`Conversation.door_state`): stores
written before the rename hold it there, so the stored name stays."""


def event_type(chunk: Chunk) -> EventType:
    """`usage` for a usage-only chunk, `tool_call` if a delta carries tool calls, `text` otherwise."""
    choices = chunk.get("choices")
    if not choices:
        return EventType.USAGE if chunk.get("usage") else EventType.TEXT
    for choice in choices:
        delta = choice.get("delta")
        if delta and delta.get("tool_calls"):
            return EventType.TOOL_CALL
    return EventType.TEXT


@dataclass
class Step:
    """The in-memory handle of an open step; its assembly grows with every committed append."""

    id: int
    tenant: str
    session_id: str | None
    model: str
    stream: bool
    parent_message_id: str | None
    next_seq: int = 0
    encoding: str = DEFAULT_ENCODING
    created_at: float = 0.0
    status: StepStatus = StepStatus.OPEN
    events: int = 0
    """Events committed so far."""
    assembly: Assembly = field(default_factory=Assembly)


class UnrecordedEnds:
    """Steps this process ended whose ending the store could not write (disk full, its server gone): open in their
    rows, dead here.

    An open row holds its Idempotency-Key and is shown in flight (`/journal`, the dashboard), and no other process
    recovers it while this one lives. The writer records each such ending here (`Journal.close`); the key checks of
    the writer and the reader read a step's status through `status`, a retry under the key writes the ending before
    its own step (`Journal.begin`), and this process writes the rest once the store takes writes again
    (`Recovery.settle_unrecorded`, woken by `wait`). Until then, one small entry per step that ended while the
    store could not be written.
    """

    def __init__(self) -> None:
        self._endings: dict[int, tuple[StepStatus, str | None]] = {}
        self._begins: dict[tuple[str, float], str] = {}
        """Begins whose commit was not confirmed (the server went away during it), by (tenant, created_at): the
        error their client was told. Such a row may exist, open, with no handle in this process."""
        self._waiting = asyncio.Event()
        """Set while an ending (or an unconfirmed begin) waits to be written."""

    def remember(self, step_id: int, status: StepStatus, error: str | None) -> None:
        self._endings[step_id] = (status, error)
        self._waiting.set()

    def ending(self, step_id: int) -> tuple[StepStatus, str | None] | None:
        """The status and error (JSON) this process knows of a step whose row says `open`."""
        return self._endings.get(step_id)

    def forget(self, step_id: int) -> None:
        """The ending is written now (or the row was ended otherwise)."""
        self._endings.pop(step_id, None)
        self._idle()

    def remember_begin(self, tenant: str, created_at: float, error: str) -> None:
        """A begin failed where its commit may have happened unseen: its row, if any, ends `failed` with `error`."""
        self._begins[(tenant, created_at)] = error
        self._waiting.set()

    def unconfirmed_begins(self) -> list[tuple[str, float, str]]:
        return [(tenant, created_at, error) for (tenant, created_at), error in self._begins.items()]

    def forget_begin(self, tenant: str, created_at: float) -> None:
        self._begins.pop((tenant, created_at), None)
        self._idle()

    def _idle(self) -> None:
        if not self._endings and not self._begins:
            self._waiting.clear()

    def step_ids(self) -> list[int]:
        return list(self._endings)

    async def wait(self) -> None:
        """Return once an ending waits to be written."""
        await self._waiting.wait()

    def status(self, step_id: int, stored: str) -> str:
        """The status to act on: the stored one, or the ending this process knows of an `open` row."""
        known = self._endings.get(step_id) if stored == StepStatus.OPEN else None
        return stored if known is None else known[0]

    def __len__(self) -> int:
        return len(self._endings)


@dataclass(frozen=True)
class StepRecord:
    id: int
    tenant: str
    session_id: str | None
    model: str
    stream: bool
    status: StepStatus
    created_at: float
    sealed_at: float | None
    content: str | None
    tool_calls: list[dict[str, Any]] | None
    finish_reason: str | None
    usage: dict[str, Any] | None
    error: dict[str, Any] | None
    message_id: str | None
    events: int
    """Events still stored (0 once pruned)."""
    context: dict[str, Any] | None = None
    """The working context the step sent: `ContextReport.as_json` (None for steps from before it was kept)."""
    parent_message_id: str | None = None
    """Where the step's answer joins (or would have joined) the conversation: the end of its request."""

    def door_state(self) -> dict[str, Any]:
        """What the step's door kept of its request (`Conversation.door_state`)."""
        state = (self.context or {}).get(DOOR_STATE)
        return state if isinstance(state, dict) else {}

    def readable_through(self, door: str, *, unstored: bool = False) -> bool:
        """Whether the door that answered serves the step back by id: not another door's, not one the client
        deleted, and not one it asked not to store (`store: false`) unless `unstored` ones may be read."""
        state = self.door_state()
        stored = unstored or bool(state.get("store", True))
        return state.get("door") == door and stored and not state.get("deleted")

    def as_json(self) -> dict[str, Any]:
        """The item shape of `GET /journal`."""
        return {"step_id": self.id, **{name: getattr(self, name) for name in _RECORD_JSON_FIELDS}}


_RECORD_JSON_FIELDS = (
    *("session_id", "model", "status", "created_at", "sealed_at", "content", "tool_calls"),
    *("finish_reason", "usage", "error", "message_id", "context"),
)


@dataclass(frozen=True)
class StoredAnswer:
    """What the stored events of a step add up to."""

    assembly: Assembly
    done: bool
    """A `done` event exists: the answer was whole."""
    error: Any
    """The `error` event's body, or None."""


def replay_events(stream: bool, events: Iterable[StoredEvent]) -> StoredAnswer:
    assembly, done, error = Assembly(), False, None
    for _seq, kind, content in events:
        if kind in CHUNK_EVENTS:
            assembly.add(json.loads(content))
        elif kind == EventType.DONE:
            done = True
            if not stream:
                assembly = assemble([json.loads(content)])
        elif kind == EventType.ERROR:
            error = json.loads(content)
    return StoredAnswer(assembly, done, error)


async def stored_events(db: Database, step_ids: Sequence[int]) -> dict[int, list[StoredEvent]]:
    """The events of several steps in one query, each step's in order."""
    found: dict[int, list[StoredEvent]] = {step_id: [] for step_id in step_ids}
    if not step_ids:
        return found
    rows = await db.fetchall(
        "SELECT step_id, seq, type, content FROM journal_events "
        "WHERE step_id IN (SELECT value FROM json_each(?)) ORDER BY step_id, seq",
        (json.dumps(list(step_ids)),),
    )
    for row in rows:
        found[row[0]].append((row[1], row[2], row[3]))
    return found


def step_from_row(row: Row, events: list[StoredEvent]) -> Step:
    """The handle of a step read back (recovery), positioned after its last stored event."""
    return Step(
        row["id"],
        row["tenant"],
        row["session_id"],
        row["model"],
        bool(row["stream"]),
        row["parent_message_id"],
        next_seq=events[-1][0] + 1 if events else 0,
        encoding=row["encoding"] or DEFAULT_ENCODING,
        created_at=row["created_at"],
        events=len(events),
    )


def record_from_row(row: Row, assembly: Assembly | None = None) -> StepRecord:
    """The record of a stored step; `assembly` replaces the row's answer for a step still open."""
    return StepRecord(
        id=row["id"],
        tenant=row["tenant"],
        session_id=row["session_id"],
        model=row["model"],
        stream=bool(row["stream"]),
        status=StepStatus(row["status"]),
        created_at=row["created_at"],
        sealed_at=row["sealed_at"],
        content=assembly.content if assembly else row["content"],
        tool_calls=assembly.tool_calls if assembly else loads(row["tool_calls"]),
        finish_reason=assembly.finish_reason if assembly else row["finish_reason"],
        usage=assembly.usage if assembly else loads(row["usage"]),
        error=loads(row["error"]),
        message_id=row["message_id"],
        events=row["events"],
        context=loads(row["context"]),
        parent_message_id=row["parent_message_id"],
    )


def dumps(value: Any) -> str | None:
    return None if value is None else JSON_ENCODER.encode(value)


def loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)
