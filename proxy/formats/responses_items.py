"""Responses items ↔ chat messages: the one mapping the Responses door and the Responses upstream share.

A run of items the model produced (assistant text, reasoning, function and custom tool calls, hosted tools'
calls) is one assistant message of the canonical chat form, with a tool call per function or custom call and
the run itself kept under `vocabulary.ITEMS`. The door maps what a client sends this way, and the upstream maps what
a Responses-native model answers the same way, so an answer the client echoes back is the node it was stored as.
The other way, a working context becomes input items again: each message's own items as they came, and the
proxy's own messages (summaries, acknowledgements) as plain message items.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from proxy.canonical.types import Message, assistant_turn
from proxy.canonical.vocabulary import ITEMS

CUSTOM_INPUT = "input"
"""The one parameter of the chat function a custom tool becomes: its calls carry {"input": ...}."""
NAMESPACE_SEPARATOR = "__"
OUTPUT_ITEM_TYPES = frozenset(
    {"reasoning", "function_call", "custom_tool_call", "mcp_list_tools", "mcp_approval_request", "program"}
)
"""The model's own items whose type does not end in `_call` (those are all the model's, outputs aside)."""
OUTPUT_ITEM_SUFFIX = "_call"
TOOL_OUTPUT_TYPES = frozenset({"function_call_output", "custom_tool_call_output"})
SERVER_EXECUTION = "server"
"""A tool search's `execution` when the API ran it: its output is then part of the model's turn too."""
ITEM_REFERENCE = "item_reference"
OUTPUT_TEXT_TYPES = frozenset({"output_text"})
ASSISTANT_TEXT_TYPES = frozenset({"output_text", "input_text"})
"""An assistant message's text parts: the model's own, or input_text in an easy input message (the only text
part the SDK's EasyInputMessage allows in a list, whatever its role)."""


def item_kind(item: Mapping[str, Any]) -> str:
    """An item's type; an easy input message may leave it out, and so may an item reference (just its `id`)."""
    kind = item.get("type")
    if kind is None and "role" in item:
        return "message"
    if kind is None and "id" in item:
        return ITEM_REFERENCE
    return kind if isinstance(kind, str) else ""


def is_output(item: Mapping[str, Any]) -> bool:
    """Whether the model produced it: it belongs to an assistant turn."""
    kind = item_kind(item)
    if kind == "message":
        return item.get("role") == "assistant"
    if kind in OUTPUT_ITEM_TYPES or item.get("execution") == SERVER_EXECUTION:
        return True
    return kind.endswith(OUTPUT_ITEM_SUFFIX) and kind not in TOOL_OUTPUT_TYPES


def assistant_message(run: Sequence[Mapping[str, Any]]) -> Message:
    """One assistant message for a run of output items: their text, a tool call per function or custom call."""
    texts: list[str] = []
    calls: list[dict[str, Any]] = []
    for item in run:
        kind = item_kind(item)
        if kind == "message":
            texts.extend(_texts(item.get("content"), ASSISTANT_TEXT_TYPES))
        elif kind == "function_call":
            calls.append(_tool_call(str(item["call_id"]), qualified_name(item), str(item["arguments"])))
        elif kind == "custom_tool_call":
            arguments = json.dumps({CUSTOM_INPUT: item["input"]})
            calls.append(_tool_call(str(item["call_id"]), qualified_name(item), arguments))
    message = assistant_turn("".join(texts), calls)
    message[ITEMS] = list(run)
    return message


def qualified_name(item: Mapping[str, Any]) -> str:
    """A tool's name as a chat function: `namespace__name` for a tool of a namespace."""
    namespace = item.get("namespace")
    name = str(item["name"])
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if isinstance(namespace, str) and namespace else name


def _tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def output_text(content: Any) -> list[str]:
    """The text of an assistant message's content: output_text and refusal parts, or a string."""
    return _texts(content, OUTPUT_TEXT_TYPES)


def _texts(content: Any, text_types: frozenset[str]) -> list[str]:
    if isinstance(content, str):
        return [content]
    texts: list[str] = []
    for part in content or ():
        if not isinstance(part, Mapping):
            continue
        if part.get("type") in text_types and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
    return texts


def input_items(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """A working context as Responses input items: every message's own items as they came; a message with no
    items (a summary, an acknowledgement, one sent through the chat door) as a message item. Instructions (a
    system message with an empty item list) are left out: they travel as the request's `instructions`."""
    items: list[dict[str, Any]] = []
    for message in messages:
        kept = message.get(ITEMS)
        if isinstance(kept, list):
            items.extend(kept)
            continue
        items.append(_message_item(message))
    return items


def _message_item(message: Message) -> dict[str, Any]:
    role = message.get("role")
    content = message.get("content")
    if role == "tool":
        return {"type": "function_call_output", "call_id": message.get("tool_call_id"), "output": content or ""}
    if isinstance(content, list):
        kind = "output_text" if role == "assistant" else "input_text"
        parts = [{"type": kind, "text": str(part.get("text", ""))} for part in content if isinstance(part, Mapping)]
        return {"type": "message", "role": role, "content": parts}
    return {"type": "message", "role": role, "content": content or ""}
