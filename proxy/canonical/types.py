"""Type aliases every stage shares, defined once.

The canonical conversation is OpenAI's chat-completions form: a list of chat messages, answered by
`chat.completion` objects or a stream of `chat.completion.chunk` objects. LiteLLM speaks it to every provider,
so the stages after a door see nothing else (docs/architecture.md, "The canonical form").
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.canonical.pieces import Pieces

JSONObject = dict[str, Any]
Message = dict[str, Any]
"""One chat message: role, content, and name / tool_calls / tool_call_id where present."""


def assistant_turn(text: str, calls: list[dict[str, Any]]) -> Message:
    """An assistant message for another API's turn, in the form the history stores (`history.chain.normalize`):
    its text, no content beside tool calls when it has none, else "". (A re-sent turn then equals its stored
    form, and is not normalized again on every request.)"""
    message: Message = {"role": "assistant"}
    if text or not calls:
        message["content"] = text
    if calls:
        message["tool_calls"] = calls
    return message


Chunk = dict[str, Any]
"""A `chat.completion.chunk` (stream) or a `chat.completion` (non-stream) JSON object."""
Clock = Callable[[], float]
"""Seconds; `time.time` for stored timestamps, `time.monotonic` for durations. Injected so tests control time."""


@dataclass(frozen=True, eq=False)
class RawList:
    """A list in a request's body as the client sent it: `elements` are what `raw` parsed to, element i ending at
    byte `ends[i]`. An upstream body that holds a run of these very objects writes their bytes as they came
    instead of encoding them again (`proxy.upstream.json_body`): equal bytes, since nothing changes a request's
    messages in place."""

    raw: Pieces = field(repr=False)
    elements: Sequence[Any] = field(repr=False)
    ends: Sequence[int] = field(repr=False)


@dataclass(frozen=True)
class NativeRequest:
    """A request in the client's own API (Responses, Messages) without its conversation: what a model configured
    with the same `api` is sent, with the working context put in that API's form (`proxy.upstream.router`)."""

    api: str
    """The API (`RESPONSES_API`, `MESSAGES_API`: `proxy.config.models.UPSTREAM_APIS`), as a model entry's `api`
    names it and its client in `proxy.upstream.natives` declares it."""
    body: Mapping[str, Any]
    """The request's other fields, as sent."""
    headers: Mapping[str, str] = field(default_factory=dict)
    """The client's headers its API defines (`anthropic-beta`): the fields it sent may depend on them."""
