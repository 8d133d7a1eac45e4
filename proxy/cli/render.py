"""The inspection views as text tables for a person at a terminal (`--json` prints the views themselves)."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

PREVIEW_CHARS = 60
SHORT_ID_CHARS = 12
"""A message id as `sessions show` prints it; `sessions pin|unpin` take such a prefix (`--json` has them whole)."""


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


def render_corrections(data: dict[str, Any]) -> str:
    if not data["data"]:
        return "no corrections in force: every model's budget is as configured"
    rows = [("MODEL", "FACTOR", "WINDOW", "CONFIGURED", "LEARNED", "EXPIRES")]
    rows += [
        (
            c["model"],
            f"{c['factor']:.3f}",
            str(c["context_window"] or "-"),
            str(c["configured_window"] or "-"),
            _time(c["learned_at"]),
            _time(c["expires_at"]),
        )
        for c in data["data"]
    ]
    return _table(rows)


def render_reset(data: dict[str, Any]) -> str:
    models = data["models"]
    return f"reset: {', '.join(models)}" if models else "nothing to reset: no correction was in force"


def render_session(data: dict[str, Any]) -> str:
    usage = data["usage"]
    lines = [
        f"session {data['id']}  model {data['model']}  updated {_time(data['updated_at'])}",
        f"usage   {usage['text']}  severity {usage['severity']}  history {usage['history_tokens']} tokens",
        f"limits  {data['limits']['context_window']} window / {data['limits']['max_output']} output "
        f"({data['limits']['source']})",
        "",
    ]
    rows = [("#", "ID", "ROLE", "TOKENS", "SUMMARY", "PINNED", "CONTENT")]
    for index, message in enumerate(data["messages"]):
        content = message["content"] if isinstance(message["content"], str) else str(message["content"] or "")
        if "tool_calls" in message:
            content = "tool_calls: " + ", ".join(c["function"]["name"] for c in message["tool_calls"]) + " " + content
        rows.append(
            (
                str(index),
                message["id"][:SHORT_ID_CHARS],
                message["role"],
                str(message["tokens"]),
                str(message["summary_id"] or ""),
                "pinned" if message.get("pinned") else "",
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


def render_pins(data: dict[str, Any]) -> str:
    rows = [("#", "MESSAGE", "ROLE", "TOKENS", "PINNED BY")]
    rows += [(str(p["position"]), p["message_id"], p["role"], str(p["tokens"]), p["pinned_by"]) for p in data["pins"]]
    lines = [f"session {data['session_id']}  {len(data['pins'])} pinned"]
    if "removed" in data:
        lines[0] += f"  ({data['removed']} unpinned)"
    return "\n".join([*lines, "", _table(rows)] if data["pins"] else lines)


def render_events(data: dict[str, Any]) -> str:
    rows = [("ID", "EVENT", "STRATEGY", "RANGE", "TOKENS", "MS", "SUMMARY", "BY", "MODEL", "WHEN", "DETAIL")]
    rows += [
        (
            str(e["id"]),
            e["event"],
            e["strategy"] + (" (background)" if e["background"] else ""),
            "" if e["range_start"] is None else f"[{e['range_start']}, {e['range_end']})",
            "" if e["tokens_before"] is None else f"{e['tokens_before']} -> {_blank(e['tokens_after'])}",
            "" if e["duration_ms"] is None else f"{e['duration_ms']:.0f}",
            _blank(e["summary_id"]),
            _blank(e["generated_by"]),
            _blank(e["model"]),
            _time(e["created_at"]),
            _preview(e["detail"] or ""),
        )
        for e in data["events"]
    ]
    more = "\n(more: use --offset)" if data["more"] else ""
    return f"session {data['session_id']}\n\n" + _table(rows) + more


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


def _blank(value: object) -> str:
    return "" if value is None else str(value)


def _preview(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= PREVIEW_CHARS else flat[: PREVIEW_CHARS - 1] + "…"


def _time(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S")
