"""A request's plan: what it sends upstream (its working context for its model and budget), and the numbers its
response headers report and its journal step keeps; and how it is made (`Planner`): the request's messages stored
under its session's lock, its changed settings attached, its budget worked out, its working context prepared."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.budget.budgets import Budget, Budgets
from proxy.canonical.answers import ContextReport
from proxy.canonical.conversation import ContextMode, ContextOptions, Conversation
from proxy.compaction.compactor import CompactionRequest, Compactor
from proxy.compaction.spans import Allowance
from proxy.compaction.working_context import WorkingContext
from proxy.config.models import ModelEntry
from proxy.history.messages import Reconciled
from proxy.history.settings import BUDGET_SETTING, STRATEGIES_SETTING, session_budget, session_strategies
from proxy.history.store import History
from proxy.journal.steps import DOOR_STATE
from proxy.request.budget import request_budget
from proxy.tokens import encoding_for_model


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
        the next request with them), the system prompts as sent, whether it crossed the budget (a prompt that does
        not extend the previous one), and what the client's door keeps of the request (`Conversation.door_state`)."""
        context = {
            **self.report.as_json(),
            "definitions": self.budget.definitions,
            "pinned": self.reconciled.pinned_forms(),
            "crossed": self.prepared.crossed,
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


@dataclass(frozen=True)
class Planner:
    """Makes a request's plan from the stages it reads (`proxy.request.pipeline` holds one)."""

    history: History
    budgets: Budgets
    compactor: Compactor
    preserve_recent: int
    """`context.preserve_recent`, unless a request's X-Context-Preserve-Recent says otherwise."""

    async def plan(
        self, tenant: str, conversation: Conversation, options: ContextOptions, entry: ModelEntry, allowance: Allowance
    ) -> Plan:
        """`allowance` is the summarizer work this request may still wait for: one per request, so a healing
        retry does not get a second."""
        encoding = encoding_for_model(entry.model)
        stored = self.history.stored(tenant, options.session_id, conversation.messages, conversation.model, encoding)
        async with stored as (located, reconciled):
            reconciled = await self._remember_settings(reconciled, options)
            budget = request_budget(self.budgets, entry, conversation, reconciled.settings)
            prepared = await self._prepare(
                CompactionRequest.for_session(
                    tenant,
                    reconciled.path,
                    reconciled.settings,
                    session_id=reconciled.session.id,
                    messages=located.messages,
                    entry=entry,
                    encoding=encoding,
                    budget=budget.for_messages,
                    preserve_recent=self.preserve_recent,
                    allowance=allowance,
                    tools=bool(conversation.params.get("tools")),
                ),
                options,
            )
        return Plan(entry, reconciled, budget, prepared, encoding, allowance, conversation.door_state)

    async def saved(self, tenant: str, conversation: Conversation, options: ContextOptions, entry: ModelEntry) -> Plan:
        """The conversation stored, and the plan of a request that sends nothing upstream."""
        encoding = encoding_for_model(entry.model)
        stored = self.history.stored(tenant, options.session_id, conversation.messages, conversation.model, encoding)
        async with stored as (_located, reconciled):
            reconciled = await self._remember_settings(reconciled, options)
        budget = request_budget(self.budgets, entry, conversation, reconciled.settings)
        nothing = WorkingContext([], 0, summaries=0, written=0)
        return Plan(entry, reconciled, budget, nothing, encoding, self.compactor.allowance(), conversation.door_state)

    async def _remember_settings(self, reconciled: Reconciled, options: ContextOptions) -> Reconciled:
        """Attach a changed X-Context-Budget or X-Context-Strategy where this request's conversation ends (only a
        change: a tool that sends the headers on every request writes nothing)."""
        changes: dict[str, Any] = {}
        in_force = session_budget(reconciled.settings)
        if options.reset_budget and in_force is not None:
            changes[BUDGET_SETTING] = None
        elif options.budget is not None and options.budget != in_force:
            changes[BUDGET_SETTING] = options.budget
        if options.strategies is not None and options.strategies != session_strategies(reconciled.settings):
            changes[STRATEGIES_SETTING] = list(options.strategies)
        return await self.history.attach_settings(reconciled, changes) if changes else reconciled

    async def _prepare(self, request: CompactionRequest, options: ContextOptions) -> WorkingContext:
        if options.mode == ContextMode.OFF:
            return WorkingContext(list(request.messages), request.path.tokens, summaries=0, written=0)
        if options.preserve_recent is not None:
            request = replace(request, preserve_recent=options.preserve_recent)
        prepared = await self.compactor.prepare(request)
        self.compactor.precompact(request, prepared)
        return prepared
