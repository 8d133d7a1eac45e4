"""The canonical request: what the pipeline works on, whatever API the client spoke.

A door parses its client's body into a `Conversation` (chat messages, the parameters to forward, how the answer
is to be delivered) and its headers into `ContextOptions`; the pipeline answers with an `Answer`
(`proxy.canonical.answers`). See docs/architecture.md, "The canonical form".
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from proxy.canonical.types import Message, NativeRequest, RawList


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
    door_state: Mapping[str, Any] = field(default_factory=dict)
    """What the client's door keeps of the request with its journal step (JSON), to render the response again
    later: the Responses door's stored responses (`GET /v1/responses/{id}`)."""
    continues: Continuation | None = None
    """A stored conversation this request continues (Responses' `previous_response_id`, a compaction item): it
    goes before the request's own messages."""
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
