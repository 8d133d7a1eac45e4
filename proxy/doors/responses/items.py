"""A Responses input's items as chat messages, and the checks across them.

The canonical form is chat (docs/architecture.md, "The canonical form"), so every input item becomes part of a
chat message, and each message keeps the items it stands for (`vocabulary.ITEMS`), as the client sent them:

    message (user, system, developer)           that role's message: its text as one string, or chat parts
                                                (input_image → image_url, input_file → file) when it has more
                                                than text; `instructions` is a system message before the input
    a run of model output items                 one assistant message: its text, and a tool call for each
    (assistant message, reasoning, function_    function_call (`call_id` is the call's id) or custom_tool_call
    call, custom_tool_call, other *_call,       (its `input` as the arguments {"input": ...}); reasoning and
    mcp_list_tools, mcp_approval_request,       hosted tool calls ride along in its items
    program, a server-executed tool search)
    function_call_output, custom_tool_call_     a tool message answering `call_id`
    output
    any other item (other tools' outputs, an    that role's message (user without one), its text if it has
    item_reference, additional_tools)           any: nothing, in chat terms, for most

So a reasoning item stays with the item that follows it, and a call and its output pair exactly as chat tool
calls do. A message's identity is its chat meaning only (ids, status and encrypted reasoning aside), so a client
that echoes an answer back as items lands on the node the answer was stored as.
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.canonical.tool_pairs import MAX_SHOWN_ID_CHARS, unanswered_calls, unanswered_output
from proxy.canonical.types import Message
from proxy.canonical.vocabulary import ITEMS
from proxy.doors.body import part_type
from proxy.doors.resent import Conversion
from proxy.errors import InvalidRequest, json_type
from proxy.formats.responses_items import (
    TOOL_OUTPUT_TYPES,
    assistant_message,
    is_output,
    item_kind,
    output_text,
)

INPUT_ROLES = frozenset({"user", "system", "developer", "assistant"})
PART_TYPES = ("input_text", "input_image", "output_text", "refusal", "input_file", "input_audio", "text")
"""The content parts a message (or a tool output) may hold: OpenAI's, and chat's `text`."""
_TEXT_FIELDS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}


def input_messages(items: Sequence[Any]) -> list[Message]:
    """The input items as chat messages (see the module docstring), each keeping the items it stands for."""
    return input_conversion(items, 0).messages


def input_conversion(items: Sequence[Any], first: int) -> Conversion:
    """The input items from index `first` on as chat messages; a run of output items is one assistant message,
    which a later item may still join (`Conversion.closed`)."""
    messages: list[Message] = []
    origins, closed = array("q"), array("q", [0])
    run: list[Mapping[str, Any]] = []
    for index, item in enumerate(items, first):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"'{where}' must be an object, not {json_type(item)}.", param=where)
        if is_output(item):
            _check_output_item(item, where)
            if not run:
                origins.append(index)
            run.append(item)
            closed.append(-1)
            continue
        if run:
            messages.append(assistant_message(run))
            run = []
        messages.append(_message(item, where))
        origins.append(index)
        closed.append(len(messages))
    if run:
        messages.append(assistant_message(run))
    return Conversion(messages, origins, closed)


def _kind(item: Mapping[str, Any]) -> str:
    kind = item_kind(item)
    if not kind:
        raise InvalidRequest("Every input item needs a string 'type'.", param="input")
    return kind


def _check_output_item(item: Mapping[str, Any], where: str) -> None:
    kind = _kind(item)
    if kind == "message" and not isinstance(item.get("content"), str):  # EasyInputMessage: a string, any role
        _content_parts(item.get("content"), f"{where}.content")
    if kind in ("function_call", "custom_tool_call"):
        _string(item, "call_id", where)
        _string(item, "name", where)
        _string(item, "arguments" if kind == "function_call" else "input", where)


def _string(item: Mapping[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise InvalidRequest(
            f"Invalid '{where}.{name}': expected a string, but got {json_type(value)}.", param=f"{where}.{name}"
        )
    return value


def _message(item: Mapping[str, Any], where: str) -> Message:
    kind = _kind(item)
    if kind in TOOL_OUTPUT_TYPES:
        call_id = _string(item, "call_id", where)
        output = item.get("output")
        if not isinstance(output, str | list):
            raise InvalidRequest(
                f"Invalid '{where}.output': expected a string or an array of parts, but got {json_type(output)}.",
                param=f"{where}.output",
            )
        content = output if isinstance(output, str) else _chat_content(_content_parts(output, f"{where}.output"))
        return {"role": "tool", "tool_call_id": call_id, "content": content, ITEMS: [item]}
    role = item.get("role")
    if role is not None and not isinstance(role, str):
        raise InvalidRequest(
            f"Invalid type for '{where}.role': expected a string, but got {json_type(role)}.", param=f"{where}.role"
        )
    if kind == "message":
        if role not in INPUT_ROLES:
            raise InvalidRequest(
                f"Invalid value for '{where}.role': {role!r}. Supported values are: 'assistant', 'developer', "
                "'system' and 'user'.",
                param=f"{where}.role",
            )
        text = item.get("content")
        content = text if isinstance(text, str) else _chat_content(_content_parts(text, f"{where}.content"))
        return {"role": role, "content": content, ITEMS: [item]}
    # Another kind of item, kept and shown as it came; in chat terms it is its text, if it has any.
    texts = output_text(item.get("content")) if isinstance(item.get("content"), list | str) else []
    return {"role": role if role in INPUT_ROLES else "user", "content": "".join(texts), ITEMS: [item]}


def _content_parts(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        raise InvalidRequest(
            f"Invalid type for '{where}': expected a string or an array of content parts, "
            f"but got {json_type(content)}.",
            param=where,
        )
    for index, part in enumerate(content):
        _check_part(part, f"{where}[{index}]")
    return content


def _check_part(part: Any, where: str) -> None:
    kind = part_type(part, where, PART_TYPES)
    if kind in _TEXT_FIELDS:
        _string(part, _TEXT_FIELDS[kind], where)
    elif kind == "input_image":
        for name in ("image_url", "file_id"):
            if part.get(name) is not None:
                _string(part, name, where)
    elif kind == "input_audio" and not isinstance(audio := part.get("input_audio"), dict):
        raise InvalidRequest(
            f"Invalid type for '{where}.input_audio': expected an object, but got {json_type(audio)}.",
            param=f"{where}.input_audio",
        )


def _chat_content(parts: Sequence[Mapping[str, Any]]) -> str | list[dict[str, Any]]:
    """Text-only content as one string, whether the client sent a string or text parts (the SDK and Codex send
    the same message either way: it must be the same node); anything else as chat parts."""
    chat = _chat_parts(parts)
    if all(part["type"] == "text" for part in chat):
        return "\n".join(part["text"] for part in chat)
    return chat


def _chat_parts(parts: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    chat: list[dict[str, Any]] = []
    for part in parts:
        kind = part.get("type")
        if kind in ("input_text", "output_text", "text"):
            chat.append({"type": "text", "text": str(part.get("text", ""))})
        elif kind == "refusal":
            chat.append({"type": "text", "text": str(part.get("refusal", ""))})
        elif kind == "input_image":
            url = part.get("image_url") or part.get("file_id")
            image: dict[str, Any] = {"url": url}
            if part.get("detail") is not None:
                image["detail"] = part["detail"]
            chat.append({"type": "image_url", "image_url": image})
        elif kind == "input_file":
            chat.append({"type": "file", "file": {k: v for k, v in part.items() if k != "type"}})
        else:
            chat.append(dict(part))
    return chat


def check_pairs(messages: Sequence[Message], start: int = 0) -> None:
    """A tool output must answer a call made before it, as every provider requires. `start`: how many leading
    messages are those of a list that passed (`proxy.canonical.tool_pairs`)."""
    orphan = unanswered_output(messages, start)
    if orphan is not None:
        raise InvalidRequest(
            f"No tool call found for function call output with call_id {orphan[:MAX_SHOWN_ID_CHARS]}.", param="input"
        )


def check_answered(messages: Sequence[Message], start: int = 0) -> None:
    """A call must be answered by an output after it once the conversation goes on past it, as OpenAI requires
    (a call at the end is the client's to answer in its next request). `start`: how many leading messages are
    those of a list that passed, with no tool output past them (`proxy.canonical.tool_pairs.unanswered_calls`)."""
    unanswered = unanswered_calls(messages, adjacent=False, start=start)
    if unanswered is None:
        return
    index, ids = unanswered
    items = messages[index].get(ITEMS) or ()
    custom = any(item.get("type") == "custom_tool_call" and item.get("call_id") == ids[0] for item in items)
    what = "custom tool call" if custom else "function call"
    raise InvalidRequest(f"No tool output found for {what} {ids[0][:MAX_SHOWN_ID_CHARS]}.", param="input")
