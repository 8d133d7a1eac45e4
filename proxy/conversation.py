"""The canonical request: what every stage after a wire adapter works on, whatever format the client spoke.

A wire adapter parses its client's body into a `Conversation` (chat messages, the parameters to forward, how
the answer is to be delivered) and its headers into `ContextOptions`; the pipeline answers with an `Answer`,
which the adapter renders back in its own format. See docs/architecture.md, "The canonical form".
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from proxy.journal.relay import JournaledGroups
from proxy.journal.steps import StepRecord
from proxy.types import Chunk, Message

NATIVE_API = "__api__"
"""The key of `Conversation.native` that names its API."""
NATIVE_HEADERS = "__headers__"
"""The key of `Conversation.native` with the client's headers its API defines (`anthropic-beta`), forwarded."""


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
    native: Mapping[str, Any] | None = None
    """The request in the client's own API without its conversation, and that API under `NATIVE_API`
    (`responses`, `messages`): a model configured with the same `api` is sent it with the working context in
    that API's form (`proxy.formats.responses_items.input_items`, `proxy.formats.anthropic_blocks.anthropic_request`)."""
    wire: Mapping[str, Any] = field(default_factory=dict)
    """What the client's door keeps of the request with its journal step (JSON), to render the response again
    later: the Responses door's stored responses (`GET /v1/responses/{id}`)."""


@dataclass(frozen=True)
class ContextReport:
    """What the proxy did with the context of one request; every door sends it as X-Context-* headers."""

    session_id: str
    prompt_tokens: int
    """The working context sent upstream, by the proxy's own count."""
    budget: int
    """The effective input budget it had to fit."""
    history_tokens: int
    """The whole stored conversation, which the working context stands for."""
    summaries: int
    recalled: int = 0
    """Archived passages recalled into the working context."""

    def as_json(self) -> dict[str, int]:
        """What the journal keeps of it for the step (the session id is the step's own)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "budget": self.budget,
            "history_tokens": self.history_tokens,
            "summaries": self.summaries,
            "recalled": self.recalled,
        }


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
    `stream` asked for (`proxy.journal.replay.answer_chunks`)."""

    record: StepRecord
    chunks: list[Chunk]


Answer = Completed | Streaming | Replayed
