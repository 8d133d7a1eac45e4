"""A strict fake OpenAI Responses API server for tests, served over real HTTP.

`FakeResponsesUpstream` is to `POST /v1/responses` what `tests.support.fake_upstream.FakeUpstream` is to chat
completions: a uvicorn server on 127.0.0.1 in a thread that answers the way OpenAI does and refuses what OpenAI
refuses, with OpenAI's error bodies, wherever a proxy could get the wire format wrong:

- `input` items are checked by type (required fields, message roles and content part types, unknown types);
- every `function_call_output` / `custom_tool_call_output` must follow its call in the same `input`, and (with
  `require_tool_outputs`) every call must be answered;
- a `reasoning` item's `encrypted_content` must be a blob this fake issued, byte for byte, and (with
  `strict_reasoning_order`) be followed by the assistant item it produced;
- an item field its type does not have is an unknown parameter (`reject_unknown_item_fields`);
- the fake keeps no conversation state: `previous_response_id` and `item_reference` are refused as unknown ids;
- the prompt (instructions + the text of every item, counted as `FakeUpstream` counts chat messages) must leave
  `max_output_tokens` of room in `context_window`.

Streams have `event: <type>` / `data: <json>` framing, a `sequence_number` on every event and the full order of a
real stream. `fail_next` answers the next requests with an error; `error_mid_stream_after` fails streams with
`response.failed` after some events.
"""

from __future__ import annotations

import base64
import json
import re
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from openai.types.responses import (
    easy_input_message_param,
    response_custom_tool_call_output_param,
    response_custom_tool_call_param,
    response_function_tool_call_param,
    response_input_item_param,
    response_output_message_param,
    response_reasoning_item_param,
)
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.fake_upstream import (
    ARGUMENT_FRAGMENT_CHARS,
    DEFAULT_CONTEXT_WINDOW,
    ECHO_MAX_CHARS,
    ECHO_PREFIX,
    FAKE_MODEL_ID,
    UpstreamError,
    _http_error,
    _invalid,
    _missing,
    _tokens,
    count_prompt_tokens,
    default_error_body,
    error_body,
    token_ids,
)
from tests.support.loopback_server import LoopbackServer
from tests.support.prompt_cache import PrefixCache

__all__ = [
    "CONTEXT_EXCEEDED_MESSAGE",
    "DEFAULT_CONTEXT_WINDOW",
    "FAKE_MODEL_ID",
    "REASONING_SUMMARY",
    "FakeResponsesUpstream",
    "ReceivedRequest",
    "ResponsesReply",
    "context_exceeded_body",
    "count_input_tokens",
]

CONTEXT_EXCEEDED_MESSAGE = (
    "Your input exceeds the context window of this model. Please adjust your input and try again."
)
REASONING_SUMMARY = "thinking..."
REASONING_TOKENS = 16
MIN_MAX_OUTPUT_TOKENS = 16
ENCRYPTED_PREFIX = "gAAAAAB"
ENCRYPTED_RANDOM_BYTES = 96
MESSAGE_ROLES = ("user", "assistant", "system", "developer")
INPUT_PART_TYPES = ("input_text", "input_image", "input_file")
OUTPUT_PART_TYPES = ("output_text", "refusal")
ITEM_TYPES = (
    "message",
    "function_call",
    "function_call_output",
    "custom_tool_call",
    "custom_tool_call_output",
    "reasoning",
    "item_reference",
)


def _keys(*params: Any) -> frozenset[str]:
    return frozenset().union(*(cls.__required_keys__ | cls.__optional_keys__ for cls in params))


# The fields each item type may have, from the SDK's request types (OpenAI refuses others: "Unknown parameter").
ITEM_FIELDS: dict[str, frozenset[str]] = {
    "message": _keys(
        easy_input_message_param.EasyInputMessageParam,
        response_input_item_param.Message,
        response_output_message_param.ResponseOutputMessageParam,
    ),
    "function_call": _keys(response_function_tool_call_param.ResponseFunctionToolCallParam),
    "function_call_output": _keys(response_input_item_param.FunctionCallOutput),
    # Codex echoes `status` on custom tool calls (the SDK's type lacks it; OpenAI accepts it).
    "custom_tool_call": _keys(response_custom_tool_call_param.ResponseCustomToolCallParam) | {"status"},
    "custom_tool_call_output": _keys(response_custom_tool_call_output_param.ResponseCustomToolCallOutputParam),
    "reasoning": _keys(response_reasoning_item_param.ResponseReasoningItemParam),
    "item_reference": _keys(response_input_item_param.ItemReference),
}
CALL_TYPES = {"function_call_output": "function_call", "custom_tool_call_output": "custom_tool_call"}
OUTPUT_KIND = {"function_call_output": "function call output", "custom_tool_call_output": "custom tool call output"}
MISSING_KEY_MESSAGE = (
    "You didn't provide an API key. You need to provide your API key in an Authorization header using Bearer auth "
    "(i.e. Authorization: Bearer YOUR_KEY), or as the password field (with blank username) if you're accessing the "
    "API from your browser and are prompted for a username. You can obtain an API key from "
    "https://platform.openai.com/account/api-keys."
)
MID_STREAM_ERROR = {"code": "server_error", "message": "The model produced an error while generating a response."}


@dataclass
class ReceivedRequest:
    """One request as it arrived: `body` parsed (`{"_unparsed": text}` when it was not a JSON object)."""

    body: dict[str, Any]
    raw: bytes
    headers: dict[str, str]
    """Lower-cased header names, as Starlette gives them."""
    path: str = "/v1/responses"


@dataclass
class ResponsesReply:
    """What the model answers; the fake mints every id (`rs_`, `msg_`, `fc_`, `ctc_`, `call_`)."""

    text: str | None = None
    function_calls: list[tuple[str, str]] = field(default_factory=list)
    """(name, arguments as a JSON string)."""
    reasoning: bool = False
    """Start the output with a reasoning item carrying a fresh `encrypted_content` the fake remembers."""
    custom_calls: list[tuple[str, str]] = field(default_factory=list)
    """(name, raw input) of `custom_tool_call` items (freeform tools such as Codex's `apply_patch`)."""


ResponderFn = Callable[[dict[str, Any]], ResponsesReply]


def context_exceeded_body() -> dict[str, Any]:
    return error_body(CONTEXT_EXCEEDED_MESSAGE, "invalid_request_error", "input", "context_length_exceeded")


def _parts_text(content: Any) -> str:
    """The text of a message's content: a string, or its text parts (input_text, output_text, refusal)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    texts: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        value = part.get("refusal") if part.get("type") == "refusal" else part.get("text")
        if isinstance(value, str):
            texts.append(value)
    return "".join(texts)


def _as_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The request as chat-like messages, so that `count_prompt_tokens` counts it as FakeUpstream counts chat."""
    messages: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str):
        messages.append({"role": "system", "content": instructions})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role") if isinstance(item.get("role"), str) else "user"
            messages.append({"role": role, "content": _parts_text(item.get("content"))})
        elif kind in ("function_call", "custom_tool_call"):
            payload = item.get("arguments") if kind == "function_call" else item.get("input")
            call = {"id": item.get("call_id"), "function": {"name": item.get("name"), "arguments": payload}}
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind in CALL_TYPES:
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": _output_text(item)})
        elif kind == "reasoning":
            summary = item.get("summary") if isinstance(item.get("summary"), list) else []
            messages.append({"role": "assistant", "content": _parts_text(summary)})
    return messages


def _output_text(item: dict[str, Any]) -> str:
    output = item.get("output")
    return output if isinstance(output, str) else _parts_text(output)


def count_input_tokens(body: dict[str, Any]) -> int:
    """The request's prompt tokens as the fake counts them (instructions and every item's text, chat formula; each
    function tool as FakeUpstream counts a chat function)."""
    tools = body.get("tools")
    listed = tools if isinstance(tools, list) else []
    functions = [{"function": tool} for tool in listed if isinstance(tool, dict) and tool.get("type") == "function"]
    return count_prompt_tokens(_as_messages(body), functions)


def input_token_ids(body: dict[str, Any]) -> Sequence[int]:
    """The prompt's tokens in the order the model reads them (instructions, tools, input), for prefix caching."""
    items = body.get("input")
    pieces = [str(body.get("instructions") or ""), json.dumps(body.get("tools") or [], sort_keys=True)]
    if isinstance(items, list):
        pieces.extend(json.dumps(item, sort_keys=True) for item in items)
    else:
        pieces.append(str(items or ""))
    return token_ids(pieces)


def _reply_tokens(reply: ResponsesReply) -> int:
    total = _tokens(reply.text or "")
    for name, payload in [*reply.function_calls, *reply.custom_calls]:
        total += _tokens(name) + _tokens(payload)
    return total


def _invalid_value(value: Any, supported: tuple[str, ...], param: str) -> UpstreamError:
    listed = ", ".join(f"'{s}'" for s in supported[:-1]) + f", and '{supported[-1]}'"
    return _invalid(f"Invalid value: '{value}'. Supported values are: {listed}.", param, "invalid_value")


def _invalid_type(param: str, expected: str, value: Any) -> UpstreamError:
    return _invalid(
        f"Invalid type for '{param}': expected {expected}, but got {type(value).__name__} instead.",
        param,
        "invalid_type",
    )


def _require_string(item: dict[str, Any], key: str, where: str) -> None:
    if key not in item or item[key] is None:
        raise _missing(f"{where}.{key}")
    if not isinstance(item[key], str):
        raise _invalid_type(f"{where}.{key}", "a string", item[key])


def _check_parts(content: list[Any], role: str, where: str) -> None:
    """`where` names the list itself (`input[2].content`, `input[3].output`)."""
    allowed = OUTPUT_PART_TYPES if role == "assistant" else INPUT_PART_TYPES
    for index, part in enumerate(content):
        part_where = f"{where}[{index}]"
        if not isinstance(part, dict):
            raise _invalid_type(part_where, "an object", part)
        kind = part.get("type")
        if kind is None:
            raise _missing(f"{part_where}.type")
        if kind not in allowed:
            raise _invalid_value(kind, allowed, f"{part_where}.type")
        if kind in ("input_text", "output_text"):
            _require_string(part, "text", part_where)
        elif kind == "refusal":
            _require_string(part, "refusal", part_where)


def _check_message(item: dict[str, Any], where: str) -> None:
    role = item.get("role")
    if role is None:
        raise _missing(f"{where}.role")
    if role not in MESSAGE_ROLES:
        raise _invalid_value(role, MESSAGE_ROLES, f"{where}.role")
    if "content" not in item or item["content"] is None:
        raise _missing(f"{where}.content")
    content = item["content"]
    if isinstance(content, list):
        _check_parts(content, role, f"{where}.content")
    elif not isinstance(content, str):
        raise _invalid_type(f"{where}.content", "one of a string or array of input items", content)


def _check_output(item: dict[str, Any], where: str) -> None:
    _require_string(item, "call_id", where)
    if "output" not in item or item["output"] is None:
        raise _missing(f"{where}.output")
    output = item["output"]
    if isinstance(output, list):
        _check_parts(output, "tool", f"{where}.output")
    elif not isinstance(output, str):
        raise _invalid_type(f"{where}.output", "one of a string or array of input items", output)


class FakeResponsesUpstream(LoopbackServer):
    """An OpenAI Responses server on 127.0.0.1; attributes are read per request, so tests may change them."""

    def __init__(self, context_window: int = DEFAULT_CONTEXT_WINDOW) -> None:
        self.context_window = context_window
        self.responder: ResponderFn | None = None
        """body → `ResponsesReply`; None: `echo_reply` (reasoning + "echo: <last user text>")."""
        self.error_mid_stream_after: int | None = None
        """Send `response.failed` (with `mid_stream_error`) instead of the event with this index, then end."""
        self.mid_stream_error: dict[str, Any] = dict(MID_STREAM_ERROR)
        self.require_tool_outputs = True
        """Refuse a function/custom call in `input` that no output answers ("No tool output found ...")."""
        self.reject_unknown_item_fields = True
        """Refuse an input item with a field its type does not have (the SDK's request types list them)."""
        self.strict_reasoning_order = True
        """Refuse a reasoning item not followed by an assistant message or a call (as OpenAI does)."""
        self.prompt_cache = PrefixCache()
        """OpenAI's automatic prefix caching, reported as `input_tokens_details.cached_tokens`."""
        self.requests: list[ReceivedRequest] = []
        self.rejected: list[dict[str, Any]] = []
        """Error bodies of requests refused by a check (auth, validation, window); not those of `fail_next`."""
        self.issued: set[str] = set()
        """Every `encrypted_content` blob this fake has handed out (the only ones it accepts back)."""
        self._default_context_window = context_window
        self._faults: list[tuple[int, dict[str, Any] | None]] = []
        self._counters: dict[str, int] = {}
        self._lock = threading.Lock()
        app = Starlette(
            routes=[
                Route("/v1/responses", self._responses, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ],
            exception_handlers={HTTPException: _http_error},
        )
        super().__init__(app, "fake-responses", "/v1")

    # -- test controls ----------------------------------------------------------------------------------------

    def fail_next(self, status: int = 500, body: dict[str, Any] | None = None, count: int = 1) -> None:
        """Answer the next `count` POSTs to /v1/responses with `status` and `body` (OpenAI's default by status)."""
        with self._lock:
            self._faults.extend([(status, body)] * count)

    def reset(self) -> None:
        """Forget requests, rejections, faults, issued blobs and id counters; restore the defaults."""
        with self._lock:
            self.requests.clear()
            self.rejected.clear()
            self._faults.clear()
            self.issued.clear()
            self._counters.clear()
        self.prompt_cache.clear()
        self.responder = None
        self.error_mid_stream_after = None
        self.mid_stream_error = dict(MID_STREAM_ERROR)
        self.require_tool_outputs = True
        self.strict_reasoning_order = True
        self.reject_unknown_item_fields = True
        self.context_window = self._default_context_window

    @staticmethod
    def count_tokens(body: dict[str, Any]) -> int:
        """The prompt tokens the fake counts for a request body (what its window check and usage use)."""
        return count_input_tokens(body)

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._counters[prefix] = self._counters.get(prefix, 0) + 1
            return f"{prefix}_{self._counters[prefix]}"

    def _new_blob(self) -> str:
        blob = ENCRYPTED_PREFIX + base64.urlsafe_b64encode(secrets.token_bytes(ENCRYPTED_RANDOM_BYTES)).decode()
        with self._lock:
            self.issued.add(blob)
        return blob

    # -- checks -----------------------------------------------------------------------------------------------

    def _check_body(self, body: dict[str, Any]) -> None:
        if "model" not in body or body["model"] is None:
            raise _missing("model")
        if not isinstance(body["model"], str):
            raise _invalid_type("model", "a string", body["model"])
        if "input" not in body or body["input"] is None:
            raise _missing("input")
        items = body["input"]
        if not isinstance(items, str | list):
            raise _invalid_type("input", "one of a string or array of input items", items)
        instructions = body.get("instructions")
        if instructions is not None and not isinstance(instructions, str):
            raise _invalid_type("instructions", "a string", instructions)
        limit = body.get("max_output_tokens")
        if limit is not None:
            if not isinstance(limit, int) or isinstance(limit, bool):
                raise _invalid_type("max_output_tokens", "an integer", limit)
            if limit < MIN_MAX_OUTPUT_TOKENS:
                raise _invalid(
                    f"Invalid 'max_output_tokens': integer below minimum value. Expected a value >= "
                    f"{MIN_MAX_OUTPUT_TOKENS}, but got {limit} instead.",
                    "max_output_tokens",
                    "integer_below_min_value",
                )
        for key in ("tools", "include"):
            if body.get(key) is not None and not isinstance(body[key], list):
                raise _invalid_type(key, "an array", body[key])
        if isinstance(items, list):
            for index, item in enumerate(items):
                self._check_item(item, f"input[{index}]")
            self._check_pairing(items)
            if self.strict_reasoning_order:
                _check_reasoning_order(items)
        previous = body.get("previous_response_id")
        if previous is not None:
            raise UpstreamError(
                400,
                f"Previous response with id '{previous}' not found.",
                "invalid_request_error",
                "previous_response_id",
                "previous_response_not_found",
            )

    def _check_item(self, item: Any, where: str) -> None:
        if not isinstance(item, dict):
            raise _invalid_type(where, "an object", item)
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"  # EasyInputMessage: `type` may be omitted
        if kind is None:
            raise _missing(f"{where}.type")
        if kind not in ITEM_TYPES:
            raise _invalid_value(kind, ITEM_TYPES, f"{where}.type")
        if self.reject_unknown_item_fields:
            unknown = sorted(set(item) - ITEM_FIELDS[kind])
            if unknown:
                param = f"{where}.{unknown[0]}"
                raise _invalid(f"Unknown parameter: '{param}'.", param, "unknown_parameter")
        if kind == "message":
            _check_message(item, where)
        elif kind == "function_call":
            for key in ("call_id", "name", "arguments"):
                _require_string(item, key, where)
        elif kind == "custom_tool_call":
            for key in ("call_id", "name", "input"):
                _require_string(item, key, where)
        elif kind in CALL_TYPES:
            _check_output(item, where)
        elif kind == "reasoning":
            self._check_reasoning(item, where)
        else:  # item_reference: this fake stores nothing, so every referenced id is unknown
            _require_string(item, "id", where)
            raise UpstreamError(
                404,
                f"Item with id '{item['id']}' not found. Items are not persisted when `store` is set to false. "
                "Try again with `store` set to true, or remove this item from your input.",
                "invalid_request_error",
                "input",
                None,
            )

    def _check_reasoning(self, item: dict[str, Any], where: str) -> None:
        _require_string(item, "id", where)
        summary = item.get("summary")
        if summary is None:
            raise _missing(f"{where}.summary")
        if not isinstance(summary, list):
            raise _invalid_type(f"{where}.summary", "an array", summary)
        for index, part in enumerate(summary):
            part_where = f"{where}.summary[{index}]"
            if not isinstance(part, dict) or part.get("type") != "summary_text":
                raise _invalid_value(
                    part.get("type") if isinstance(part, dict) else part, ("summary_text",), f"{part_where}.type"
                )
            _require_string(part, "text", part_where)
        blob = item.get("encrypted_content")
        if blob is None:
            return
        with self._lock:
            known = isinstance(blob, str) and blob in self.issued
        if not known:
            raise _invalid(
                f"The encrypted content for item {item['id']} could not be verified.",
                None,
                "invalid_encrypted_content",
            )

    def _check_pairing(self, items: list[Any]) -> None:
        calls: dict[str, str] = {}  # call_id -> call type, calls seen so far
        answered: set[str] = set()
        for item in items:
            kind = item.get("type", "message")
            if kind in ("function_call", "custom_tool_call"):
                calls[item["call_id"]] = kind
            elif kind in CALL_TYPES:
                call_id = item["call_id"]
                if calls.get(call_id) != CALL_TYPES[kind]:
                    raise _invalid(f"No tool call found for {OUTPUT_KIND[kind]} with call_id {call_id}.", "input")
                answered.add(call_id)
        if self.require_tool_outputs:
            for call_id, kind in calls.items():
                if call_id not in answered:
                    what = "function call" if kind == "function_call" else "custom tool call"
                    raise _invalid(f"No tool output found for {what} {call_id}.", "input")

    def _check_window(self, body: dict[str, Any], input_tokens: int) -> None:
        room = self.context_window - (body.get("max_output_tokens") or 0)
        if input_tokens > room:
            raise UpstreamError(
                400, CONTEXT_EXCEEDED_MESSAGE, "invalid_request_error", "input", "context_length_exceeded"
            )

    # -- answers ----------------------------------------------------------------------------------------------

    def _output_items(self, reply: ResponsesReply) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        if reply.reasoning:
            items.append(
                {
                    "id": self._next_id("rs"),
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": REASONING_SUMMARY}],
                    "encrypted_content": self._new_blob(),
                }
            )
        if reply.text is not None:
            items.append(
                {
                    "id": self._next_id("msg"),
                    "type": "message",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []}],
                }
            )
        for name, arguments in reply.function_calls:
            items.append(
                {
                    "id": self._next_id("fc"),
                    "type": "function_call",
                    "status": "completed",
                    "call_id": self._next_id("call"),
                    "name": name,
                    "arguments": arguments,
                }
            )
        for name, payload in reply.custom_calls:
            items.append(
                {
                    "id": self._next_id("ctc"),
                    "type": "custom_tool_call",
                    "status": "completed",
                    "call_id": self._next_id("call"),
                    "name": name,
                    "input": payload,
                }
            )
        return items

    def _response(self, body: dict[str, Any], response_id: str, created_at: int) -> dict[str, Any]:
        """The `response` object without output and usage (as in `response.created`)."""
        return {
            "id": response_id,
            "object": "response",
            "created_at": created_at,
            "status": "in_progress",
            "background": False,
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "model": body["model"],
            "output": [],
            "parallel_tool_calls": body.get("parallel_tool_calls", True),
            "previous_response_id": None,
            "prompt_cache_key": body.get("prompt_cache_key"),
            "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
            "service_tier": "default",
            "store": body.get("store", True),
            "temperature": body.get("temperature", 1.0),
            "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"),
            "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0),
            "truncation": body.get("truncation", "disabled"),
            "usage": None,
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }

    async def _models(self, request: Request) -> Response:
        if (refusal := self._auth_refusal(request)) is not None:
            return refusal
        model = {"id": FAKE_MODEL_ID, "object": "model", "created": 0, "owned_by": "fake-responses-upstream"}
        return JSONResponse({"object": "list", "data": [model]})

    def _auth_refusal(self, request: Request) -> Response | None:
        header = request.headers.get("authorization", "")
        if re.fullmatch(r"Bearer \S.*", header):
            return None
        body = error_body(MISSING_KEY_MESSAGE, "invalid_request_error", None, None)
        with self._lock:
            self.rejected.append(body)
        return JSONResponse(body, status_code=401)

    async def _responses(self, request: Request) -> Response:
        raw = await request.body()
        try:
            parsed: Any = json.loads(raw)
        except ValueError:
            parsed = None
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {"_unparsed": raw.decode("utf-8", "replace")}
        with self._lock:
            self.requests.append(ReceivedRequest(body=body, raw=raw, headers=dict(request.headers.items())))
            fault = self._faults.pop(0) if self._faults else None
        if fault is not None:
            status, error = fault
            return JSONResponse(error if error is not None else default_error_body(status), status_code=status)
        if (refusal := self._auth_refusal(request)) is not None:
            return refusal
        try:
            if not isinstance(parsed, dict):
                raise _invalid(
                    "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
                    "using your HTTP library correctly. The OpenAI API expects a JSON payload.)"
                )
            self._check_body(body)
            input_tokens = count_input_tokens(body)
            self._check_window(body, input_tokens)
        except UpstreamError as exc:
            with self._lock:
                self.rejected.append(exc.body)
            return JSONResponse(exc.body, status_code=exc.status)

        responder = self.responder
        reply = responder(body) if responder is not None else echo_reply(body)
        response = self._response(body, self._next_id("resp"), int(time.time()))
        output = self._output_items(reply)
        output_tokens = _reply_tokens(reply) + (REASONING_TOKENS if reply.reasoning else 0)
        scope = f"{body.get('model')}\x00{request.headers.get('authorization', '')}"
        cached = self.prompt_cache.serve(scope, input_token_ids(body), input_tokens)
        final = {
            **response,
            "status": "completed",
            "completed_at": int(time.time()),
            "output": output,
            "usage": {
                "input_tokens": input_tokens,
                "input_tokens_details": {"cached_tokens": cached},
                "output_tokens": output_tokens,
                "output_tokens_details": {"reasoning_tokens": REASONING_TOKENS if reply.reasoning else 0},
                "total_tokens": input_tokens + output_tokens,
            },
        }
        if body.get("stream") is not True:
            return JSONResponse(final)
        events = stream_events(response, final)
        return StreamingResponse(self._events(events, response), media_type="text/event-stream")

    async def _events(self, events: list[dict[str, Any]], response: dict[str, Any]) -> AsyncIterator[str]:
        fail_at = self.error_mid_stream_after
        for index, event in enumerate(events):
            if index == fail_at:
                failed = {**response, "status": "failed", "error": dict(self.mid_stream_error)}
                yield _sse({"type": "response.failed", "sequence_number": index, "response": failed})
                return
            yield _sse(event)


def _check_reasoning_order(items: list[Any]) -> None:
    """A reasoning item must be followed by the item it was produced with (OpenAI refuses it alone)."""
    for index, item in enumerate(items):
        if item.get("type") != "reasoning":
            continue
        following = items[index + 1] if index + 1 < len(items) else None
        kind = following.get("type", "message") if following is not None else None
        role = following.get("role") if following is not None else None
        if not (
            kind in ("function_call", "custom_tool_call", "reasoning") or (kind == "message" and role == "assistant")
        ):
            raise _invalid(
                f"Item '{item['id']}' of type 'reasoning' was provided without its required following item.",
                "input",
            )


def echo_reply(body: dict[str, Any]) -> ResponsesReply:
    """The default answer: a reasoning item, then "echo: " and the last user message's text."""
    items = body.get("input")
    text = items if isinstance(items, str) else ""
    if isinstance(items, list):
        for item in reversed(items):
            if isinstance(item, dict) and item.get("type", "message") == "message" and item.get("role") == "user":
                text = _parts_text(item.get("content"))
                break
    return ResponsesReply(text=(ECHO_PREFIX + text)[:ECHO_MAX_CHARS], reasoning=True)


def _word_pieces(text: str) -> list[str]:
    return re.findall(r"\s*\S+|\s+", text) or [""]


def _fragments(text: str) -> list[str]:
    return [text[i : i + ARGUMENT_FRAGMENT_CHARS] for i in range(0, len(text), ARGUMENT_FRAGMENT_CHARS)] or [""]


def stream_events(response: dict[str, Any], final: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event of a real stream for `final`, in order, numbered by `sequence_number`."""
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": response},
        {"type": "response.in_progress", "response": response},
    ]
    for index, item in enumerate(final["output"]):
        kind, item_id = item["type"], item["id"]
        where = {"item_id": item_id, "output_index": index}
        if kind == "message":
            opening = {**item, "status": "in_progress", "content": []}
            events.append({"type": "response.output_item.added", "output_index": index, "item": opening})
            text = item["content"][0]["text"]
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events.append({"type": "response.content_part.added", **where, "content_index": 0, "part": part})
            for piece in _word_pieces(text):
                events.append(
                    {"type": "response.output_text.delta", **where, "content_index": 0, "delta": piece, "logprobs": []}
                )
            events.append(
                {"type": "response.output_text.done", **where, "content_index": 0, "text": text, "logprobs": []}
            )
            events.append(
                {"type": "response.content_part.done", **where, "content_index": 0, "part": item["content"][0]}
            )
        elif kind == "function_call":
            opening = {**item, "status": "in_progress", "arguments": ""}
            events.append({"type": "response.output_item.added", "output_index": index, "item": opening})
            for piece in _fragments(item["arguments"]):
                events.append({"type": "response.function_call_arguments.delta", **where, "delta": piece})
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    **where,
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
        elif kind == "custom_tool_call":
            opening = {**item, "status": "in_progress", "input": ""}
            events.append({"type": "response.output_item.added", "output_index": index, "item": opening})
            for piece in _fragments(item["input"]):
                events.append({"type": "response.custom_tool_call_input.delta", **where, "delta": piece})
            events.append({"type": "response.custom_tool_call_input.done", **where, "input": item["input"]})
        else:  # reasoning: the summary and blob arrive whole with output_item.done
            opening = {"id": item_id, "type": "reasoning", "summary": []}
            events.append({"type": "response.output_item.added", "output_index": index, "item": opening})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    events.append({"type": "response.completed", "response": final})
    return [{**event, "sequence_number": number} for number, event in enumerate(events)]


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
