"""Model limits (config → LiteLLM's map → prefix table → default), the effective input budget, and the
corrections learned from an upstream's context-window refusals."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pytest

from proxy.budget.budgets import Budget, Budgets, effective_budget
from proxy.budget.corrections import FALLBACK_FACTOR_STEP, HEADROOM, MAX_FACTOR, TokenCorrections
from proxy.budget.limits import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_MAX_OUTPUT,
    ModelLimits,
    model_limits,
    prefix_limits,
    with_reported_window,
)
from proxy.budget.shared_corrections import SharedCorrections
from proxy.config import ModelEntry
from proxy.errors import ContextOverflow
from proxy.store.database import Database


def unknown(model: str) -> Mapping[str, Any] | None:
    return None


def mapped(**info: Any) -> Any:
    calls: list[str] = []

    def lookup(model: str) -> Mapping[str, Any] | None:
        calls.append(model)
        return info

    lookup.calls = calls  # type: ignore[attr-defined]
    return lookup


def entry(model: str, context_window: int | None = None, max_output: int | None = None) -> ModelEntry:
    return ModelEntry(name="m", model=model, context_window=context_window, max_output=max_output)


def test_config_wins_over_every_other_source() -> None:
    lookup = mapped(max_input_tokens=128_000, max_output_tokens=16_384)
    limits = model_limits(entry("openai/gpt-4o", 50_000, 2_000), lookup)
    assert limits == ModelLimits(50_000, 2_000, "config")
    assert lookup.calls == []


def test_config_window_alone_takes_max_output_from_litellm() -> None:
    limits = model_limits(entry("openai/gpt-4o", 50_000), mapped(max_input_tokens=128_000, max_output_tokens=9_000))
    assert limits == ModelLimits(50_000, 9_000, "config")


def test_config_max_output_alone_overrides_only_max_output() -> None:
    lookup = mapped(max_input_tokens=128_000, max_output_tokens=16_384)
    assert model_limits(entry("openai/gpt-4o", max_output=1_000), lookup) == ModelLimits(128_000, 1_000, "litellm")


def test_litellm_map_is_used_for_known_models() -> None:
    lookup = mapped(max_input_tokens=200_000, max_output_tokens=64_000, max_tokens=64_000)
    assert model_limits(entry("anthropic/claude-opus-4-1"), lookup) == ModelLimits(200_000, 64_000, "litellm")
    assert lookup.calls == ["anthropic/claude-opus-4-1"]


def test_litellm_max_tokens_stands_in_for_a_missing_max_input() -> None:
    assert model_limits(entry("x/y"), mapped(max_tokens=32_000, max_output_tokens=None)) == ModelLimits(
        32_000, DEFAULT_MAX_OUTPUT, "litellm"
    )


def test_litellm_entry_without_limits_falls_through_to_the_prefix_table() -> None:
    assert model_limits(entry("openai/gpt-4o-2099"), mapped(mode="chat")) == ModelLimits(128_000, 16_384, "prefix")


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("anthropic/claude-opus-4-1-20990101", (200_000, 64_000)),
        ("claude-sonnet-4-5", (200_000, 64_000)),
        ("anthropic/claude-3-5-haiku-20241022", (200_000, 64_000)),
        ("bedrock/us.anthropic.claude-3-haiku", (200_000, 64_000)),
        ("claude-instant", (200_000, 64_000)),
        ("openai/gpt-5-mini", (400_000, 128_000)),
        ("azure/GPT-4o-mini", (128_000, 16_384)),
        ("gpt-4-turbo-preview", (128_000, 4_096)),
        ("openai/gpt-4-0613", (8_192, 4_096)),
        ("gpt-3.5-turbo-16k", (16_385, 4_096)),
        ("openrouter/meta/llama-3-70b", None),
        ("my-gpt-4o", None),
    ],
)
def test_prefix_table_matches_the_longest_prefix_after_the_provider(
    model: str, expected: tuple[int, int] | None
) -> None:
    assert prefix_limits(model) == expected


def test_prefix_table_is_the_source_when_litellm_does_not_know_the_model() -> None:
    assert model_limits(entry("openai/gpt-4-turbo-2099"), unknown) == ModelLimits(128_000, 4_096, "prefix")


def test_unknown_models_get_the_default() -> None:
    limits = model_limits(entry("hosted_vllm/mystery"), unknown)
    assert limits == ModelLimits(DEFAULT_CONTEXT_WINDOW, DEFAULT_MAX_OUTPUT, "default")
    assert model_limits(entry("hosted_vllm/mystery", max_output=100), unknown).max_output == 100


@pytest.mark.parametrize(
    ("model_entry", "lookup", "expected"),
    [
        (
            entry("x/y"),
            mapped(max_input_tokens=8_000, max_output_tokens=8_000),
            ModelLimits(8_000, 4_000, "litellm"),
        ),
        (entry("claude-x", 10_000), unknown, ModelLimits(10_000, 5_000, "config")),
        (entry("x/y", max_output=9_000), unknown, ModelLimits(8_192, 4_096, "default")),
    ],
)
def test_max_output_is_clamped_below_the_window(model_entry: ModelEntry, lookup: Any, expected: ModelLimits) -> None:
    assert model_limits(model_entry, lookup) == expected


def test_nonsense_values_from_the_map_are_ignored() -> None:
    lookup = mapped(max_input_tokens="many", max_tokens=True, max_output_tokens=-1)
    assert model_limits(entry("gpt-4o"), lookup) == ModelLimits(128_000, 16_384, "prefix")


LIMITS = ModelLimits(128_000, 16_384, "litellm")


def test_budget_reserves_the_model_max_output_and_the_safety_margin() -> None:
    assert effective_budget(LIMITS, None, 0.05) == Budget(LIMITS, 16_384, 128_000 - 16_384 - 6_400, None)


def test_budget_reserves_the_requested_max_tokens_instead() -> None:
    assert effective_budget(LIMITS, 1_000, 0.05).input_budget == 128_000 - 1_000 - 6_400


def test_safety_margin_is_rounded_up_but_exact_products_cost_nothing_extra() -> None:
    assert effective_budget(ModelLimits(200_000, 64_000, "prefix"), 0, 0.05).input_budget == 190_000
    assert effective_budget(ModelLimits(8_193, 4_096, "default"), 0, 0.05).input_budget == 8_193 - 410


def test_session_cap_lowers_the_budget_and_is_reported() -> None:
    budget = effective_budget(LIMITS, None, 0.05, session_cap=50_000)
    assert (budget.input_budget, budget.session_cap) == (50_000, 50_000)


def test_session_cap_never_raises_the_budget() -> None:
    budget = effective_budget(LIMITS, None, 0.05, session_cap=10_000_000)
    assert (budget.input_budget, budget.session_cap) == (105_216, None)


def test_no_room_left_is_a_zero_budget_for_the_caller_to_report() -> None:
    assert effective_budget(LIMITS, 125_000, 0.05).input_budget == 0
    assert effective_budget(LIMITS, 10_000_000, 0.05).input_budget == 0


# Corrections: learning from the upstream's refusals how much more it counts, and how large its window really is.


def counted(prompt: int | None = None, window: int | None = None) -> ContextOverflow:
    return ContextOverflow(prompt_tokens=prompt, context_window=window)


def test_a_counted_refusal_shrinks_that_models_budget_by_the_ratio() -> None:
    corrections = TokenCorrections()

    factor = corrections.learn("small", 1000, counted(1200), 4096)

    assert factor == pytest.approx(1.2 * HEADROOM)
    assert corrections.apply("small", 3379) == math.floor(3379 / (1.2 * HEADROOM))
    assert corrections.apply("big", 3379) == 3379
    assert corrections.factor("big") == 1.0


def test_a_refusal_that_explains_nothing_shrinks_by_a_fixed_step_up_to_a_limit() -> None:
    corrections = TokenCorrections()

    assert corrections.learn("m", 1000, counted(), 4096) == pytest.approx(FALLBACK_FACTOR_STEP)
    assert corrections.learn("m", 1000, counted(900), 4096) == pytest.approx(FALLBACK_FACTOR_STEP**2)
    for _ in range(20):
        corrections.learn("m", 1000, counted(), 4096)
    assert corrections.factor("m") == MAX_FACTOR
    assert corrections.apply("m", 4000) == 1000


def test_a_factor_never_shrinks_back() -> None:
    corrections = TokenCorrections()
    corrections.learn("m", 1000, counted(1500), 4096)

    again = corrections.learn("m", 1000, counted(1100), 4096)

    assert again == pytest.approx(1.5 * HEADROOM * HEADROOM)


def test_a_smaller_reported_window_is_learned_without_shrinking_the_factor_when_the_counts_agree() -> None:
    corrections = TokenCorrections()

    assert corrections.learn("m", 3000, counted(3000, 2048), 4096) == 1.0
    assert corrections.window("m") == 2048
    assert corrections.factor("m") == 1.0


def test_a_reported_window_no_smaller_than_ours_is_not_learned() -> None:
    corrections = TokenCorrections()

    corrections.learn("m", 1000, counted(1270, 4096), 4096)

    assert corrections.window("m") is None
    assert corrections.factor("m") == pytest.approx(1.27 * HEADROOM)


# Budgets: what the request path and the views ask, after a refusal was learned.

LLAMA_CPP_REFUSAL = ContextOverflow(prompt_tokens=2063, context_window=2048)
"""What llama.cpp's "request (2063 tokens) exceeds the available context size (2048 tokens)" reports."""


async def test_budgets_learn_the_ratio_from_the_refusal_of_another_provider() -> None:
    local = ModelEntry("local", "openai/smollm2", "http://127.0.0.1:8080/v1", None, 2048, 256)
    budgets = Budgets((local,), unknown, 0.05)
    before = budgets.budget(local).input_budget

    factor = await budgets.learn(local, 1624, LLAMA_CPP_REFUSAL)

    assert factor == pytest.approx(2063 / 1624 * HEADROOM)
    assert budgets.budget(local).input_budget == math.floor(before / factor)
    assert budgets.limits(local) == ModelLimits(2048, 256, "config")


async def test_budgets_use_the_smaller_window_the_upstream_reported() -> None:
    configured = ModelEntry("local", "openai/smollm2", "http://127.0.0.1:8080/v1", None, 8192, 1024)
    budgets = Budgets((configured,), unknown, 0.05)

    await budgets.learn(configured, 2063, LLAMA_CPP_REFUSAL)

    assert budgets.limits(configured) == ModelLimits(2048, 1024, "upstream")
    assert budgets.budget(configured).input_budget == 2048 - 1024 - math.ceil(0.05 * 2048)


def test_a_reported_window_keeps_the_output_limit_below_it() -> None:
    assert with_reported_window(ModelLimits(8192, 4096, "config"), 4096) == ModelLimits(4096, 2048, "upstream")
    assert with_reported_window(ModelLimits(8192, 4096, "config"), 16384) == ModelLimits(8192, 4096, "config")


async def test_what_one_replica_learns_the_others_adopt_and_keep_across_restarts(db: Database) -> None:
    local = ModelEntry("local", "openai/smollm2", "http://127.0.0.1:8080/v1", None, 8192, 1024)
    first, second = (Budgets((local,), unknown, 0.05, SharedCorrections(db)) for _ in range(2))
    before = second.budget(local).input_budget

    factor = await first.learn(local, 1500, ContextOverflow(prompt_tokens=1800, context_window=None))
    assert second.budget(local).input_budget == before  # until it reads what the other learned
    await second.refresh()

    assert second.budget(local).input_budget == math.floor(before / factor)
    # The second replica's own refusal builds on what it adopted; a restart starts from what the fleet knows.
    again = await second.learn(local, 2000, ContextOverflow(prompt_tokens=2063, context_window=4096))
    assert again > factor
    await first.learn(local, 1500, ContextOverflow(prompt_tokens=1600, context_window=None))  # looser: ignored
    restarted = Budgets((local,), unknown, 0.05, SharedCorrections(db))
    await restarted.refresh()
    assert restarted.limits(local) == ModelLimits(4096, 1024, "upstream")
    assert [(row.factor, row.window) for row in await SharedCorrections(db).read()] == [(again, 4096)]
    assert restarted.budget(local).input_budget == math.floor((4096 - 1024 - math.ceil(0.05 * 4096)) / again)
