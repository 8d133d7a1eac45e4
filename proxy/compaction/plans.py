"""The last plan built for each session, reused when a request asks the builder the very same question.

`build` is a pure function of the path's items, the spans in force and the policy, and a client re-sending the
same request (a retry, a regenerated answer, a benchmark) asks it the same question again: on a long session
that is a walk over every message and span. The items and spans are the cached objects `PathReader` and
`SpanStore` hand out for the same message and row, so "the same question" is checked by identity, at C speed;
any change (a new message, a pin, a span written, released or orphaned, an evicted cache entry) misses, and the
builder runs. Bounded, per process, correct to lose.
"""

from __future__ import annotations

import operator
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.compaction.builder import BuildResult, Policy, build
from proxy.compaction.layout import Item
from proxy.compaction.path_items import PathState
from proxy.compaction.span_store import StoredSpan

PLAN_SESSIONS = 1_000
"""Sessions whose last plan is remembered (each holds its path's item list, ~8 bytes per message)."""


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


class Plans:
    def __init__(self, sessions: int = PLAN_SESSIONS) -> None:
        self._sessions = sessions
        self._last: OrderedDict[tuple[str, str], _Plan] = OrderedDict()
        """(tenant, session) → the last plan built for it."""

    def build(
        self,
        session: tuple[str, str],
        state: PathState,
        spans: Sequence[StoredSpan],
        policy: Policy,
        *,
        compacting: bool = False,
    ) -> BuildResult:
        """`build(state.items, spans, policy, compacting=...)`, the session's last result when asked the same."""
        items = state.items
        stored = tuple(spans)
        last = self._last.get(session)
        if last is not None and last.answers(items, stored, policy, compacting):
            self._last.move_to_end(session)
            return last.result
        result = build(items, [span.span for span in stored], policy, compacting=compacting, cuts=state.cuts)
        self._last[session] = _Plan(items, stored, policy, compacting, result)
        self._last.move_to_end(session)
        while len(self._last) > self._sessions:
            self._last.popitem(last=False)
        return result
