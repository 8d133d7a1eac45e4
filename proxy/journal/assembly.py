"""An answer from its chunks: what the journal stores as a step's text, tool calls, finish_reason and usage.

One function for every place that needs it — the journal as chunks are appended, recovery reading events
back, replays — so a streamed answer, a replayed one and a recovered one are assembled alike. Only choice 0 is
assembled (the proxy answers `n=1`; other choices stay in the stored chunks).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from proxy.canonical.types import Chunk, Message
from proxy.canonical.vocabulary import ANSWER

PIECES_PER_BLOCK = 512
"""Stream deltas are a few characters each, and a Python string costs ~50 bytes beside its text: pieces are joined
into blocks as they come, so a long answer costs about its own size in memory, not ten times that."""


@dataclass
class Text:
    """A text appended piece by piece, kept as blocks of joined pieces."""

    blocks: list[str] = field(default_factory=list)
    pieces: list[str] = field(default_factory=list)
    size: int = 0

    def append(self, piece: str) -> None:
        self.pieces.append(piece)
        self.size += len(piece)
        if len(self.pieces) >= PIECES_PER_BLOCK:
            self.blocks.append("".join(self.pieces))
            self.pieces = []

    def value(self) -> str:
        return "".join(self.blocks) + "".join(self.pieces)


@dataclass
class _ToolCall:
    id: str | None = None
    type: str = "function"
    name: str = ""
    arguments: Text = field(default_factory=Text)


@dataclass
class Assembly:
    """The answer put together from chunks: choice 0's text, tool calls by index, finish_reason, usage.

    A chat.completion is treated as a one-chunk stream (its `message` read like a `delta`), so one function
    assembles both kinds.
    """

    text: Text = field(default_factory=Text)
    calls: dict[int, _ToolCall] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    answer: Message | None = None
    """A native upstream's answer as the message it is (`ANSWER` in a chunk's delta): its items as the upstream
    sent them (reasoning, thinking with signatures, ids), which the deltas alone do not carry."""

    def add(self, chunk: Chunk) -> None:
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        for choice in chunk.get("choices") or ():
            if choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta") or choice.get("message")
            if delta:
                answer = delta.get(ANSWER)
                if isinstance(answer, dict):
                    self.answer = answer
                content = delta.get("content")
                if isinstance(content, str) and content:
                    self.text.append(content)
                for position, call in enumerate(delta.get("tool_calls") or ()):
                    self._add_call(position, call)
            reason = choice.get("finish_reason")
            if reason:
                self.finish_reason = reason

    def _add_call(self, position: int, delta: dict[str, Any]) -> None:
        # The first fragment of a call carries id, type and function name; later ones append arguments.
        index = delta.get("index")
        call = self.calls.setdefault(index if isinstance(index, int) else position, _ToolCall())
        if delta.get("id") and call.id is None:
            call.id = delta["id"]
        if delta.get("type"):
            call.type = delta["type"]
        function = delta.get("function") or {}
        if function.get("name") and not call.name:
            call.name = function["name"]
        arguments = function.get("arguments")
        if isinstance(arguments, str) and arguments:
            call.arguments.append(arguments)

    @property
    def size(self) -> int:
        """Characters of text and tool call arguments so far: what `limits.max_answer_chars` bounds."""
        return self.text.size + sum(call.arguments.size for call in self.calls.values())

    @property
    def content(self) -> str | None:
        return self.text.value() or None

    @property
    def tool_calls(self) -> list[dict[str, Any]] | None:
        if not self.calls:
            return None
        return [
            {
                "id": call.id or f"call_{index}",
                "type": call.type,
                "function": {"name": call.name, "arguments": call.arguments.value()},
            }
            for index, call in sorted(self.calls.items())
        ]

    def cut(self, limit: int) -> Assembly:
        """This answer's first `limit` characters (its text, then its tool calls' arguments), as a step failed
        for `limits.max_answer_chars` keeps it: an oversized answer is never stored whole. A native upstream's
        whole message (`answer`) is not kept."""
        kept = Assembly(finish_reason=self.finish_reason, usage=self.usage)
        text = self.text.value()[:limit]
        if text:
            kept.text.append(text)
        room = limit - len(text)
        for index, call in sorted(self.calls.items()):
            arguments = call.arguments.value()[:room]
            room -= len(arguments)
            kept.calls[index] = _ToolCall(call.id, call.type, call.name)
            if arguments:
                kept.calls[index].arguments.append(arguments)
        return kept

    def message(self) -> Message:
        """The assistant message this answer is, as stored in history."""
        if self.answer is not None:
            return dict(self.answer)
        message: Message = {"role": "assistant", "content": self.content}
        tool_calls = self.tool_calls
        if tool_calls:
            message["tool_calls"] = tool_calls
        return message


def answer_chars(chunk: Chunk) -> int:
    """What `chunk` adds to `Assembly.size`: checked as chunks arrive, before anything is journaled."""
    size = 0
    for choice in chunk.get("choices") or ():
        if choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or choice.get("message") or {}
        content = delta.get("content")
        size += len(content) if isinstance(content, str) else 0
        for call in delta.get("tool_calls") or ():
            arguments = (call.get("function") or {}).get("arguments")
            size += len(arguments) if isinstance(arguments, str) else 0
    return size


def assemble(chunks: Iterable[Chunk]) -> Assembly:
    assembly = Assembly()
    for chunk in chunks:
        assembly.add(chunk)
    return assembly
