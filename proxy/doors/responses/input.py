"""A Responses request as the canonical conversation: input items → chat messages, Responses fields → chat fields.

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

Tools and the other fields, for a chat upstream: `proxy.doors.responses.fields`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from proxy.config import RequestLimits
from proxy.conversation import Continuation, Conversation
from proxy.doors.body import (
    check_message_size,
    check_messages,
    check_shape,
    parse_json_object,
    part_type,
)
from proxy.doors.resent import Conversion, Listed, TenantLists, parse_listed
from proxy.doors.responses.compaction import CompactedInput, compacts, split_input
from proxy.doors.responses.fields import ToolNames, chat_params, chat_tools
from proxy.doors.responses.ids import step_of
from proxy.errors import InvalidRequest, json_type
from proxy.formats.responses_items import (
    TOOL_OUTPUT_TYPES,
    assistant_message,
    is_output,
    item_kind,
    output_text,
)
from proxy.history.chain import MAX_SHOWN_ID_CHARS, unanswered_calls, unanswered_output
from proxy.types import Message, NativeRequest
from proxy.vocabulary import ITEMS, SYSTEM_ROLES

INPUT_ROLES = frozenset({"user", "system", "developer", "assistant"})
PART_TYPES = ("input_text", "input_image", "output_text", "refusal", "input_file", "input_audio", "text")
"""The content parts a message (or a tool output) may hold: OpenAI's, and chat's `text`."""
_TEXT_FIELDS = {"input_text": "text", "output_text": "text", "text": "text", "refusal": "refusal"}

_PREVIOUS = "previous_response_id"
_DELIVERY = ("stream", "stream_options")
_NOT_NATIVE = frozenset({"model", "input", "stream", "stream_options", "previous_response_id"})
"""What a Responses-native upstream does not get as sent: the proxy names the model, sends the working context
as `input`, decides the streaming, and resolves `previous_response_id` itself."""
ECHOED_FIELDS = (
    "instructions",
    "metadata",
    "temperature",
    "top_p",
    "max_output_tokens",
    "previous_response_id",
    "reasoning",
    "store",
    "text",
    "truncation",
    "user",
    "prompt_cache_key",
    "service_tier",
)
"""Request fields the response object repeats, as OpenAI's does."""


def echoed(request: Mapping[str, Any]) -> dict[str, Any]:
    """The request's fields a response repeats: what a stored response keeps to be rendered again."""
    keys = (*ECHOED_FIELDS, "tools", "tool_choice", "parallel_tool_calls")
    return {key: request[key] for key in keys if key in request}


@dataclass(frozen=True)
class ResponsesRequest:
    """The parsed request: the canonical conversation, and what rendering the answer needs."""

    conversation: Conversation
    tools: ToolNames
    body: Mapping[str, Any]
    """The request as sent: the Response object echoes its fields (instructions, tools, metadata, ...)."""
    session_key: str | None
    """The client's own conversation key (`prompt_cache_key`), a session id when no header names one."""
    generate: bool = True
    """False: a socket warm-up (`generate: false`), answered without a model call."""


def parse_responses_request(raw: bytes, limits: RequestLimits, resent: TenantLists | None = None) -> ResponsesRequest:
    """A Responses request as the canonical conversation; a 400 naming the field for anything invalid. `resent`:
    the door's last requests, whose input items this one need not convert again."""
    listed = parse_listed(raw, "input", limits, resent)
    return responses_request(listed.body, limits, listed)


def parse_socket_event(raw: bytes, limits: RequestLimits) -> ResponsesRequest:
    """A client event of WebSocket mode: `response.create` with the fields of `POST /v1/responses`, streamed
    (the stream is implicit over a socket)."""
    event = parse_json_object(raw)
    kind = event.get("type")
    if kind != "response.create":
        raise InvalidRequest(
            f"Unsupported client event type {str(kind)[:40]!r}: this socket takes 'response.create'.", param="type"
        )
    if event.get("background"):
        raise InvalidRequest("'background' is not supported over a WebSocket.", param="background")
    generate = event.get("generate", True)
    if not isinstance(generate, bool):
        raise InvalidRequest(
            f"Invalid type for 'generate': expected a boolean, but got {json_type(generate)}.", param="generate"
        )
    body = {key: value for key, value in event.items() if key not in ("type", "generate")}
    return replace(responses_request({**body, "stream": True}, limits), generate=generate)


def responses_request(body: dict[str, Any], limits: RequestLimits, listed: Listed | None = None) -> ResponsesRequest:
    """A Responses request body, parsed, as the canonical conversation (`listed`: the body as `ResentLists` read
    it, whose input items it converts)."""
    check_shape({key: value for key, value in body.items() if key != "input"}, "", limits)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("You must provide a model parameter.", param="model")
    instructions = _instructions(body.get("instructions"), limits)
    messages = list(instructions)
    raw_input = body.get("input")
    compacted = CompactedInput([], None, trigger=False)
    if isinstance(raw_input, str):
        check_message_size(raw_input, "input", limits)
        messages.append({"role": "user", "content": raw_input})
    elif isinstance(raw_input, list) and listed is not None and not compacts(raw_input):
        compacted = CompactedInput(raw_input, None, trigger=False)
        messages.extend(listed.convert(input_conversion, "input").messages)
    elif isinstance(raw_input, list):
        check_messages(raw_input, "input", limits)
        compacted = split_input(raw_input)
        messages.extend(input_messages(compacted.items))
    elif raw_input is None:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    else:
        raise InvalidRequest(
            f"'input' must be a string or an array of items, not {json_type(raw_input)}.", param="input"
        )
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidRequest(
            f"Invalid type for 'previous_response_id': expected a string, but got {json_type(previous)}.",
            param="previous_response_id",
        )
    continues = compacted.continues
    if previous is not None:
        if continues is not None:
            raise InvalidRequest(
                "A request continues a previous response or a compaction item, not both.", param=_PREVIOUS
            )
        continues = Continuation(step_of(previous), "responses", previous, _PREVIOUS)
    if continues is None:
        if not compacted.trigger and not any(message["role"] not in SYSTEM_ROLES for message in messages):
            raise InvalidRequest("'input' must contain at least one item.", param="input")
        check_pairs(messages)  # else the calls may be in what it continues: checked once that is put in
    check_answered(messages)
    store = body.get("store", True)
    if not isinstance(store, bool):
        raise InvalidRequest(
            f"Invalid type for 'store': expected a boolean, but got {json_type(store)}.", param="store"
        )
    tools, names = chat_tools(body.get("tools"))
    max_output = _max_output(body)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise InvalidRequest(
            f"Invalid type for 'stream': expected a boolean, but got {json_type(stream)}.", param="stream"
        )
    params = chat_params(body, tools, names, stream)
    key = body.get("prompt_cache_key")
    return ResponsesRequest(
        conversation=Conversation(
            model=model,
            messages=messages,
            params=params,
            stream=stream,
            max_output=max_output,
            max_output_param="max_output_tokens",
            identity={key: value for key, value in body.items() if key not in _DELIVERY},
            native=NativeRequest("responses", {key: value for key, value in body.items() if key not in _NOT_NATIVE}),
            wire={"door": "responses", "store": store, "request": echoed(body), "input_from": len(instructions)},
            continues=continues,
            instructions=len(instructions),
            compaction=compacted.trigger,
        ),
        tools=names,
        body=body,
        session_key=key if isinstance(key, str) else None,
    )


def _instructions(instructions: Any, limits: RequestLimits) -> list[Message]:
    if instructions is None:
        return []
    if isinstance(instructions, str):
        check_message_size(instructions, "instructions", limits)
        # No items of its own: not an input item, and not carried over by `previous_response_id`.
        return [{"role": "system", "content": instructions, ITEMS: []}] if instructions else []
    raise InvalidRequest(f"'instructions' must be a string, not {json_type(instructions)}.", param="instructions")


def _max_output(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_output_tokens")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 16:
        raise InvalidRequest(
            f"Invalid 'max_output_tokens': expected an integer of at least 16, got {value!r}.",
            param="max_output_tokens",
        )
    return value


def input_messages(items: Sequence[Any]) -> list[Message]:
    """The input items as chat messages (see the module docstring), each keeping the items it stands for."""
    return input_conversion(items, 0).messages


def input_conversion(items: Sequence[Any], first: int) -> Conversion:
    """The input items from index `first` on as chat messages; a run of output items is one assistant message,
    which a later item may still join (`Conversion.closed`)."""
    messages: list[Message] = []
    origins: list[int] = []
    closed = [0]
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


def check_pairs(messages: Sequence[Message]) -> None:
    """A tool output must answer a call made before it, as every provider requires."""
    orphan = unanswered_output(messages)
    if orphan is not None:
        raise InvalidRequest(
            f"No tool call found for function call output with call_id {orphan[:MAX_SHOWN_ID_CHARS]}.", param="input"
        )


def check_answered(messages: Sequence[Message]) -> None:
    """A call must be answered by an output after it once the conversation goes on past it, as OpenAI requires
    (a call at the end is the client's to answer in its next request)."""
    unanswered = unanswered_calls(messages, adjacent=False)
    if unanswered is None:
        return
    index, ids = unanswered
    items = messages[index].get(ITEMS) or ()
    custom = any(item.get("type") == "custom_tool_call" and item.get("call_id") == ids[0] for item in items)
    what = "custom tool call" if custom else "function call"
    raise InvalidRequest(f"No tool output found for {what} {ids[0][:MAX_SHOWN_ID_CHARS]}.", param="input")
