"""The canonical answers: what the pipeline hands a door to render in its own API, and the context report every
door sends as X-Context-* headers. A door's rendering reads these only; how they were journaled is the journal's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from proxy.canonical.types import Chunk


@dataclass(frozen=True)
class Journaled:
    """A chunk that is durable, with the JSON text the journal stored for it."""

    chunk: Chunk
    text: str


class StreamGroups(Protocol):
    """A stream answer's durable groups, in order; `aclose` tells the producer the consumer left (even before the
    first group, which closing a generator that never started would not)."""

    def __aiter__(self) -> AsyncIterator[Sequence[Journaled]]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class ContextReport:
    """What the proxy did with the context of one request; every door sends it as X-Context-* headers."""

    session_id: str
    prompt_tokens: int
    """The working context sent upstream with the request's definitions (tools, schema), by the proxy's count."""
    budget: int
    """The effective input budget it had to fit."""
    history_tokens: int
    """The whole stored conversation, which the working context stands for (with the request's definitions: what
    sending it all would cost)."""
    summaries: int
    recalled: int = 0
    """Archived passages recalled into the working context."""

    @classmethod
    def from_json(cls, session_id: str, kept: Mapping[str, Any] | None) -> ContextReport:
        """The report a step kept (`as_json`); zeros for a step from before reports were kept."""
        numbers = {name: int((kept or {}).get(name) or 0) for name in _REPORT_NUMBERS}
        return cls(session_id=session_id, **numbers)

    def as_json(self) -> dict[str, int]:
        """What the journal keeps of it for the step (the session id is the step's own)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "budget": self.budget,
            "history_tokens": self.history_tokens,
            "summaries": self.summaries,
            "recalled": self.recalled,
        }


_REPORT_NUMBERS = ("prompt_tokens", "budget", "history_tokens", "summaries", "recalled")


@dataclass(frozen=True)
class StepRef:
    """The journal step that answered: doors whose wire names a response by id (Responses) derive it from this."""

    id: int
    created_at: float


@dataclass(frozen=True)
class Completed:
    """A non-stream answer: one `chat.completion`, already sealed in the journal and the history."""

    response: Chunk
    report: ContextReport
    step: StepRef


@dataclass(frozen=True)
class Streaming:
    """A stream answer: groups of chunks, each durable before it is yielded (`proxy.journal.relay`)."""

    groups: StreamGroups
    report: ContextReport
    step: StepRef


@dataclass(frozen=True)
class Replayed:
    """An Idempotency-Key retry answered from the journal, without an upstream call; `chunks` are of the kind
    `stream` asked for (`proxy.journal.replay.replayed`). `report` is the step's own, as it was sent."""

    chunks: list[Chunk]
    report: ContextReport
    step: StepRef


Answer = Completed | Streaming | Replayed


def usage_text(tokens: int, budget: int, summaries: int) -> str:
    """The compact gauge of `X-Context-Usage`: `2.1k / 129k (1%)`, `50k / 129k (39%) [2S]`."""
    percent = round(100 * tokens / budget) if budget > 0 else 100
    text = f"{compact_count(tokens)} / {compact_count(budget)} ({percent}%)"
    return f"{text} [{summaries}S]" if summaries else text


def compact_count(tokens: int) -> str:
    if tokens < 1000:
        return str(tokens)
    if tokens < 10_000:
        return f"{tokens / 1000:.1f}k".replace(".0k", "k")
    if tokens < 1_000_000:
        return f"{round(tokens / 1000)}k"
    return f"{tokens / 1_000_000:.1f}M".replace(".0M", "M")
