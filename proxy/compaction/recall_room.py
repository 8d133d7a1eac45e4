"""How much room a turn's recall gets, and whether it fills that room (pure).

Between two crossings the context grows back from the crossing's target to the budget, so a question is asked
anywhere in between; what the budget leaves it is recall's (`recall.Recall.passages`), just before the question
and for that turn only (docs/architecture.md, invariant 6). Two things keep the prompt cacheable:
- the room is what the budget leaves the turn's first request less one turn's growth (`groups.request_growth`,
  before the question): the same at each of the turn's requests, whose tool steps are that growth, so the recall
  and the prompt after it stay as sent; a turn that outgrows it gets what is left, for what the question asks
  only;
- the next turn sends again, uncached, what followed the recall (a turn), so the room is filled only when that
  brings at least as much as it costs: a chat's turns are small, an agent's turn of tool outputs is not.
A turn that cannot go on in tool steps (its request declares no tools and its path calls none: a chat's) is one
request: nothing follows its recall within the turn, so its fill takes all the budget leaves (invariant 9: a
question's context is as full as a sliding window's), while what the question asks about stays within
`context.recall_tokens`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RecallRoom:
    tokens: int
    """What the recall message may cost (its acknowledgements aside); ≤ 0: no recall."""
    fill: bool
    """Fill it past what the question asks about (`Recall.passages`' `fill`)."""
    asked: int | None = None
    """What the passages the question asks about (its hits and the turns sharing its words) may cost of it;
    None: all of it."""


def recall_room(
    *,
    budget: int,
    tokens: int,
    turn: int,
    growth: int,
    acknowledgements: int,
    limit: int,
    fill: bool,
    steps: bool = True,
) -> RecallRoom:
    """The room for a recall in a context of `tokens` (of which `turn` follow the question: its turn's steps so
    far) under `budget`; `growth`: what one turn adds; `acknowledgements`: what the recall's two cost; `limit`:
    `context.recall_tokens`; `fill`: `context.recall_fill`; `steps`: the turn may go on in tool steps (false: it
    is one request, and a fill takes all the budget leaves)."""
    if not steps:
        left = budget - tokens - acknowledgements
        if fill and left >= growth:
            return RecallRoom(left, fill=True, asked=min(limit, left))
        return RecallRoom(min(limit, left), fill=False)
    stable = min(limit, budget - (tokens - turn) - growth - acknowledgements)
    if stable < 0 or tokens + stable + acknowledgements > budget:
        return RecallRoom(min(limit, budget - tokens - acknowledgements), fill=False)
    return RecallRoom(stable, fill=fill and stable >= growth)
