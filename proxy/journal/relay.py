"""Relaying a stream: every upstream chunk is durable in the journal before the client can see it.

Three parties per stream, so none waits on another more than it must:

    reader task   upstream chunks → `pending` (as fast as the upstream sends, up to `MAX_PENDING_CHUNKS`)
    pump task     takes up to `MAX_GROUP_CHUNKS` pending as one group → `journal.append` (one commit) → the
                  group, with the JSON the journal stored for each chunk → `ready` queue (the backlog)
    consumer      `events()`: `ready` → the door, which renders it for its client

Chunks that arrive while a commit is in flight form the next group, so a fast stream costs one commit per
group rather than one per chunk, and no chunk is relayed before its commit (docs/architecture.md, invariant 7).
The first chunk goes alone: the reader waits until it has been relayed before it parses on, so an upstream that
sends its whole answer at once does not keep the first commit and the client waiting behind the parsing of the
rest (time to first chunk, what an interactive client sees; the upstream's socket holds the rest meanwhile).
Every stage is bounded, so a stream's memory and the event loop's longest turn depend on a group's size, not on
the answer's: a group is at most `MAX_GROUP_CHUNKS` (the work between two suspensions), the reader waits while
`pending` is full (the upstream's socket then holds the rest), and the pump waits while the client's backlog is
over `MAX_BACKLOG_CHARS`. A client that does not catch up within `write_timeout_s` is dropped — its `events()`
raise `ClientTooSlow` — and the answer is journaled to its end as for a client that left: the client is
dropped, never the data.
The pump owns the step's ending: seal on completion (the answer lands in history before `events()` ends), fail
on an upstream error (raised from `events()` after the last durable group) and on a journal failure (disk full),
interrupt when cancelled; no ending leaves the step open while this process lives (see `Journal.close` for a
store that cannot even record the failure). If the consumer goes away, the pump by default reads the answer to
its end and seals it — it was paid for — unless `finish_on_disconnect` is off. The reader enforces the stream's
deadlines (`proxy.upstream.deadlines`): past one, the upstream stream is closed and the step fails with a 504
`upstream_timeout`; an answer past `limits.max_answer_chars` is cut off the same way, with `answer_too_large`
(memory per stream stays bounded). The relay knows nothing of wire formats: groups are canonical chunks.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence

from proxy.canonical.answers import Journaled
from proxy.canonical.types import Chunk
from proxy.config.schema import DEFAULT_WRITE_TIMEOUT_S
from proxy.errors import AnswerTooLarge, ClientTooSlow, StepKept, StorageFull, StoreUnavailable, error_fields
from proxy.journal.assembly import answer_chars
from proxy.journal.steps import Step
from proxy.journal.writer import Journal
from proxy.upstream.deadlines import StreamDeadlines

log = logging.getLogger(__name__)

READER_SLICE_S = 0.001
"""How long the reader may parse an already-buffered burst before it lets the pump and the client run: long
enough for groups of dozens of chunks (one commit each), short enough to add at most ~1 ms to any chunk."""
MAX_GROUP_CHUNKS = 256
"""Chunks journaled in one commit and relayed as one group: the event loop's work between two suspensions
(encoding, assembling and rendering a group of small chunks takes a few ms)."""
MAX_PENDING_CHUNKS = 2 * MAX_GROUP_CHUNKS
"""Chunks read ahead of the journal; past this the reader waits, and the upstream's socket holds the rest."""
MAX_BACKLOG_CHARS = 256 * 1024
"""JSON characters of durable groups waiting for the client; past this the pump waits for it (at most the write
timeout, then drops it). Bounds a stalled client's memory: its groups' chunks cost a few times their JSON."""


class _Done:
    """The stream's end marker in the ready queue."""


DONE = _Done()
Ready = Sequence[Journaled] | BaseException | _Done


class Backlog:
    """The durable groups waiting for the client, and their size in JSON characters."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[Ready, int]] = asyncio.Queue()
        self.chars = 0
        self.caught_up = asyncio.Event()
        """Set whenever the backlog is at most `MAX_BACKLOG_CHARS` (or the client is gone)."""
        self.caught_up.set()

    def put(self, item: Ready, chars: int = 0) -> None:
        self.queue.put_nowait((item, chars))
        self.chars += chars
        if self.chars > MAX_BACKLOG_CHARS:
            self.caught_up.clear()

    def took(self, chars: int) -> None:
        self.chars -= chars
        if self.chars <= MAX_BACKLOG_CHARS:
            self.caught_up.set()

    def drop(self, last: Ready) -> None:
        """Forget every group the client has not taken; `last` is all it will get."""
        while not self.queue.empty():
            self.queue.get_nowait()
        self.chars = 0
        self.caught_up.set()
        self.queue.put_nowait((last, 0))


class StreamRelay:
    def __init__(
        self,
        journal: Journal,
        step: Step,
        chunks: AsyncIterator[Chunk],
        *,
        finish_on_disconnect: bool,
        background: set[asyncio.Task[None]],
        deadlines: StreamDeadlines | None = None,
        max_answer_chars: int | None = None,
        write_timeout_s: float = DEFAULT_WRITE_TIMEOUT_S,
    ) -> None:
        self._journal = journal
        self._step = step
        self._chunks = chunks
        self._deadlines = deadlines
        self._max_answer_chars = max_answer_chars
        self._finish_on_disconnect = finish_on_disconnect
        self._write_timeout_s = write_timeout_s
        self._pending: list[Chunk] = []
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        """Set whenever `pending` has room: the reader waits on it."""
        self._room.set()
        self._first_relayed = asyncio.Event()
        """Set once the first group is durable and handed to the consumer: the reader waits for it after the first
        chunk."""
        self._ended = False
        self._error: BaseException | None = None
        self._backlog = Backlog()
        self._detached = False
        self._started = False
        self._abandoned = False
        self._pump = asyncio.create_task(self._run(), name=f"stream-step-{step.id}")
        background.add(self._pump)
        self._pump.add_done_callback(background.discard)
        streams = journal.metrics.active_streams
        streams.inc()
        self._pump.add_done_callback(lambda _task: streams.dec())

    def events(self) -> JournaledGroups:
        """The consumer's side: groups of journaled chunks; ends when the step is sealed, or raises the failure
        (an `UpstreamError`, or the journal's own) once everything before it was delivered.

        Closing it before the end (the client left) detaches the consumer; see `finish_on_disconnect`.
        """
        return JournaledGroups(self._backlog, self._client_gone)

    @property
    def backlog_chars(self) -> int:
        """JSON characters of durable groups the client has not taken yet."""
        return self._backlog.chars

    @property
    def pending_chunks(self) -> int:
        """Chunks read from the upstream and not yet journaled."""
        return len(self._pending)

    def _client_gone(self) -> None:
        if self._detached:
            return  # dropped already (`_drop_client`)
        self._detached = True
        self._backlog.caught_up.set()
        if self._finish_on_disconnect:
            log.info("client left stream step %d; reading the answer to its end", self._step.id)
        elif self._started:
            self._pump.cancel()
        else:
            self._abandoned = True  # a task cancelled before it starts runs none of its code, so no interrupt

    async def _run(self) -> None:
        self._started = True
        if self._abandoned:
            await self._journal.interrupt(self._step)
            return
        reader = asyncio.create_task(self._read())
        sealing = False
        try:
            while True:
                await self._arrived.wait()
                self._arrived.clear()
                group = self._pending[:MAX_GROUP_CHUNKS]
                del self._pending[:MAX_GROUP_CHUNKS]
                if self._pending:
                    self._arrived.set()
                self._room.set()
                if group:
                    texts = await self._journal.append(self._step, group)
                    journaled = [Journaled(chunk, text) for chunk, text in zip(group, texts, strict=True)]
                    del group
                    self._publish(journaled, sum(len(text) for text in texts))
                    self._first_relayed.set()
                    await self._wait_for_client()
                if self._ended and not self._pending:
                    break
            if self._error is None:
                sealing = True
                await self._journal.seal(self._step)
                self._publish(DONE)
            else:
                await self._journal.fail(self._step, error_fields(self._error))
                self._publish(self._error)
        except asyncio.CancelledError:
            reader.cancel()
            try:
                await asyncio.shield(self._journal.interrupt(self._step))
            except Exception as exc:
                log.error("could not record stream step %d as interrupted: %s", self._step.id, exc)
            raise
        except Exception as exc:
            # The journal itself failed (disk full, I/O error, the store's server gone): nothing more can be made
            # durable, so nothing more may be relayed. The consumer hears why and what the step kept, and the step
            # ends failed (or, if the store cannot even record that, is known failed in this process and recorded
            # once the store is back: `Journal.close`, `Recovery.settle_unrecorded`).
            if isinstance(exc, StoreUnavailable):
                log.error("journal failed for stream step %d: %s", self._step.id, exc)
            else:
                log.exception("journal failed for stream step %d", self._step.id)
            if isinstance(exc, StorageFull):
                exc = StorageFull.mid_stream(self._step.id)
            elif isinstance(exc, StoreUnavailable):
                exc = exc.in_step(self._step.id, self._kept(sealing))
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            try:
                await self._journal.fail(self._step, error_fields(exc))
            except Exception as again:
                log.error("could not record stream step %d as failed: %s", self._step.id, again)
            self._publish(exc)
        finally:
            await asyncio.gather(reader, return_exceptions=True)

    def _kept(self, sealing: bool) -> StepKept:
        """What the step holds of the answer when the store failed: every chunk was journaled and relayed once it
        was sealing (the seal failed); before that, the groups relayed so far."""
        if sealing:
            return StepKept.WHOLE
        return StepKept.RELAYED if self._first_relayed.is_set() else StepKept.NOTHING

    async def _read(self) -> None:
        deadlines = self._deadlines
        deadline = asyncio.timeout_at(None if deadlines is None else deadlines.first_chunk)
        first_seen = False
        try:
            async with deadline:
                # Chunks already buffered arrive without a real suspension, so neither the pump nor the client
                # would run until the whole buffer is parsed. Wait after the first chunk until it is relayed
                # (time to first chunk), then yield once per time slice; a slow upstream suspends between
                # chunks anyway.
                slice_started = time.monotonic()
                size, limit = 0, self._max_answer_chars
                async for chunk in self._chunks:
                    first = not first_seen
                    if first:
                        first_seen = True
                        if deadlines is not None:
                            deadline.reschedule(deadlines.end)
                    size += answer_chars(chunk)
                    if limit is not None and size > limit:
                        # Cut off before the chunk that passes the limit: what the step keeps stays bounded.
                        raise AnswerTooLarge(limit, self._step.id)
                    self._pending.append(chunk)
                    self._arrived.set()
                    if len(self._pending) >= MAX_PENDING_CHUNKS:
                        self._room.clear()
                        await self._room.wait()
                        slice_started = time.monotonic()
                        continue
                    if first:
                        await self._first_relayed.wait()
                        slice_started = time.monotonic()
                        continue
                    now = time.monotonic()
                    if now - slice_started >= READER_SLICE_S:
                        await asyncio.sleep(0)
                        slice_started = time.monotonic()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Handed to the pump, which journals it as the step's error and raises it to the consumer.
            self._error = exc
            if isinstance(exc, AnswerTooLarge):
                if exc.step_id is None:  # one event passed the byte cap as it was read (`upstream.bounded_bodies`)
                    self._error = AnswerTooLarge(exc.limit, self._step.id)
                log.warning("stream step %d: %s", self._step.id, self._error)
            if isinstance(exc, TimeoutError) and deadlines is not None and deadline.expired():
                self._error = deadlines.exceeded(first_seen)
                log.warning("stream step %d: %s", self._step.id, self._error)
        finally:
            self._ended = True
            self._arrived.set()
            await self._close_upstream()

    async def _close_upstream(self) -> None:
        """Close the upstream stream however the reading ended (a deadline, a cancel), so its connection goes."""
        close = getattr(self._chunks, "aclose", None)
        if close is None:
            return
        try:
            await close()
        except Exception as exc:
            log.debug("closing the upstream stream of step %d: %s", self._step.id, exc)

    async def _wait_for_client(self) -> None:
        """Hold the stream while the client's backlog is full; drop a client that does not catch up in time."""
        if self._backlog.caught_up.is_set():
            return
        try:
            async with asyncio.timeout(self._write_timeout_s):
                await self._backlog.caught_up.wait()
        except TimeoutError:
            self._drop_client()

    def _drop_client(self) -> None:
        behind = self._backlog.chars
        self._detached = True
        self._backlog.drop(
            ClientTooSlow(
                f"The client fell {behind} characters behind the stream and did not catch up within "
                f"{self._write_timeout_s} s (server.write_timeout_s); the answer is kept in journal step "
                f"{self._step.id}."
            )
        )
        if self._finish_on_disconnect:
            log.info("stream step %d: client too slow, dropped; reading the answer to its end", self._step.id)
        else:
            log.info("stream step %d: client too slow, dropped", self._step.id)
            self._pump.cancel()

    def _publish(self, item: Ready, chars: int = 0) -> None:
        if not self._detached:
            self._backlog.put(item, chars)


class JournaledGroups:
    """What `StreamRelay.events` hands the consumer: an async iterator of durable groups.

    A class rather than an async generator, because closing a generator that never started runs none of its
    code: `aclose` must tell the relay that the consumer left, even before the first group.
    """

    def __init__(self, backlog: Backlog, on_leave: Callable[[], None]) -> None:
        self._backlog = backlog
        self._ready = backlog.queue
        self._on_leave = on_leave
        self._finished = False
        self._slice_started = time.monotonic()

    def __aiter__(self) -> JournaledGroups:
        return self

    async def __anext__(self) -> Sequence[Journaled]:
        if self._finished:
            raise StopAsyncIteration
        if self._ready.empty():
            item, chars = await self._ready.get()  # suspends
            self._slice_started = time.monotonic()
        else:
            # A backlog of groups and a client that reads as fast as we write would never suspend: let the other
            # clients run once per time slice, as the reader does.
            if time.monotonic() - self._slice_started >= READER_SLICE_S:
                await asyncio.sleep(0)
                self._slice_started = time.monotonic()
            item, chars = self._ready.get_nowait()
        self._backlog.took(chars)
        if isinstance(item, _Done):
            self._finished = True
            raise StopAsyncIteration
        if isinstance(item, BaseException):
            self._finished = True
            raise item
        return item

    async def aclose(self) -> None:
        if not self._finished:
            self._finished = True
            self._on_leave()
