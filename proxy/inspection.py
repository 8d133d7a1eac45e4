"""What the inspection endpoints and the CLI show: sessions, their history and summaries, the journal.

The HTTP routes and `context-proxy sessions|journal` share these views (as JSON-ready dicts), so a person
reading the terminal and a program reading JSON see the same facts. A session's usage is what its last request
actually sent (the journal keeps each step's numbers: the same as that response's X-Context-* headers); a
session with no such step shows an estimate, a dry run of the builder (no summarizer call) against the budget
its next request would get.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.budget.budgets import Budgets
from proxy.compaction.builder import Span, WorkingContext, build
from proxy.compaction.compactor import CompactionRequest, Compactor, builder_item
from proxy.compaction.summaries import StoredSummary, Summaries, in_force
from proxy.config import Config, ModelEntry
from proxy.errors import InvalidRequest, NotFound
from proxy.history.messages import Session, StoredMessage
from proxy.history.store import History
from proxy.journal.reader import DEFAULT_PAGE, JournalReader
from proxy.journal.steps import StepStatus
from proxy.tokens import count_prompt, encoding_for_model
from proxy.wire.context_headers import usage_text

YELLOW_AT = 70
RED_AT = 90


def severity(percent: float) -> str:
    if percent > RED_AT:
        return "red"
    if percent >= YELLOW_AT:
        return "yellow"
    return "green"


@dataclass
class Inspector:
    config: Config
    history: History
    summaries: Summaries
    journal: JournalReader
    compactor: Compactor
    budgets: Budgets

    async def sessions(self, tenant: str, limit: int = DEFAULT_PAGE, offset: int = 0) -> dict[str, Any]:
        infos, has_more = await self.history.sessions(tenant, limit, offset)
        data = [
            {
                "id": info.id,
                "object": "session",
                "model": info.model,
                "message_count": info.message_count,
                "history_tokens": info.history_tokens,
                "summaries": info.summaries,
                "created_at": info.created_at,
                "updated_at": info.updated_at,
            }
            for info in infos
        ]
        return {"object": "list", "data": data, "has_more": has_more}

    async def session(self, tenant: str, session_id: str) -> dict[str, Any]:
        session, entry, encoding = await self._model_of(tenant, session_id)
        path = await self.history.path(tenant, session_id, encoding) or []
        summaries = await self.summaries.on_path(tenant, path)
        settings = await self.history.settings_on(tenant, path)
        limits = self.budgets.limits(entry)
        budget = self.budgets.budget(entry, None, settings).input_budget
        context_tokens, used = self._dry_run(path, in_force(summaries), budget)
        in_context, source = len(used), "estimate"
        last = await self.journal.last_context(tenant, session_id)
        if last is not None:
            context_tokens, budget, in_context = last["prompt_tokens"], last["budget"], last["summaries"]
            source = "last_request"
            path = await self._as_sent(path, last.get("pinned") or {})
        percent = round(100 * context_tokens / budget, 1) if budget > 0 else 100.0
        covered_by = {position: span.id for span in used for position in range(span.start, span.end)}
        return {
            "id": session.id,
            "object": "session",
            "model": session.model,
            "created_at": session.created_at,
            "updated_at": session.updated_at,
            "settings": settings,
            "limits": {
                "context_window": limits.context_window,
                "max_output": limits.max_output,
                "source": limits.source,
            },
            "usage": {
                "context_tokens": context_tokens,
                "budget": budget,
                "percent": percent,
                "severity": severity(percent),
                "text": usage_text(context_tokens, budget, in_context),
                "history_tokens": count_prompt(m.tokens for m in path),
                "summaries_in_context": in_context,
                "source": source,
            },
            "messages": [
                {
                    "id": stored.id,
                    "role": stored.role,
                    "content": stored.message.get("content"),
                    **({"tool_calls": stored.message["tool_calls"]} if "tool_calls" in stored.message else {}),
                    "tokens": stored.tokens,
                    "created_at": stored.created_at,
                    "summary_id": covered_by.get(position),
                }
                for position, stored in enumerate(path)
            ],
            "summaries": [
                {
                    **summary.as_json(),
                    "covers": [m.id for m in path[summary.start_depth : summary.end_depth + 1]],
                }
                for summary in summaries
            ],
        }

    async def summarize(self, tenant: str, session_id: str) -> dict[str, Any]:
        _session, entry, encoding = await self._model_of(tenant, session_id)
        async with self.history.lock(tenant, session_id):
            path = await self.history.path(tenant, session_id, encoding) or []
            settings = await self.history.settings_on(tenant, path)
            budget = self.budgets.budget(entry, None, settings).input_budget
            summary = await self.compactor.force(
                CompactionRequest(
                    tenant=tenant,
                    session_id=session_id,
                    messages=[m.message for m in path],
                    path=path,
                    entry=entry,
                    encoding=encoding,
                    budget=budget,
                    preserve_recent=self.config.context.preserve_recent,
                )
            )
        if summary is None:
            raise InvalidRequest(
                f"Session {session_id} has nothing to summarize: every message older than the "
                f"{self.config.context.preserve_recent} most recent ones is already in a summary.",
                code="nothing_to_summarize",
            )
        return {"object": "summary", "session_id": session_id, **summary.as_json()}

    async def steps(
        self,
        tenant: str,
        status: str | None,
        session_id: str | None,
        limit: int = DEFAULT_PAGE,
        offset: int = 0,
    ) -> dict[str, Any]:
        if status is not None and status not in tuple(StepStatus):
            raise InvalidRequest(f"status must be one of {', '.join(StepStatus)}.", param="status")
        records, has_more = await self.journal.steps(
            tenant,
            status=None if status is None else StepStatus(status),
            session_id=session_id,
            limit=limit,
            offset=offset,
        )
        return {"object": "list", "data": [record.as_json() for record in records], "has_more": has_more}

    async def step(self, tenant: str, step_id: int) -> dict[str, Any]:
        record = await self.journal.step(tenant, step_id)
        if record is None:
            raise NotFound(f"No journal step {step_id}.", code="step_not_found")
        return record.as_json()

    async def _model_of(self, tenant: str, session_id: str) -> tuple[Session, ModelEntry, str]:
        """The session, the model entry it last used (a bare entry if that model left the config) and its encoding."""
        session = await self.history.session(tenant, session_id)
        if session is None:
            raise NotFound(f"No session with id '{session_id}'.", code="session_not_found")
        model = session.model or ""
        entry = self.config.model(model) or ModelEntry(name=model, model=model)
        return session, entry, encoding_for_model(entry.model)

    async def _as_sent(self, path: list[StoredMessage], pinned: Mapping[str, str]) -> list[StoredMessage]:
        """The path with the system prompts its session last sent (a node keeps the first prompt sent there)."""
        forms = await self.history.forms(pinned)
        return [replace(m, message=forms[m.id]) if m.id in forms else m for m in path]

    def _dry_run(
        self, path: Sequence[StoredMessage], summaries: Sequence[StoredSummary], budget: int
    ) -> tuple[int, list[Span]]:
        """The next request's context size without writing anything: a fitting build, or the whole history."""
        items = [builder_item(stored) for stored in path]
        policy = self.compactor.policy(budget, self.config.context.preserve_recent)
        result = build(items, [s.span() for s in summaries], policy)
        if isinstance(result, WorkingContext):
            return result.tokens, [part for part in result.parts if isinstance(part, Span)]
        return count_prompt(item.tokens for item in items), []
