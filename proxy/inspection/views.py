"""What the inspection endpoints and the CLI show: sessions, their history, summaries, pins and compaction
events, the journal. Pin writes are `proxy.inspection.pinning`'s; `Inspector.pin` and `unpin` find the session for them.

The HTTP routes and `context-proxy sessions|journal` share these views (as JSON-ready dicts), so a person
reading the terminal and a program reading JSON see the same facts. A session's usage is what its last request
actually sent (the journal keeps each step's numbers: the same as that response's X-Context-* headers); a
session with no such step shows an estimate, a dry run of the builder (no summarizer call) against the budget
its next request would get.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.budget.budgets import Budgets
from proxy.budget.limits import ModelLimits
from proxy.canonical.answers import usage_text
from proxy.compaction.compactor import CompactionRequest, Compactor
from proxy.compaction.events import CompactionEvents
from proxy.compaction.path_items import pinned_groups
from proxy.compaction.span_store import SpanStore, StoredSpan
from proxy.compaction.summarizer_calls import SummarizerCalls
from proxy.compaction.working_context import ContextView
from proxy.config.models import ModelEntry
from proxy.config.schema import Config
from proxy.errors import InvalidRequest, NotFound
from proxy.history.messages import Session, StoredMessage, StoredPath, token_counts
from proxy.history.pins import Pins
from proxy.history.store import History
from proxy.inspection.pinning import Pinning, checked_ids
from proxy.journal.costs import session_cost, with_summarizer_calls
from proxy.journal.reader import DEFAULT_PAGE, JournalReader
from proxy.journal.steps import StepStatus
from proxy.offload import compute
from proxy.tokens import count_prompt, encoding_for_model

YELLOW_AT = 70
RED_AT = 90
LISTED_CHARS = 100
"""About what one entry of the whole-session view (a message's fields, an id a summary covers) makes it look at,
content aside: what decides whether listing them is worth a thread (`proxy.offload`)."""


@dataclass(frozen=True)
class SessionState:
    session: Session
    settings: Mapping[str, Any]
    limits: ModelLimits
    usage: dict[str, Any]
    path: list[StoredMessage]
    summaries: list[StoredSpan]
    """Every span on the path, orphaned ones included."""
    view: ContextView
    pinned: dict[int, str]
    """Position → how it is pinned ('api' or 'pattern')."""

    def header(self) -> dict[str, Any]:
        """What the session's JSON views open with."""
        return {
            "id": self.session.id,
            "object": "session",
            "model": self.session.model,
            "created_at": self.session.created_at,
            "updated_at": self.session.updated_at,
            "settings": dict(self.settings),
            "limits": {
                "context_window": self.limits.context_window,
                "max_output": self.limits.max_output,
                "source": self.limits.source,
            },
            "usage": self.usage,
        }


def _session_listing(state: SessionState) -> dict[str, Any]:
    """The whole-session view's messages (each with the summary that covers it, and whether it is pinned) and
    summaries (each with the messages it covers)."""
    path = state.path
    covered_by = {
        position: span.id for span in state.view.spans for position in range(span.start_depth, span.end_depth + 1)
    }
    return {
        "messages": [
            {
                "id": stored.id,
                "role": stored.role,
                "content": stored.message.get("content"),
                **({"tool_calls": stored.message["tool_calls"]} if "tool_calls" in stored.message else {}),
                "tokens": stored.tokens,
                "created_at": stored.created_at,
                "summary_id": covered_by.get(position),
                "pinned": position in state.pinned,
            }
            for position, stored in enumerate(path)
        ],
        "summaries": [
            {**summary.as_json(), "covers": [m.id for m in path[summary.start_depth : summary.end_depth + 1]]}
            for summary in state.summaries
        ],
    }


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
    summaries: SpanStore
    journal: JournalReader
    compactor: Compactor
    budgets: Budgets
    pins: Pins
    events: CompactionEvents
    summarizer_calls: SummarizerCalls
    _pinning: Pinning = field(init=False)

    def __post_init__(self) -> None:
        self._pinning = Pinning(self.config, self.history, self.pins, self.budgets)

    async def sessions(self, tenant: str, limit: int = DEFAULT_PAGE, offset: int = 0) -> dict[str, Any]:
        infos, has_more = await self.history.sessions(tenant, limit, offset)
        contexts = await self.journal.last_contexts(tenant, [info.id for info in infos])
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
                "usage": _last_usage(contexts.get(info.id)),
            }
            for info in infos
        ]
        return {"object": "list", "data": data, "has_more": has_more}

    async def session(self, tenant: str, session_id: str) -> dict[str, Any]:
        state = await self.state(tenant, session_id)
        # Every message, and every message each summary covers: ~40 ms on the event loop at 4,000 messages.
        listed = len(state.path) + sum(summary.end_depth + 1 - summary.start_depth for summary in state.summaries)
        listing = await compute(listed * LISTED_CHARS, _session_listing, state)
        return {**state.header(), **listing, "cost": await self.cost(tenant, session_id)}

    async def cost(self, tenant: str, session_id: str, turns: int | None = None) -> dict[str, Any]:
        """The session's cost (`proxy.journal.costs`): its totals, and per step (the latest `turns` of them)."""
        calls = await self.summarizer_calls.for_session(tenant, session_id)
        steps = with_summarizer_calls(
            await self.journal.costs(tenant, session_id), [(call.created_at, call.cost) for call in calls]
        )
        shown = steps if turns is None else steps[-turns:] if turns > 0 else []
        return {**session_cost(steps), "turns": [step.as_json() for step in shown]}

    async def state(self, tenant: str, session_id: str) -> SessionState:
        """A session as its next request would find it: path (with the system prompts it last sent), budget,
        pins, and the working context worked out from what is stored (no write, no summarizer call)."""
        session, entry, encoding = await self._model_of(tenant, session_id)
        path = await self.history.path(tenant, session_id, encoding) or []
        summaries = await self.summaries.on_path(tenant, path)
        settings = await self.history.settings_on(tenant, path)
        last = await self.journal.last_context(tenant, session_id)
        definitions = _definitions(last)
        request = self._request(tenant, session_id, path, entry, encoding, settings, definitions)
        view = await self.compactor.view(request)
        if last is None:
            budget = self.budgets.budget(entry, None, settings).input_budget
            usage = usage_view(view.tokens, budget, len(view.spans), "estimate")
        else:
            usage = usage_view(last["prompt_tokens"], last["budget"], last["summaries"], "last_request")
            path = await self._as_sent(path, last.get("pinned") or {})
        usage["history_tokens"] = count_prompt(token_counts(path)) + definitions
        pinned = pinned_groups(path, await self.pins.on_session(tenant, session_id), self.config.context.pin_patterns)
        limits = self.budgets.limits(entry)
        return SessionState(session, settings, limits, usage, path, summaries, view, pinned)

    async def summarize(self, tenant: str, session_id: str) -> dict[str, Any]:
        _session, entry, encoding = await self._model_of(tenant, session_id)
        async with self.history.lock(tenant, session_id):
            path = await self.history.path(tenant, session_id, encoding) or []
            settings = await self.history.settings_on(tenant, path)
            definitions = _definitions(await self.journal.last_context(tenant, session_id))
            request = self._request(tenant, session_id, path, entry, encoding, settings, definitions)
            summary = await self.compactor.force(request)
        if summary is None:
            raise InvalidRequest(
                f"Session {session_id} has nothing to summarize: every message older than the "
                f"{self.config.context.preserve_recent} most recent ones is already in a summary.",
                code="nothing_to_summarize",
            )
        return {"object": "summary", "session_id": session_id, **summary.as_json()}

    def corrections(self) -> dict[str, Any]:
        """The budget corrections in force (`proxy.budget.corrections`): every tenant's, so the operator's only."""
        expiry = self.budgets.correction_ttl_s
        data = []
        for correction in self.budgets.corrections():
            entry = self.config.model(correction.model)
            data.append(
                {
                    "model": correction.model,
                    "factor": round(correction.factor, 6),
                    "context_window": correction.window,
                    "configured_window": None if entry is None else self.budgets.configured(entry).context_window,
                    "learned_at": correction.learned_at,
                    "expires_at": correction.learned_at + expiry,
                }
            )
        return {"object": "list", "data": data}

    async def forget_corrections(self, model: str | None) -> dict[str, Any]:
        """The operator's reset of one model's correction (None: of every model's)."""
        if model is not None and self.config.model(model) is None:
            raise NotFound(f"No model named '{model[:100]}' is configured.", param="model", code="model_not_found")
        return {"object": "corrections.reset", "models": await self.budgets.forget(model)}

    async def session_pins(self, tenant: str, session_id: str) -> dict[str, Any]:
        _session, _entry, encoding = await self._model_of(tenant, session_id)
        path = await self.history.path(tenant, session_id, encoding) or []
        return self._pinning.view(session_id, path, await self.pins.on_session(tenant, session_id))

    async def pin(self, tenant: str, session_id: str, message_ids: Sequence[str]) -> dict[str, Any]:
        """`Pinning.pin`, for the caller's session (a 404 if it has none by that id)."""
        ids = checked_ids(list(message_ids))
        _session, entry, encoding = await self._model_of(tenant, session_id)
        return await self._pinning.pin(tenant, session_id, entry, encoding, ids)

    async def unpin(self, tenant: str, session_id: str, message_ids: Sequence[str]) -> dict[str, Any]:
        """`Pinning.unpin`, for the caller's session (a 404 if it has none by that id)."""
        ids = checked_ids(list(message_ids))
        _session, _entry, encoding = await self._model_of(tenant, session_id)
        return await self._pinning.unpin(tenant, session_id, encoding, ids)

    async def session_events(
        self, tenant: str, session_id: str, limit: int = DEFAULT_PAGE, offset: int = 0
    ) -> dict[str, Any]:
        await self.require(tenant, session_id)
        events, more = await self.events.for_session(tenant, session_id, limit, offset)
        return {"session_id": session_id, "events": events, "more": more}

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

    def _request(
        self,
        tenant: str,
        session_id: str,
        path: list[StoredMessage],
        entry: ModelEntry,
        encoding: str,
        settings: Mapping[str, Any],
        definitions: int,
    ) -> CompactionRequest:
        """What the session's next request would ask of the compactor, with its remembered budget and strategies,
        and the `definitions` (tools) its last request sent."""
        return CompactionRequest.for_session(
            tenant,
            StoredPath(path),
            settings,
            session_id=session_id,
            messages=[m.message for m in path],
            entry=entry,
            encoding=encoding,
            budget=self.budgets.budget(entry, None, settings, definitions).for_messages,
            preserve_recent=self.config.context.preserve_recent,
        )

    async def require(self, tenant: str, session_id: str) -> Session:
        """The caller's session, or a 404: the one check views that read no path make."""
        session, _entry, _encoding = await self._model_of(tenant, session_id)
        return session

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


def _definitions(last: Mapping[str, Any] | None) -> int:
    """What the definitions (tools) of a session's last request cost: its next one is planned with them."""
    value = (last or {}).get("definitions")
    return value if isinstance(value, int) else 0


def usage_view(context_tokens: int, budget: int, in_context: int, source: str) -> dict[str, Any]:
    """How full a working context is: tokens against the budget, with the severity a gauge is coloured by."""
    percent = round(100 * context_tokens / budget, 1) if budget > 0 else 100.0
    return {
        "context_tokens": context_tokens,
        "budget": budget,
        "percent": percent,
        "severity": severity(percent),
        "text": usage_text(context_tokens, budget, in_context),
        "summaries_in_context": in_context,
        "source": source,
    }


def _last_usage(context: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A session list line's usage: what its last request sent; None before its first."""
    if context is None:
        return None
    return usage_view(context["prompt_tokens"], context["budget"], context["summaries"], "last_request")
