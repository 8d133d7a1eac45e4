"""The write side of the journal: a step's lifecycle from `begin` to its end (see `proxy.journal.steps`).

`append` is one write job per batch of chunks and returns after its commit, so the caller relays only what is
durable (docs/architecture.md, invariant 7): a client can never have seen a chunk that a `kill -9` loses.
Ending a step with a whole answer (`seal`, and `complete` in recovery) writes the `done` event, the answer's
history node (`proxy.history.answers`) and the step row in one transaction, so there is no moment where the
answer is sealed but missing from the conversation, or the reverse. A step failed or interrupted while the store
cannot be written (disk full, the store's server gone) is remembered as such in memory (`unrecorded`), so its
Idempotency-Key is free, and written once the store takes writes again (`Recovery.settle_unrecorded`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.canonical.types import Chunk, Clock
from proxy.config.schema import JournalConfig
from proxy.errors import Conflict, StoreUnavailable, error_fields
from proxy.history.answers import Answers, PendingAnswer
from proxy.history.messages import StoredMessage
from proxy.journal.assembly import assemble
from proxy.journal.keys import KEY_DONE, KEY_PARAM, check_key
from proxy.journal.steps import (
    DOOR_STATE,
    ENDED,
    JSON_ENCODER,
    PRUNABLE,
    EventType,
    Step,
    StepRecord,
    StepStatus,
    UnrecordedEnds,
    dumps,
    event_type,
)
from proxy.observability.metrics import Metrics
from proxy.offload import OFF_LOOP_CHARS
from proxy.store.connection import Connection
from proxy.store.database import Database

log = logging.getLogger(__name__)

INSERT_EVENT = "INSERT INTO journal_events (step_id, seq, type, content, created_at) VALUES (?, ?, ?, ?, ?)"

_END_STEP = """UPDATE journal_steps
SET status = ?, message_id = ?, content = ?, tool_calls = ?, finish_reason = ?, usage = ?, error = ?,
    sealed_at = ?
WHERE id = ? AND status = ?"""

ClosingEvent = tuple[EventType, str]


class Journal:
    def __init__(
        self,
        db: Database,
        answers: Answers,
        config: JournalConfig,
        clock: Clock = time.time,
        metrics: Metrics | None = None,
    ) -> None:
        self._db = db
        self._answers = answers
        self.config = config
        self.clock = clock
        self.unrecorded = UnrecordedEnds()
        """Endings the store could not write; `JournalReader` reads keys through it too."""
        self.owner: str | None = None
        """This process's id in `journal_owners` (`proxy.journal.owners`), stamped on each step it opens; None
        for a process that does not register (its steps are anyone's to recover)."""
        self.metrics = Metrics() if metrics is None else metrics
        """The app's metrics; the relay, the pipeline and recovery record through the journal's."""

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
        context: Mapping[str, Any] | None = None,
    ) -> Step:
        """Open a step; Conflict if the Idempotency-Key is held by another body or by a live/ended step.

        `fingerprint` identifies the request body for Idempotency-Key checks; it is empty for unkeyed steps.
        `parent_message_id` is where the answer will join the history; `context` what the working context sent
        upstream adds up to (what inspection reports as the session's usage).
        """
        now = self.clock()
        row = (
            tenant,
            session_id,
            model,
            fingerprint,
            idempotency_key,
            int(stream),
            StepStatus.OPEN,
            parent_message_id,
            now,
            encoding,
            dumps(context),
            self.owner,
        )

        unrecorded = self.unrecorded

        def write(connection: Connection) -> int:
            if idempotency_key is not None:
                prior = connection.execute(
                    "SELECT id, fingerprint, status FROM journal_steps WHERE tenant = ? AND idempotency_key = ? "
                    "ORDER BY id DESC LIMIT 1",
                    (tenant, idempotency_key),
                ).fetchone()
                if prior is not None:
                    status = unrecorded.status(prior["id"], prior["status"])
                    check_key(prior["fingerprint"], status, fingerprint)
                    if status in ENDED:
                        raise Conflict(KEY_DONE, param=KEY_PARAM)
                    if status != prior["status"]:
                        write_unrecorded_ending(connection, prior["id"])
            cursor = connection.execute(
                "INSERT INTO journal_steps (tenant, session_id, model, fingerprint, idempotency_key, stream, "
                "status, parent_message_id, created_at, encoding, context, owner) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
                row,
            )
            step_id: int = cursor.fetchone()[0]
            return step_id

        def write_unrecorded_ending(connection: Connection, prior_id: int) -> None:
            # The step this process knows ended still holds the key in the store (an open row): end it there.
            ending = unrecorded.ending(prior_id)
            assert ending is not None
            connection.execute(
                "UPDATE journal_steps SET status = ?, error = ? WHERE id = ? AND status = ?",
                (ending[0], ending[1], prior_id, StepStatus.OPEN),
            )
            ended_prior.append(prior_id)

        ended_prior: list[int] = []
        # Without an unrecorded ending to write, the only statement that changes anything is the INSERT, which
        # SQLite rolls back alone if it fails.
        known_dead = idempotency_key is not None and len(unrecorded) > 0
        try:
            step_id = await self._db.write(write, atomic=not known_dead)
        except StoreUnavailable as exc:
            if exc.commit_unknown and self.owner is not None:  # an unowned row is any process's to recover
                unrecorded.remember_begin(tenant, now, JSON_ENCODER.encode(error_fields(exc)))
            raise
        for prior_id in ended_prior:
            unrecorded.forget(prior_id)
        return Step(step_id, tenant, session_id, model, stream, parent_message_id, encoding=encoding, created_at=now)

    async def append(self, step: Step, chunks: Sequence[Chunk]) -> list[str]:
        """Store a batch of chunks as events in one write job; returns once they are committed.

        Returns each chunk's JSON as stored, so a door can send the very bytes that are durable without
        encoding every chunk a second time.
        """
        if step.status != StepStatus.OPEN:
            raise RuntimeError(f"journal step {step.id} is {step.status}, not open")
        if not chunks:
            return []
        now = self.clock()
        seq = step.next_seq
        texts = [JSON_ENCODER.encode(chunk) for chunk in chunks]
        rows = [
            (step.id, seq + offset, event_type(chunk), text, now)
            for offset, (chunk, text) in enumerate(zip(chunks, texts, strict=True))
        ]
        step.next_seq = seq + len(rows)

        def write(connection: Connection) -> None:
            connection.executemany(INSERT_EVENT, rows)

        await self._db.write(write, atomic=False, bulk=len(rows) > 1)
        self.metrics.journal_events.inc(len(rows))
        step.events += len(rows)
        for chunk in chunks:
            step.assembly.add(chunk)
        return texts

    async def recontext(self, step: Step, context: Mapping[str, Any]) -> None:
        """The step's request was compacted again (a context error healed): record what the retry sent."""

        def write(connection: Connection) -> None:
            connection.execute("UPDATE journal_steps SET context = ? WHERE id = ?", (dumps(context), step.id))

        await self._db.write(write, atomic=False)

    async def annotate(self, tenant: str, step_id: int, changes: Mapping[str, Any]) -> bool:
        """Merge `changes` into what the step's door keeps of it (`Conversation.door_state`, under `DOOR_STATE`);
        False if the tenant has no such step."""

        def write(connection: Connection) -> bool:
            row = connection.execute(
                "SELECT context FROM journal_steps WHERE tenant = ? AND id = ?", (tenant, step_id)
            ).fetchone()
            if row is None:
                return False
            context = json.loads(row[0]) if row[0] else {}
            context[DOOR_STATE] = {**(context.get(DOOR_STATE) or {}), **changes}
            connection.execute("UPDATE journal_steps SET context = ? WHERE id = ?", (dumps(context), step_id))
            return True

        return await self._db.write(write)

    async def seal(self, step: Step, response: Chunk | None = None) -> StepRecord:
        """End a step with its whole answer: `done` event, history node and step row in one transaction.

        For a stream the answer is what was appended; for a non-stream call `response` is the chat.completion,
        stored as the step's one event. Conflict if the step is no longer open.
        """
        if response is not None:
            step.assembly = assemble([response])
            done = JSON_ENCODER.encode(response)
        else:
            done = JSON_ENCODER.encode({"finish_reason": step.assembly.finish_reason})
        record = await self.close(step, StepStatus.SEALED, (EventType.DONE, done))
        assert record is not None  # close raises rather than return None for a sealing status
        return record

    async def fail(self, step: Step, error: dict[str, Any]) -> None:
        """End a step on an upstream failure: an `error` event, the error, and the partial answer so far."""
        await self.close(step, StepStatus.FAILED, (EventType.ERROR, JSON_ENCODER.encode(error)), error)

    async def interrupt(self, step: Step) -> None:
        """End a step cancelled on purpose (the client left); its partial answer and events are kept."""
        await self.close(step, StepStatus.INTERRUPTED)

    async def close(
        self,
        step: Step,
        status: StepStatus,
        event: ClosingEvent | None = None,
        error: dict[str, Any] | None = None,
    ) -> StepRecord | None:
        """Move an open step to `status` with its closing event and its answer so far, in one transaction.

        An ending status (sealed, complete) also links the answer into history and raises Conflict if the step
        is no longer open; failing or interrupting an ended step is a no-op returning None, since cleanup paths
        (a cancelled seal) may call them late. If the store cannot write a failed or interrupted ending, the
        step is remembered as ended in `unrecorded` (its row stays open until that ending is written) and the
        error is raised.
        """
        answer = await self._pending_answer(step) if status in ENDED else None
        now = self.clock()
        sealed_at = now if status in ENDED else None
        prune = status in PRUNABLE and self.config.keep_events_s == 0
        assembly = step.assembly
        fields = (assembly.content, dumps(assembly.tool_calls), assembly.finish_reason, dumps(assembly.usage))

        def write(connection: Connection) -> tuple[bool, StoredMessage | None]:
            stored = None if answer is None else answer.write(connection)
            values = (
                status,
                None if stored is None else stored.id,
                *fields,
                dumps(error),
                sealed_at,
                step.id,
                StepStatus.OPEN,
            )
            if connection.execute(_END_STEP, values).rowcount == 0:
                if status in ENDED:
                    raise Conflict(f"journal step {step.id} is no longer open")
                return False, None
            if prune:
                connection.execute("DELETE FROM journal_events WHERE step_id = ?", (step.id,))
            elif event is not None:
                connection.execute(INSERT_EVENT, (step.id, step.next_seq, *event, now))
            return True, stored

        try:
            closed, stored = await self._db.write(write, bulk=assembly.size > OFF_LOOP_CHARS)
        except Conflict:
            raise
        except Exception:
            if status not in ENDED:
                if self.unrecorded.ending(step.id) is None:  # not again at each retry of `settle_unrecorded`
                    log.error(
                        "journal step %d could not be recorded as %s; this process knows it ended and records it "
                        "once the store takes writes again",
                        step.id,
                        status,
                    )
                self.unrecorded.remember(step.id, status, dumps(error))
                step.status = status
            raise
        if not closed:
            log.warning("journal step %d was no longer open; not marked %s", step.id, status)
            return None
        step.status = status
        self.metrics.journal_steps.labels(status).inc()
        self.metrics.usage(step.model, assembly.usage)
        if answer is not None and stored is not None:
            self._answers.committed(answer, stored)
        if prune:
            step.events = 0
        elif event is not None:
            step.events, step.next_seq = step.events + 1, step.next_seq + 1
            self.metrics.journal_events.inc()
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
            None if stored is None else stored.id,
            step.events,
            parent_message_id=step.parent_message_id,
        )

    async def _pending_answer(self, step: Step) -> PendingAnswer | None:
        if step.session_id is None or step.parent_message_id is None:
            return None
        return await self._answers.prepare(
            step.tenant, step.session_id, step.parent_message_id, step.assembly.message(), step.encoding
        )
