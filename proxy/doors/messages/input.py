"""An Anthropic Messages request as the canonical conversation: content blocks → chat messages, fields → chat fields.

Each chat message keeps the blocks it stands for (`vocabulary.ITEMS`), as the client sent them (signatures,
`cache_control`, server tool blocks), so nothing is lost and a Messages-native upstream can get them back:

    system (a string or text blocks)           a system message (its blocks kept); so is a `system` turn
                                               inside `messages` (Claude Code sends one with a beta)
    user message                               a tool message per `tool_result` block (answering its
                                               `tool_use_id`), then a user message with the other blocks: its
                                               text as one string, or chat parts (image, document) when it has
                                               more than text
    assistant message                          one assistant message: its text, a tool call per `tool_use` block
                                               (`input` as JSON arguments); thinking blocks ride along in its items

So a tool_use and its tool_result pair exactly as chat tool calls do, and thinking blocks stay with their
assistant turn. A message's identity is its chat meaning only, so an answer the client echoes back (its
`tool_use` input re-serialized as JSON) lands on the node it was stored as.

Fields for a chat upstream: `max_tokens` (required, reserved from the budget), `stop_sequences` → `stop`,
`temperature`, `top_p`, tools (`input_schema` → `parameters`), `tool_choice` (any → required, tool → that
function), `metadata.user_id` → `user`. Anthropic's own (`thinking`, `top_k`, `context_management`,
`cache_control`) stay behind for a chat upstream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.canonical.conversation import Conversation
from proxy.canonical.pieces import Received
from proxy.canonical.tool_pairs import MAX_SHOWN_ID_CHARS, shown_ids, unanswered_calls, unanswered_output
from proxy.canonical.types import Message, NativeRequest
from proxy.canonical.vocabulary import ITEMS
from proxy.config.models import MESSAGES_API
from proxy.config.schema import RequestLimits
from proxy.doors.body import check_message_size, check_shape
from proxy.doors.resent import Conversion, TenantLists, parse_listed
from proxy.errors import InvalidRequest, json_type
from proxy.formats.anthropic_blocks import assistant_from_blocks
from proxy.request.references import TOKEN_PREFIX

ROLES = ("user", "assistant", "system")
_DELIVERY = ("stream",)
_NOT_NATIVE = frozenset({"model", "messages", "system", "stream"})
"""What an Anthropic upstream gets from the proxy rather than as sent: the model name, the working context (as
`system` and `messages`) and the streaming."""


def parse_messages_request(
    raw: Received | bytes, limits: RequestLimits, resent: TenantLists | None = None, *, counting: bool = False
) -> Conversation:
    """An Anthropic Messages request as the canonical conversation; a 400 naming the field for anything invalid.
    `resent`: the door's last requests, whose messages this one need not convert again; `counting`: a
    `count_tokens` request, which has no `max_tokens`."""
    listed = parse_listed(raw, "messages", limits, resent)
    body = listed.body
    check_shape({key: value for key, value in body.items() if key != "messages"}, "", limits)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("model: Field required", param="model")
    max_tokens = body.get("max_tokens")
    if counting and max_tokens is None:
        max_tokens = 1
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise InvalidRequest("max_tokens: Field required (an integer of at least 1)", param="max_tokens")
    _check_metadata(body.get("metadata"))
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise InvalidRequest("messages: Field required (a non-empty list)", param="messages")
    system = body.get("system")
    if system is not None:
        check_message_size(system, "system", limits)
    prelude = listed.prelude(system, _system)
    listed.convert(_converted, "messages", _check_pairs, prelude)
    messages = listed.messages
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest(f"stream: Input should be a valid boolean, not {json_type(stream)}", param="stream")
    return Conversation(
        model=model,
        messages=messages,
        params=chat_params(body, max_tokens, stream),
        stream=stream,
        max_output=max_tokens,
        max_output_param="max_tokens",
        identity={key: value for key, value in body.items() if key not in _DELIVERY},
        native=NativeRequest(MESSAGES_API, {key: value for key, value in body.items() if key not in _NOT_NATIVE}),
        door_state={"door": "messages"},
        fit_output=True,
    )


MAX_USER_ID_CHARS = 256
"""Anthropic's bound on `metadata.user_id`, the only member its `metadata` takes."""


def _check_metadata(metadata: Any) -> None:
    """`metadata` as Anthropic takes it: an object whose only member is `user_id`, a string of at most
    `MAX_USER_ID_CHARS` (or null); refused, as Anthropic refuses it, before anything is stored or sent."""
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise InvalidRequest(
            f"metadata: Input should be a valid dictionary, not {json_type(metadata)}", param="metadata"
        )
    extra = next((key for key in metadata if key != "user_id"), None)
    if extra is not None:
        raise InvalidRequest(f"metadata.{extra[:64]}: Extra inputs are not permitted", param=f"metadata.{extra[:64]}")
    user_id = metadata.get("user_id")
    if user_id is not None and not isinstance(user_id, str):
        raise InvalidRequest(
            f"metadata.user_id: Input should be a valid string, not {json_type(user_id)}", param="metadata.user_id"
        )
    if user_id is not None and len(user_id) > MAX_USER_ID_CHARS:
        raise InvalidRequest(
            f"metadata.user_id: String should have at most {MAX_USER_ID_CHARS} characters", param="metadata.user_id"
        )


def _system(system: Any, where: str = "system") -> list[Message]:
    if system is None or system == "":
        return []
    if isinstance(system, str):
        return [{"role": "system", "content": system}]
    blocks = _blocks(system, where)
    text = "\n".join(_text(block, f"{where}.{index}") for index, block in enumerate(blocks) if block["type"] == "text")
    return [{"role": "system", "content": text, ITEMS: blocks}]


def input_messages(messages: Sequence[Any]) -> list[Message]:
    """The conversation's messages as chat messages (see the module docstring)."""
    conversion = _converted(messages, 0)
    _check_pairs(conversion)
    return conversion.messages


def _converted(messages: Sequence[Any], first: int) -> Conversion:
    """Messages from index `first` on, each as its chat messages."""
    return Conversion.each(
        [_chat_message(message, f"messages.{first + i}") for i, message in enumerate(messages)], first
    )


def _chat_message(message: Any, where: str) -> list[Message]:
    if not isinstance(message, dict):
        raise InvalidRequest(f"{where}: Input should be a valid dictionary", param=where)
    role = message.get("role")
    if role not in ROLES:
        raise InvalidRequest(f"{where}.role: Input should be 'user', 'assistant' or 'system'", param=f"{where}.role")
    content = message.get("content")
    if role == "system":  # Claude Code's mid-conversation system turns (beta `mid-conversation-system`)
        return _system(content, f"{where}.content") or [{"role": "system", "content": ""}]
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    blocks = _blocks(content, f"{where}.content")
    return _assistant(blocks, where) if role == "assistant" else _user(blocks, where)


def _blocks(content: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: Input should be a valid string or list of blocks", param=where)
    for index, block in enumerate(content):
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise InvalidRequest(f"{where}.{index}: each block needs a string 'type'", param=f"{where}.{index}")
    return content


def _assistant(blocks: Sequence[dict[str, Any]], where: str) -> list[Message]:
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            _text(block, f"{where}.content.{index}")
        elif block["type"] == "tool_use" and not (
            isinstance(block.get("id"), str) and isinstance(block.get("name"), str)
        ):
            raise InvalidRequest(
                f"{where}.content.{index}: a tool_use block needs a string 'id' and 'name'",
                param=f"{where}.content.{index}",
            )
    return [assistant_from_blocks(blocks)]


def _user(blocks: Sequence[dict[str, Any]], where: str) -> list[Message]:
    messages: list[Message] = []
    rest: list[dict[str, Any]] = []
    places: list[str] = []
    for index, block in enumerate(blocks):
        if _carries_reference(block):
            # A summary of the proxy's that the client compacted its turns into stands alone, so that it alone
            # gives way to the conversation it stands for (`proxy.request.continuations`), not the blocks beside it.
            place = f"{where}.content.{index}"
            messages.append({"role": "user", "content": _chat_content([block], [place]), ITEMS: [block]})
            continue
        if block["type"] != "tool_result":
            rest.append(block)
            places.append(f"{where}.content.{index}")
            continue
        call_id = block.get("tool_use_id")
        if not isinstance(call_id, str):
            raise InvalidRequest(
                f"{where}.content.{index}.tool_use_id: Field required", param=f"{where}.content.{index}.tool_use_id"
            )
        messages.append({"role": "tool", "tool_call_id": call_id, "content": result_text(block), ITEMS: [block]})
    if rest:
        messages.append({"role": "user", "content": _chat_content(rest, places), ITEMS: rest})
    return messages


def _carries_reference(block: Mapping[str, Any]) -> bool:
    text = block.get("text")
    return block["type"] == "text" and isinstance(text, str) and TOKEN_PREFIX in text


def _text(block: Mapping[str, Any], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidRequest(f"{where}.text: Input should be a valid string", param=f"{where}.text")
    return text


def result_text(block: Mapping[str, Any]) -> str:
    """A tool_result's content as text (nested text blocks joined); an error result says so."""
    content = block.get("content")
    if isinstance(content, list):
        text = "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    else:
        text = "" if content is None else str(content)
    return f"[error] {text}" if block.get("is_error") else text


def _chat_content(blocks: Sequence[Mapping[str, Any]], places: Sequence[str]) -> str | list[dict[str, Any]]:
    """Text-only content as one string (the same node whether sent as a string or as text blocks); else parts.
    `places`: where each block is in the request, for errors."""
    if all(block["type"] == "text" for block in blocks):
        return "\n".join(_text(block, where) for block, where in zip(blocks, places, strict=True))
    parts: list[dict[str, Any]] = []
    for block, where in zip(blocks, places, strict=True):
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, where)})
        elif kind == "image":
            source = block.get("source")
            if not isinstance(source, dict):
                raise InvalidRequest(f"{where}.source: Input should be a valid dictionary", param=f"{where}.source")
            url = source.get("url") or f"data:{source.get('media_type')};base64,{source.get('data', '')}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            parts.append({"type": "text", "text": f"[{kind}]"})  # a document or server block, kept in the items
    return parts


def _check_pairs(conversion: Conversion, start: int = 0) -> None:
    """Each tool_result answers a tool_use before it; each tool_use another message follows is answered by the
    next one (a tool_use at the end is the client's to answer)."""
    messages, origins = conversion.messages, conversion.origins
    orphan = unanswered_output(messages, start)
    if orphan is not None:
        raise InvalidRequest(
            f"messages: unexpected `tool_use_id` found in `tool_result` blocks: {orphan[:MAX_SHOWN_ID_CHARS]}. "
            "Each `tool_result` block must have a corresponding `tool_use` block in the previous message.",
            param="messages",
        )
    unanswered = unanswered_calls(messages, start=start)
    if unanswered is not None:
        index, ids = unanswered
        where = f"messages.{origins[index]}"
        raise InvalidRequest(
            f"{where}: `tool_use` ids were found without `tool_result` blocks immediately after: {shown_ids(ids)}. "
            "Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
            param=where,
        )


def chat_params(body: Mapping[str, Any], max_tokens: int, stream: bool) -> dict[str, Any]:
    params: dict[str, Any] = {"max_tokens": max_tokens}
    for key in ("temperature", "top_p"):
        if body.get(key) is not None:
            params[key] = body[key]
    stop = body.get("stop_sequences")
    if isinstance(stop, list) and stop:
        params["stop"] = stop
    user = (body.get("metadata") or {}).get("user_id") if isinstance(body.get("metadata"), dict) else None
    if isinstance(user, str):
        params["user"] = user
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
            raise InvalidRequest("tools: Input should be a valid list of tools", param="tools")
        functions = [_function(tool, index) for index, tool in enumerate(tools) if "input_schema" in tool]
        if functions:
            params["tools"] = functions
            choice = _tool_choice(body.get("tool_choice"))
            if choice is not None:
                params["tool_choice"] = choice
    if stream:
        params["stream"] = True
        params["stream_options"] = {"include_usage": True}
    return params


def _function(tool: Mapping[str, Any], index: int) -> dict[str, Any]:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"tools.{index}.name: Field required", param=f"tools.{index}.name")
    function: dict[str, Any] = {"name": name, "parameters": tool.get("input_schema") or {"type": "object"}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(choice: Any) -> Any:
    if not isinstance(choice, dict):
        return None
    kind = choice.get("type")
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    return {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
