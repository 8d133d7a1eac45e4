"""A Responses request as the canonical conversation: input items → chat messages, Responses fields → chat fields.

The canonical form is chat (docs/architecture.md, "The canonical form"), so every input item becomes part of a
chat message, and each message keeps the items it stands for (`chain.ITEMS`), as the client sent them:

    message (user, system, developer)           that role's message: its text as one string, or chat parts
                                                (input_image → image_url, input_file → file) when it has more
                                                than text; `instructions` is a system message before the input
    a run of model output items                 one assistant message: its text, and a tool call for each
    (assistant message, reasoning, function_    function_call (`call_id` is the call's id) or custom_tool_call
    call, custom_tool_call, other *_call)       (its `input` as the arguments {"input": ...}); reasoning and
                                                hosted tool calls ride along in its items
    function_call_output, custom_tool_call_     a tool message answering `call_id`
    output
    any other item with a role                  that role's message, its text if it has any

So a reasoning item stays with the item that follows it, and a call and its output pair exactly as chat tool
calls do. A message's identity is its chat meaning only (ids, status and encrypted reasoning aside), so a client
that echoes an answer back as items lands on the node the answer was stored as.

Tools: `function` tools become chat functions; `custom` tools (free-form input, like Codex's apply_patch) become
functions with one string parameter `input`; tools of a `namespace` become functions named `namespace__name`;
hosted tools a chat model cannot run (web_search, tool_search, ...) are left out for a chat upstream. What the
answer's tool calls were is mapped back by `ToolNames` (`proxy.wire.responses_output`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.config import RequestLimits
from proxy.conversation import Conversation
from proxy.errors import InvalidRequest
from proxy.history.chain import ITEMS
from proxy.items import (
    CUSTOM_INPUT,
    NAMESPACE_SEPARATOR,
    TOOL_OUTPUT_TYPES,
    assistant_message,
    is_output,
    item_kind,
    output_text,
)
from proxy.types import Message
from proxy.wire.body import check_messages, check_shape, json_type, parse_json_object

INPUT_ROLES = frozenset({"user", "system", "developer", "assistant"})

_CHAT_FIELDS = (
    "temperature",
    "top_p",
    "user",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "seed",
    "store",
)
_RESPONSES_ONLY = frozenset(
    {
        "input",
        "instructions",
        "model",
        "stream",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "reasoning",
        "text",
        "include",
        "store",
        "previous_response_id",
        "truncation",
        "metadata",
        "background",
        "client_metadata",
        "prompt",
        "conversation",
        "max_tool_calls",
        "top_logprobs",
        "stream_options",
        *_CHAT_FIELDS,
    }
)
"""Fields with a Responses meaning, mapped (or left out) for a chat upstream; any other field passes through."""
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
class ToolNames:
    """How the chat function names the upstream sees map back to the client's tools."""

    custom: frozenset[str] = frozenset()
    """Functions that stand for custom tools: their calls go back as custom_tool_call items."""
    namespaced: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """Function name → (namespace, tool name)."""


@dataclass(frozen=True)
class ResponsesRequest:
    """The parsed request: the canonical conversation, and what rendering the answer needs."""

    conversation: Conversation
    tools: ToolNames
    body: Mapping[str, Any]
    """The request as sent: the Response object echoes its fields (instructions, tools, metadata, ...)."""
    session_key: str | None
    """The client's own conversation key (`prompt_cache_key`), a session id when no header names one."""
    previous_response_id: str | None
    instructions: list[Message]
    """The system message `instructions` became (none or one): it leads the conversation, before a previous
    response's, whose own instructions are not carried over."""


def parse_responses_request(raw: bytes, limits: RequestLimits) -> ResponsesRequest:
    """A Responses request as the canonical conversation; a 400 naming the field for anything invalid."""
    body = parse_json_object(raw)
    check_shape({key: value for key, value in body.items() if key != "input"}, "", limits)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("You must provide a model parameter.", param="model")
    instructions = _instructions(body.get("instructions"))
    messages = list(instructions)
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        messages.append({"role": "user", "content": raw_input})
    elif isinstance(raw_input, list):
        check_messages(raw_input, "input", limits)
        messages.extend(input_messages(raw_input))
    elif raw_input is None:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    else:
        raise InvalidRequest(
            f"'input' must be a string or an array of items, not {json_type(raw_input)}.", param="input"
        )
    if not any(message["role"] not in ("system", "developer") for message in messages):
        raise InvalidRequest("'input' must contain at least one item.", param="input")
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise InvalidRequest(
            f"Invalid type for 'previous_response_id': expected a string, but got {json_type(previous)}.",
            param="previous_response_id",
        )
    if previous is None:
        check_pairs(messages)  # else the calls may be in the previous response: checked once it is prepended
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
            native={key: value for key, value in body.items() if key not in _NOT_NATIVE},
            wire={"door": "responses", "store": store, "request": echoed(body), "input_from": len(instructions)},
        ),
        tools=names,
        body=body,
        session_key=key if isinstance(key, str) else None,
        previous_response_id=previous,
        instructions=instructions,
    )


def _instructions(instructions: Any) -> list[Message]:
    if instructions is None:
        return []
    if isinstance(instructions, str):
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
    messages: list[Message] = []
    run: list[Mapping[str, Any]] = []
    for index, item in enumerate(items):
        where = f"input[{index}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"'{where}' must be an object, not {json_type(item)}.", param=where)
        if is_output(item):
            _check_output_item(item, where)
            run.append(item)
            continue
        if run:
            messages.append(assistant_message(run))
            run = []
        messages.append(_message(item, where))
    if run:
        messages.append(assistant_message(run))
    return messages


def _kind(item: Mapping[str, Any]) -> str:
    kind = item_kind(item)
    if not kind:
        raise InvalidRequest("Every input item needs a string 'type'.", param="input")
    return kind


def _check_output_item(item: Mapping[str, Any], where: str) -> None:
    kind = _kind(item)
    if kind == "message":
        _content_parts(item.get("content"), where)
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
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise InvalidRequest(
                f"'{where}[{index}]' must be an object with a string 'type'.", param=f"{where}[{index}]"
            )
    return content


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
    called: set[str] = set()
    for message in messages:
        for call in message.get("tool_calls") or ():
            called.add(call["id"])
        if message["role"] == "tool" and message["tool_call_id"] not in called:
            raise InvalidRequest(
                f"No tool call found for function call output with call_id {message['tool_call_id']}.",
                param="input",
            )


def chat_tools(tools: Any) -> tuple[list[dict[str, Any]], ToolNames]:
    """The request's tools as chat functions, and how their names map back."""
    if tools is None:
        return [], ToolNames()
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise InvalidRequest("Invalid type for 'tools': expected an array of objects.", param="tools")
    chat: list[dict[str, Any]] = []
    custom: set[str] = set()
    namespaced: dict[str, tuple[str, str]] = {}
    for index, tool in enumerate(tools):
        kind = tool.get("type")
        if kind == "function":
            chat.append(_function(tool, _tool_name(tool, index)))
        elif kind == "custom":
            name = _tool_name(tool, index)
            custom.add(name)
            chat.append(_custom_function(tool, name))
        elif kind == "namespace":
            namespace = _tool_name(tool, index)
            for inner_index, inner in enumerate(tool.get("tools") or ()):
                if not isinstance(inner, dict):
                    continue
                name = f"{namespace}{NAMESPACE_SEPARATOR}{_tool_name(inner, inner_index)}"
                namespaced[name] = (namespace, str(inner["name"]))
                if inner.get("type") == "custom":
                    custom.add(name)
                    chat.append(_custom_function(inner, name))
                else:
                    chat.append(_function(inner, name))
        # Hosted tools (web_search, file_search, tool_search, ...) are the provider's to run: a chat model has none.
    return chat, ToolNames(frozenset(custom), namespaced)


def _tool_name(tool: Mapping[str, Any], index: int) -> str:
    name = tool.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"Missing required parameter: 'tools[{index}].name'.", param=f"tools[{index}].name")
    return name


def _function(tool: Mapping[str, Any], name: str) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name}
    for key in ("description", "parameters", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _custom_function(tool: Mapping[str, Any], name: str) -> dict[str, Any]:
    description = str(tool.get("description") or "")
    grammar = tool.get("format")
    if isinstance(grammar, dict) and grammar.get("definition"):
        description += f"\n\nThe input follows this {grammar.get('syntax', '')} grammar:\n{grammar['definition']}"
    parameters = {
        "type": "object",
        "properties": {CUSTOM_INPUT: {"type": "string", "description": "The tool's whole input, as free text."}},
        "required": [CUSTOM_INPUT],
        "additionalProperties": False,
    }
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def chat_params(body: Mapping[str, Any], tools: list[dict[str, Any]], names: ToolNames, stream: bool) -> dict[str, Any]:
    """The chat request's fields besides model and messages."""
    params: dict[str, Any] = {key: body[key] for key in _CHAT_FIELDS if body.get(key) is not None}
    params.update({key: value for key, value in body.items() if key not in _RESPONSES_ONLY})
    if stream:
        params["stream"] = True
        params["stream_options"] = {"include_usage": True}  # response.completed reports usage
    if body.get("max_output_tokens") is not None:
        params["max_tokens"] = body["max_output_tokens"]
    if tools:
        params["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"), names)
        if choice is not None:
            params["tool_choice"] = choice
        if isinstance(body.get("parallel_tool_calls"), bool):
            params["parallel_tool_calls"] = body["parallel_tool_calls"]
    reasoning = body.get("reasoning")
    if isinstance(reasoning, dict) and isinstance(reasoning.get("effort"), str):
        params["reasoning_effort"] = reasoning["effort"]
    text = body.get("text")
    response_format = _response_format(text.get("format")) if isinstance(text, dict) else None
    if response_format is not None:
        params["response_format"] = response_format
    return params


def _tool_choice(choice: Any, names: ToolNames) -> Any:
    if isinstance(choice, str):
        return choice
    if (
        isinstance(choice, dict)
        and choice.get("type") in ("function", "custom")
        and isinstance(choice.get("name"), str)
    ):
        return {"type": "function", "function": {"name": choice["name"]}}
    return None  # an allowed_tools or hosted-tool choice has no chat equivalent: the model chooses


def _response_format(fmt: Any) -> dict[str, Any] | None:
    if not isinstance(fmt, dict):
        return None
    kind = fmt.get("type")
    if kind == "json_schema":
        schema = {key: fmt[key] for key in ("name", "schema", "strict", "description") if key in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if kind == "json_object":
        return {"type": "json_object"}
    return None
