"""The canonical request and answers: what the pipeline works on, whatever API the client spoke.

A door parses its client's body into a `Conversation` (chat messages, the parameters to forward, how the answer
is to be delivered) and its headers into `ContextOptions`; the pipeline answers with an `Answer`, which the door
renders back in its own API. See docs/architecture.md, "The canonical form".
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.journal.relay import JournaledGroups
from proxy.journal.steps import StepRecord
from proxy.types import Chunk, Message, NativeRequest, RawList


class ContextMode(enum.StrEnum):
    AUTO = "auto"
    OFF = "off"
    """Pure pass-through: the messages are stored but sent as they came, never compacted."""


@dataclass(frozen=True)
class Conversation:
    model: str
    """The configured model name the client asked for."""
    messages: list[Message]
    """The whole conversation as the client sent it, in chat-completions form."""
    params: dict[str, Any]
    """Every other field of the request, forwarded to the upstream as sent (the stream flag included)."""
    stream: bool
    max_output: int | None
    """The output the client asked to reserve, which the input budget leaves room for."""
    max_output_param: str
    """The request field `max_output` came from, named in errors."""
    identity: Mapping[str, Any]
    """What makes two requests the same request for an Idempotency-Key: the body without its delivery fields,
    so a retry may ask for a stream where the first attempt asked for JSON, or the reverse."""
    native: NativeRequest | None = None
    """The request in the client's own API (Responses, Messages): a model configured with the same `api` is sent
    it in that API (`proxy.upstream.router`)."""
    wire: Mapping[str, Any] = field(default_factory=dict)
    """What the client's door keeps of the request with its journal step (JSON), to render the response again
    later: the Responses door's stored responses (`GET /v1/responses/{id}`)."""
    continues: Continuation | None = None
    """A stored conversation this request continues (Responses' `previous_response_id`, a compaction item): it
    goes before the request's own messages."""
    compaction: bool = False
    """The client asks for its context to be compacted (Codex's `compaction_trigger`, `/v1/responses/compact`):
    the proxy keeps what is new and answers with a reference to the stored conversation, without a model call."""
    instructions: int = 0
    """How many leading messages are the request's own instructions: a continued conversation goes after them."""
    fit_output: bool = False
    """The client asks for its own model's output limit, not the configured model's (Anthropic clients): the
    output to reserve is lowered to what the configured model can give."""
    definitions: int = 0
    """What the request's tool definitions and output schema cost by the proxy's count (`tokens.count_definitions`,
    set by the pipeline): sent with every request besides the messages, so the budget leaves room for them."""
    raw_messages: RawList | None = None
    """The client's bytes of `messages` (the chat door's, whose messages are the list's elements)."""


@dataclass(frozen=True)
class Continuation:
    """What a request continues: a journal step's answer, readable only through the door that answered it, or
    (`message_id`) a stored conversation a reference of the proxy's stands for."""

    step_id: int | None
    """None: an id that names no step (it reads as not found), or a `message_id` continuation."""
    door: str
    reference: str
    """The id as the client gave it, for errors."""
    param: str
    """The request field it came in, for errors."""
    same_connection: bool = False
    """The step was answered on the same socket: it may be continued even if the client did not store it, as
    OpenAI's WebSocket mode allows."""
    message_id: str | None = None
    """The last message of the stored conversation continued (a compaction item's)."""


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
class ContextOptions:
    """The per-request headers that steer the proxy (docs/architecture.md, "External interface")."""

    session_id: str | None = None
    """X-Session-Id: the conversation's name; derived from its first request when absent."""
    budget: int | None = None
    """X-Context-Budget: a lower input budget, remembered for the session."""
    reset_budget: bool = False
    """X-Context-Budget: none — forget the session's remembered budget."""
    preserve_recent: int | None = None
    """X-Context-Preserve-Recent: how many latest messages stay verbatim (else `context.preserve_recent`)."""
    mode: ContextMode = ContextMode.AUTO
    """X-Context-Mode."""
    idempotency_key: str | None = None
    """Idempotency-Key: a retry under the same key and body is answered from the journal."""
    strategies: tuple[str, ...] | None = None
    """X-Context-Strategy: the compaction strategies for this session, remembered like its budget."""
    session_hints: tuple[str, ...] = ()
    """The client's own names for its conversation (a header of its own, a field of its body), in order: the
    session when X-Session-Id names none and the request continues no stored answer."""

    def with_session(self, continued: str | None) -> ContextOptions:
        """X-Session-Id; else the session of the answer the request continues; else the client's own name for
        its conversation."""
        if self.session_id is not None:
            return self
        for key in (continued, *self.session_hints):
            if key:
                return replace(self, session_id=key)
        return self


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
    step: StepRef = field(default_factory=lambda: StepRef(0, 0.0))


@dataclass(frozen=True)
class Streaming:
    """A stream answer: groups of chunks, each durable before it is yielded (`proxy.journal.relay`)."""

    groups: JournaledGroups
    report: ContextReport
    step: StepRef = field(default_factory=lambda: StepRef(0, 0.0))


@dataclass(frozen=True)
class Replayed:
    """An Idempotency-Key retry answered from the journal, without an upstream call; `chunks` are of the kind
    `stream` asked for (`proxy.journal.replay.answer_chunks`). `report` is the step's own, as it was sent."""

    chunks: list[Chunk]
    report: ContextReport
    step: StepRef
    record: StepRecord

    @classmethod
    def of(cls, record: StepRecord, chunks: list[Chunk]) -> Replayed:
        report = ContextReport.from_json(record.session_id or "", record.context)
        return cls(chunks, report, StepRef(record.id, record.created_at), record)


@dataclass(frozen=True)
class Compacted:
    """A client's compaction request answered by the proxy: the conversation is stored, and `message_id` (its
    last message) is what the client's reference to it names."""

    message_id: str
    report: ContextReport
    step: StepRef
    """No journal step answered it: its id is 0, its time the answer's."""


Answer = Completed | Streaming | Replayed | Compacted


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
