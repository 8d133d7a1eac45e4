"""The first stage of a request: read the body within its size limit and validate it into a `ChatRequest`.

Everything a client can get wrong is caught here, before any state is touched, as a 400 (or 413) that names
the field: the rest of the pipeline can then trust its input. Validation is deliberately limited to what
OpenAI itself rejects and what the proxy relies on; every other field passes through untouched, because the
upstream is the authority on its own parameters.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from proxy.errors import InvalidRequest, PayloadTooLarge

Message = dict[str, Any]

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_SESSION_ID_LENGTH = 200

_INTEGER_PARAMS = {"max_tokens": 0, "max_completion_tokens": 0, "n": 1, "top_logprobs": 0}
_NUMBER_PARAMS = ("temperature", "top_p", "presence_penalty", "frequency_penalty")
_BOOLEAN_PARAMS = ("stream", "logprobs", "parallel_tool_calls", "store")
_OBJECT_PARAMS = ("stream_options", "response_format", "logit_bias", "metadata")
_LIST_PARAMS = ("tools", "functions")


@dataclass(frozen=True)
class ChatRequest:
    """A validated chat completion request; `body` is the client's JSON object, unchanged."""

    body: dict[str, Any]

    @property
    def model(self) -> str:
        return str(self.body["model"])

    @property
    def messages(self) -> list[Message]:
        messages: list[Message] = self.body["messages"]
        return messages

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream", False))

    @property
    def max_output(self) -> int | None:
        """The output the client asked to reserve; `max_completion_tokens` wins as it does at OpenAI."""
        for name in ("max_completion_tokens", "max_tokens"):
            value = self.body.get(name)
            if value is not None:
                return int(value)
        return None

    def params(self) -> dict[str, Any]:
        """Every field but model and messages: what the upstream receives as the client sent it."""
        return {key: value for key, value in self.body.items() if key not in ("model", "messages")}


async def read_body(chunks: AsyncIterator[bytes], content_length: str | None, max_bytes: int) -> bytes:
    """Read at most `max_bytes`; a larger body is refused before (or as soon as) it is known to be too big."""
    if content_length is not None and content_length.isdigit() and int(content_length) > max_bytes:
        raise PayloadTooLarge(f"Request body is {content_length} bytes; the limit is {max_bytes} bytes.")
    received = bytearray()
    async for chunk in chunks:
        received += chunk
        if len(received) > max_bytes:
            raise PayloadTooLarge(f"Request body exceeds the limit of {max_bytes} bytes.")
    return bytes(received)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"Request body is not valid UTF-8 (byte {exc.start}).") from exc
    try:
        body = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidRequest(
            f"We could not parse the JSON body of your request: {exc.msg} at line {exc.lineno} column {exc.colno}."
        ) from exc
    except RecursionError as exc:
        raise InvalidRequest("The JSON body of your request is nested too deeply.") from exc
    except ValueError as exc:
        # Python refuses integers of more than 4,300 digits (`sys.get_int_max_str_digits`) with a ValueError.
        raise InvalidRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    if _SURROGATE_ESCAPE.search(raw) is not None:
        _reject_lone_surrogates(body)
    if not isinstance(body, dict):
        raise InvalidRequest(f"The request body must be a JSON object, not {_json_type(body)}.")
    return body


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
"""A `\\ud800`–`\\udfff` escape: the only way a JSON text in valid UTF-8 can smuggle in a surrogate."""


def _reject_lone_surrogates(body: Any) -> None:
    """A surrogate escape not paired into one character is not Unicode: it could be neither hashed, stored nor
    echoed back (UTF-8 cannot encode it), so it is refused here like any other malformed input."""
    try:
        json.dumps(body, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            "The JSON body of your request contains an unpaired UTF-16 surrogate escape (\\ud800-\\udfff), "
            "which is not valid Unicode."
        ) from exc
    except RecursionError as exc:
        raise InvalidRequest("The JSON body of your request is nested too deeply.") from exc


def parse_chat_request(raw: bytes) -> ChatRequest:
    body = parse_json_object(raw)
    model = body.get("model")
    if model is None:
        raise InvalidRequest("You must provide a model parameter.", param="model")
    if not isinstance(model, str) or not model:
        raise InvalidRequest(f"'model' must be a non-empty string, not {_json_type(model)}.", param="model")
    messages = body.get("messages")
    if messages is None:
        raise InvalidRequest("Missing required parameter: 'messages'.", param="messages")
    if not isinstance(messages, list):
        raise InvalidRequest(f"'messages' must be an array, not {_json_type(messages)}.", param="messages")
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    for index, message in enumerate(messages):
        _validate_message(message, f"messages[{index}]")
    _validate_params(body)
    return ChatRequest(body)


def _validate_message(message: Any, where: str) -> None:
    if not isinstance(message, dict):
        raise InvalidRequest(f"'{where}' must be an object, not {_json_type(message)}.", param=where)
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
    content = message.get("content")
    if content is None:
        if role != "assistant" and not (role == "tool" and "content" in message):
            raise InvalidRequest(f"Missing required parameter: '{where}.content'.", param=f"{where}.content")
    elif isinstance(content, list):
        for part_index, part in enumerate(content):
            if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                raise InvalidRequest(
                    f"'{where}.content[{part_index}]' must be an object with a string 'type'.",
                    param=f"{where}.content[{part_index}]",
                )
    elif not isinstance(content, str):
        raise InvalidRequest(
            f"Invalid type for '{where}.content': expected a string or an array of content parts, "
            f"but got {_json_type(content)}.",
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


def _validate_params(body: Mapping[str, Any]) -> None:
    for name, minimum in _INTEGER_PARAMS.items():
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidRequest(
                f"Invalid type for '{name}': expected an integer, but got {_json_type(value)}.", param=name
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
                f"Invalid type for '{name}': expected a number, but got {_json_type(value)}.", param=name
            )
    for name in _BOOLEAN_PARAMS:
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise InvalidRequest(
                f"Invalid type for '{name}': expected a boolean, but got {_json_type(value)}.", param=name
            )
    for name in _OBJECT_PARAMS:
        value = body.get(name)
        if value is not None and not isinstance(value, dict):
            raise InvalidRequest(
                f"Invalid type for '{name}': expected an object, but got {_json_type(value)}.", param=name
            )
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
        raise InvalidRequest(f"Invalid type for 'user': expected a string, but got {_json_type(user)}.", param="user")


@dataclass(frozen=True)
class ContextOptions:
    """The per-request headers that steer the proxy (DESIGN.md, external interface)."""

    session_id: str | None = None
    budget: int | None = None
    """X-Context-Budget: a lower input budget, remembered for the session."""
    reset_budget: bool = False
    """X-Context-Budget: none — forget the session's remembered budget."""
    preserve_recent: int | None = None
    mode: str = "auto"
    idempotency_key: str | None = None


MODES = ("auto", "off")
MAX_PRESERVE_RECENT = 1000
MAX_IDEMPOTENCY_KEY_LENGTH = 255


def context_options(headers: Mapping[str, str]) -> ContextOptions:
    budget_text = headers.get("x-context-budget")
    reset = budget_text is not None and budget_text.strip().lower() == "none"
    mode = headers.get("x-context-mode", "auto").strip().lower()
    if mode not in MODES:
        raise InvalidRequest(
            f"Header X-Context-Mode must be one of {', '.join(MODES)}, got {mode!r}.", param="X-Context-Mode"
        )
    return ContextOptions(
        session_id=_token_header(headers, "X-Session-Id", MAX_SESSION_ID_LENGTH),
        budget=None if reset else _int_header(headers, "X-Context-Budget", minimum=1),
        reset_budget=reset,
        preserve_recent=_int_header(headers, "X-Context-Preserve-Recent", minimum=0, maximum=MAX_PRESERVE_RECENT),
        mode=mode,
        idempotency_key=_token_header(headers, "Idempotency-Key", MAX_IDEMPOTENCY_KEY_LENGTH),
    )


def _token_header(headers: Mapping[str, str], name: str, max_length: int) -> str | None:
    value = headers.get(name.lower())
    if value is None:
        return None
    value = value.strip()
    if not value or len(value) > max_length or not value.isprintable():
        raise InvalidRequest(f"Header {name} must be 1 to {max_length} printable characters.", param=name)
    return value


def _int_header(headers: Mapping[str, str], name: str, minimum: int, maximum: int | None = None) -> int | None:
    value = headers.get(name.lower())
    if value is None:
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or int(text) < minimum or (maximum is not None and int(text) > maximum):
        limits = f"at least {minimum}" + (f" and at most {maximum}" if maximum is not None else "")
        raise InvalidRequest(f"Header {name} must be a whole number {limits}, got {value!r}.", param=name)
    return int(text)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"
