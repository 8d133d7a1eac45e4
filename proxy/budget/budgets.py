"""The effective input budget: how many tokens one request's working context may use.

    input budget = (context window − reserved output − safety margin) / learned correction, capped by the session
    for messages = input budget − the request's definitions (tools, output schema: `tokens.count_definitions`)

The reserved output is the request's own max_tokens when it gives one, else the model's output limit. The
margin exists because our tiktoken count is only an estimate of the provider's tokenizer; when the upstream
still counts more than we did, `corrections` learns the ratio per model, and the window itself when the
upstream reports a smaller one than configured. The ratio is of whole prompts, definitions included, so it stays
a tokenizer's ratio and never absorbs the size of a tool list. A session's `X-Context-Budget` may lower the result,
never raise it. `Budgets` is the one place this is computed, and the one holder of the learned corrections: the
request path, the inspection views and the summarizer all ask it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.budget.corrections import DEFAULT_TTL_S, Correction, Refused, TokenCorrections, implausible
from proxy.budget.limits import ModelInfoLookup, ModelLimits, model_limits, with_reported_window
from proxy.budget.shared_corrections import SharedCorrections
from proxy.canonical.types import Clock
from proxy.config.models import ModelEntry
from proxy.errors import ContextOverflow
from proxy.history.settings import session_budget

log = logging.getLogger(__name__)

DEFAULT_SAFETY_MARGIN = 0.05
"""Our count (tiktoken cl100k/o200k) differs from Anthropic's or Google's tokenizer by a few percent."""
OUTPUT_SHARE = 4
"""At most a quarter of a model's window, and of what the request's fixed part leaves of it, is kept for the answer
when a client asks for its own model's limit."""
OUTPUT_FLOOR = 1_024
"""The least kept for such an answer when the fixed part leaves little room: an agent's step (a tool call, a
short answer) fits."""


@dataclass(frozen=True)
class Budget:
    limits: ModelLimits
    reserved_output: int
    input_budget: int
    """Tokens the working context may use (0 if the reserved output leaves none: the caller reports it)."""
    session_cap: int | None
    """The session's X-Context-Budget, set only when it lowered the budget."""
    definitions: int = 0
    """What the request's tool definitions and output schema cost: sent with every request, before any message."""

    @property
    def for_messages(self) -> int:
        """What the working context's messages may use: the input budget less the definitions."""
        return max(0, self.input_budget - self.definitions)


def effective_budget(
    limits: ModelLimits,
    requested_output: int | None,
    safety_margin: float = DEFAULT_SAFETY_MARGIN,
    session_cap: int | None = None,
) -> Budget:
    """Input tokens = window - reserved output (request max_tokens, else the model's) - safety margin."""
    reserved = limits.max_output if requested_output is None else max(0, requested_output)
    input_budget = max(0, limits.context_window - reserved - margin_tokens(limits, safety_margin))
    applied_cap: int | None = None
    if session_cap is not None and session_cap < input_budget:
        input_budget = max(0, session_cap)
        applied_cap = session_cap
    return Budget(limits=limits, reserved_output=reserved, input_budget=input_budget, session_cap=applied_cap)


def margin_tokens(limits: ModelLimits, safety_margin: float) -> int:
    """The safety margin in tokens."""
    # round() first: 0.05 * 200_000 is 10000.000000000002 in some float paths and must not cost a token.
    return math.ceil(round(safety_margin * limits.context_window, 6))


class Budgets:
    """Every configured model's limits (resolved once at startup) and the corrections learned since."""

    def __init__(
        self,
        models: tuple[ModelEntry, ...],
        lookup: ModelInfoLookup,
        safety_margin: float,
        shared: SharedCorrections | None = None,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Clock = time.time,
    ) -> None:
        """`shared`: the corrections the replicas of the store share (none: this process learns alone); `ttl_s`:
        how long one lasts (`context.correction_ttl_s`)."""
        self._lookup = lookup
        self._table = {entry.name: model_limits(entry, lookup) for entry in models}
        self._safety_margin = safety_margin
        self._corrections = TokenCorrections(ttl_s)
        self._shared = shared
        self._clock = clock

    def configured(self, entry: ModelEntry) -> ModelLimits:
        """The model's limits as configured (or looked up), before anything was learned."""
        known = self._table.get(entry.name)
        return known if known is not None else model_limits(entry, self._lookup)

    def limits(self, entry: ModelEntry) -> ModelLimits:
        """The model's limits, with the smaller window its upstream reported when it refused a prompt."""
        reported = self._corrections.window(entry.name, self._clock())
        limits = self.configured(entry)
        return limits if reported is None else with_reported_window(limits, reported)

    def budget(
        self,
        entry: ModelEntry,
        requested_output: int | None = None,
        settings: Mapping[str, Any] | None = None,
        definitions: int = 0,
    ) -> Budget:
        """The budget of one request to `entry` (`requested_output`: its max_tokens, `definitions`: what its tools
        cost) in a session with `settings`."""
        budget = effective_budget(
            self.limits(entry),
            requested_output,
            self._safety_margin,
            session_budget(settings or {}),
        )
        return Budget(
            budget.limits,
            budget.reserved_output,
            self._corrections.apply(entry.name, budget.input_budget, self._clock()),
            budget.session_cap,
            definitions,
        )

    def fitted_output(self, entry: ModelEntry, requested: int, fixed: int = 0) -> int:
        """An output request within the model's output limit, `1 / OUTPUT_SHARE` of its window and of the room
        the request's `fixed` part (its definitions and system messages, sent with every request of the session)
        leaves past the safety margin, not below `OUTPUT_FLOOR` for that room: clients that ask for their own
        model's limit (Claude Code asks for 32k and more) would leave a small configured model no room for the
        conversation. Providers refuse a prompt whose max_tokens does not fit beside it; the answer then gives
        way, as long as a step still fits."""
        limits = self.limits(entry)
        room = limits.context_window - margin_tokens(limits, self._safety_margin) - fixed
        share = max(OUTPUT_FLOOR, room // OUTPUT_SHARE)
        return min(requested, limits.max_output, limits.context_window // OUTPUT_SHARE, share)

    async def learn(self, entry: ModelEntry, refused: Refused, overflow: ContextOverflow) -> Correction | None:
        """The upstream refused `refused` as too many tokens for its window: shrink this model's budgets from now
        on by what its refusal reported (`upstream.context_window` read it where the error entered), here and,
        once published, on the other replicas. None: nothing learned (an implausible refusal, or nothing tighter
        than what is known), so a retry would be refused the same way."""
        configured = self.configured(entry).context_window
        reason = implausible(refused, overflow, configured)
        if reason is not None:
            log.warning("upstream refusal for %s not learned from: %s", entry.name, reason)
            return None
        learned = self._corrections.learn(entry.name, refused, overflow, configured, self._clock())
        if learned is not None and self._shared is not None:
            try:
                await self._shared.publish(learned)
            except Exception as exc:  # the store down: this replica keeps it, the others learn for themselves
                log.warning("could not share the correction learned for %s: %s", entry.name, exc)
        return learned

    def corrections(self) -> list[Correction]:
        """The corrections in force, for the operator (`GET /admin/corrections`, `context-proxy corrections`)."""
        return self._corrections.in_force(self._clock())

    @property
    def correction_ttl_s(self) -> float:
        return self._corrections.ttl_s

    async def forget(self, model: str | None) -> list[str]:
        """The operator's reset: the correction of `model` (None: every model) is dropped here and in the store,
        which the other replicas read within `REFRESH_S`; returns the models that had one."""
        known = {correction.model for correction in self.corrections() if model in (None, correction.model)}
        self._corrections.forget(model)
        if self._shared is not None:
            known.update(await self._shared.forget(model))
        return sorted(known)

    async def refresh(self) -> None:
        """Take what the store holds (every replica's corrections, and resets) as what this process knows."""
        if self._shared is None:
            return
        self._corrections.replace(await self._shared.read(self._clock()))
