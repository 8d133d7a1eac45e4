"""What an upstream call cost in tokens, read from its usage in whichever shape the upstream reported it.

One reading for every place that shows cost (the journal's per-turn figures, `/metrics`, the
X-Context-Cached-Tokens header, the summarizer's ledger), so that "cached" means the same everywhere:

- chat completions (LiteLLM's canonical form, and the proxy's own clients' `chat_usage`): `prompt_tokens` is the
  whole input, `prompt_tokens_details.cached_tokens` the part read from the prompt cache,
  `prompt_tokens_details.cache_write_tokens` (LiteLLM's name; `cache_creation_tokens` and Anthropic's top-level
  `cache_creation_input_tokens` as it also keeps them) the part written to it;
- Anthropic Messages: `input_tokens` is only the uncached rest, `cache_read_input_tokens` and
  `cache_creation_input_tokens` are added to it;
- Responses: `input_tokens` is the whole input, `input_tokens_details.cached_tokens` the cached part.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class TokenCost:
    sent: int = 0
    """Input tokens the upstream billed, cached ones included."""
    cached: int = 0
    """Of those, read from the upstream's prompt cache."""
    cache_creation: int = 0
    """Of those, written to the prompt cache (Anthropic bills them above the base price)."""
    completion: int = 0

    @classmethod
    def from_usage(cls, usage: Mapping[str, Any] | None) -> TokenCost:
        if not usage:
            return cls()
        completion = _number(
            usage.get("completion_tokens") if "completion_tokens" in usage else usage.get("output_tokens")
        )
        if "prompt_tokens" in usage:
            details = _mapping(usage.get("prompt_tokens_details"))
            creation = _first(details, "cache_write_tokens", "cache_creation_tokens") or _number(
                usage.get("cache_creation_input_tokens")
            )
            return cls(_number(usage.get("prompt_tokens")), _number(details.get("cached_tokens")), creation, completion)
        if "cache_read_input_tokens" in usage or "cache_creation_input_tokens" in usage:
            read = _number(usage.get("cache_read_input_tokens"))
            creation = _number(usage.get("cache_creation_input_tokens"))
            return cls(_number(usage.get("input_tokens")) + read + creation, read, creation, completion)
        cached = _number(_mapping(usage.get("input_tokens_details")).get("cached_tokens"))
        return cls(_number(usage.get("input_tokens")), cached, 0, completion)

    def __add__(self, other: TokenCost) -> TokenCost:
        return TokenCost(
            self.sent + other.sent,
            self.cached + other.cached,
            self.cache_creation + other.cache_creation,
            self.completion + other.completion,
        )

    @property
    def uncached(self) -> int:
        """Input billed at the full price: neither read from nor written to the cache."""
        return max(0, self.sent - self.cached - self.cache_creation)

    def as_json(self) -> dict[str, int]:
        return {
            "sent_tokens": self.sent,
            "cached_tokens": self.cached,
            "cache_creation_tokens": self.cache_creation,
            "completion_tokens": self.completion,
        }


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _number(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _first(details: Mapping[str, Any], *names: str) -> int:
    return next((_number(details.get(name)) for name in names if _number(details.get(name))), 0)
