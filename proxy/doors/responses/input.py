"""A Responses request as the canonical conversation: Responses fields → chat fields, and its input items as chat
messages (`proxy.doors.responses.items`). Tools and the other fields, for a chat upstream:
`proxy.doors.responses.fields`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.canonical.conversation import Continuation, Conversation
from proxy.canonical.pieces import Received
from proxy.canonical.types import Message, NativeRequest
from proxy.canonical.vocabulary import ITEMS, SYSTEM_ROLES
from proxy.config.models import RESPONSES_API
from proxy.config.schema import RequestLimits
from proxy.doors.body import check_message_size, check_messages, check_metadata, check_shape
from proxy.doors.resent import Conversion, Listed, TenantLists, parse_listed
from proxy.doors.responses.compaction import CompactedInput, compacts, split_input
from proxy.doors.responses.fields import ToolNames, chat_params, chat_tools
from proxy.doors.responses.ids import step_of
from proxy.doors.responses.items import check_answered, check_pairs, input_conversion, input_messages
from proxy.errors import InvalidRequest, json_type

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
    compact: bool = False
    """The input ends with a `compaction_trigger`: the client asks for a compaction item, not a response."""


def parse_responses_request(
    raw: Received | bytes, limits: RequestLimits, resent: TenantLists | None = None
) -> ResponsesRequest:
    """A Responses request as the canonical conversation; a 400 naming the field for anything invalid. `resent`:
    the door's last requests, whose input items this one need not convert again."""
    listed = parse_listed(raw, "input", limits, resent)
    return responses_request(listed.body, limits, listed)


def parse_socket_event(
    raw: Received | bytes, limits: RequestLimits, resent: TenantLists | None = None
) -> ResponsesRequest:
    """A client event of WebSocket mode: `response.create` with the fields of `POST /v1/responses`, streamed
    (the stream is implicit over a socket). `resent`: as for a request; Codex opens a socket per turn and sends
    the whole input first, so the kept events are what its next turn's input is read after."""
    listed = parse_listed(raw, "input", limits, resent)
    event = listed.body
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
    return replace(responses_request({**body, "stream": True}, limits, listed, warm_up=not generate), generate=generate)


def responses_request(
    body: dict[str, Any], limits: RequestLimits, listed: Listed | None = None, *, warm_up: bool = False
) -> ResponsesRequest:
    """A Responses request body, parsed, as the canonical conversation (`listed`: the body as `ResentLists` read
    it, whose input items it converts). A socket's `warm_up` may hold its system messages alone: Codex 0.171.0
    warms with its developer message only, then sends the turn's items continuing the warm-up."""
    check_shape({key: value for key, value in body.items() if key != "input"}, "", limits)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest("You must provide a model parameter.", param="model")
    check_metadata(body.get("metadata"))
    make = functools.partial(_instructions, limits=limits)
    instructions = make(body.get("instructions")) if listed is None else listed.prelude(body.get("instructions"), make)
    messages = list(instructions)
    raw_input = body.get("input")
    compacted = CompactedInput([], None, trigger=False)
    checked = False  # the pair checks were made as the list was converted (`_checked_pairs`)
    if isinstance(raw_input, str):
        check_message_size(raw_input, "input", limits)
        messages.append({"role": "user", "content": raw_input})
    elif isinstance(raw_input, list) and listed is not None and not compacts(raw_input, listed.resumed):
        # A kept request's elements hold no compaction item (it came this way), and passed the pair checks when
        # it continued nothing: only what follows them is read for either.
        compacted = CompactedInput(raw_input, None, trigger=False)
        checked = body.get("previous_response_id") is None
        check = _checked_pairs if checked else None
        # One that continues a response holds only what is new since: no later request begins with it, and kept it
        # would push out a whole input (Codex sends several per turn on its socket, then the whole input again).
        listed.convert(input_conversion, "input", check, instructions, answered_later=True, keep=checked)
        messages = listed.messages
    elif isinstance(raw_input, list):
        check_messages(raw_input, "input", limits)
        compacted = split_input(raw_input)
        messages.extend(input_messages(compacted.items))
    elif raw_input is None:
        if body.get("previous_response_id") is None:  # with it, the previous response's conversation is the input
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
        conversing = any(message["role"] not in SYSTEM_ROLES for message in messages)
        if not compacted.trigger and not conversing and not (warm_up and messages):
            raise InvalidRequest("'input' must contain at least one item.", param="input")
        if not checked:
            check_pairs(messages)  # else the calls may be in what it continues: checked once that is put in
    if not checked:
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
            native=NativeRequest(RESPONSES_API, {key: value for key, value in body.items() if key not in _NOT_NATIVE}),
            door_state={"door": "responses", "store": store, "request": echoed(body), "input_from": len(instructions)},
            continues=continues,
            instructions=len(instructions),
        ),
        tools=names,
        body=body,
        session_key=key if isinstance(key, str) else None,
        compact=compacted.trigger,
    )


def _checked_pairs(conversion: Conversion, start: int) -> None:
    """Both pair checks of an input that continues nothing, past the `start` messages of a kept input that passed
    them (`Listed.convert`)."""
    check_pairs(conversion.messages, start)
    check_answered(conversion.messages, start)


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
