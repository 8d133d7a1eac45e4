"""`TokenCost.from_usage`: the one reading of an upstream's usage, whichever shape it came in."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.cost import TokenCost
from proxy.upstream.anthropic_client import chat_usage


@pytest.mark.parametrize(
    ("usage", "cost"),
    [
        (None, TokenCost()),
        ({}, TokenCost()),
        ({"prompt_tokens": 900, "completion_tokens": 12}, TokenCost(900, 0, 0, 12)),
        (
            {"prompt_tokens": 3000, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": 2048}},
            TokenCost(3000, 2048, 0, 5),
        ),
        (  # LiteLLM's reading of an Anthropic answer keeps the write under both names
            {
                "prompt_tokens": 3000,
                "completion_tokens": 5,
                "prompt_tokens_details": {"cached_tokens": 1000, "cache_write_tokens": 1500},
                "cache_creation_input_tokens": 1500,
            },
            TokenCost(3000, 1000, 1500, 5),
        ),
        (  # Anthropic's own: input_tokens is the uncached rest
            {
                "input_tokens": 500,
                "cache_read_input_tokens": 1000,
                "cache_creation_input_tokens": 1500,
                "output_tokens": 7,
            },
            TokenCost(3000, 1000, 1500, 7),
        ),
        (  # Responses
            {"input_tokens": 2000, "input_tokens_details": {"cached_tokens": 1024}, "output_tokens": 3},
            TokenCost(2000, 1024, 0, 3),
        ),
        ({"prompt_tokens": "many", "prompt_tokens_details": None, "completion_tokens": True}, TokenCost()),
    ],
)
def test_every_usage_shape_reads_the_same(usage: dict[str, Any] | None, cost: TokenCost) -> None:
    assert TokenCost.from_usage(usage) == cost


def test_the_anthropic_client_s_chat_usage_reads_back_as_anthropic_s_own() -> None:
    native = {"input_tokens": 500, "cache_read_input_tokens": 1000, "cache_creation_input_tokens": 1500}
    assert TokenCost.from_usage(chat_usage({**native, "output_tokens": 2})) == TokenCost.from_usage(
        {**native, "output_tokens": 2}
    )


def test_costs_add_up_and_the_uncached_rest_is_what_neither_read_nor_wrote() -> None:
    total = TokenCost(3000, 1000, 1500, 5) + TokenCost(100, 0, 0, 1)
    assert total == TokenCost(3100, 1000, 1500, 6)
    assert total.uncached == 600
    assert total.as_json() == {
        "sent_tokens": 3100,
        "cached_tokens": 1000,
        "cache_creation_tokens": 1500,
        "completion_tokens": 6,
    }
