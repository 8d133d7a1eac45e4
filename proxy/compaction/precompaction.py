"""Background pre-compaction: when a request leaves its session past `context.precompact_ratio` of the budget,
the spans the next crossing will need are written off the critical path (one task per session,
`precompact_concurrency` at once). The crossing request waits for that task, never for a second summarizer call
of its own. Replicas sharing a PostgreSQL store take the session's pre-compaction lock: one of them writes the
spans, and a crossing request on another waits for it as for its own.

A run that found nothing to write is remembered per session (bounded, lost on restart): a request on the same
path with the same working context and policy starts no second run, since its build would find nothing either.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import replace

from proxy.canonical.types import Clock
from proxy.compaction.builder import Policy
from proxy.compaction.spans import Allowance, CompactionRequest
from proxy.config.schema import ContextConfig
from proxy.history.messages import StoredMessage
from proxy.store.database import Database, lock_name

log = logging.getLogger(__name__)

CLOSE_GRACE_S = 5.0
"""How long shutdown lets running pre-compactions finish before it cancels them."""

IDLE_SESSIONS = 10_000
"""Sessions whose last pre-compaction found nothing to write, remembered (~200 bytes each)."""

WriteAhead = Callable[[CompactionRequest, Policy], Awaitable[int]]
"""Writes, held back, the spans a session's next crossing will need: given the request and the policy to write
them by (the compactor's loop, with `ahead_policy`); returns how many it wrote."""

Idle = tuple[str, int, int, int, int, Policy]
"""What a run that wrote nothing read: the path's tip (id, depth), its length, the working context's tokens and
summaries, and the policy it built with. The same again builds the same nothing (`build` is pure)."""


def ahead_policy(policy: Policy, tokens: int, floor: int, ratio: float) -> Policy:
    """Compact as the crossing will, ahead of it: to the crossing's target (`Policy.target`) less the room still
    left before the trigger (the turns until the crossing fill it), the trigger a share of the free space above
    `floor` (`Policy.level`)."""
    headroom = max(0.0, policy.level(policy.trigger_ratio, floor) - tokens)
    return replace(policy, trigger_ratio=min(policy.trigger_ratio, ratio), ahead_by=math.ceil(headroom))


class Precompactions:
    def __init__(
        self, config: ContextConfig, write_ahead: WriteAhead, clock: Clock, locks: Database | None = None
    ) -> None:
        """`locks`: the store shared with other replicas, whose pre-compaction of a session this one must not
        repeat (none: this process is the only one)."""
        self._ratio = config.precompact_ratio
        self._write_ahead = write_ahead
        self._clock = clock
        self._locks = locks
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        """Pre-compactions running, by (tenant, session)."""
        self._slots = asyncio.Semaphore(config.precompact_concurrency)
        self._idle: OrderedDict[tuple[str, str], Idle] = OrderedDict()
        """(tenant, session) → what its last run read when it found nothing to write."""

    def start(
        self, request: CompactionRequest, policy: Policy, tokens: int, floor: int, *, ahead: bool, summaries: int = 0
    ) -> None:
        """Start writing the session's next spans in the background when the request sent `tokens`, more than
        `context.precompact_ratio` of its free space above `floor`, and no spans already wait (`ahead`); one task
        per session, none when the session's last run read the same (`Idle`: the same path, a working context
        of the same `tokens` and `summaries`, the same policy) and wrote nothing."""
        ratio = self._ratio
        key = (request.tenant, request.session_id)
        if ratio is None or ahead or tokens <= policy.level(ratio, floor) or key in self._running:
            return
        aim = ahead_policy(policy, tokens, floor, ratio)
        idle = _idle(request.path, tokens, summaries, aim)
        if idle is not None and self._idle.get(key) == idle:
            self._idle.move_to_end(key)
            return
        self._idle.pop(key, None)
        task = asyncio.create_task(self._run(request, aim, key, idle))
        self._running[key] = task
        task.add_done_callback(functools.partial(self._done, key))

    async def wait(self, request: CompactionRequest, allowance: Allowance) -> None:
        """Wait for the session's pre-compaction, within the request's summarizer allowance: the spans it writes
        are the ones this request would otherwise pay for. If it is still running at the deadline, this request
        writes what it lacks without the summarizer (extractive), never a second call for the same work."""
        task = self._running.get((request.tenant, request.session_id))
        if task is None and self._locks is None:
            return
        left = allowance.left(self._clock())
        try:
            async with asyncio.timeout(max(0.0, left)):
                if task is not None:
                    await asyncio.shield(task)
                else:  # another replica's pre-compaction of the session, if one is running: until it ends
                    async with self._fleet_lock(request, wait=True):
                        pass
        except TimeoutError:
            allowance.exhaust()
            log.warning(
                "compaction session=%s: the session's pre-compaction is still running after %.1f s; this request's "
                "summaries are extractive",
                request.session_id,
                left,
            )
        except Exception:  # logged by `_done`; the request compacts on its own
            pass

    async def settled(self) -> None:
        """Until no pre-compaction is running (what a test or a benchmark waits for)."""
        while self._running:
            await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def close(self, grace_s: float = CLOSE_GRACE_S) -> None:
        """Stop the pre-compactions (shutdown): a summarizer call under way may finish within `grace_s`, so its
        connection is closed cleanly and its summary kept; the rest is cancelled and redone when next needed."""
        tasks = list(self._running.values())
        if tasks and grace_s > 0:
            await asyncio.wait(tasks, timeout=grace_s)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _done(self, key: tuple[str, str], task: asyncio.Task[None]) -> None:
        self._running.pop(key, None)
        if not task.cancelled() and task.exception() is not None:
            log.warning("pre-compaction of session %s failed: %s", key[1], task.exception())

    async def _run(self, request: CompactionRequest, policy: Policy, key: tuple[str, str], idle: Idle | None) -> None:
        async with self._slots, self._fleet_lock(request, wait=False) as held:
            if held:  # else another replica is writing this session's next spans
                written = await self._write_ahead(request, policy)
                if written == 0 and idle is not None:
                    self._idle[key] = idle
                    while len(self._idle) > IDLE_SESSIONS:
                        self._idle.popitem(last=False)

    @contextlib.asynccontextmanager
    async def _fleet_lock(self, request: CompactionRequest, *, wait: bool) -> AsyncIterator[bool]:
        """The session's pre-compaction lock across the replicas sharing the store: True if held for the block."""
        if self._locks is None:
            yield True
            return
        name = lock_name("precompaction", request.tenant, request.session_id)
        if wait:
            async with self._locks.lock(name):
                yield True
        else:
            async with self._locks.try_lock(name) as held:
                yield held


def _idle(path: Sequence[StoredMessage], tokens: int, summaries: int, policy: Policy) -> Idle | None:
    if not path:
        return None
    tip = path[-1]
    return (tip.id, tip.depth, len(path), tokens, summaries, policy)
