"""An answer rebuilt from a step's record, for a replay whose events were pruned or were of the other kind.

An Idempotency-Key retry may ask for a stream where the first attempt asked for JSON, or the reverse, and
events of ended steps expire: the step row's assembled answer is then enough to answer in the canonical form
(a `chat.completion`, or a minimal `chat.completion.chunk` sequence), which the door renders.
"""

from __future__ import annotations

from typing import Any

from proxy.canonical.answers import ContextReport, Replayed, StepRef
from proxy.canonical.types import Chunk
from proxy.journal.steps import StepRecord

REPLAY_ID_PREFIX = "chatcmpl-journal-"


def completion_from_record(record: StepRecord) -> Chunk:
    """A chat.completion carrying a step's assembled answer."""
    message: dict[str, Any] = {"role": "assistant", "content": record.content}
    if record.tool_calls:
        message["tool_calls"] = record.tool_calls
    completion: Chunk = {
        "id": f"{REPLAY_ID_PREFIX}{record.id}",
        "object": "chat.completion",
        "created": int(record.created_at),
        "model": record.model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(record)}],
    }
    if record.usage is not None:
        completion["usage"] = record.usage
    return completion


def chunks_from_record(record: StepRecord) -> list[Chunk]:
    """A minimal chat.completion.chunk sequence for a step's answer: text, tool calls, finish, usage."""
    base = {
        "id": f"{REPLAY_ID_PREFIX}{record.id}",
        "object": "chat.completion.chunk",
        "created": int(record.created_at),
        "model": record.model,
    }

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> Chunk:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}]}

    chunks = [chunk({"role": "assistant", "content": record.content or ""})]
    if record.tool_calls:
        calls = [{"index": index, **call} for index, call in enumerate(record.tool_calls)]
        chunks.append(chunk({"tool_calls": calls}))
    chunks.append(chunk({}, _finish_reason(record)))
    if record.usage is not None:
        chunks.append({**base, "choices": [], "usage": record.usage})
    return chunks


def replayed(record: StepRecord, stored: list[Chunk], stream: bool) -> Replayed:
    """An Idempotency-Key retry's answer: the step's chunks of the kind `stream` asks for, and the report it sent."""
    report = ContextReport.from_json(record.session_id or "", record.context)
    return Replayed(_answer_chunks(record, stored, stream), report, StepRef(record.id, record.created_at))


def _answer_chunks(record: StepRecord, stored: list[Chunk], stream: bool) -> list[Chunk]:
    """What a replay sends: the stored chunks when they are of the kind asked for, else rebuilt ones.

    For `stream=False` the list holds one chat.completion.
    """
    if stream:
        return stored if stored and record.stream else chunks_from_record(record)
    return stored[:1] if stored and not record.stream else [completion_from_record(record)]


def _finish_reason(record: StepRecord) -> str:
    return record.finish_reason or ("tool_calls" if record.tool_calls else "stop")
