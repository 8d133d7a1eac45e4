"""Model limits: a model's context window and the most it may write.

They come from the first source that knows them: the operator's config entry, then LiteLLM's bundled model map
(passed in as `lookup`, so this module stays pure and never imports litellm), then a prefix table of well-known
families, then a conservative default; later, a smaller window the upstream itself reported (learned by
`proxy.budget.corrections`). What they leave for the input is `proxy.budget.budgets`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from proxy.config.models import ModelEntry

DEFAULT_CONTEXT_WINDOW = 8_192
"""Unknown models get the smallest window still common today: too small wastes context, too big is a 400."""
DEFAULT_MAX_OUTPUT = 4_096

PREFIX_LIMITS: tuple[tuple[str, int, int], ...] = (
    ("claude-opus-4", 200_000, 64_000),
    ("claude-sonnet-4", 200_000, 64_000),
    ("claude-3-5", 200_000, 64_000),
    ("claude-3", 200_000, 64_000),
    ("claude", 200_000, 64_000),
    ("gpt-5", 400_000, 128_000),
    ("gpt-4o", 128_000, 16_384),
    ("gpt-4-turbo", 128_000, 4_096),
    ("gpt-4", 8_192, 4_096),
    ("gpt-3.5", 16_385, 4_096),
)
"""(name prefix, context window, max output) for families LiteLLM may not map (e.g. dated snapshots)."""

_BY_LONGEST_PREFIX = tuple(sorted(PREFIX_LIMITS, key=lambda row: -len(row[0])))
_VENDOR_SEGMENT = re.compile(r"^[a-z]+\.")
"""Bedrock-style vendor prefixes such as `us.anthropic.`; `gpt-3.5` is safe because of its hyphen."""

LimitsSource = Literal["config", "litellm", "prefix", "default", "upstream"]
"""Where the window came from; "upstream": the upstream's own refusal reported a smaller one (learned)."""
ModelInfoLookup = Callable[[str], Mapping[str, Any] | None]


@dataclass(frozen=True)
class ModelLimits:
    context_window: int
    max_output: int
    source: LimitsSource


def model_limits(entry: ModelEntry, lookup: ModelInfoLookup) -> ModelLimits:
    """The limits of one configured model: config → LiteLLM's map (`lookup`) → prefix table → default."""
    prefix = prefix_limits(entry.model)
    window: int
    output: int | None = None
    source: LimitsSource
    if entry.context_window is not None:
        window, output, source = entry.context_window, entry.max_output, "config"
        if output is None:
            info = lookup(entry.model)
            output = None if info is None else _positive(info.get("max_output_tokens"))
    else:
        info = lookup(entry.model)
        known = _known_window(info)
        if known is not None and info is not None:
            window, output, source = known, _positive(info.get("max_output_tokens")), "litellm"
        elif prefix is not None:
            window, source = prefix[0], "prefix"
        else:
            window, source = DEFAULT_CONTEXT_WINDOW, "default"
        if entry.max_output is not None:
            output = entry.max_output
    if output is None:
        output = prefix[1] if prefix is not None else DEFAULT_MAX_OUTPUT
    if output >= window:
        output = window // 2
    return ModelLimits(context_window=window, max_output=output, source=source)


def with_reported_window(limits: ModelLimits, window: int) -> ModelLimits:
    """`limits` with the window the upstream reported, when smaller; the output limit kept below it as above."""
    if window >= limits.context_window:
        return limits
    output = limits.max_output if limits.max_output < window else window // 2
    return ModelLimits(context_window=window, max_output=output, source="upstream")


def prefix_limits(model: str) -> tuple[int, int] | None:
    """(context window, max output) from the prefix table, matched on the name after the provider prefix."""
    name = model.rsplit("/", 1)[-1].lower()
    while _VENDOR_SEGMENT.match(name):
        name = _VENDOR_SEGMENT.sub("", name, count=1)
    for prefix, window, output in _BY_LONGEST_PREFIX:
        if name.startswith(prefix):
            return window, output
    return None


def _known_window(info: Mapping[str, Any] | None) -> int | None:
    """LiteLLM's input limit; older map entries only carry `max_tokens`."""
    if info is None:
        return None
    return _positive(info.get("max_input_tokens")) or _positive(info.get("max_tokens"))


def _positive(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 1:
        return None
    return int(value)
