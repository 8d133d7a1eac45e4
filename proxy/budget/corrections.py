"""Self-healing when the upstream counts tokens differently from us, or has a smaller window than configured.

Our tiktoken count is an estimate of the upstream's tokenizer (exact for OpenAI, close elsewhere; llama.cpp
serving a small model counted 27 % more). When the upstream still refuses a working context as too long for
its window, it usually says how many tokens it counted (and often its window): the ratio to our count is
remembered per model and shrinks that model's budget from then on, and a window smaller than the configured
one replaces it, so the mistake is paid for once, not on every request. What the upstream reported is read by
`proxy.upstream.context_window`, the same reading that recognized the refusal.
"""

from __future__ import annotations

import math

from proxy.errors import ContextOverflow

FALLBACK_FACTOR_STEP = 1.15
"""How much to shrink when the upstream's refusal says nothing that explains it."""
HEADROOM = 1.02
MAX_FACTOR = 4.0


class TokenCorrections:
    """Per model: how many upstream tokens one of ours is worth (≥ 1), and the window the upstream reported when
    it is smaller than the configured one. Process memory; shared with the other replicas and kept across restarts
    by `proxy.budget.shared_corrections`."""

    def __init__(self) -> None:
        self._factors: dict[str, float] = {}
        self._windows: dict[str, int] = {}

    def factor(self, model: str) -> float:
        return self._factors.get(model, 1.0)

    def window(self, model: str) -> int | None:
        """The window the upstream reported for `model`, when it was smaller than the one we used."""
        return self._windows.get(model)

    def adopt(self, model: str, factor: float, window: int | None) -> None:
        """What another replica learned for `model`: kept where it is tighter than what this one knows."""
        self._factors[model] = min(MAX_FACTOR, max(self.factor(model), factor))
        if window is not None and window < self._windows.get(model, window + 1):
            self._windows[model] = window

    def apply(self, model: str, budget: int) -> int:
        return math.floor(budget / self.factor(model))

    def learn(self, model: str, ours: int, reported: ContextOverflow, window: int) -> float:
        """The upstream refused `ours` tokens (our count) for a `window` we believed in; returns the new factor.

        Each fact the refusal reports is learned: a prompt count above ours is the tokenizers' ratio, a window
        below ours is the real window. When it reports neither (or only counts that do not explain the
        refusal), the factor grows by a fixed step so that the retry is smaller all the same.
        """
        previous = self.factor(model)
        smaller = reported.context_window
        if smaller is not None and smaller < window:
            self._windows[model] = smaller
        else:
            smaller = None
        theirs = reported.prompt_tokens
        if theirs is not None and ours > 0 and theirs > ours:
            factor = max(theirs / ours * HEADROOM, previous * HEADROOM)
        elif smaller is not None:
            return previous
        else:
            factor = previous * FALLBACK_FACTOR_STEP
        factor = min(MAX_FACTOR, factor)
        self._factors[model] = factor
        return factor
