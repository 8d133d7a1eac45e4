"""The summarizer's circuit breaker (issue 42): after repeated failures the summarizer is skipped for a cool-down
and summaries are extractive meanwhile, with no call and no wait; a call that ran out of time opens it at once.
Driven through the upstream seam (`ScriptedUpstream`) with a clock that moves only when the test says so."""

from __future__ import annotations

import asyncio

from proxy.budget.budgets import Budgets
from proxy.compaction.breaker import SummarizerBreaker
from proxy.compaction.compactor import Compactor
from proxy.compaction.span_store import SpanStore
from proxy.compaction.summarizer import FALLBACK_MODEL, Summarizer
from proxy.config.schema import ContextConfig
from proxy.history.store import History
from proxy.store.database import Database
from tests.support.scripted_upstream import ScriptedUpstream, completion, server_error
from tests.unit.compaction.test_compaction_robustness import ManualClock
from tests.unit.compaction.test_span_store import ENTRY, TENANT, conversation, request, stored_path, total

MESSAGES = [{"role": "user", "content": "Maria adopted a beagle named Biscuit in March."}]
CONFIG = ContextConfig(summarizer_failures=3, summarizer_cooldown_s=60.0)


def summarizer(upstream: ScriptedUpstream, clock: ManualClock, config: ContextConfig = CONFIG) -> Summarizer:
    budgets = Budgets((ENTRY,), lambda model: None, config.safety_margin)
    breaker = SummarizerBreaker(config.summarizer_failures, config.summarizer_cooldown_s, clock)
    return Summarizer(upstream, None, budgets, config, breaker=breaker)


async def test_after_repeated_failures_the_summarizer_is_skipped_until_the_cool_down_ends() -> None:
    clock, upstream = ManualClock(), ScriptedUpstream()
    writer = summarizer(upstream, clock)
    for _ in range(3):
        upstream.refuse(server_error())
        assert (await writer.summarize(MESSAGES, 64, ENTRY)).generated_by == "fallback"
    assert len(upstream.calls) == 3
    assert not writer.available(ENTRY)

    skipped = await writer.summarize(MESSAGES, 64, ENTRY)  # an unscripted call would fail the test
    assert (skipped.generated_by, skipped.model) == ("fallback", FALLBACK_MODEL)
    assert "Biscuit" in skipped.content
    assert len(upstream.calls) == 3

    clock.now += 59.0
    assert not writer.available(ENTRY)
    clock.now += 2.0
    assert writer.available(ENTRY)
    upstream.reply(completion("Maria adopted Biscuit."))
    assert (await writer.summarize(MESSAGES, 64, ENTRY)).generated_by == "llm"
    assert len(upstream.calls) == 4


async def test_a_failure_after_the_cool_down_opens_it_again_and_a_success_closes_it() -> None:
    clock, upstream = ManualClock(), ScriptedUpstream()
    writer = summarizer(upstream, clock)
    for _ in range(3):
        upstream.refuse(server_error())
        await writer.summarize(MESSAGES, 64, ENTRY)
    clock.now += 61.0
    upstream.refuse(server_error())
    await writer.summarize(MESSAGES, 64, ENTRY)
    assert not writer.available(ENTRY)  # the trial call failed: another cool-down at once

    clock.now += 61.0
    upstream.reply(completion("Maria adopted Biscuit."))
    await writer.summarize(MESSAGES, 64, ENTRY)
    upstream.refuse(server_error())
    await writer.summarize(MESSAGES, 64, ENTRY)
    assert writer.available(ENTRY)  # one failure after a success is not "repeated"


async def test_failures_that_are_not_in_a_row_never_open_it() -> None:
    clock, upstream = ManualClock(), ScriptedUpstream()
    writer = summarizer(upstream, clock)
    for _ in range(5):
        upstream.refuse(server_error())
        upstream.refuse(server_error())
        upstream.reply(completion("fine"))
        for _ in range(3):
            await writer.summarize(MESSAGES, 64, ENTRY)
    assert writer.available(ENTRY)
    assert len(upstream.calls) == 15


async def test_a_summarizer_that_timed_out_makes_no_later_request_wait(db: Database) -> None:
    history, summaries = History(db), SpanStore(db)
    config = ContextConfig(summarizer_deadline_s=0.2, summarizer_failures=3, summarizer_cooldown_s=60.0)
    clock, upstream = ManualClock(), ScriptedUpstream()
    upstream.reply(completion("never in time")).hold()
    compactor = Compactor(config, summaries, summarizer(upstream, clock, config))
    first = await stored_path(history, conversation(10))

    await asyncio.wait_for(compactor.prepare(request(first, total(first) - 50)), 10)
    assert len(upstream.calls) == 1

    second = await stored_path(history, conversation(12, " again"), session="s2")
    prepared = await asyncio.wait_for(compactor.prepare(request(second, total(second) - 50, "s2")), 10)

    assert len(upstream.calls) == 1  # the second request did not call (nor wait for) the summarizer
    assert prepared.written >= 1
    assert {s.generated_by for s in await summaries.on_path(TENANT, second)} == {"fallback"}
