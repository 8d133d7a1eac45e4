"""What each step of a session cost, from what the journal keeps of it, with the summarizer's calls put in.

A step keeps the upstream's usage (what it billed: sent, cached, written to the cache, completion) and its
context report (what the proxy counted it sent, and `history_tokens`: the whole conversation, which is what the
client's request would have sent without the proxy). The summarizer's calls (`proxy.compaction.summarizer_calls`)
run in the background across steps: each is put in the step during which it ended (the latest step that started
before it ended; one before any step goes to the first). Read by `GET /sessions/{id}` (`cost`) and the dashboard.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.cost import TokenCost


@dataclass(frozen=True)
class StepCost:
    step_id: int
    created_at: float
    status: str
    model: str
    upstream: TokenCost
    """The upstream's usage of the step's answer (zeros when it reported none, e.g. a failed step)."""
    counted: int
    """What the proxy counted it sent (the working context)."""
    requested: int
    """The conversation the working context stands for: what the request would have sent without the proxy."""
    summarizer: TokenCost = field(default_factory=TokenCost)
    summarizer_calls: int = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "step_id": self.step_id,
            "created_at": self.created_at,
            "status": self.status,
            "model": self.model,
            **self.upstream.as_json(),
            "counted_tokens": self.counted,
            "requested_tokens": self.requested,
            "summarizer_tokens": self.summarizer.sent + self.summarizer.completion,
            "summarizer_calls": self.summarizer_calls,
        }


def with_summarizer_calls(steps: Sequence[StepCost], calls: Sequence[tuple[float, TokenCost]]) -> list[StepCost]:
    """`steps` (oldest first) with each summarizer call (its end time, its cost) added to its step."""
    if not steps:
        return []
    starts = [step.created_at for step in steps]
    costs = [TokenCost()] * len(steps)
    counts = [0] * len(steps)
    for ended_at, cost in calls:
        index = max(0, bisect.bisect_right(starts, ended_at) - 1)
        costs[index] = costs[index] + cost
        counts[index] += 1
    return [
        replace(step, summarizer=step.summarizer + costs[index], summarizer_calls=step.summarizer_calls + counts[index])
        for index, step in enumerate(steps)
    ]


def session_cost(steps: Sequence[StepCost]) -> dict[str, Any]:
    """A session's totals: what the upstream billed, the cached share of it, the summarizer's share, and what the
    client's requests would have sent without the proxy."""
    upstream = sum((step.upstream for step in steps), TokenCost())
    summarizer = sum((step.summarizer for step in steps), TokenCost())
    return {
        "steps": len(steps),
        **upstream.as_json(),
        "cached_share": round(upstream.cached / upstream.sent, 4) if upstream.sent else None,
        "counted_tokens": sum(step.counted for step in steps),
        "requested_tokens": sum(step.requested for step in steps),
        "summarizer_calls": sum(step.summarizer_calls for step in steps),
        "summarizer_prompt_tokens": summarizer.sent,
        "summarizer_cached_tokens": summarizer.cached,
        "summarizer_completion_tokens": summarizer.completion,
    }
