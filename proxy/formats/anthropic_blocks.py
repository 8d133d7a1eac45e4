"""Anthropic content blocks ↔ chat messages: the one mapping the Messages door and the Anthropic upstream share.

An assistant turn's blocks are one assistant message of the canonical chat form: its text, a tool call per
`tool_use` block (`input` as JSON arguments), the blocks themselves kept under `vocabulary.ITEMS` (thinking with its
signature, server tool blocks, `cache_control`). The door maps what a client sends this way and the upstream maps
what an Anthropic model answers the same way, so an answer the client echoes back is the node it was stored as.
The other way, a working context becomes an Anthropic request again: each message's own blocks as they came,
consecutive user-side messages (tool results, then the user's text) merged into one user turn, the leading
system messages into `system`, and the proxy's own messages (summaries, acknowledgements) as text blocks where
they stand, so turns alternate as Anthropic requires.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from proxy.canonical.types import Message, assistant_turn
from proxy.canonical.vocabulary import ITEMS, SYSTEM_ROLES, Origin, origin
from proxy.tokens import content_text

Block = dict[str, Any]


def assistant_from_blocks(blocks: Sequence[Block]) -> Message:
    """One assistant message for an assistant turn's blocks."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            arguments = json.dumps(block.get("input") or {}, ensure_ascii=False)
            function = {"name": str(block.get("name")), "arguments": arguments}
            calls.append({"id": str(block.get("id")), "type": "function", "function": function})
    message = assistant_turn("".join(texts), calls)
    message[ITEMS] = list(blocks)
    return message


MAX_BREAKPOINTS = 4
"""Anthropic refuses a request with more `cache_control` breakpoints than this."""
EPHEMERAL = {"type": "ephemeral"}


def anthropic_request(
    messages: Iterable[Message], tools: Sequence[Any] = ()
) -> tuple[list[Block] | str | None, list[dict[str, Any]]]:
    """A working context as Anthropic's `system` (None if there is none) and `messages`. A message the client
    sent as a plain string goes as that string when it is its turn's only message.

    Where the proxy's summaries end, the prompt stays the same until the next crossing that summarizes, while the
    client's own breakpoints (its system prompt, its latest turns) sit before it or move with every turn: a
    `cache_control` breakpoint is added after the last summary (or marker), when the client's, its `tools`
    included, leave room for one, so that a crossing that only stubs tool outputs still reads the summaries
    from the cache. A recall (for its turn only, docs/architecture.md invariant 6) gets one just before it, where
    the part the next turn sends again ends, taken first when only one fits."""
    system: list[Block] | str | None = None
    turns: list[dict[str, Any]] = []
    stable: int | None = None
    recall: int | None = None
    for message in messages:
        role = message.get("role")
        if origin(message) in (Origin.SUMMARY, Origin.MARKER):
            stable = len(turns) if not turns or turns[-1]["role"] != "user" else len(turns) - 1
        if origin(message) == Origin.RECALL and turns:
            recall = len(turns) - 1 if turns[-1]["role"] != "user" else None
        if role in SYSTEM_ROLES and not turns:
            system = _merged(system, _plain(message) if ITEMS not in message else _blocks(message))
            continue
        side = "assistant" if role == "assistant" else "user"
        content: list[Block] | str = _plain(message) if _is_plain(message) else _blocks(message)
        if role in SYSTEM_ROLES:  # a system turn later on is user-side text where Anthropic has no system turns
            content = [{"type": "text", "text": _text(message)}]
        if turns and turns[-1]["role"] == side:
            turns[-1]["content"] = _merged(turns[-1]["content"], content)
        else:
            turns.append({"role": side, "content": content})
    for at in dict.fromkeys(turn for turn in (recall, stable) if turn is not None):
        if _breakpoints([*tools, *_as_blocks(system or []), *_turn_blocks(turns)]) < MAX_BREAKPOINTS:
            blocks = _as_blocks(turns[at]["content"])
            blocks[-1] = {**blocks[-1], "cache_control": EPHEMERAL}
            turns[at] = {**turns[at], "content": blocks}
    return system, turns


def _turn_blocks(turns: Sequence[dict[str, Any]]) -> list[Any]:
    """Every block of the turns, a tool result's own blocks too: where a breakpoint may stand."""
    blocks: list[Any] = []
    for turn in turns:
        for block in _as_blocks(turn["content"]):
            blocks.append(block)
            inner = block.get("content") if isinstance(block, dict) else None
            if isinstance(inner, list):
                blocks.extend(inner)
    return blocks


def _breakpoints(blocks: Sequence[Any]) -> int:
    """The `cache_control` breakpoints among a request's tools and blocks."""
    return sum(1 for block in blocks if isinstance(block, dict) and block.get("cache_control") is not None)


def _is_plain(message: Message) -> bool:
    return (
        ITEMS not in message
        and isinstance(message.get("content"), str)
        and not message.get("tool_calls")
        and (message.get("role") in ("user", "assistant"))
    )


def _plain(message: Message) -> str:
    return _text(message)


def _merged(first: list[Block] | str | None, second: list[Block] | str) -> list[Block] | str:
    if first is None:
        return second
    return [*_as_blocks(first), *_as_blocks(second)]


def _as_blocks(content: list[Block] | str) -> list[Block]:
    return [{"type": "text", "text": content}] if isinstance(content, str) else list(content)


def _blocks(message: Message) -> list[Block]:
    kept = message.get(ITEMS)
    if isinstance(kept, list) and kept:
        return list(kept)
    if message.get("role") == "tool":
        return [{"type": "tool_result", "tool_use_id": message.get("tool_call_id"), "content": _text(message)}]
    blocks: list[Block] = []
    text = _text(message)
    if text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        try:
            arguments = json.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        blocks.append({"type": "tool_use", "id": call.get("id"), "name": function.get("name"), "input": arguments})
    return blocks


def _text(message: Message) -> str:
    return content_text(message.get("content"), "\n")
