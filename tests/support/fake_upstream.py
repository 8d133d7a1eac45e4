"""A strict fake OpenAI chat-completions server for tests, served over real HTTP.

The proxy talks to its upstream through LiteLLM and the network, so the fake is a real uvicorn server on
127.0.0.1 rather than a mocked transport: every byte the proxy would see from OpenAI goes through sockets.
It rejects what OpenAI rejects (missing fields, unpaired tool messages, prompts over the context window) with
OpenAI's error bodies, streams `chat.completion.chunk` events the way OpenAI does, and can be told to fail
the next requests (`Fault`): error statuses, slow answers, streams cut mid-way or corrupted. With `strict_roles`
it also rejects the role orders that strict chat templates reject (local models, several providers), and `delay`
can slow down chosen requests (a slow summarizer). `context_dialect` refuses a prompt over the window the way
another provider does (llama.cpp, Anthropic, vLLM, Ollama), and `token_ratio` counts like a tokenizer that
sees more tokens than OpenAI's.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
import math
import os
import re
import threading
import time
from array import array
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import tiktoken
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.support.context_dialects import ContextDialect
from tests.support.loopback_server import (
    IntentionalDrop,
    LoopbackServer,
)
from tests.support.prompt_cache import PrefixCache

DEFAULT_CONTEXT_WINDOW = 8192
FAKE_MODEL_ID = "fake-model"
SYSTEM_FINGERPRINT = "fp_fake_upstream"
ENCODING_NAME = "o200k_base"
ECHO_PREFIX = "echo: "
ECHO_MAX_CHARS = 200
ARGUMENT_FRAGMENT_CHARS = 8

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_REPLY_PRIMING = 3

MESSAGE_ROLES = ("system", "assistant", "user", "function", "tool", "developer")
MALFORMED_EVENT = "data: {not json\n\n"
DONE_EVENT = "data: [DONE]\n\n"

# status -> (type, code, message) as OpenAI sends them.
DEFAULT_ERRORS: dict[int, tuple[str, str | None, str]] = {
    400: ("invalid_request_error", None, "Bad request."),
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided."),
    403: ("invalid_request_error", "unsupported_country_region_territory", "Region not supported."),
    404: ("invalid_request_error", "model_not_found", "The model does not exist."),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests. Please try again later."),
    500: ("server_error", None, "The server had an error while processing your request. Sorry about that!"),
    502: ("server_error", None, "Bad gateway."),
    503: ("server_error", "service_unavailable", "The server is overloaded or not ready yet."),
}

ReplyFn = Callable[[dict[str, Any]], "Reply"]
DelayFn = Callable[[dict[str, Any]], float]
PINNED_ROLES = ("system", "developer")
ROLES_MUST_ALTERNATE = "Conversation roles must alternate user/assistant/user/assistant/..."


@dataclass
class ReceivedRequest:
    body: dict[str, Any]
    headers: dict[str, str]
    peer: tuple[str, int] | None = None
    """The client's address and port: requests from one port came over one kept connection."""


@dataclass(frozen=True)
class Served:
    """The usage the fake reported for one answered request (what a bench adds up as cost)."""

    model: str
    tools: int
    """Tool definitions the request offered."""
    prompt_tokens: int
    cached_tokens: int


@dataclass
class Reply:
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    finish_reason: str | None = None


@dataclass
class Fault:
    """One injected failure.

    A fault with `drop_after_chunks` or `malformed_after_chunks` only matches streaming requests and ignores
    `status`. Any other fault answers `status` with `body` after `delay_s`, except a status below 400 with
    no body, which only delays the normal answer (`Fault(status=200, delay_s=3)`).
    """

    status: int = 500
    body: dict[str, Any] | None = None
    headers: dict[str, str] | None = None
    delay_s: float = 0.0
    drop_after_chunks: int | None = None
    malformed_after_chunks: int | None = None
    error_after_chunks: int | None = None
    """Send `data: {body}` (an OpenAI error event) after this many chunks, then end the stream."""
    after_done: str | None = None
    """Raw SSE text sent after `[DONE]` (a misbehaving upstream), with a normal answer before it."""
    raw_body: bytes | None = None
    """Sent as the whole answer, with `status` and `media_type`, to a stream or non-stream request alike."""
    media_type: str = "application/json"
    raw_parts: Callable[[], Iterator[bytes]] | None = None
    """Like `raw_body`, made and sent piece by piece: a body too large for the test to hold."""
    when: Callable[[dict[str, Any]], bool] | None = None
    """Only a request whose body this accepts takes the fault (others are answered as usual)."""

    @property
    def breaks_stream(self) -> bool:
        return any(
            value is not None
            for value in (self.drop_after_chunks, self.malformed_after_chunks, self.error_after_chunks, self.after_done)
        )


class UpstreamError(Exception):
    """An OpenAI-shaped error answer, raised while checking a request."""

    def __init__(self, status: int, message: str, type_: str, param: str | None, code: str | None) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(message, type_, param, code)


def error_body(message: str, type_: str, param: str | None, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def default_error_body(status: int) -> dict[str, Any]:
    type_, code, message = DEFAULT_ERRORS.get(
        status,
        ("server_error", None, "Server error.") if status >= 500 else ("invalid_request_error", None, "Error."),
    )
    return error_body(message, type_, None, code)


def _invalid(message: str, param: str | None = None, code: str | None = None) -> UpstreamError:
    return UpstreamError(400, message, "invalid_request_error", param, code)


def _missing(param: str) -> UpstreamError:
    return _invalid(f"Missing required parameter: '{param}'.", param, "missing_required_parameter")


@functools.cache
def _encoding() -> tiktoken.Encoding:
    # tiktoken downloads encodings by default; LiteLLM ships them, which keeps the fake offline.
    if "TIKTOKEN_CACHE_DIR" not in os.environ:
        spec = importlib.util.find_spec("litellm")
        if spec is not None and spec.origin is not None:
            bundled = os.path.join(os.path.dirname(spec.origin), "litellm_core_utils", "tokenizers")
            os.environ["TIKTOKEN_CACHE_DIR"] = bundled
    return tiktoken.get_encoding(ENCODING_NAME)


REMEMBERED_PIECES = 1 << 14
"""How many texts the fake remembers the tokens of (a 5,000-message history re-sent is 10,000)."""


@functools.lru_cache(maxsize=REMEMBERED_PIECES)
def _tokens(text: str) -> int:
    """Remembered: a client re-sends its conversation every turn, and a benchmark's fake must not take longer
    than the proxy in front of it to count it again."""
    return len(_encoding().encode_ordinary(text))


@functools.lru_cache(maxsize=REMEMBERED_PIECES)
def _piece_ids(piece: str) -> array[int]:
    return array("q", _encoding().encode_ordinary(piece))


def content_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
        )
    return ""


def count_prompt_tokens(messages: list[dict[str, Any]], tools: Any = None) -> int:
    """OpenAI's cookbook formula for chat prompts, with o200k_base; the tool definitions count too (OpenAI renders
    them into the prompt), as name, description and JSON schema, as the Anthropic fake counts them."""
    total = TOKENS_REPLY_PRIMING
    for tool in tools if isinstance(tools, list) else ():
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict):
            total += _tokens(f"{function.get('name', '')}{function.get('description', '')}")
            total += _tokens(json.dumps(function.get("parameters"), sort_keys=True)) if "parameters" in function else 0
    for message in messages:
        total += TOKENS_PER_MESSAGE
        for key in ("role", "name", "tool_call_id"):
            value = message.get(key)
            if isinstance(value, str):
                total += _tokens(value)
        if isinstance(message.get("name"), str):
            total += TOKENS_PER_NAME
        total += _tokens(content_text(message.get("content")))
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                for key in ("name", "arguments"):
                    value = function.get(key)
                    if isinstance(value, str):
                        total += _tokens(value)
    return total


def prompt_token_ids(body: dict[str, Any]) -> Sequence[int]:
    """The prompt's tokens in the order the model reads them (tools, then messages), for prefix caching."""
    pieces = [json.dumps(body.get("tools") or [], sort_keys=True)]
    pieces.extend(json.dumps(message, sort_keys=True) for message in body.get("messages") or [])
    return token_ids(pieces)


def token_ids(pieces: list[str]) -> Sequence[int]:
    """The tokens of `pieces` one after another, with the fake's tokenizer."""
    tokens = array("q")
    for piece in pieces:
        tokens.extend(_piece_ids(piece))
    return tokens


def _check_body(body: dict[str, Any]) -> list[dict[str, Any]]:
    """Reject what OpenAI rejects before generating; returns the messages."""
    if not isinstance(body.get("model"), str):
        raise _invalid("you must provide a model parameter")
    if "messages" not in body:
        raise _missing("messages")
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _invalid(
            f"Invalid type for 'messages': expected an array, but got {type(messages).__name__} instead.",
            "messages",
            "invalid_type",
        )
    if not messages:
        raise _invalid(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            "messages",
            "empty_array",
        )
    if body.get("stream_options") is not None and body.get("stream") is not True:
        raise _invalid("The 'stream_options' parameter is only allowed when 'stream' is enabled.", "stream_options")
    for index, message in enumerate(messages):
        _check_message(index, message)
    _check_tool_pairing(messages)
    for key in ("max_tokens", "max_completion_tokens"):
        value = body.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise _invalid(
                f"Invalid '{key}': expected an integer >= 1, but got {value!r} instead.", key, "invalid_value"
            )
    return messages


def _check_message(index: int, message: Any) -> None:
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise _invalid(f"Invalid type for '{where}': expected an object.", where, "invalid_type")
    role = message.get("role")
    if role is None:
        raise _missing(f"{where}.role")
    if role not in MESSAGE_ROLES:
        supported = ", ".join(f"'{r}'" for r in MESSAGE_ROLES[:-1]) + f", and '{MESSAGE_ROLES[-1]}'"
        raise _invalid(f"Invalid value: '{role}'. Supported values are: {supported}.", f"{where}.role", "invalid_value")
    content = message.get("content")
    has_tool_calls = role == "assistant" and bool(message.get("tool_calls"))
    if content is None and not has_tool_calls:
        if "content" not in message and role != "assistant":
            raise _missing(f"{where}.content")
        raise _invalid("Invalid value for 'content': expected a string, got null.", f"messages.[{index}].content", None)
    if content is not None and not isinstance(content, str | list):
        raise _invalid(
            f"Invalid type for '{where}.content': expected one of a string or array of objects.",
            f"{where}.content",
            "invalid_type",
        )
    if role == "tool" and not isinstance(message.get("tool_call_id"), str):
        raise _missing(f"{where}.tool_call_id")
    if has_tool_calls:
        _check_tool_calls(where, message["tool_calls"])


def _check_tool_calls(where: str, tool_calls: Any) -> None:
    if not isinstance(tool_calls, list):
        raise _invalid(
            f"Invalid type for '{where}.tool_calls': expected an array.",
            f"{where}.tool_calls",
            "invalid_type",
        )
    for call_index, call in enumerate(tool_calls):
        call_where = f"{where}.tool_calls[{call_index}]"
        if not isinstance(call, dict) or not isinstance(call.get("id"), str):
            raise _missing(f"{call_where}.id")
        function = call.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _missing(f"{call_where}.function.name")
        if not isinstance(function.get("arguments"), str):
            raise _missing(f"{call_where}.function.arguments")


def _check_tool_pairing(messages: list[dict[str, Any]]) -> None:
    """Each tool message answers the assistant turn right before it; each call of that turn is answered."""
    open_ids: set[str] | None = None
    unanswered: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            if open_ids is None or message["tool_call_id"] not in open_ids:
                raise _invalid(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message "
                    "with 'tool_calls'.",
                    "messages",
                )
            if message["tool_call_id"] in unanswered:
                unanswered.remove(message["tool_call_id"])
            continue
        _raise_if_unanswered(unanswered)
        open_ids = None
        if message["role"] == "assistant" and message.get("tool_calls"):
            unanswered = [call["id"] for call in message["tool_calls"]]
            open_ids = set(unanswered)
    _raise_if_unanswered(unanswered)


def _raise_if_unanswered(unanswered: list[str]) -> None:
    if unanswered:
        raise _invalid(
            "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
            "'tool_call_id'. The following tool_call_ids did not have response messages: " + ", ".join(unanswered),
            "messages",
        )


def role_order_error(messages: list[dict[str, Any]]) -> str | None:
    """Why the strictest common chat templates would refuse this order of roles, or None if they accept it.

    One system message may come first, and no other; then turns alternate, starting with a user turn. An
    assistant turn may hold tool calls, their results, and the assistant's message after them (whether the
    results answer the calls is `_check_tool_pairing`'s business). The texts are the raise_exception messages of
    Hugging Face chat templates.
    """
    leading = 1 if messages and messages[0].get("role") in PINNED_ROLES else 0
    previous: str | None = None
    for message in messages[leading:]:
        role = message.get("role")
        if role in PINNED_ROLES:
            return "System message must be at the beginning."
        if previous is None and role != "user":
            return "After the optional system message, conversation roles must start with a user message."
        if role == previous and role in ("user", "assistant"):
            return ROLES_MUST_ALTERNATE
        previous = role if isinstance(role, str) else None
    return None


def _check_role_order(messages: list[dict[str, Any]]) -> None:
    error = role_order_error(messages)
    if error is not None:
        raise _invalid(error, "messages")


def _check_context_window(prompt_tokens: int, max_tokens: int, context_window: int) -> None:
    if prompt_tokens + max_tokens <= context_window:
        return
    if max_tokens:
        detail = (
            f"However, you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or completion."
        )
    else:
        detail = f"However, your messages resulted in {prompt_tokens} tokens. Please reduce the length of the messages."
    raise _invalid(
        f"This model's maximum context length is {context_window} tokens. {detail}",
        "messages",
        "context_length_exceeded",
    )


def echo_reply(body: dict[str, Any]) -> Reply:
    """The default answer: the last user message, echoed."""
    last_user = next((m for m in reversed(body["messages"]) if m.get("role") == "user"), None)
    text = content_text(last_user.get("content")) if last_user is not None else ""
    return Reply(content=(ECHO_PREFIX + text)[:ECHO_MAX_CHARS])


def _finish_reason(reply: Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


def _completion_tokens(reply: Reply) -> int:
    total = _tokens(reply.content or "")
    for call in reply.tool_calls or []:
        total += _tokens(call["function"]["name"]) + _tokens(call["function"]["arguments"])
    return total


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens, "audio_tokens": 0},
        "completion_tokens_details": {
            "reasoning_tokens": 0,
            "audio_tokens": 0,
            "accepted_prediction_tokens": 0,
            "rejected_prediction_tokens": 0,
        },
    }


def _normalized_tool_calls(reply: Reply) -> list[dict[str, Any]]:
    return [
        {
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]},
        }
        for call in reply.tool_calls or []
    ]


def completion_json(
    completion_id: str, created: int, model: str, reply: Reply, prompt_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    message: dict[str, Any] = {
        "role": "assistant",
        "content": reply.content,
        "refusal": None,
        "annotations": [],
    }
    if reply.tool_calls:
        message["tool_calls"] = _normalized_tool_calls(reply)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish_reason(reply)}],
        "usage": _usage(prompt_tokens, _completion_tokens(reply), cached_tokens),
        "service_tier": "default",
        "system_fingerprint": SYSTEM_FINGERPRINT,
    }


def _word_pieces(text: str) -> list[str]:
    return re.findall(r"\s*\S+|\s+", text)


def completion_chunks(
    completion_id: str,
    created: int,
    model: str,
    reply: Reply,
    prompt_tokens: int,
    include_usage: bool,
    cached_tokens: int = 0,
) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects OpenAI would stream for this reply, in order."""

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "service_tier": "default",
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }
        if include_usage:
            body["usage"] = None
        return body

    first_content = "" if reply.content is not None else None
    chunks = [chunk({"role": "assistant", "content": first_content, "refusal": None})]
    chunks.extend(chunk({"content": piece}) for piece in _word_pieces(reply.content or ""))
    for index, call in enumerate(_normalized_tool_calls(reply)):
        opening = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        chunks.append(chunk({"tool_calls": [opening]}))
        arguments: str = call["function"]["arguments"]
        for start in range(0, len(arguments), ARGUMENT_FRAGMENT_CHARS):
            fragment = arguments[start : start + ARGUMENT_FRAGMENT_CHARS]
            chunks.append(chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}))
    chunks.append(chunk({}, _finish_reason(reply)))
    if include_usage:
        usage_chunk = chunk({})
        usage_chunk["choices"] = []
        usage_chunk["usage"] = _usage(prompt_tokens, _completion_tokens(reply), cached_tokens)
        chunks.append(usage_chunk)
    return chunks


async def _async_parts(parts: Iterator[bytes]) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data)}\n\n"


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status in (404, 405):
        message = f"Invalid URL ({request.method} {request.url.path})"
        return JSONResponse(error_body(message, "invalid_request_error", None, None), status_code=status)
    return JSONResponse(default_error_body(status), status_code=status)


class FakeUpstream(LoopbackServer):
    """A chat-completions server on 127.0.0.1; attributes are read per request, so tests may change them."""

    def __init__(
        self, context_window: int = DEFAULT_CONTEXT_WINDOW, chunk_delay_s: float = 0.0, *, keep_requests: bool = True
    ) -> None:
        self.context_window = context_window
        self.chunk_delay_s = chunk_delay_s
        self.keep_requests = keep_requests
        """Whether `requests` records what was received: a bench's fake, which nobody asks, keeps nothing (it would
        hold every body of a long run: gigabytes at 5,000 messages)."""
        self.responder: ReplyFn | None = None
        self.strict_roles = False
        """Reject role orders a strict chat template rejects (`role_order_error`)."""
        self.delay: DelayFn | None = None
        """Seconds to wait before answering a request, by its body (on top of any fault's delay)."""
        self.context_dialect: ContextDialect | None = None
        """How a prompt over the window is refused (`tests.support.context_dialects`); None: in OpenAI's words."""
        self.token_ratio = 1.0
        """How many tokens this upstream's tokenizer counts for one of OpenAI's (llama.cpp counted 1.27)."""
        self.prompt_cache = PrefixCache()
        """OpenAI's automatic prefix caching, reported as `prompt_tokens_details.cached_tokens`."""
        self.requests: list[ReceivedRequest] = []
        self.rejected: list[dict[str, Any]] = []
        """The error bodies of requests refused as invalid (the window, pairing, role order)."""
        self.served: list[Served] = []
        """The usage of every request answered, in order."""
        self._default_context_window = context_window
        self._default_chunk_delay_s = chunk_delay_s
        self._faults: list[Fault] = []
        self._completions = 0
        self._lock = threading.Lock()
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat_completions, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ],
            exception_handlers={HTTPException: _http_error},
        )
        super().__init__(app, "fake-upstream", "/v1")

    def fail_next(self, fault: Fault, count: int = 1) -> None:
        with self._lock:
            self._faults.extend([fault] * count)

    def reset(self) -> None:
        with self._lock:
            self.requests.clear()
            self.rejected.clear()
            self.served.clear()
            self._faults.clear()
            self._completions = 0
        self.prompt_cache.clear()
        self.responder = None
        self.strict_roles = False
        self.delay = None
        self.context_dialect = None
        self.token_ratio = 1.0
        self.context_window = self._default_context_window
        self.chunk_delay_s = self._default_chunk_delay_s

    @staticmethod
    def count_tokens(messages: list[dict[str, Any]]) -> int:
        return count_prompt_tokens(messages)

    def prompt_tokens(self, messages: list[dict[str, Any]], tools: Any = None) -> int:
        """The prompt as this upstream counts it: OpenAI's count times `token_ratio`."""
        return math.ceil(count_prompt_tokens(messages, tools) * self.token_ratio)

    def _take_fault(self, stream: bool, body: dict[str, Any]) -> Fault | None:
        with self._lock:
            for index, fault in enumerate(self._faults):
                if (stream or not fault.breaks_stream) and (fault.when is None or fault.when(body)):
                    return self._faults.pop(index)
        return None

    def _next_completion_id(self) -> str:
        with self._lock:
            self._completions += 1
            return f"chatcmpl-fake-{self._completions}"

    async def _pause(self, seconds: float) -> None:
        # Cut short by stop(), so that a long scripted delay does not hold up the shutdown.
        if seconds <= 0 or self._stopping is None:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    async def _models(self, request: Request) -> Response:
        model = {"id": FAKE_MODEL_ID, "object": "model", "created": 0, "owned_by": "fake-upstream"}
        return JSONResponse({"object": "list", "data": [model]})

    async def _chat_completions(self, request: Request) -> Response:
        raw = await request.body()
        try:
            parsed: Any = json.loads(raw)
        except ValueError:
            parsed = None
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {"_unparsed": raw.decode("utf-8", "replace")}
        with self._lock:
            peer = (request.client.host, request.client.port) if request.client is not None else None
            if self.keep_requests:
                self.requests.append(ReceivedRequest(body=body, headers=dict(request.headers.items()), peer=peer))

        stream = body.get("stream") is True
        fault = self._take_fault(stream, body)
        if fault is not None:
            await self._pause(fault.delay_s)
            if fault.raw_body is not None:
                return Response(fault.raw_body, status_code=fault.status, media_type=fault.media_type)
            if fault.raw_parts is not None:
                parts = _async_parts(fault.raw_parts())
                return StreamingResponse(parts, status_code=fault.status, media_type=fault.media_type)
            if not fault.breaks_stream and (fault.status >= 400 or fault.body is not None):
                error = fault.body if fault.body is not None else default_error_body(fault.status)
                return JSONResponse(error, status_code=fault.status, headers=fault.headers)
        try:
            if not isinstance(parsed, dict):
                raise _invalid(
                    "We could not parse the JSON body of your request. (HINT: This likely means you aren't "
                    "using your HTTP library correctly. The OpenAI API expects a JSON payload.)"
                )
            messages = _check_body(body)
            if self.strict_roles:
                _check_role_order(messages)
            prompt_tokens = self.prompt_tokens(messages, body.get("tools"))
            max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or 0
            dialect = self.context_dialect
            if dialect is None:
                _check_context_window(prompt_tokens, max_tokens, self.context_window)
            elif (refusal := dialect(prompt_tokens, max_tokens, self.context_window)) is not None:
                return JSONResponse(refusal[1], status_code=refusal[0])
        except UpstreamError as exc:
            self.rejected.append(exc.body)
            return JSONResponse(exc.body, status_code=exc.status)

        delay = self.delay
        if delay is not None:
            await self._pause(delay(body))
        responder = self.responder
        reply = responder(body) if responder is not None else echo_reply(body)
        completion_id, created, model = self._next_completion_id(), int(time.time()), body["model"]
        scope = f"{model}\x00{request.headers.get('authorization', '')}"
        cached = self.prompt_cache.serve(scope, prompt_token_ids(body), prompt_tokens)
        with self._lock:
            self.served.append(Served(model, len(body.get("tools") or []), prompt_tokens, cached))
        if not stream:
            return JSONResponse(completion_json(completion_id, created, model, reply, prompt_tokens, cached))
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = completion_chunks(completion_id, created, model, reply, prompt_tokens, include_usage, cached)
        return StreamingResponse(self._events(chunks, fault), media_type="text/event-stream")

    async def _events(self, chunks: list[dict[str, Any]], fault: Fault | None) -> AsyncIterator[str]:
        drop_at = fault.drop_after_chunks if fault is not None else None
        malformed_at = fault.malformed_after_chunks if fault is not None else None
        error_at = fault.error_after_chunks if fault is not None else None
        for sent, chunk in enumerate(chunks):
            if sent == error_at and fault is not None:
                yield _sse(fault.body or default_error_body(500))
                return
            if sent == drop_at:
                raise IntentionalDrop(f"fake upstream dropped the stream after {sent} chunks")
            if sent == malformed_at:
                yield MALFORMED_EVENT
                return
            if sent:
                await self._pause(self.chunk_delay_s)
            yield _sse(chunk)
        # A cut-off beyond the last chunk still withholds [DONE].
        if drop_at is not None:
            raise IntentionalDrop(f"fake upstream dropped the stream after {len(chunks)} chunks")
        if malformed_at is not None:
            yield MALFORMED_EVENT
            return
        yield DONE_EVENT
        if fault is not None and fault.after_done is not None:
            yield fault.after_done
