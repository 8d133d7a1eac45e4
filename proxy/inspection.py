"""What the inspection endpoints and the CLI show: sessions, their history and summaries, the journal.

The HTTP routes and `context-proxy sessions|journal` share these views, so a person reading the terminal and
a program reading JSON see the same facts. Usage is the working context the session's next request would send
(a dry run of the builder: no summarizer call), against the budget of the session's model.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.compaction import Span, WorkingContext, build
from proxy.compactor import Compactor, builder_item
from proxy.compactor import Request as CompactionRequest
from proxy.config import Config, ModelEntry
from proxy.errors import InvalidRequest, NotFound
from proxy.history import History, StoredMessage
from proxy.journal import Journal
from proxy.limits import ModelLimits, effective_budget
from proxy.outbound import usage_text
from proxy.summaries import StoredSummary, Summaries, in_force
from proxy.tokens import count_prompt, encoding_for_model

DEFAULT_PAGE = 50
MAX_PAGE = 500
YELLOW_AT = 70
RED_AT = 90
STEP_STATUSES = ("open", "sealed", "complete", "interrupted", "failed")
PREVIEW_CHARS = 60


def severity(percent: float) -> str:
    if percent > RED_AT:
        return "red"
    if percent >= YELLOW_AT:
        return "yellow"
    return "green"


def page_params(limit: str | None, offset: str | None) -> tuple[int, int]:
    """`limit` and `offset` query parameters, checked: a bad one is a 400 naming it."""
    values = []
    for name, text, default, maximum in (
        ("limit", limit, DEFAULT_PAGE, MAX_PAGE),
        ("offset", offset, 0, None),
    ):
        if text is None:
            values.append(default)
            continue
        if not text.isascii() or not text.isdigit() or (maximum is not None and not 1 <= int(text) <= maximum):
            bound = f" between 1 and {maximum}" if maximum else ""
            raise InvalidRequest(f"Query parameter '{name}' must be a whole number{bound}.", param=name)
        values.append(int(text))
    return values[0], values[1]


@dataclass
class Inspector:
    config: Config
    history: History
    summaries: Summaries
    journal: Journal
    compactor: Compactor
    limits: Callable[[ModelEntry], ModelLimits]

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
        session = await self.history.session(tenant, session_id)
        if session is None:
            raise _no_session(session_id)
        entry = self._entry(session.model)
        encoding = encoding_for_model(entry.model)
        path = await self.history.path(tenant, session_id, encoding) or []
        summaries = await self.summaries.on_path(tenant, path)
        limits = self.limits(entry)
        cap = session.settings.get("budget")
        budget = effective_budget(
            limits, None, self.config.context.safety_margin, cap if isinstance(cap, int) else None
        ).input_budget
        context_tokens, used = self._dry_run(path, in_force(summaries), budget)
        percent = round(100 * context_tokens / budget, 1) if budget > 0 else 100.0
        covered_by = {position: span.id for span in used for position in range(span.start, span.end)}
        return {
            "id": session.id,
            "object": "session",
            "model": session.model,
            "created_at": session.created_at,
            "updated_at": session.updated_at,
            "settings": session.settings,
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
                "text": usage_text(context_tokens, budget, len(used)),
                "history_tokens": count_prompt(m.tokens for m in path),
                "summaries_in_context": len(used),
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
        session = await self.history.session(tenant, session_id)
        if session is None:
            raise _no_session(session_id)
        entry = self._entry(session.model)
        encoding = encoding_for_model(entry.model)
        async with self.history.lock(tenant, session_id):
            path = await self.history.path(tenant, session_id, encoding) or []
            budget = effective_budget(self.limits(entry), None, self.config.context.safety_margin).input_budget
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
        if status is not None and status not in STEP_STATUSES:
            raise InvalidRequest(f"status must be one of {', '.join(STEP_STATUSES)}.", param="status")
        records, has_more = await self.journal.steps(
            tenant, status=status, session_id=session_id, limit=limit, offset=offset
        )
        return {"object": "list", "data": [record.as_json() for record in records], "has_more": has_more}

    async def step(self, tenant: str, step_id: int) -> dict[str, Any]:
        record = await self.journal.step(tenant, step_id)
        if record is None:
            raise NotFound(f"No journal step {step_id}.", code="step_not_found")
        return record.as_json()

    def _entry(self, model: str | None) -> ModelEntry:
        return (self.config.model(model) if model else None) or ModelEntry(name=model or "", model=model or "")

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


def _no_session(session_id: str) -> NotFound:
    return NotFound(f"No session with id '{session_id}'.", code="session_not_found")


def render_sessions(data: dict[str, Any]) -> str:
    rows = [("SESSION", "MODEL", "MESSAGES", "TOKENS", "SUMMARIES", "UPDATED")]
    rows += [
        (
            s["id"],
            str(s["model"]),
            str(s["message_count"]),
            str(s["history_tokens"]),
            str(s["summaries"]),
            _time(s["updated_at"]),
        )
        for s in data["data"]
    ]
    more = "\n(more: use --offset)" if data["has_more"] else ""
    return _table(rows) + more


def render_session(data: dict[str, Any]) -> str:
    usage = data["usage"]
    lines = [
        f"session {data['id']}  model {data['model']}  updated {_time(data['updated_at'])}",
        f"usage   {usage['text']}  severity {usage['severity']}  history {usage['history_tokens']} tokens",
        f"limits  {data['limits']['context_window']} window / {data['limits']['max_output']} output "
        f"({data['limits']['source']})",
        "",
    ]
    rows = [("#", "ROLE", "TOKENS", "SUMMARY", "CONTENT")]
    for index, message in enumerate(data["messages"]):
        content = message["content"] if isinstance(message["content"], str) else str(message["content"] or "")
        if "tool_calls" in message:
            content = "tool_calls: " + ", ".join(c["function"]["name"] for c in message["tool_calls"]) + " " + content
        rows.append(
            (
                str(index),
                message["role"],
                str(message["tokens"]),
                str(message["summary_id"] or ""),
                _preview(content),
            )
        )
    lines.append(_table(rows))
    if data["summaries"]:
        lines += [
            "",
            _table(
                [("SUMMARY", "RANGE", "TOKENS", "ORIGINAL", "RATIO", "MODEL", "BY", "STATE")]
                + [
                    (
                        str(s["id"]),
                        f"[{s['range'][0]}, {s['range'][1]})",
                        str(s["tokens"]),
                        str(s["original_tokens"]),
                        str(s["ratio"]),
                        s["model"],
                        s["generated_by"],
                        "orphaned" if s["orphaned"] else "in force",
                    )
                    for s in data["summaries"]
                ]
            ),
        ]
    return "\n".join(lines)


def render_steps(data: dict[str, Any]) -> str:
    rows = [("STEP", "STATUS", "SESSION", "MODEL", "CREATED", "TEXT")]
    rows += [
        (
            str(s["step_id"]),
            s["status"],
            str(s["session_id"]),
            s["model"],
            _time(s["created_at"]),
            _preview(s["content"] or ""),
        )
        for s in data["data"]
    ]
    return _table(rows) + ("\n(more: use --offset)" if data["has_more"] else "")


def render_step(data: dict[str, Any]) -> str:
    header = (
        f"step {data['step_id']}  {data['status']}  session {data['session_id']}  model {data['model']}  "
        f"created {_time(data['created_at'])}  finish {data['finish_reason']}"
    )
    parts = [header, "", data["content"] or ""]
    if data["tool_calls"]:
        parts += ["", "tool calls:"] + [
            f"  {c['function']['name']}({c['function']['arguments']})" for c in data["tool_calls"]
        ]
    if data["error"]:
        parts += ["", f"error: {data['error'].get('message')}"]
    return "\n".join(parts)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"


def _time(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")


class InspectionError(Exception):
    """A CLI look-up that found nothing or was asked wrongly."""


@dataclass(frozen=True)
class Report:
    data: dict[str, Any]
    text: str


async def cli_report(config: Config, what: str, args: argparse.Namespace) -> Report:
    """Open the store read-side, build the view `what`, close again."""
    from proxy.services import open_services

    tenant = _cli_tenant(config, args.key)
    async with open_services(config, recover=False) as services:
        inspector = services.inspector
        try:
            if what == "sessions_list":
                data = await inspector.sessions(tenant, args.limit, args.offset)
                return Report(data, render_sessions(data))
            if what == "sessions_show":
                data = await inspector.session(tenant, args.session_id)
                return Report(data, render_session(data))
            if what == "journal_list":
                data = await inspector.steps(tenant, args.status, None, args.limit, args.offset)
                return Report(data, render_steps(data))
            data = await inspector.step(tenant, args.step_id)
            return Report(data, render_step(data))
        except (NotFound, InvalidRequest) as exc:
            raise InspectionError(exc.message) from exc


def _cli_tenant(config: Config, key: str | None) -> str:
    from proxy.auth import OPEN_TENANT, tenant_of

    if not config.auth.enabled:
        return OPEN_TENANT
    if key is None or key not in config.auth.keys:
        raise InspectionError("auth.keys is set: pass --key with one of the configured proxy keys")
    return tenant_of(key)
