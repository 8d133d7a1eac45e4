"""A chat request's body as JSON, each message written once per conversation.

A client re-sends its conversation every turn, and its messages reach this layer as the very objects of its
last request (`proxy.sharing`): a 5,000-message history is ~4 MB of JSON, ~2 ms for orjson on every request.
So the JSON of each message is kept beside the messages of the conversation's last body, and a body whose
messages start with the same objects reuses it, writing only the rest; the pieces are joined (C, ~0.3 ms for
4 MB). Bounded by bytes, per process, correct to lose.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from proxy.sharing import shared_prefix
from proxy.types import Message

WRITTEN_BYTES = 64 * 1024 * 1024
"""About how much JSON the kept bodies hold in all; the least recent conversations' go first."""


def json_bytes(value: Any) -> bytes:
    """Compact UTF-8 JSON: orjson writes a 5,000-message history in ~2 ms, the standard library in ~20 ms. It
    refuses only integers past 64 bits, which the standard library writes."""
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


@dataclass(frozen=True)
class _Written:
    messages: list[Message]
    """The messages of the conversation's last body; the first is what it is found by."""
    pieces: list[bytes]
    """Each message's JSON."""
    size: int


class JsonBodies:
    def __init__(self, max_bytes: int = WRITTEN_BYTES) -> None:
        self._max_bytes = max_bytes
        self._written: OrderedDict[int, _Written] = OrderedDict()
        """id of a body's first message (held, so the id is its own) → what its body's messages were written as."""
        self._bytes = 0

    def body(self, fields: Mapping[str, Any], messages: Sequence[Message]) -> bytes:
        """`{**fields, "messages": messages}` as JSON (`json_bytes`), the messages after `fields`."""
        head = json_bytes(fields)
        key = id(messages[0]) if messages else 0
        written = self._written.pop(key, None)
        shared, pieces = 0, []
        if written is not None:
            self._bytes -= written.size
            shared = shared_prefix(messages, written.messages)  # 0 unless the first is the very same object
            pieces = written.pieces[:shared]
        pieces.extend(map(json_bytes, messages[shared:]))
        listed = b",".join(pieces)
        if messages and len(listed) <= self._max_bytes:
            self._written[key] = _Written(list(messages), pieces, len(listed))
            self._bytes += len(listed)
            while self._bytes > self._max_bytes:
                _, oldest = self._written.popitem(last=False)
                self._bytes -= oldest.size
        return head[:-1] + (b"," if len(head) > 2 else b"") + b'"messages":[' + listed + b"]}"
