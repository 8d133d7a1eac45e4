"""Relaying a stream: every upstream chunk is durable in the journal before the client can see it.

Three parties per stream, so none waits on another more than it must:

    reader task   upstream chunks → `pending` (as fast as the upstream sends)
    pump task     takes everything pending as one group → `journal.append` (one commit) → the group, with
                  the JSON the journal stored for each chunk → `ready` queue
    consumer      `events()`: `ready` → the wire adapter, which renders it for its client

Chunks that arrive while a commit is in flight form the next group, so a fast stream costs one commit per
group rather than one per chunk, and no chunk is relayed before its commit (docs/architecture.md, invariant 7).
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
from dataclasses import dataclass

from proxy.errors import AnswerTooLarge, error_fields
from proxy.journal.assembly import answer_chars
from proxy.journal.steps import Step
from proxy.journal.writer import Journal
from proxy.types import Chunk
from proxy.upstream.deadlines import StreamDeadlines

log = logging.getLogger(__name__)

READER_SLICE_S = 0.001
"""How long the reader may parse an already-buffered burst before it lets the pump and the client run: long
enough for groups of dozens of chunks (one commit each), short enough to add at most ~1 ms to any chunk."""


@dataclass(frozen=True)
class Journaled:
    """A chunk that is durable, with the JSON text the journal stored for it."""

    chunk: Chunk
    text: str


class _Done:
    """The stream's end marker in the ready queue."""


DONE = _Done()
Ready = Sequence[Journaled] | BaseException | _Done


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
    ) -> None:
        self._journal = journal
        self._step = step
        self._chunks = chunks
        self._deadlines = deadlines
        self._max_answer_chars = max_answer_chars
        self._finish_on_disconnect = finish_on_disconnect
        self._pending: list[Chunk] = []
        self._arrived = asyncio.Event()
        self._ended = False
        self._error: BaseException | None = None
        self._ready: asyncio.Queue[Ready] = asyncio.Queue()
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
        return JournaledGroups(self._ready, self._client_gone)

    def _client_gone(self) -> None:
        self._detached = True
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
        try:
            while True:
                await self._arrived.wait()
                self._arrived.clear()
                group, self._pending = self._pending, []
                if group:
                    texts = await self._journal.append(self._step, group)
                    self._publish([Journaled(chunk, text) for chunk, text in zip(group, texts, strict=True)])
                if self._ended and not self._pending:
                    break
            if self._error is None:
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
            # The journal itself failed (disk full, I/O error): nothing more can be made durable, so nothing
            # more may be relayed. The consumer hears why, and the step ends failed (or, if the store cannot
            # even record that, is known failed in this process: `Journal.close`).
            log.exception("journal failed for stream step %d", self._step.id)
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            try:
                await self._journal.fail(self._step, error_fields(exc))
            except Exception as again:
                log.error("could not record stream step %d as failed: %s", self._step.id, again)
            self._publish(exc)
        finally:
            await asyncio.gather(reader, return_exceptions=True)

    async def _read(self) -> None:
        deadlines = self._deadlines
        deadline = asyncio.timeout_at(None if deadlines is None else deadlines.first_chunk)
        first_seen = False
        try:
            async with deadline:
                # Chunks already buffered arrive without a real suspension, so neither the pump nor the client
                # would run until the whole buffer is parsed. Yield after the first chunk (time to first chunk)
                # and then once per time slice; a slow upstream suspends between chunks anyway.
                slice_started = None
                size, limit = 0, self._max_answer_chars
                async for chunk in self._chunks:
                    if not first_seen and deadlines is not None:
                        first_seen = True
                        deadline.reschedule(deadlines.end)
                    size += answer_chars(chunk)
                    if limit is not None and size > limit:
                        # Cut off before the chunk that passes the limit: what the step keeps stays bounded.
                        raise AnswerTooLarge(limit, self._step.id)
                    self._pending.append(chunk)
                    self._arrived.set()
                    now = time.monotonic()
                    if slice_started is None or now - slice_started >= READER_SLICE_S:
                        await asyncio.sleep(0)
                        slice_started = time.monotonic()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # Handed to the pump, which journals it as the step's error and raises it to the consumer.
            self._error = exc
            if isinstance(exc, AnswerTooLarge):
                log.warning("stream step %d: %s", self._step.id, exc)
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

    def _publish(self, item: Ready) -> None:
        if not self._detached:
            self._ready.put_nowait(item)


class JournaledGroups:
    """What `StreamRelay.events` hands the consumer: an async iterator of durable groups.

    A class rather than an async generator, because closing a generator that never started runs none of its
    code: `aclose` must tell the relay that the consumer left, even before the first group.
    """

    def __init__(self, ready: asyncio.Queue[Ready], on_leave: Callable[[], None]) -> None:
        self._ready = ready
        self._on_leave = on_leave
        self._finished = False
        self._slice_started = time.monotonic()

    def __aiter__(self) -> JournaledGroups:
        return self

    async def __anext__(self) -> Sequence[Journaled]:
        if self._finished:
            raise StopAsyncIteration
        if self._ready.empty():
            item = await self._ready.get()  # suspends
            self._slice_started = time.monotonic()
        else:
            # A backlog of groups and a client that reads as fast as we write would never suspend: let the other
            # clients run once per time slice, as the reader does.
            if time.monotonic() - self._slice_started >= READER_SLICE_S:
                await asyncio.sleep(0)
                self._slice_started = time.monotonic()
            item = self._ready.get_nowait()
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
