"""The summarizer's circuit breaker: after `summarizer_failures` failed calls in a row (or one that ran out of
time) a summarizer model is not called for `summarizer_cooldown_s`, and every summary meanwhile is extractive.

A summarizer that is down fails every summary a session needs; calling it again each time costs a refused
connection at best, and a whole `summarizer_deadline_s` of a user's request at worst (a host that times out).
After the cool-down the next summary tries it again: one success closes the breaker, one more failure opens it
for another cool-down. State is per summarizer model, in memory, per process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from proxy.canonical.types import Clock
from proxy.config.schema import DEFAULT_SUMMARIZER_COOLDOWN_S, DEFAULT_SUMMARIZER_FAILURES


@dataclass
class _State:
    failures: int = 0
    """Failed calls in a row."""
    open_until: float = 0.0


class SummarizerBreaker:
    def __init__(
        self,
        failures: int = DEFAULT_SUMMARIZER_FAILURES,
        cooldown_s: float = DEFAULT_SUMMARIZER_COOLDOWN_S,
        clock: Clock = time.monotonic,
    ) -> None:
        self._failures = max(1, failures)
        self._cooldown_s = cooldown_s
        self._clock = clock
        self._states: dict[str, _State] = {}

    def is_open(self, model: str) -> bool:
        """Whether `model` is being skipped (cooling down)."""
        state = self._states.get(model)
        return state is not None and self._clock() < state.open_until

    def failed(self, model: str, *, timed_out: bool = False) -> bool:
        """Count a failed call; True when this opened the breaker. A call that ran out of time opens it at once:
        it already made a request wait as long as any may."""
        state = self._states.setdefault(model, _State())
        state.failures += 1
        if timed_out or state.failures >= self._failures:
            state.open_until = self._clock() + self._cooldown_s
            return True
        return False

    def succeeded(self, model: str) -> None:
        self._states.pop(model, None)
