"""The proxy's in-band vocabulary: every key it carries inside the canonical dicts, declared once.

The canonical form is OpenAI's chat shape (`proxy.canonical.types`); a few things ride inside it under keys of the
proxy's own: the parts of another API a message stands for, a native upstream's events and answers, and the origin of
messages the proxy writes itself (so it never has to recognize them by their text). A chat upstream must never
see them: `chat_messages` is the one place they are stripped.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.canonical.types import Message

SYSTEM_ROLES = ("system", "developer")
"""The roles of the instructions a conversation carries: pinned context, identified by their place (`history.chain`)."""
ITEMS = "items"
"""On a message: the parts of another API it stands for (Responses items, Anthropic blocks) as the client sent
them — ids, encrypted reasoning, unknown fields. Stored with it, never part of its identity."""
ANSWER = "answer"
"""On the delta of a native upstream's last chunk (and a native completion's message): the whole answer message,
its parts assembled from the events."""
EVENT = "event"
"""On a chunk from a native upstream: that upstream's event, whole, relayed as it came to a client of its API."""
RESPONSE = "response"
"""On a completion from a native upstream: that upstream's own answer object."""
ORIGIN = "origin"
"""On a message the proxy wrote into a working context: which kind it is (`Origin`)."""


class Origin:
    """The kinds of message the proxy writes into a working context."""

    SUMMARY = "summary"
    """A summary of earlier turns, a user turn."""
    MARKER = "marker"
    """Where turns left the context (sliding window), a user turn."""
    ACKNOWLEDGEMENT = "acknowledgement"
    """The assistant turn that keeps turns alternating around a summary, a marker or a recall."""
    RECALL = "recall"
    """Archived passages placed back before the latest question, a user turn."""


_MESSAGE_KEYS = (ITEMS, ANSWER, ORIGIN)


def proxy_key(message: Mapping[str, Any]) -> str | None:
    """The first of the proxy's in-band keys a message carries, if any: a client's message must carry none (a
    client that sent `origin` would pass its text off as a summary the proxy wrote)."""
    return next((key for key in _MESSAGE_KEYS if key in message), None)


def origin(message: Mapping[str, Any]) -> str | None:
    """Which kind of proxy-written message this is; None for a message the client sent (or the model wrote)."""
    value = message.get(ORIGIN)
    return value if isinstance(value, str) else None


def chat_messages(messages: Sequence[Message], verbatim: int = 0) -> list[Message]:
    """Messages as a chat-completions upstream takes them: without the proxy's keys, and without a message that
    was only another API's items (a reasoning item, a hosted tool's call) and says nothing in chat terms.

    The last `verbatim` messages are not looked at: the run of a chat request's own messages at the end
    (`json_body.client_run`), on which the chat door refused the proxy's keys (`proxy_key`)."""
    chat = list(messages)
    looked = len(chat) - verbatim
    # Found a key at a time at C speed (a dict lookup each, cheaper than a set test of each message's keys): most
    # messages carry none of them.
    marked = {
        index
        for key in _MESSAGE_KEYS
        if any(map(operator.contains, itertools.islice(chat, looked), itertools.repeat(key)))
        for index in itertools.compress(range(looked), map(operator.contains, chat, itertools.repeat(key)))
    }
    for index in sorted(marked, reverse=True):
        message = chat[index]
        plain = {key: value for key, value in message.items() if key not in _MESSAGE_KEYS}
        if ITEMS not in message or plain.get("role") == "tool" or plain.get("content") or plain.get("tool_calls"):
            chat[index] = plain
        else:
            del chat[index]
    return chat
