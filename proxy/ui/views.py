"""The dashboard's JSON views: a session as rows (every compacted range one marker row), a span's summary and
originals, the tokens sent per turn, the streams in flight.

Sessions of 10,000 messages are read in pages: the server works out the whole path once per request (as every
proxied request does) and sends one page of rows, each message's text cut to `CONTENT_CHARS`. The markers are
the spans the session's next request would send (`Compactor.view`), so what the page shows compacted is what
the model is shown compacted; a tool output sent as its stub is a message row with its stub beside it.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.compaction.events import CompactionEvents
from proxy.compaction.span_store import StoredSpan
from proxy.errors import NotFound
from proxy.history.messages import StoredMessage
from proxy.inspection.views import Inspector, SessionState
from proxy.journal.reader import JournalReader
from proxy.journal.steps import StepStatus
from proxy.tokens import content_text

CONTENT_CHARS = 20_000
"""A message's text in a row is cut to this; the row says how long it was."""
ARGUMENT_CHARS = 2_000
TURNS_SHOWN = 1_000
"""The plot shows a session's latest turns."""
EVENTS_SHOWN = 2_000
STREAMS_SHOWN = 50
TAIL_CHARS = 400


@dataclass(frozen=True)
class Dashboard:
    inspector: Inspector
    journal: JournalReader
    events: CompactionEvents

    async def session(self, tenant: str, session_id: str) -> dict[str, Any]:
        state = await self.inspector.state(tenant, session_id)
        return {
            **state.header(),
            "message_count": len(state.path),
            "row_count": len(_rows(state)),
            "pins": len(state.pinned),
            "compacts": state.view.compacts,
            "spans": [_span(summary) for summary in state.view.spans],
        }

    async def rows(self, tenant: str, session_id: str, limit: int, offset: int) -> dict[str, Any]:
        state = await self.inspector.state(tenant, session_id)
        rows = _rows(state)
        page = [
            {"kind": "span", "span": _span(row)}
            if isinstance(row, StoredSpan)
            else {"kind": "message", "message": _message(state, row)}
            for row in rows[offset : offset + limit]
        ]
        return {"rows": page, "offset": offset, "total": len(rows), "has_more": offset + limit < len(rows)}

    async def span(self, tenant: str, session_id: str, span_id: int, limit: int, offset: int) -> dict[str, Any]:
        """A span on the session's path (in force or not) with a page of the originals it covers."""
        state = await self.inspector.state(tenant, session_id)
        summary = next((s for s in state.summaries if s.id == span_id), None)
        if summary is None:
            raise NotFound(f"Session '{session_id}' has no span {span_id} on its path.", code="span_not_found")
        start, end = summary.start_depth, summary.end_depth + 1
        positions = range(start + offset, min(end, start + offset + limit))
        return {
            "span": {**_span(summary), "content": summary.content},
            "messages": [_message(state, position) for position in positions],
            "offset": offset,
            "total": end - start,
            "has_more": start + offset + limit < end,
        }

    async def turns(self, tenant: str, session_id: str) -> dict[str, Any]:
        """Tokens sent against the budget for each of the latest turns, where compactions fell among them, and what
        the turns cost (`Inspector.cost`: sent, cached and summarizer tokens per turn, and the session's totals)."""
        await self.inspector.require(tenant, session_id)
        turns = await self.journal.contexts(tenant, session_id, TURNS_SHOWN)
        times = [turn["created_at"] for turn in turns]
        events = await self.events.latest(tenant, session_id, EVENTS_SHOWN)
        compactions = [
            {
                # Spans are written before the step of the request that needed them begins: they mark that turn.
                "turn": bisect.bisect_left(times, event["created_at"]),
                **{
                    name: event[name]
                    for name in ("event", "strategy", "tokens_before", "tokens_after", "background", "created_at")
                },
            }
            for event in reversed(events)
            if event["event"] != "start" and (not times or event["created_at"] >= times[0])
        ]
        cost = await self.inspector.cost(tenant, session_id, TURNS_SHOWN)
        return {"turns": turns, "compactions": compactions, "cost": cost}

    async def streams(self, tenant: str) -> dict[str, Any]:
        """The caller's steps still open: streams being relayed (and calls still waiting on the upstream)."""
        records, _more = await self.journal.steps(tenant, status=StepStatus.OPEN, limit=STREAMS_SHOWN)
        now = time.time()
        return {
            "data": [
                {
                    "step_id": record.id,
                    "session_id": record.session_id,
                    "model": record.model,
                    "stream": record.stream,
                    "created_at": record.created_at,
                    "age_s": round(max(0.0, now - record.created_at), 1),
                    "events": record.events,
                    "chars": len(record.content or ""),
                    "tail": (record.content or "")[-TAIL_CHARS:],
                }
                for record in records
            ]
        }


def _rows(state: SessionState) -> list[StoredSpan | int]:
    """The path in order: a summary or marker in the working context stands for its range, once."""
    starts = {summary.start_depth: summary for summary in state.view.spans}
    rows: list[StoredSpan | int] = []
    position = 0
    while position < len(state.path):
        summary = starts.get(position)
        if summary is None:
            rows.append(position)
            position += 1
        else:
            rows.append(summary)
            position = summary.end_depth + 1
    return rows


def _span(summary: StoredSpan) -> dict[str, Any]:
    start, end = summary.start_depth, summary.end_depth + 1
    return {
        "id": summary.id,
        "strategy": summary.strategy,
        "start": start,
        "end": end,
        "messages": end - start,
        "tokens_before": summary.original_tokens,
        "tokens_after": summary.tokens,
        "model": summary.model,
        "generated_by": summary.generated_by,
        "created_at": summary.created_at,
    }


def _message(state: SessionState, position: int) -> dict[str, Any]:
    stored: StoredMessage = state.path[position]
    message = stored.message
    text = content_text(message.get("content"))
    stub = state.view.stubs.get(position)
    tool_call_id = message.get("tool_call_id")
    return {
        "id": stored.id,
        "position": position,
        "role": stored.role,
        "content": text[:CONTENT_CHARS],
        "content_chars": len(text),
        "truncated": len(text) > CONTENT_CHARS,
        "tool_calls": _calls(message.get("tool_calls")),
        "tool_call_id": tool_call_id if isinstance(tool_call_id, str) else None,
        "tokens": stored.tokens,
        "created_at": stored.created_at,
        "pinned": state.pinned.get(position),
        "stubbed": stub is not None,
        "stub": stub,
    }


def _calls(calls: Any) -> list[dict[str, Any]]:
    if not isinstance(calls, Sequence):
        return []
    shown = []
    for call in calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            continue
        arguments = function.get("arguments")
        shown.append(
            {
                "id": call.get("id"),
                "name": function.get("name"),
                "arguments": (arguments if isinstance(arguments, str) else "")[:ARGUMENT_CHARS],
            }
        )
    return shown
