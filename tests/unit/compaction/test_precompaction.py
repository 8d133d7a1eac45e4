"""Background pre-compaction's bookkeeping (`Precompactions`), with a counting write-ahead: a run that found
nothing to write is not repeated for a request that would read the same, and is for one that would not."""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.compaction.builder import Policy
from proxy.compaction.layout import MIN_COMPACT_TO
from proxy.compaction.precompaction import Precompactions, ahead_policy
from proxy.compaction.spans import CompactionRequest
from proxy.config.schema import ContextConfig
from proxy.history.store import History
from proxy.store.database import Database
from tests.unit.compaction.test_span_store import conversation, request, stored_path, total


class WriteAhead:
    """Counts its runs and writes `writes` spans in each (as the compactor's loop would report)."""

    def __init__(self, writes: int) -> None:
        self.writes = writes
        self.runs = 0

    async def __call__(self, request: CompactionRequest, policy: Policy) -> int:
        self.runs += 1
        return self.writes


async def started(ahead: Precompactions, asked: CompactionRequest, tokens: int, summaries: int = 0) -> None:
    ahead.start(asked, Policy(budget=asked.budget), tokens, 0, ahead=False, summaries=summaries)
    await asyncio.wait_for(ahead.settled(), 10)


async def test_a_run_that_wrote_nothing_is_not_repeated_on_the_same_path(db: Database) -> None:
    path = await stored_path(History(db), conversation(10))
    budget = int(total(path) / 0.85)
    write_ahead = WriteAhead(writes=0)
    ahead = Precompactions(ContextConfig(), write_ahead, time.monotonic)

    for _ in range(3):
        await started(ahead, request(path, budget), total(path))
    assert write_ahead.runs == 1

    await started(ahead, request(path, budget), total(path), summaries=1)  # the working context changed
    assert write_ahead.runs == 2
    await started(ahead, request(path, budget + 100), total(path), summaries=1)  # so did the policy
    assert write_ahead.runs == 3


async def test_a_grown_path_or_a_run_that_wrote_starts_again(db: Database) -> None:
    history = History(db)
    messages = conversation(10)
    path = await stored_path(history, messages)
    budget = int(total(path) / 0.85)
    idle = WriteAhead(writes=0)
    ahead = Precompactions(ContextConfig(), idle, time.monotonic)
    await started(ahead, request(path, budget), total(path))
    grown = await stored_path(history, [*messages, {"role": "user", "content": "and then?"}])
    await started(ahead, request(grown, budget), total(path))
    assert idle.runs == 2

    writing = WriteAhead(writes=1)
    busy = Precompactions(ContextConfig(), writing, time.monotonic)
    for _ in range(3):
        await started(busy, request(path, budget), total(path))
    assert writing.runs == 3


def test_a_precompaction_aims_at_the_crossings_target_less_the_room_left_before_it() -> None:
    floor, growth = 23, 100
    filling = Policy(budget=7_270, headroom_turns=8, summary_share=0.3)
    aim = ahead_policy(filling, 6_000, floor, 0.8)
    assert aim.trigger_ratio == 0.8
    assert aim.target(floor, growth) == filling.target(floor, growth) - (7_270 - 6_000) == 7_270 - 800 - 1_270
    # With the headroom off, as before: `compact_to` less the share of the free space still left.
    plain = Policy(budget=7_270)
    free = 7_270 - floor
    before = plain.level(max(MIN_COMPACT_TO, plain.compact_to - (7_270 - 6_000) / free), floor)
    assert ahead_policy(plain, 6_000, floor, 0.8).target(floor, growth) == pytest.approx(before, abs=1)
