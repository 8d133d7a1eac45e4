"""Model limits (config → LiteLLM's map → prefix table → default) and the effective input budget; the corrections
learned from an upstream's refusals are `test_corrections`'s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from proxy.budget.budgets import OUTPUT_FLOOR, Budget, Budgets, effective_budget
from proxy.budget.limits import (
    DEFAULT_CONTEXT_WINDOW,
    DEFAULT_MAX_OUTPUT,
    ModelLimits,
    model_limits,
    prefix_limits,
    with_reported_window,
)
from proxy.config.models import ModelEntry


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


def test_a_reported_window_keeps_the_output_limit_below_it() -> None:
    assert with_reported_window(ModelLimits(8192, 4096, "config"), 4096) == ModelLimits(4096, 2048, "upstream")
    assert with_reported_window(ModelLimits(8192, 4096, "config"), 16384) == ModelLimits(8192, 4096, "config")


CLAUDE_CODE_FIXED = 18_646 + 6_999
"""What Claude Code 2.1.197 sends with every request by the proxy's count: its 24 tools and its system prompt."""


def budgets(context_window: int, max_output: int | None = None) -> tuple[Budgets, ModelEntry]:
    model = entry("openai/fake-model", context_window, max_output)
    return Budgets((model,), unknown, 0.05), model


def test_a_fitted_output_keeps_the_model_limit_and_a_quarter_of_the_window() -> None:
    small, model = budgets(32_768)
    assert small.fitted_output(model, 32_000) == DEFAULT_MAX_OUTPUT
    assert small.fitted_output(model, 500) == 500
    large, model = budgets(200_000, 64_000)
    assert large.fitted_output(model, 32_000, CLAUDE_CODE_FIXED) == 32_000


def test_a_fitted_output_leaves_the_conversation_room_beside_what_every_request_sends() -> None:
    """Claude Code on a 32k model: its tools and system prompt leave 5,484 tokens of the window past the safety
    margin; the answer takes a quarter of them, not the model's 4,096 (which left the conversation 1,388, less
    than one tool output)."""
    small, model = budgets(32_768)
    room = 32_768 - 1_639 - CLAUDE_CODE_FIXED
    assert small.fitted_output(model, 32_000, CLAUDE_CODE_FIXED) == room // 4 == 1_371


def test_a_fitted_output_never_falls_below_the_floor_nor_above_the_request() -> None:
    small, model = budgets(32_768)
    assert small.fitted_output(model, 32_000, 29_000) == OUTPUT_FLOOR
    assert small.fitted_output(model, 600, 29_000) == 600
    tiny, model = budgets(2_048)
    assert tiny.fitted_output(model, 32_000) == 2_048 // 4
