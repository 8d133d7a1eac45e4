"""The stream journal: every response the proxy relays, stored before the client sees any of it.

Storage model (`journal_steps`, `journal_events` in `proxy.migrations`): one *step* per response, one *event*
per upstream chunk (the chunk's JSON, verbatim), numbered by `seq`. A step's lifecycle:

    begin ──▶ open ──append*──▶ seal ──▶ sealed      the answer is also a history node (one transaction)
                    │    └────▶ fail ──▶ failed       upstream error; partial answer and error kept
                    └─────────▶ interrupt ▶ interrupted   cancelled on purpose; partial answer kept
    (crash) open ── recover ──▶ complete | failed | interrupted

`append` is one write job per batch of chunks and returns after its commit, so the caller relays only what
is durable (invariant 7): a client can never have seen a chunk that a `kill -9` loses. Seal writes the `done`
event, the assistant message into history and the step's assembled answer in one transaction, so there is no
moment where the answer is sealed but missing from the conversation, or the reverse. At startup `recover`
classifies every step left open: one whose events show the answer ended (a finish_reason or a `done`) is
sealed into history as `complete`; the rest are kept as `interrupted` with their partial text — never
deleted. Events of ended steps are pruned after `journal.keep_events` (the step row keeps the assembled
answer, which is enough to replay it); interrupted steps keep theirs.

An Idempotency-Key maps a retried request onto its earlier step: `replay` returns the stored chunks instead
of calling the upstream again. The key is held by the live or successful step only (see `m003_journal`), so a
failed attempt can be retried. Every read filters by tenant. Assembling an answer from chunks is
`proxy.assembly` (re-exported here with the replay helpers `completion_from_record`, `chunks_from_record`).
"""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.assembly import Assembly as Assembly
from proxy.assembly import Chunk as Chunk
from proxy.assembly import assemble as assemble
from proxy.config import JournalConfig
from proxy.database import Database
from proxy.errors import Conflict
from proxy.history import History, StoredMessage, WriteFunction
from proxy.tokens import DEFAULT_ENCODING

log = logging.getLogger(__name__)

Clock = Callable[[], float]

ENDED = ("sealed", "complete")
"""Statuses of a step whose answer is whole and can be replayed."""
PRUNABLE = ("sealed", "complete", "failed")
"""Statuses whose events expire after `keep_events_s`; interrupted steps keep theirs."""
CHUNK_EVENTS = ("text", "tool_call", "usage")
DEFAULT_PAGE = 50
REPLAY_ID_PREFIX = "chatcmpl-journal-"

KEY_PARAM = "Idempotency-Key"
KEY_REUSED = "This Idempotency-Key was already used with a different request body; use a new key."
KEY_IN_PROGRESS = "A request with this Idempotency-Key is still in progress."
KEY_DONE = "A request with this Idempotency-Key has already completed; replay it instead."

_JSON = json.JSONEncoder(separators=(",", ":"))

_STEP_COLUMNS = """s.id, s.tenant, s.session_id, s.model, s.fingerprint, s.stream, s.status,
    s.parent_message_id, s.message_id, s.content, s.tool_calls, s.finish_reason, s.usage, s.error,
    s.created_at, s.sealed_at, s.encoding,
    (SELECT COUNT(*) FROM journal_events AS e WHERE e.step_id = s.id) AS events"""

_INSERT_EVENTS = "INSERT INTO journal_events (step_id, seq, type, content, created_at) VALUES (?, ?, ?, ?, ?)"

_END_STEP = """UPDATE journal_steps
SET status = ?, message_id = ?, content = ?, tool_calls = ?, finish_reason = ?, usage = ?, error = ?,
    sealed_at = ?
WHERE id = ? AND status = 'open'"""


def event_type(chunk: Chunk) -> str:
    """`usage` for a usage-only chunk, `tool_call` if a delta carries tool calls, `text` otherwise."""
    choices = chunk.get("choices")
    if not choices:
        return "usage" if chunk.get("usage") else "text"
    for choice in choices:
        delta = choice.get("delta")
        if delta and delta.get("tool_calls"):
            return "tool_call"
    return "text"


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
    status: str = "open"
    events: int = 0
    """Events committed so far."""
    assembly: Assembly = field(default_factory=Assembly)


@dataclass(frozen=True)
class StepRecord:
    id: int
    tenant: str
    session_id: str | None
    model: str
    stream: bool
    status: str
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

    def as_json(self) -> dict[str, Any]:
        """The item shape of `GET /journal`."""
        return {"step_id": self.id, **{name: getattr(self, name) for name in _RECORD_JSON_FIELDS}}


_RECORD_JSON_FIELDS = (
    *("session_id", "model", "status", "created_at", "sealed_at", "content", "tool_calls"),
    *("finish_reason", "usage", "error", "message_id"),
)


@dataclass
class RecoveryReport:
    complete: list[int] = field(default_factory=list)
    interrupted: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    pruned_events: int = 0

    def counts(self) -> dict[str, int]:
        return {name: len(getattr(self, name)) for name in ("complete", "interrupted", "failed")}


def completion_from_record(record: StepRecord) -> Chunk:
    """A chat.completion carrying a step's assembled answer (replay of a pruned or streamed step)."""
    message: dict[str, Any] = {"role": "assistant", "content": record.content}
    if record.tool_calls:
        message["tool_calls"] = record.tool_calls
    completion: Chunk = {
        "id": f"{REPLAY_ID_PREFIX}{record.id}",
        "object": "chat.completion",
        "created": int(record.created_at),
        "model": record.model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(record)}],
    }
    if record.usage is not None:
        completion["usage"] = record.usage
    return completion


def chunks_from_record(record: StepRecord) -> list[Chunk]:
    """A minimal chat.completion.chunk sequence for a step's answer: text, tool calls, finish, usage."""
    base = {
        "id": f"{REPLAY_ID_PREFIX}{record.id}",
        "object": "chat.completion.chunk",
        "created": int(record.created_at),
        "model": record.model,
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> Chunk:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    chunks = [chunk({"role": "assistant", "content": record.content or ""})]
    if record.tool_calls:
        calls = [{"index": index, **call} for index, call in enumerate(record.tool_calls)]
        chunks.append(chunk({"tool_calls": calls}))
    chunks.append(chunk({}, _finish_reason(record)))
    if record.usage is not None:
        chunks.append({**base, "choices": [], "usage": record.usage})
    return chunks


def _finish_reason(record: StepRecord) -> str:
    return record.finish_reason or ("tool_calls" if record.tool_calls else "stop")


class Journal:
    def __init__(self, db: Database, history: History, config: JournalConfig, clock: Clock = time.time) -> None:
        self._db = db
        self._history = history
        self._config = config
        self._clock = clock

    async def begin(
        self,
        *,
        tenant: str,
        session_id: str | None,
        model: str,
        fingerprint: str,
        idempotency_key: str | None,
        stream: bool,
        parent_message_id: str | None,
        encoding: str,
    ) -> Step:
        """Open a step; Conflict if the Idempotency-Key is held by another body or by a live/ended step.

        `fingerprint` identifies the request body for Idempotency-Key checks; it is empty for unkeyed steps.
        """
        now = self._clock()
        row = (
            tenant,
            session_id,
            model,
            fingerprint,
            idempotency_key,
            int(stream),
            parent_message_id,
            now,
            encoding,
        )

        def write(connection: sqlite3.Connection) -> int:
            if idempotency_key is not None:
                prior = connection.execute(
                    "SELECT fingerprint, status FROM journal_steps WHERE tenant = ? AND idempotency_key = ? "
                    "ORDER BY id DESC LIMIT 1",
                    (tenant, idempotency_key),
                ).fetchone()
                if prior is not None:
                    _check_key(prior["fingerprint"], prior["status"], fingerprint)
                    if prior["status"] in ENDED:
                        raise Conflict(KEY_DONE, param=KEY_PARAM)
            cursor = connection.execute(
                "INSERT INTO journal_steps (tenant, session_id, model, fingerprint, idempotency_key, stream, "
                "status, parent_message_id, created_at, encoding) VALUES (?, ?, ?, ?, ?, ?, 'open', ?, ?, ?)",
                row,
            )
            if cursor.lastrowid is None:
                raise RuntimeError("journal step was not inserted")
            return cursor.lastrowid

        # The only statement that changes anything is the INSERT, which SQLite rolls back alone if it fails.
        step_id = await self._db.write(write, atomic=False)
        return Step(step_id, tenant, session_id, model, stream, parent_message_id, encoding=encoding, created_at=now)

    async def append(self, step: Step, chunks: Sequence[Chunk]) -> list[str]:
        """Store a batch of chunks as events in one write job; returns once they are committed.

        Returns each chunk's JSON as stored, so the relay sends the very bytes that are durable without
        encoding every chunk a second time.
        """
        if step.status != "open":
            raise RuntimeError(f"journal step {step.id} is {step.status}, not open")
        if not chunks:
            return []
        now = self._clock()
        seq = step.next_seq
        texts = [_JSON.encode(chunk) for chunk in chunks]
        rows = [
            (step.id, seq + offset, event_type(chunk), text, now)
            for offset, (chunk, text) in enumerate(zip(chunks, texts, strict=True))
        ]
        step.next_seq = seq + len(rows)

        def write(connection: sqlite3.Connection) -> None:
            connection.executemany(_INSERT_EVENTS, rows)

        await self._db.write(write, atomic=False, bulk=len(rows) > 1)
        step.events += len(rows)
        for chunk in chunks:
            step.assembly.add(chunk)
        return texts

    async def seal(self, step: Step, response: Chunk | None = None) -> StepRecord:
        """End a step with its whole answer: `done` event, history node and step row in one transaction.

        For a stream the answer is what was appended; for a non-stream call `response` is the chat.completion,
        stored as the step's one event. Conflict if the step is no longer open.
        """
        if response is not None:
            step.assembly = assemble([response])
            done = _JSON.encode(response)
        else:
            done = _JSON.encode({"finish_reason": step.assembly.finish_reason})
        record = await self._close(step, "sealed", ("done", done))
        assert record is not None  # _close raises rather than return None for a sealing status
        return record

    async def fail(self, step: Step, error: dict[str, Any]) -> None:
        """End a step on an upstream failure: an `error` event, the error, and the partial answer so far."""
        await self._close(step, "failed", ("error", _JSON.encode(error)), error)

    async def interrupt(self, step: Step) -> None:
        """End a step cancelled on purpose (the client left); its partial answer and events are kept."""
        await self._close(step, "interrupted")

    async def recover(self) -> RecoveryReport:
        """Classify every step left open by a previous process; run once at startup, before serving."""
        report = RecoveryReport()
        rows = await self._db.fetchall(
            f"SELECT {_STEP_COLUMNS} FROM journal_steps AS s WHERE s.status = 'open' ORDER BY s.id"
        )
        for row in rows:
            events = await self._events(row["id"])
            step = _step(row, events)
            assembly, done, error = _replay_events(step.stream, events)
            step.assembly = assembly
            if error is not None:
                await self._close(step, "failed", None, error)
                report.failed.append(step.id)
            elif done or assembly.finish_reason is not None:
                event = None if done else ("done", _JSON.encode({"finish_reason": assembly.finish_reason}))
                await self._close(step, "complete", event)
                report.complete.append(step.id)
            else:
                await self._close(step, "interrupted")
                report.interrupted.append(step.id)
        report.pruned_events = await self.prune_expired()
        if rows:
            log.info("journal recovery: %s", report.counts())
        return report

    async def prune_expired(self) -> int:
        """Delete the events of ended steps older than `keep_events_s`; returns how many were deleted."""
        keep = self._config.keep_events_s
        if keep is None:
            return 0
        cutoff = self._clock() - keep

        def write(connection: sqlite3.Connection) -> int:
            cursor = connection.execute(
                "DELETE FROM journal_events WHERE step_id IN (SELECT id FROM journal_steps "
                f"WHERE status IN {PRUNABLE!r} AND COALESCE(sealed_at, created_at) <= ?)",
                (cutoff,),
            )
            return cursor.rowcount

        return await self._db.write(write, atomic=False)

    async def replay(
        self, tenant: str, idempotency_key: str, fingerprint: str
    ) -> tuple[StepRecord, list[Chunk]] | None:
        """The ended step holding this key and its stored chunks; None if there is none (or it failed).

        Chunks are the stream's chunk events, or the one chat.completion of a non-stream step; an empty list
        once the events were pruned (then answer with `chunks_from_record` or `completion_from_record`).
        """
        row = await self._db.fetchone(
            f"SELECT {_STEP_COLUMNS} FROM journal_steps AS s WHERE s.tenant = ? AND s.idempotency_key = ? "
            "ORDER BY s.id DESC LIMIT 1",
            (tenant, idempotency_key),
        )
        if row is None:
            return None
        _check_key(row["fingerprint"], row["status"], fingerprint)
        if row["status"] not in ENDED:
            return None
        wanted = CHUNK_EVENTS if row["stream"] else ("done",)
        chunks = [json.loads(content) for _seq, kind, content in await self._events(row["id"]) if kind in wanted]
        return _record(row), chunks

    async def steps(
        self,
        tenant: str,
        *,
        status: str | None = None,
        session_id: str | None = None,
        limit: int = DEFAULT_PAGE,
        offset: int = 0,
    ) -> tuple[list[StepRecord], bool]:
        """A page of the tenant's steps, newest first, and whether more follow."""
        where, params = ["s.tenant = ?"], [tenant]
        if status is not None:
            where.append("s.status = ?")
            params.append(status)
        if session_id is not None:
            where.append("s.session_id = ?")
            params.append(session_id)
        rows = await self._db.fetchall(
            f"SELECT {_STEP_COLUMNS} FROM journal_steps AS s WHERE {' AND '.join(where)} "
            "ORDER BY s.id DESC LIMIT ? OFFSET ?",
            [*params, limit + 1, offset],
        )
        records = [await self._readable(row) for row in rows[:limit]]
        return records, len(rows) > limit

    async def step(self, tenant: str, step_id: int) -> StepRecord | None:
        row = await self._db.fetchone(
            f"SELECT {_STEP_COLUMNS} FROM journal_steps AS s WHERE s.tenant = ? AND s.id = ?",
            (tenant, step_id),
        )
        return None if row is None else await self._readable(row)

    async def _readable(self, row: sqlite3.Row) -> StepRecord:
        # An open step's row holds no text yet: show what its events have assembled so far.
        if row["status"] != "open" or not row["events"]:
            return _record(row)
        assembly, _done, _error = _replay_events(bool(row["stream"]), await self._events(row["id"]))
        return _record(row, assembly)

    async def _events(self, step_id: int) -> list[tuple[int, str, str]]:
        rows = await self._db.fetchall(
            "SELECT seq, type, content FROM journal_events WHERE step_id = ? ORDER BY seq", (step_id,)
        )
        return [(row[0], row[1], row[2]) for row in rows]

    async def _close(
        self,
        step: Step,
        status: str,
        event: tuple[str, str] | None = None,
        error: dict[str, Any] | None = None,
    ) -> StepRecord | None:
        """Move an open step to `status` with its closing event and its answer so far, in one transaction.

        A sealing status (sealed, complete) also links the answer into history and raises Conflict if the
        step is no longer open; failing or interrupting an ended step is a no-op returning None, since
        cleanup paths (a cancelled seal) may call them late.
        """
        answer: tuple[StoredMessage, WriteFunction] | None = None
        if status in ENDED and step.session_id is not None and step.parent_message_id is not None:
            try:
                answer = self._history.answer_writer(
                    step.tenant,
                    step.session_id,
                    step.parent_message_id,
                    step.assembly.message(),
                    step.encoding,
                )
            except LookupError as exc:
                log.error("journal step %d: answer not linked into history: %s", step.id, exc)
        now = self._clock()
        sealed_at = now if status in ENDED else None
        prune = status in PRUNABLE and self._config.keep_events_s == 0
        assembly = step.assembly
        values: list[Any] = [
            status,
            None,  # message_id, known once the history write has run
            assembly.content,
            _dumps(assembly.tool_calls),
            assembly.finish_reason,
            _dumps(assembly.usage),
            _dumps(error),
            sealed_at,
            step.id,
        ]

        def write(connection: sqlite3.Connection) -> bool:
            if answer is not None:
                values[1] = _link_answer(connection, step.id, *answer)
            cursor = connection.execute(_END_STEP, values)
            if cursor.rowcount == 0:
                if status in ENDED:
                    raise Conflict(f"journal step {step.id} is no longer open")
                return False
            if prune:
                connection.execute("DELETE FROM journal_events WHERE step_id = ?", (step.id,))
            elif event is not None:
                connection.execute(_INSERT_EVENTS, (step.id, step.next_seq, *event, now))
            return True

        if not await self._db.write(write):
            log.warning("journal step %d was no longer open; not marked %s", step.id, status)
            return None
        step.status = status
        if answer is not None and values[1] is not None and step.session_id is not None:
            self._history.remember_answer(step.tenant, step.session_id, step.encoding, answer[0])
        if prune:
            step.events = 0
        elif event is not None:
            step.events, step.next_seq = step.events + 1, step.next_seq + 1
        return StepRecord(
            step.id,
            step.tenant,
            step.session_id,
            step.model,
            step.stream,
            status,
            step.created_at,
            sealed_at,
            assembly.content,
            assembly.tool_calls,
            assembly.finish_reason,
            assembly.usage,
            error,
            values[1],
            step.events,
        )


def _link_answer(
    connection: sqlite3.Connection, step_id: int, stored: StoredMessage, write: WriteFunction
) -> str | None:
    """Run the history write in its own savepoint: if the session or parent is gone, the step is still sealed
    (its answer kept in the journal row) and only the link is missing, rather than the answer being lost."""
    connection.execute("SAVEPOINT answer")
    try:
        write(connection)
    except LookupError as exc:
        connection.execute("ROLLBACK TO answer")
        connection.execute("RELEASE answer")
        log.error("journal step %d: answer not linked into history: %s", step_id, exc)
        return None
    connection.execute("RELEASE answer")
    return stored.id


def _replay_events(stream: bool, events: Iterable[tuple[int, str, str]]) -> tuple[Assembly, bool, Any]:
    """The assembly, whether a `done` event exists, and the `error` event's body (or None)."""
    assembly, done, error = Assembly(), False, None
    for _seq, kind, content in events:
        if kind in CHUNK_EVENTS:
            assembly.add(json.loads(content))
        elif kind == "done":
            done = True
            if not stream:
                assembly = assemble([json.loads(content)])
        elif kind == "error":
            error = json.loads(content)
    return assembly, done, error


def _step(row: sqlite3.Row, events: list[tuple[int, str, str]]) -> Step:
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


def _check_key(stored_fingerprint: str, status: str, fingerprint: str) -> None:
    if stored_fingerprint != fingerprint:
        raise Conflict(KEY_REUSED, param=KEY_PARAM)
    if status == "open":
        raise Conflict(KEY_IN_PROGRESS, param=KEY_PARAM)


def _dumps(value: Any) -> str | None:
    return None if value is None else _JSON.encode(value)


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def _record(row: sqlite3.Row, assembly: Assembly | None = None) -> StepRecord:
    return StepRecord(
        id=row["id"],
        tenant=row["tenant"],
        session_id=row["session_id"],
        model=row["model"],
        stream=bool(row["stream"]),
        status=row["status"],
        created_at=row["created_at"],
        sealed_at=row["sealed_at"],
        content=assembly.content if assembly else row["content"],
        tool_calls=assembly.tool_calls if assembly else _loads(row["tool_calls"]),
        finish_reason=assembly.finish_reason if assembly else row["finish_reason"],
        usage=assembly.usage if assembly else _loads(row["usage"]),
        error=_loads(row["error"]),
        message_id=row["message_id"],
        events=row["events"],
    )
