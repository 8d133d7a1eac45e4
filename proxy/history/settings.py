"""Session settings: what a session remembers from its requests' headers (X-Context-Budget, X-Context-Strategy).

They are attached to the chain where a conversation ends (`History.attach_settings`), so they hold for every
request continuing from there and for no other branch, and are folded along a path, the latest change of each
key winning. The keys are declared here once, and read through `session_budget` and `session_strategies`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

BUDGET_SETTING = "budget"
"""The input cap X-Context-Budget set: an int."""
STRATEGIES_SETTING = "strategies"
"""The compaction strategies X-Context-Strategy chose, in order: a list of names."""


def session_budget(settings: Mapping[str, Any]) -> int | None:
    """The input cap a session remembered from `X-Context-Budget`, if any."""
    cap = settings.get(BUDGET_SETTING)
    return cap if isinstance(cap, int) and not isinstance(cap, bool) else None


def session_strategies(settings: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The strategies a session chose with `X-Context-Strategy`, if any."""
    names = settings.get(STRATEGIES_SETTING)
    return tuple(names) if isinstance(names, list) else None


def fold(in_force: Mapping[str, Any], changes: Mapping[str, Any]) -> Mapping[str, Any]:
    """Settings after `changes` (None removes a key); `in_force` itself when nothing changes."""
    merged = {**in_force, **changes}
    merged = {key: value for key, value in merged.items() if value is not None}
    return in_force if merged == in_force else merged
