"""The per-session plan memo (`PlanCache`): over random sessions asked random sequences of questions, what it returns
is what `build` computes from scratch, and it answers from memory only for the very same question; a long path's
plan is built in a worker thread."""

from __future__ import annotations

import asyncio
import random
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.compaction import plans as plans_module
from proxy.compaction.builder import BuildResult, Policy, build
from proxy.compaction.groups import Cuts
from proxy.compaction.layout import Item
from proxy.compaction.path_items import PathState
from proxy.compaction.plans import OFF_LOOP_ITEMS, PlanCache
from proxy.compaction.span_store import StoredSpan
from proxy.config.schema import SUMMARIZE, TOOL_RESULTS

SESSION = ("t", "s")


def session_items(rng: random.Random, messages: int) -> list[Item]:
    items = [Item("system", rng.randint(5, 50))]
    while len(items) < messages:
        items.append(Item("user", rng.randint(10, 300)))
        if rng.random() < 0.5:
            call = f"call_{len(items)}"
            items.append(Item("assistant", rng.randint(5, 40), tool_call_ids=(call,)))
            items.append(Item("tool", rng.randint(50, 900), tool_call_id=call, stub_tokens=12))
        items.append(Item("assistant", rng.randint(10, 300)))
    return items[:messages]


def stored_span(rng: random.Random, identity: int, count: int) -> StoredSpan:
    start = rng.randint(1, max(1, count - 2))
    end = rng.randint(start, max(start, count - 1))
    strategy = rng.choice((SUMMARIZE, TOOL_RESULTS))
    return StoredSpan(
        id=identity, start_depth=start, end_depth=end, end_id=f"m{end}", content="summary", tokens=rng.randint(20, 80),
        original_tokens=500, model="m", generated_by="llm", replaces=(), orphaned_at=None, created_at=0.0,
        strategy=strategy, held=rng.choice((0, 0, identity)),
    )  # fmt: skip


def ask(plans: PlanCache, *args: Any, **kwargs: Any) -> BuildResult:
    """`PlanCache.plan` from a test that runs no loop (paths shorter than `OFF_LOOP_ITEMS`: no thread)."""
    return asyncio.run(plans.plan(*args, **kwargs))


@pytest.mark.slow
@given(st.integers(0, 2**32 - 1), st.integers(2, 60), st.integers(2, 12))
@settings(max_examples=150, deadline=None)
def test_a_remembered_plan_is_the_plan_built_from_scratch(seed: int, messages: int, questions: int) -> None:
    rng = random.Random(seed)
    plans = PlanCache()
    items = session_items(rng, messages)
    spans: list[StoredSpan] = []
    policy = Policy(budget=rng.randint(200, 6000), strategies=(TOOL_RESULTS, SUMMARIZE))
    cuts = Cuts.of(items)
    for question in range(questions):
        change = rng.choice(("same", "same", "grow", "span", "policy", "copy", "compacting"))
        compacting = change == "compacting"
        if change == "grow":
            items = items + session_items(rng, rng.randint(1, 4))[1:] or items
        elif change == "span":
            spans = [*spans, stored_span(rng, question + 1, len(items))]
        elif change == "policy":
            policy = Policy(budget=rng.randint(200, 6000), strategies=policy.strategies)
        elif change == "copy":  # equal items, not the cached objects: asked again, not remembered
            items = [Item(i.role, i.tokens, i.tool_call_ids, i.tool_call_id, i.pinned, i.stub_tokens) for i in items]
        cuts = Cuts.of(items, cuts)  # carried over the session's growth, as `PathReader` does
        state = PathState(items, {}, cuts)
        fresh = build(items, [span.span for span in spans], policy, compacting=compacting)
        assert ask(plans, SESSION, state, spans, policy, compacting=compacting) == fresh
        assert ask(plans, SESSION, state, spans, policy, compacting=compacting) == fresh


def test_only_the_same_question_is_answered_from_memory() -> None:
    rng = random.Random(7)
    plans = PlanCache(sessions=1)
    items = session_items(rng, 40)
    policy = Policy(budget=800)
    state = PathState(items, {}, Cuts.of(items))
    first = ask(plans, SESSION, state, [], policy)
    same = PathState(list(items), {}, state.cuts)
    assert ask(plans, SESSION, same, [], policy) is first  # the same items, in a new list
    assert ask(plans, SESSION, state, [], Policy(budget=801)) is not first
    again = ask(plans, SESSION, state, [], policy)
    assert again == first
    assert again is not first
    ask(plans, ("t", "other"), state, [], policy)  # one session remembered: the first is forgotten
    assert ask(plans, SESSION, state, [], policy) is not again


@pytest.mark.parametrize("messages", [OFF_LOOP_ITEMS - 1, OFF_LOOP_ITEMS])
async def test_a_long_path_is_planned_in_a_worker_thread_and_remembered(
    messages: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction builds once or twice a round, each session compacting a path at once too: from
    `OFF_LOOP_ITEMS` messages on, not on the event loop."""
    threads: list[int] = []

    def recorded(*args: Any, **kwargs: Any) -> BuildResult:
        threads.append(threading.get_ident())
        return build(*args, **kwargs)

    monkeypatch.setattr(plans_module, "build", recorded)
    rng = random.Random(3)
    items = session_items(rng, messages)
    state = PathState(items, {}, Cuts.of(items))
    spans = [stored_span(rng, 1, messages)]
    policy = Policy(budget=2_000, strategies=(TOOL_RESULTS, SUMMARIZE))
    plans = PlanCache()

    planned = await plans.plan(SESSION, state, spans, policy, compacting=True)

    assert planned == build(items, [span.span for span in spans], policy, compacting=True)
    assert (threads[0] != threading.get_ident()) == (messages >= OFF_LOOP_ITEMS)
    assert await plans.plan(SESSION, state, spans, policy, compacting=True) is planned
    assert len(threads) == 1
