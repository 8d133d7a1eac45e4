"""The corrections learned from an upstream's context-window refusals: what is learned, what is not believed, how
long it lasts, how the replicas share it, and the operator's reset."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import Any

import pytest

from proxy.budget.budgets import Budgets
from proxy.budget.corrections import (
    DEFAULT_TTL_S,
    FALLBACK_FACTOR_STEP,
    HEADROOM,
    MAX_FACTOR,
    Refused,
    TokenCorrections,
    implausible,
)
from proxy.budget.limits import ModelLimits
from proxy.budget.shared_corrections import SharedCorrections
from proxy.config.models import ModelEntry
from proxy.errors import ContextOverflow
from proxy.store.database import Database
from proxy.upstream.context_window import context_overflow, unquoted

NOW = 1_800_000_000.0
TTL = 3600.0


def unknown(model: str) -> Mapping[str, Any] | None:
    return None


def counted(prompt: int | None = None, window: int | None = None) -> ContextOverflow:
    return ContextOverflow(prompt_tokens=prompt, context_window=window)


def sent(tokens: int, reserved: int = 0, budget: int | None = None) -> Refused:
    return Refused(tokens, reserved, tokens if budget is None else budget)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


# What one refusal teaches.


def test_a_counted_refusal_shrinks_that_models_budget_by_the_ratio() -> None:
    corrections = TokenCorrections()

    learned = corrections.learn("small", sent(1000), counted(1200), 4096, NOW)

    assert learned is not None
    assert learned.factor == pytest.approx(1.2 * HEADROOM)
    assert corrections.apply("small", 3379, NOW) == math.floor(3379 / (1.2 * HEADROOM))
    assert corrections.apply("big", 3379, NOW) == 3379


def test_a_refusal_that_explains_nothing_shrinks_by_a_fixed_step_up_to_a_limit() -> None:
    corrections = TokenCorrections()

    assert (first := corrections.learn("m", sent(1000), counted(), 4096, NOW)) is not None
    assert first.factor == pytest.approx(FALLBACK_FACTOR_STEP)
    assert (second := corrections.learn("m", sent(1000), counted(900), 4096, NOW)) is not None
    assert second.factor == pytest.approx(FALLBACK_FACTOR_STEP**2)
    for _ in range(20):
        corrections.learn("m", sent(1000), counted(), 4096, NOW)
    assert corrections.factor("m", NOW) == MAX_FACTOR
    # At the limit nothing tighter is learned: the caller does not retry a request that would be the same.
    assert corrections.learn("m", sent(1000), counted(), 4096, NOW) is None


def test_a_factor_never_shrinks_back_while_it_holds() -> None:
    corrections = TokenCorrections()
    corrections.learn("m", sent(1000), counted(1500), 4096, NOW)

    again = corrections.learn("m", sent(1000), counted(1100), 4096, NOW)

    assert again is not None
    assert again.factor == pytest.approx(1.5 * HEADROOM * HEADROOM)


def test_a_smaller_reported_window_is_learned_without_shrinking_the_factor_when_the_counts_agree() -> None:
    corrections = TokenCorrections()

    learned = corrections.learn("m", sent(3000), counted(3000, 2048), 4096, NOW)

    assert learned is not None
    assert (learned.factor, learned.window) == (1.0, 2048)


def test_a_reported_window_no_smaller_than_ours_is_not_learned() -> None:
    corrections = TokenCorrections()

    corrections.learn("m", sent(1000), counted(1270, 4096), 4096, NOW)

    assert corrections.window("m", NOW) is None
    assert corrections.factor("m", NOW) == pytest.approx(1.27 * HEADROOM)


def test_a_correction_lasts_its_lifetime_and_then_the_configured_limits_hold_again() -> None:
    corrections = TokenCorrections(TTL)
    corrections.learn("m", sent(3000), counted(3600, 2048), 4096, NOW)

    assert (corrections.factor("m", NOW + TTL - 1), corrections.window("m", NOW + TTL - 1)) == (
        pytest.approx(1.2 * HEADROOM),
        2048,
    )
    assert (corrections.factor("m", NOW + TTL), corrections.window("m", NOW + TTL)) == (1.0, None)
    # Refused again after it expired: learned from scratch, not on top of the expired factor.
    again = corrections.learn("m", sent(3000), counted(3300), 4096, NOW + TTL)
    assert again is not None
    assert again.factor == pytest.approx(1.1 * HEADROOM)


# What is not believed: a refusal that cannot be the upstream's verdict on what was sent.


@pytest.mark.parametrize(
    ("case", "refused", "reported"),
    [
        ("the quoted attack: a 50-token window, a million tokens", sent(2000, 1024), counted(999_999, 50)),
        ("32 tokens sent", sent(32, 1024), counted()),
        ("a window under a quarter of the configured", sent(6000, 1024), counted(7000, 1000)),
        ("a count over MAX_FACTOR times ours", sent(6000, 1024), counted(int(6000 * MAX_FACTOR) + 1)),
        ("no counts, well inside the budget", sent(3000, 1024, budget=7000), counted()),
    ],
)
def test_an_implausible_refusal_is_named_as_such(case: str, refused: Refused, reported: ContextOverflow) -> None:
    assert implausible(refused, reported, 8192) is not None


@pytest.mark.parametrize(
    ("case", "refused", "reported"),
    [
        ("llama.cpp with a quarter of the configured window", sent(2063, 1024), counted(2063, 2048)),
        ("a tokenizer counting 27 % more", sent(6900, 1024, budget=6963), counted(8763, 8192)),
        ("no counts, near the budget", sent(6500, 1024, budget=6963), counted()),
        ("a count below ours", sent(6500, 1024, budget=6963), counted(6400)),
    ],
)
def test_a_refusal_a_real_upstream_gives_is_believed(case: str, refused: Refused, reported: ContextOverflow) -> None:
    assert implausible(refused, reported, 8192) is None


# The upstream's words, not the client's.

QUOTED = "This model's maximum context length is 50 tokens. However, your messages resulted in 999999 tokens."


def test_a_refusal_whose_sentence_the_client_sent_is_not_a_context_refusal() -> None:
    overflow = context_overflow(400, {"type": "invalid_request_error"}, f"Invalid value: '{QUOTED}'")
    assert overflow is not None
    assert overflow.context_window == 50
    messages = [{"role": "user", "content": [{"type": "text", "text": f"Say: {QUOTED.upper()}"}]}]

    assert unquoted(overflow, (messages, {})) is None
    # In a parameter, too (a tool's description, metadata).
    assert unquoted(overflow, ([], {"tools": [{"function": {"description": QUOTED}}]})) is None


def test_a_coded_refusal_quoting_the_client_keeps_only_its_code() -> None:
    overflow = context_overflow(400, {"code": "context_length_exceeded"}, f"Invalid: '{QUOTED}'")
    assert overflow is not None

    assert unquoted(overflow, ([{"role": "user", "content": QUOTED}], {})) == ContextOverflow(coded=True)


def test_the_upstreams_own_sentence_is_kept() -> None:
    overflow = context_overflow(400, {"code": "context_length_exceeded"}, QUOTED)
    assert overflow is not None

    assert unquoted(overflow, ([{"role": "user", "content": "a long conversation"}], {"user": "u"})) is overflow


# Budgets: what the request path and the views ask.

LLAMA_CPP_REFUSAL = ContextOverflow(prompt_tokens=2063, context_window=2048)
"""What llama.cpp's "request (2063 tokens) exceeds the available context size (2048 tokens)" reports."""


async def test_budgets_learn_the_ratio_from_the_refusal_of_another_provider() -> None:
    local = ModelEntry("local", "openai/smollm2", "http://127.0.0.1:8080/v1", None, 2048, 256)
    budgets = Budgets((local,), unknown, 0.05)
    before = budgets.budget(local).input_budget

    learned = await budgets.learn(local, sent(1624, 256), LLAMA_CPP_REFUSAL)

    assert learned is not None
    assert learned.factor == pytest.approx(2063 / 1624 * HEADROOM)
    assert budgets.budget(local).input_budget == math.floor(before / learned.factor)
    assert budgets.limits(local) == ModelLimits(2048, 256, "config")


async def test_budgets_use_the_smaller_window_the_upstream_reported() -> None:
    configured = ModelEntry("local", "openai/smollm2", "http://127.0.0.1:8080/v1", None, 8192, 1024)
    budgets = Budgets((configured,), unknown, 0.05)

    await budgets.learn(configured, sent(2063, 1024), LLAMA_CPP_REFUSAL)

    assert budgets.limits(configured) == ModelLimits(2048, 1024, "upstream")
    assert budgets.budget(configured).input_budget == 2048 - 1024 - math.ceil(0.05 * 2048)


async def test_an_implausible_refusal_changes_no_budget() -> None:
    entry = ModelEntry("echo", "openai/echo", "http://127.0.0.1:8080/v1", None, 32768, 4096)
    budgets = Budgets((entry,), unknown, 0.05)
    before = budgets.budget(entry)

    assert await budgets.learn(entry, sent(2000, 4096), ContextOverflow(999_999, 50)) is None

    assert budgets.budget(entry) == before
    assert budgets.corrections() == []


async def test_what_one_replica_learns_the_others_adopt_and_keep_across_restarts(db: Database) -> None:
    local = ModelEntry("local", "openai/smollm2", "http://127.0.0.1:8080/v1", None, 8192, 1024)
    first, second = (Budgets((local,), unknown, 0.05, SharedCorrections(db, DEFAULT_TTL_S)) for _ in range(2))
    before = second.budget(local).input_budget

    learned = await first.learn(local, sent(1500, 1024), ContextOverflow(prompt_tokens=1800, context_window=None))
    assert learned is not None
    assert second.budget(local).input_budget == before  # until it reads what the other learned
    await second.refresh()

    assert second.budget(local).input_budget == math.floor(before / learned.factor)
    # The second replica's own refusal builds on what it adopted; a restart starts from what the fleet knows.
    again = await second.learn(local, sent(2000, 1024), ContextOverflow(prompt_tokens=2063, context_window=4096))
    assert again is not None
    assert again.factor > learned.factor
    # A looser refusal learned by the first (which has not read the store since) does not loosen the store's.
    await first.learn(local, sent(1500, 1024), ContextOverflow(prompt_tokens=1600, context_window=None))
    restarted = Budgets((local,), unknown, 0.05, SharedCorrections(db, DEFAULT_TTL_S))
    await restarted.refresh()
    assert restarted.limits(local) == ModelLimits(4096, 1024, "upstream")
    assert [(row.factor, row.window) for row in await SharedCorrections(db, DEFAULT_TTL_S).read(time.time())] == [
        (again.factor, 4096)
    ]
    assert restarted.budget(local).input_budget == math.floor((4096 - 1024 - math.ceil(0.05 * 4096)) / again.factor)


async def test_an_expired_correction_is_neither_read_nor_merged_into_a_new_one(db: Database) -> None:
    local = ModelEntry("local", "openai/smollm2", "http://127.0.0.1:8080/v1", None, 8192, 1024)
    clock = Clock()
    first = Budgets((local,), unknown, 0.05, SharedCorrections(db, TTL), ttl_s=TTL, clock=clock)
    await first.learn(local, sent(3000, 1024), ContextOverflow(prompt_tokens=6000, context_window=4096))

    clock.now += TTL
    second = Budgets((local,), unknown, 0.05, SharedCorrections(db, TTL), ttl_s=TTL, clock=clock)
    await second.refresh()
    assert second.corrections() == []
    assert first.limits(local) == ModelLimits(8192, 1024, "config")
    learned = await second.learn(local, sent(6000, 1024), ContextOverflow(prompt_tokens=6600, context_window=None))

    assert learned is not None
    rows = await SharedCorrections(db, TTL).read(clock.now)
    assert [(row.factor, row.window) for row in rows] == [(pytest.approx(1.1 * HEADROOM), None)]


async def test_the_operators_reset_reaches_every_replica(db: Database) -> None:
    entries = tuple(
        ModelEntry(name, "openai/smollm2", "http://127.0.0.1:8080/v1", None, 8192, 1024) for name in ("a", "b")
    )
    first, second = (Budgets(entries, unknown, 0.05, SharedCorrections(db, TTL), ttl_s=TTL) for _ in range(2))
    for entry in entries:
        await first.learn(entry, sent(3000, 1024), ContextOverflow(prompt_tokens=3600, context_window=None))
    await second.refresh()
    assert [correction.model for correction in second.corrections()] == ["a", "b"]

    assert await first.forget("a") == ["a"]
    await second.refresh()
    assert [correction.model for correction in second.corrections()] == ["b"]
    assert second.budget(entries[0]).input_budget == 8192 - 1024 - math.ceil(0.05 * 8192)

    assert await second.forget(None) == ["b"]
    await first.refresh()
    assert first.corrections() == []
    assert await first.forget(None) == []
