"""Helpers shared by the reliability suite: SQLite probes, SSE parsing, OpenAI error shapes, time bounds."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

Chunk = dict[str, Any]
TABLES = ("sessions", "messages", "summaries", "journal_steps", "journal_events")
STEP_END_STATES = frozenset({"sealed", "complete", "interrupted", "failed"})


@contextmanager
def read_only(path: Path) -> Iterator[sqlite3.Connection]:
    """A second reader of the proxy's SQLite file (WAL lets it read beside the running writer)."""
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    connection.row_factory = sqlite3.Row
    try:
        yield connection
    finally:
        connection.close()


def integrity(path: Path) -> str:
    with read_only(path) as db:
        rows = db.execute("PRAGMA integrity_check").fetchall()
    return "; ".join(str(row[0]) for row in rows)


def row_counts(path: Path) -> dict[str, int]:
    with read_only(path) as db:
        return {table: int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]) for table in TABLES}


def step_statuses(path: Path) -> dict[str, int]:
    with read_only(path) as db:
        rows = db.execute("SELECT status, COUNT(*) FROM journal_steps GROUP BY status").fetchall()
    return {str(row[0]): int(row[1]) for row in rows}


def assert_openai_error(body: Any, *, status: int | None = None) -> dict[str, Any]:
    """`{"error": {"message": str, "type": str, "param": ..., "code": ...}}` and nothing else; returns the error."""
    assert isinstance(body, dict), body
    assert set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict), body
    assert set(error) == {"message", "type", "param", "code"}, body
    assert isinstance(error["message"], str), body
    assert error["message"], body
    assert isinstance(error["type"], str), body
    assert error["type"], body
    assert error["param"] is None or isinstance(error["param"], str), body
    assert error["code"] is None or isinstance(error["code"], str), body
    return error


def sse_events(response: httpx.Response) -> Iterator[Chunk | str]:
    """Each `data:` payload of an SSE response as it arrives: parsed JSON, or the string `[DONE]`."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            yield data
            return
        event: Chunk = json.loads(data)
        yield event


def chunk_text(chunk: Chunk) -> str:
    return "".join((choice.get("delta") or {}).get("content") or "" for choice in chunk.get("choices") or [])
