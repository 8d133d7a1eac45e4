"""Self-healing when the upstream counts tokens differently from us, or has a smaller window than configured.

Our tiktoken count is an estimate of the upstream's tokenizer (exact for OpenAI, close elsewhere; llama.cpp
serving a small model counted 27 % more). When the upstream still refuses a working context as too long for
its window, it usually says how many tokens it counted (and often its window): the ratio to our count is
remembered per model and shrinks that model's budget from then on, and a window smaller than the configured
one replaces it, so the mistake is paid for once, not on every request. What the upstream reported is read by
`proxy.upstream.context_window`, the same reading that recognized the refusal.

A correction binds every tenant of the model, so it is learned only from a refusal that can be the upstream's
real verdict on what was sent (`implausible`), and it lasts `ttl_s` from the refusal it was learned from: then
the configured limits hold again until the upstream refuses once more, so a wrong one cannot stay.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from proxy.errors import ContextOverflow

FALLBACK_FACTOR_STEP = 1.15
"""How much to shrink when the upstream's refusal says nothing that explains it."""
HEADROOM = 1.02
MAX_FACTOR = 4.0
"""The most one of our tokens may be worth upstream: a larger ratio is not a tokenizer's."""
MIN_WINDOW_SHARE = 0.25
"""A reported window below this share of the configured one is not believed: the config is wrong (the operator
sets `context_window`), or the words are not the upstream's own."""
NEAR_SHARE = 0.5
"""A refusal without counts shrinks the budget only when the request used at least this share of its budget."""
DEFAULT_TTL_S = 6 * 3600.0
"""How long a correction holds before the upstream has to confirm it by refusing again."""


@dataclass(frozen=True)
class Correction:
    """What was learned for one model: how many upstream tokens one of ours is worth (≥ 1), and the window the
    upstream reported when it is smaller than the configured one, as of `learned_at` (Unix seconds)."""

    model: str
    factor: float = 1.0
    window: int | None = None
    learned_at: float = 0.0


@dataclass(frozen=True)
class Refused:
    """A request the upstream refused as too long, by our count: its prompt (definitions included), the output
    it reserved, and the input budget it was planned for."""

    tokens: int
    reserved_output: int
    budget: int


def implausible(refused: Refused, reported: ContextOverflow, configured_window: int) -> str | None:
    """Why the refusal cannot be the upstream's verdict on what was sent, or None when it can be.

    A request too small to overflow a quarter of the configured window, a reported window below that quarter,
    a count over `MAX_FACTOR` times ours, or a refusal without counts of a request well inside its budget: each
    says the upstream misreports (or repeats a client's words), and learning it would shrink every tenant.
    """
    floor = configured_window * MIN_WINDOW_SHARE
    if refused.tokens * MAX_FACTOR + refused.reserved_output < floor:
        return (
            f"{refused.tokens} tokens sent (and {refused.reserved_output} reserved for the answer) cannot overflow "
            f"a window of even {MIN_WINDOW_SHARE:.0%} of the configured {configured_window}"
        )
    window, prompt = reported.context_window, reported.prompt_tokens
    if window is not None and window < floor:
        return (
            f"the reported window of {window} tokens is below {MIN_WINDOW_SHARE:.0%} of the configured "
            f"{configured_window}; if it is real, set the model's context_window"
        )
    if prompt is not None and prompt > refused.tokens * MAX_FACTOR:
        return f"the reported {prompt} tokens are over {MAX_FACTOR:g} times the {refused.tokens} sent"
    if prompt is None and window is None and refused.tokens < refused.budget * NEAR_SHARE:
        return f"a refusal without counts of {refused.tokens} tokens, under {NEAR_SHARE:.0%} of the budget"
    return None


class TokenCorrections:
    """The corrections in force, per model. Process memory; shared with the other replicas and kept across
    restarts by `proxy.budget.shared_corrections`, whose rows replace these when read."""

    def __init__(self, ttl_s: float = DEFAULT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self._learned: dict[str, Correction] = {}

    def current(self, model: str, now: float) -> Correction | None:
        """The correction in force for `model`, or None (never learned, expired or reset)."""
        correction = self._learned.get(model)
        if correction is not None and now - correction.learned_at >= self.ttl_s:
            del self._learned[model]
            return None
        return correction

    def in_force(self, now: float) -> list[Correction]:
        return [correction for model in sorted(self._learned) if (correction := self.current(model, now))]

    def factor(self, model: str, now: float) -> float:
        correction = self.current(model, now)
        return 1.0 if correction is None else correction.factor

    def window(self, model: str, now: float) -> int | None:
        """The window the upstream reported for `model`, when it was smaller than the one we used."""
        correction = self.current(model, now)
        return None if correction is None else correction.window

    def apply(self, model: str, budget: int, now: float) -> int:
        return math.floor(budget / self.factor(model, now))

    def replace(self, corrections: Iterable[Correction]) -> None:
        """What the store holds (every replica's, resets included) becomes what this process knows."""
        self._learned = {correction.model: correction for correction in corrections}

    def forget(self, model: str | None) -> None:
        """Drop the correction of `model` (None: of every model)."""
        if model is None:
            self._learned.clear()
        else:
            self._learned.pop(model, None)

    def learn(
        self, model: str, refused: Refused, reported: ContextOverflow, window: int, now: float
    ) -> Correction | None:
        """The upstream refused `refused` for a `window` we believed in (a plausible refusal: `implausible`):
        returns the tighter correction now in force, or None when nothing was learned.

        Each fact the refusal reports is learned: a prompt count above ours is the tokenizers' ratio, a window
        below ours is the real window. When it reports neither (or only counts that do not explain the
        refusal), the factor grows by a fixed step so that the retry is smaller all the same.
        """
        previous = self.current(model, now) or Correction(model)
        learned_window = previous.window
        smaller = reported.context_window
        if smaller is not None and smaller < (previous.window or window):
            learned_window = smaller
        theirs = reported.prompt_tokens
        if theirs is not None and refused.tokens > 0 and theirs > refused.tokens:
            factor = max(theirs / refused.tokens * HEADROOM, previous.factor * HEADROOM)
        elif learned_window != previous.window:
            factor = previous.factor
        else:
            factor = previous.factor * FALLBACK_FACTOR_STEP
        factor = min(MAX_FACTOR, factor)
        if factor == previous.factor and learned_window == previous.window:
            return None  # nothing tighter: a retry would send the same request
        correction = Correction(model, factor, learned_window, now)
        self._learned[model] = correction
        return correction
