"""A request's plan: what it sends upstream (its working context for its model and budget), and the numbers its
response headers report and its journal step keeps."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from proxy.budget.budgets import Budget
from proxy.canonical.answers import ContextReport
from proxy.compaction.compactor import WorkingContext
from proxy.compaction.spans import Allowance
from proxy.config.schema import ModelEntry
from proxy.history.messages import Reconciled
from proxy.journal.steps import DOOR_STATE


@dataclass(frozen=True)
class Plan:
    """What one request sends upstream, and the numbers its response headers report."""

    entry: ModelEntry
    reconciled: Reconciled
    budget: Budget
    prepared: WorkingContext
    encoding: str
    allowance: Allowance
    door_state: Mapping[str, Any]

    def context(self) -> dict[str, Any]:
        """What the step records of it: the report's numbers, what its definitions cost (the session views plan
        the next request with them), the system prompts as sent, and what the client's door keeps of the request
        (`Conversation.door_state`)."""
        context = {
            **self.report.as_json(),
            "definitions": self.budget.definitions,
            "pinned": self.reconciled.pinned_forms(),
        }
        if self.door_state:
            context[DOOR_STATE] = dict(self.door_state)
        return context

    @property
    def sent_tokens(self) -> int:
        """What the request sends upstream by the proxy's count: its working context and its definitions."""
        return self.prepared.tokens + self.budget.definitions if self.prepared.messages else 0

    @functools.cached_property
    def report(self) -> ContextReport:
        """The numbers its response headers report (worked out once: the history's total is a walk over it)."""
        return ContextReport(
            session_id=self.reconciled.session.id,
            prompt_tokens=self.sent_tokens,
            budget=self.budget.input_budget,
            history_tokens=self.reconciled.path.tokens + self.budget.definitions,
            summaries=self.prepared.summaries,
            recalled=self.prepared.recalled,
        )
