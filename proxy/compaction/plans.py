"""The last plan built for each session, reused when a request asks the builder the very same question.

`build` is a pure function of the path's items, the spans in force and the policy, and a client re-sending the
same request (a retry, a regenerated answer, a benchmark) asks it the same question again: on a long session
that is a walk over every message and span. The items and spans are the cached objects `PathReader` and
`SpanStore` hand out for the same message and row, so "the same question" is checked by identity, at C speed;
any change (a new message, a pin, a span written, released or orphaned, an evicted cache entry) misses, and the
builder runs. Bounded, per process, correct to lose. `plan` builds a long path in a worker thread.
"""

from __future__ import annotations

import asyncio
import functools
import operator
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.compaction.builder import BuildResult, Policy, build
from proxy.compaction.layout import Item, Span
from proxy.compaction.path_items import PathState
from proxy.compaction.span_store import StoredSpan

PLAN_SESSIONS = 1_000
"""Sessions whose last plan is remembered (each holds its path's item list, ~8 bytes per message)."""
OFF_LOOP_ITEMS = 1_000
"""Items past which `plan` builds in a worker thread (a build takes ~5 ms a thousand messages). A path compacted
from nothing is built once or twice a round for tens of rounds, by each session compacting it at once: on the
event loop, the builds of 20 sessions woken by one shared span left `/healthz` unanswered for ~0.8 s."""


@dataclass(frozen=True)
class _Plan:
    items: Sequence[Item]
    spans: tuple[StoredSpan, ...]
    policy: Policy
    compacting: bool
    result: BuildResult

    def answers(self, items: Sequence[Item], spans: tuple[StoredSpan, ...], policy: Policy, compacting: bool) -> bool:
        return (
            compacting == self.compacting
            and policy == self.policy
            and len(items) == len(self.items)
            and len(spans) == len(self.spans)
            and all(map(operator.is_, spans, self.spans))
            and all(map(operator.is_, items, self.items))
        )


class PlanCache:
    def __init__(self, sessions: int = PLAN_SESSIONS) -> None:
        self._sessions = sessions
        self._last: OrderedDict[tuple[str, str], _Plan] = OrderedDict()
        """(tenant, session) → the last plan built for it."""

    async def plan(
        self,
        session: tuple[str, str],
        state: PathState,
        spans: Sequence[StoredSpan],
        policy: Policy,
        *,
        compacting: bool = False,
    ) -> BuildResult:
        """`build(state.items, spans, policy, compacting=...)`, the session's last result when asked the same;
        made in a worker thread for a path of `OFF_LOOP_ITEMS` or more."""
        stored = tuple(spans)
        result = self._recalled(session, state, stored, policy, compacting)
        if result is None:
            result = await planned(state, [span.span for span in stored], policy, compacting=compacting)
            self._remember(session, _Plan(state.items, stored, policy, compacting, result))
        return result

    def _recalled(
        self,
        session: tuple[str, str],
        state: PathState,
        stored: tuple[StoredSpan, ...],
        policy: Policy,
        compacting: bool,
    ) -> BuildResult | None:
        last = self._last.get(session)
        if last is None or not last.answers(state.items, stored, policy, compacting):
            return None
        self._last.move_to_end(session)
        return last.result

    def _remember(self, session: tuple[str, str], plan: _Plan) -> None:
        self._last[session] = plan
        self._last.move_to_end(session)
        while len(self._last) > self._sessions:
            self._last.popitem(last=False)


async def planned(state: PathState, spans: Sequence[Span], policy: Policy, *, compacting: bool) -> BuildResult:
    """`build` of `state`'s items, in a worker thread when they are `OFF_LOOP_ITEMS` or more: it is pure, and
    nothing it reads (items, cut points, spans, policy) is ever changed in place."""
    work = functools.partial(build, state.items, spans, policy, compacting=compacting, cuts=state.cuts)
    return work() if len(state.items) < OFF_LOOP_ITEMS else await asyncio.to_thread(work)
