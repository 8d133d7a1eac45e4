"""Self-healing when the upstream counts tokens differently from us.

Our tiktoken count is an estimate of the upstream's tokenizer (exact for OpenAI, close elsewhere). When the
upstream still rejects a working context with `context_length_exceeded`, its message usually says how many
tokens it counted; the ratio to our count is remembered per model and shrinks that model's budget from then
on, so the mistake is paid for once, not on every request.
"""

from __future__ import annotations

import math
import re

FALLBACK_FACTOR_STEP = 1.15
"""How much to shrink when the upstream's message gives no count."""
HEADROOM = 1.02
MAX_FACTOR = 4.0

_COUNT = re.compile(r"(?:resulted in|requested|prompt is too long:|prompt contains at least)\s+(\d[\d,]*)\s+tokens")
_IN_MESSAGES = re.compile(r"\((\d[\d,]*) in the messages")


def upstream_count(message: str) -> int | None:
    """The prompt tokens the upstream says it counted, from OpenAI's and Anthropic's wordings."""
    match = _IN_MESSAGES.search(message) or _COUNT.search(message)
    if match is None:
        return None
    return int(match.group(1).replace(",", ""))


class TokenCorrections:
    """Per model: how many upstream tokens one of ours is worth (≥ 1). Process memory, learned again on restart."""

    def __init__(self) -> None:
        self._factors: dict[str, float] = {}

    def factor(self, model: str) -> float:
        return self._factors.get(model, 1.0)

    def apply(self, model: str, budget: int) -> int:
        return math.floor(budget / self.factor(model))

    def learn(self, model: str, ours: int, message: str) -> float:
        theirs = upstream_count(message)
        previous = self.factor(model)
        if theirs is not None and ours > 0 and theirs > ours:
            factor = theirs / ours * HEADROOM
        else:
            factor = previous * FALLBACK_FACTOR_STEP
        factor = min(MAX_FACTOR, max(factor, previous * HEADROOM))
        self._factors[model] = factor
        return factor
