"""The OpenAI chat-completions door: `POST /v1/chat/completions`.

It validates the body into the canonical `Conversation` — everything a client can get wrong is caught here,
before any state is touched, as a 400 (or 413) naming the field — and renders the `Answer`: a
`chat.completion`, or SSE chunks from the very JSON the journal stored, then `[DONE]`. Validation is
deliberately limited to what OpenAI itself rejects and what the proxy relies on; every other field passes
through untouched, because the upstream is the authority on its own parameters. Errors leave in OpenAI's shape
(`proxy.errors.openai_error`), which is also this API's. A stream's upstream is always asked for its usage chunk
(`stream_options.include_usage`), so that every step keeps what it cost; a client that did not ask for it does not
get that chunk.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, ClassVar

from starlette.responses import JSONResponse, Response

from proxy.canonical.answers import Answer, Completed, Replayed, StreamGroups
from proxy.canonical.conversation import Conversation
from proxy.canonical.pieces import Received
from proxy.canonical.tool_pairs import MAX_SHOWN_ID_CHARS, shown_ids, unanswered_calls, unanswered_output
from proxy.canonical.types import Chunk
from proxy.canonical.vocabulary import proxy_key
from proxy.config.schema import RequestLimits
from proxy.doors.body import check_metadata, check_shape, part_type
from proxy.doors.context_headers import answer_headers
from proxy.doors.door import Door, DoorRequest, RequestView
from proxy.doors.resent import Conversion, TenantLists, parse_listed
from proxy.doors.sse import SSE_DONE, RelayedStream, sse_data, sse_event, sse_response
from proxy.errors import InvalidRequest, json_type, openai_error

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
PART_TYPES: Mapping[str, tuple[str, ...]] = {
    "user": ("text", "image_url", "input_audio", "file"),
    "assistant": ("text", "refusal"),
}
"""The content part types OpenAI accepts in a message of each role; text only in the others."""
_TEXT_PARTS = ("text",)
_STRING_PARTS = ("text", "refusal")
"""Parts whose field named as their type is a string; in the others (image_url, input_audio, file) an object."""

_INTEGER_PARAMS = {"max_tokens": 0, "max_completion_tokens": 0, "n": 1, "top_logprobs": 0}
_NUMBER_PARAMS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_BOOLEAN_PARAMS = ("stream", "logprobs", "parallel_tool_calls", "store")
_OBJECT_PARAMS = ("stream_options", "response_format", "logit_bias", "metadata")
_LIST_PARAMS = ("tools", "functions")
_MAX_OUTPUT_PARAMS = ("max_completion_tokens", "max_tokens")
"""`max_completion_tokens` wins over `max_tokens`, as it does at OpenAI."""
_DELIVERY_PARAMS = ("stream", "stream_options")
"""How the answer is delivered, not what is asked."""
DEFAULT_LIMITS = RequestLimits()


class ChatCompletions(Door[bool]):
    """It renders by whether the client asked for a stream's usage chunk. The upstream is always asked for one
    (what a step cost is kept in the journal); a client that did not ask does not get it."""

    name: ClassVar[str] = "chat"
    paths: ClassVar[tuple[str, ...]] = ("/v1/chat/completions",)
    mounts: ClassVar[tuple[str, ...]] = ("/v1/chat",)

    def parse(self, request: RequestView, limits: RequestLimits, tenant: str) -> DoorRequest[bool]:
        conversation = parse_chat_request(request.body, limits, self.resent.of(tenant))
        options = conversation.params.get("stream_options") or {}
        asked = bool(options.get("include_usage"))
        if conversation.stream and not asked:
            conversation.params["stream_options"] = {**options, "include_usage": True}
        return DoorRequest(conversation, asked)

    def render(self, answer: Answer, request: DoorRequest[bool]) -> Response:
        return render(answer, request.conversation.stream, usage=request.rendering)


def render(answer: Answer, stream: bool, *, usage: bool = True) -> Response:
    """`usage`: a stream keeps its usage-only chunk (the client asked for `stream_options.include_usage`)."""
    headers = answer_headers(answer)
    if isinstance(answer, Completed):
        return JSONResponse(answer.response, headers=headers)
    if isinstance(answer, Replayed):
        if not stream:
            return JSONResponse(answer.chunks[0], headers=headers)
        return sse_response(_replay_events(answer, usage), headers)
    return RelayedStream(answer.groups, _stream_events(answer.groups, usage), headers)


def _usage_only(chunk: Chunk) -> bool:
    return not chunk.get("choices") and bool(chunk.get("usage"))


async def _stream_events(groups: StreamGroups, usage: bool) -> AsyncIterator[bytes]:
    try:
        async for group in groups:
            yield b"".join(sse_data(item.text) for item in group if usage or not _usage_only(item.chunk))
    except Exception as exc:
        _status, body, _headers = openai_error(exc)
        yield sse_event(body)
        return
    yield SSE_DONE


async def _replay_events(answer: Replayed, usage: bool) -> AsyncIterator[bytes]:
    for chunk in answer.chunks:
        if usage or not _usage_only(chunk):
            yield sse_event(chunk)
    yield SSE_DONE


def parse_chat_request(
    raw: Received | bytes, limits: RequestLimits = DEFAULT_LIMITS, resent: TenantLists | None = None
) -> Conversation:
    """A chat completion request as the canonical conversation; 400 naming the field for anything invalid
    (413 for a message over `limits.max_message_chars`). `resent`: the door's last requests, whose messages
    this one need not check again."""
    listed = parse_listed(raw, "messages", limits, resent)
    body = listed.body
    check_shape({key: value for key, value in body.items() if key != "messages"}, "", limits)
    model = body.get("model")
    if model is None:
        raise InvalidRequest("You must provide a model parameter.", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(f"'model' must be a non-empty string, not {json_type(model)}.", param="model")
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("Missing required parameter: 'messages'.", param="messages")
    if not isinstance(messages, list):
        raise InvalidRequest(f"'messages' must be an array, not {json_type(messages)}.", param="messages")
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    listed.convert(_checked, "messages", _validate_pairs)
    messages = listed.messages
    _validate_params(body)
    max_param = next((name for name in _MAX_OUTPUT_PARAMS if body.get(name) is not None), "max_tokens")
    max_output = body.get(max_param)
    return Conversation(
        model=model,
        messages=messages,
        params={key: value for key, value in body.items() if key not in ("model", "messages")},
        stream=bool(body.get("stream", False)),
        max_output=None if max_output is None else int(max_output),
        max_output_param=max_param,
        identity={key: value for key, value in body.items() if key not in _DELIVERY_PARAMS},
        raw_messages=listed.raw,
    )


def _checked(messages: Sequence[Any], first: int) -> Conversion:
    """Chat messages are the canonical form: each is only checked."""
    for offset, message in enumerate(messages):
        _validate_message(message, f"messages[{first + offset}]")
    return Conversion(
        list(messages), array("q", range(first, first + len(messages))), array("q", range(len(messages) + 1))
    )


def _validate_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise InvalidRequest(f"'{where}' must be an object, not {json_type(message)}.", param=where)
    role = message.get("role")
    if not isinstance(role, str):
        raise InvalidRequest(f"Missing or invalid 'role' in '{where}'.", param=f"{where}.role")
    if role not in ROLES:
        raise InvalidRequest(
            f"Invalid value for '{where}.role': {role!r}. Supported values are: "
            + ", ".join(f"'{r}'" for r in sorted(ROLES))
            + ".",
            param=f"{where}.role",
        )
    spoofed = proxy_key(message)
    if spoofed is not None:
        raise InvalidRequest(
            f"Unrecognized key '{where}.{spoofed}': the proxy keeps it for the messages it writes itself.",
            param=f"{where}.{spoofed}",
        )
    content = message.get("content")
    if content is None:
        if role != "assistant" and not (role == "tool" and "content" in message):
            raise InvalidRequest(f"Missing required parameter: '{where}.content'.", param=f"{where}.content")
    elif isinstance(content, list):
        for part_index, part in enumerate(content):
            _validate_part(part, f"{where}.content[{part_index}]", PART_TYPES.get(role, _TEXT_PARTS))
    elif not isinstance(content, str):
        raise InvalidRequest(
            f"Invalid type for '{where}.content': expected a string or an array of content parts, "
            f"but got {json_type(content)}.",
            param=f"{where}.content",
        )
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise InvalidRequest(f"Missing required parameter: '{where}.tool_call_id'.", param=f"{where}.tool_call_id")
    name = message.get("name")
    if name is not None and not isinstance(name, str):
        raise InvalidRequest(f"'{where}.name' must be a string.", param=f"{where}.name")
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if role != "assistant" or not isinstance(tool_calls, list):
            raise InvalidRequest(
                f"'{where}.tool_calls' must be an array on an assistant message.", param=f"{where}.tool_calls"
            )
        for call_index, call in enumerate(tool_calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(call, dict) or not isinstance(call.get("id"), str) or not isinstance(function, dict):
                raise InvalidRequest(
                    f"'{where}.tool_calls[{call_index}]' must be an object with an 'id' and a 'function'.",
                    param=f"{where}.tool_calls[{call_index}]",
                )


def _validate_part(part: Any, where: str, allowed: tuple[str, ...]) -> None:
    kind = part_type(part, where, allowed)
    value = part.get(kind)
    expected, valid = (
        ("a string", isinstance(value, str)) if kind in _STRING_PARTS else ("an object", isinstance(value, dict))
    )
    if not valid:
        raise InvalidRequest(
            f"Invalid type for '{where}.{kind}': expected {expected}, but got {json_type(value)}.",
            param=f"{where}.{kind}",
            code="invalid_type",
        )


def _validate_pairs(conversion: Conversion, start: int) -> None:
    """Every tool message answers a call made before it, and calls another message follows are answered first."""
    messages = conversion.messages
    orphan = unanswered_output(messages, start)
    if orphan is not None:
        raise InvalidRequest(
            "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with "
            f"'tool_calls' (no call has the id {orphan[:MAX_SHOWN_ID_CHARS]!r}).",
            param="messages",
        )
    unanswered = unanswered_calls(messages, start=start)
    if unanswered is not None:
        index, ids = unanswered
        raise InvalidRequest(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            f"'tool_call_id'. The following tool_call_ids did not have response messages: {shown_ids(ids)}",
            param=f"messages[{index}].tool_calls",
        )


def _validate_params(body: Mapping[str, Any]) -> None:
    for name, minimum in _INTEGER_PARAMS.items():
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequest(
                f"Invalid type for '{name}': expected an integer, but got {json_type(value)}.", param=name
            )
        if value < minimum:
            raise InvalidRequest(
                f"Invalid '{name}': integer below minimum value. Expected a value >= {minimum}, "
                f"but got {value} instead.",
                param=name,
            )
    for name in _NUMBER_PARAMS:
        value = body.get(name)
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value)
        ):
            raise InvalidRequest(
                f"Invalid type for '{name}': expected a number, but got {json_type(value)}.", param=name
            )
    for name in _BOOLEAN_PARAMS:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise InvalidRequest(
                f"Invalid type for '{name}': expected a boolean, but got {json_type(value)}.", param=name
            )
    for name in _OBJECT_PARAMS:
        value = body.get(name)
        if value is not None and not isinstance(value, dict):
            raise InvalidRequest(
                f"Invalid type for '{name}': expected an object, but got {json_type(value)}.", param=name
            )
    check_metadata(body.get("metadata"))
    for name in _LIST_PARAMS:
        value = body.get(name)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, dict) for v in value)):
            raise InvalidRequest(f"Invalid type for '{name}': expected an array of objects.", param=name)
    stop = body.get("stop")
    if (
        stop is not None
        and not isinstance(stop, str)
        and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop))
    ):
        raise InvalidRequest("Invalid type for 'stop': expected a string or an array of strings.", param="stop")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise InvalidRequest(f"Invalid type for 'user': expected a string, but got {json_type(user)}.", param="user")
