"""A strict fake Anthropic Messages API server for tests, served over real HTTP.

`FakeAnthropicUpstream` is to `POST /v1/messages` what `tests.support.fake_upstream.FakeUpstream` is to chat
completions: a uvicorn server on 127.0.0.1 in a thread that answers the way Anthropic does and refuses what
Anthropic refuses, with Anthropic's error bodies (`{"type": "error", "error": {"type": ..., "message": ...}}`),
wherever a proxy could get the wire format wrong:

- an API key (`x-api-key`, or `Authorization: Bearer` as anthropic>=2.12 sends it) and `anthropic-version` are
  required;
- `model`, `max_tokens` and a non-empty `messages` are required; roles alternate strictly (user first; the real
  API now merges consecutive same-role turns, this fake refuses them);
- content blocks are checked by type and role (required fields, unknown types, and with
  `reject_unknown_block_fields` fields the SDK's request types do not have);
- every `tool_use` must be answered by a `tool_result` in the next user message, and every `tool_result` must
  answer a `tool_use` of the message right before it;
- a `thinking` block's `signature` must be one this fake issued, for exactly the thinking text it was issued
  with; with `thinking` enabled, the assistant turn before the last tool results must start with thinking;
- at most 4 `cache_control` breakpoints (each recorded with its path in `ReceivedRequest.cache_breakpoints`);
- the prompt (tools, system and every block's text, counted as `FakeUpstream` counts chat messages) must leave
  `max_tokens` of room in `context_window`.

Prompt caching is simulated: every prefix ending at a breakpoint is remembered, and a later request whose blocks
start with a remembered prefix reads it from the cache (`cache_read_input_tokens`). Usage splits the prompt as
Anthropic does: `input_tokens + cache_creation_input_tokens + cache_read_input_tokens` is the whole prompt.

Streams have `event: <type>` / `data: <json>` framing and the full order of a real stream. `fail_next` answers
the next requests with an error; `error_mid_stream_after` ends streams with an `error` event.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import secrets
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from anthropic import types as anthropic_types
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
    TOKENS_PER_MESSAGE,
    TOKENS_REPLY_PRIMING,
    _tokens,
)
from tests.support.loopback_server import LoopbackServer
from tests.support.prompt_cache import Block, BreakpointCache

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "MAX_CACHE_BREAKPOINTS",
    "THINKING_TEXT",
    "AnthropicError",
    "AnthropicReply",
    "FakeAnthropicUpstream",
    "ReceivedRequest",
    "count_input_tokens",
    "echo_reply",
    "error_body",
    "prompt_too_long_message",
]

THINKING_TEXT = "Let me think about this."
MAX_CACHE_BREAKPOINTS = 4
MIN_THINKING_BUDGET = 1024
SIGNATURE_RANDOM_BYTES = 96
MESSAGE_ROLES = ("user", "assistant")
USER_BLOCK_TYPES = ("text", "image", "document", "tool_result")
ASSISTANT_BLOCK_TYPES = (
    "text",
    "thinking",
    "redacted_thinking",
    "tool_use",
    "server_tool_use",
    "web_search_tool_result",
)
BLOCK_TYPES = (
    "text",
    "image",
    "document",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "server_tool_use",
    "web_search_tool_result",
)
TOOL_RESULT_CONTENT_TYPES = ("text", "image", "document", "search_result")
THINKING_TYPES = ("thinking", "redacted_thinking")
CACHE_TTLS = ("5m", "1h")
API_KEY_MISSING = "x-api-key header is required"
VERSION_MISSING = "anthropic-version: header is required"
MID_STREAM_ERROR = {"type": "overloaded_error", "message": "Overloaded"}
THINKING_FIRST = (
    "Expected `thinking` or `redacted_thinking`, but found `{found}`. When `thinking` is enabled, a final "
    "`assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` and "
    "`tool_result` blocks). We recommend you include thinking blocks from previous turns. To avoid this "
    "requirement, disable `thinking`. Please consult our documentation at "
    "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
)

# status -> (type, message) as Anthropic sends them.
DEFAULT_ERRORS: dict[int, tuple[str, str]] = {
    400: ("invalid_request_error", "Bad request"),
    401: ("authentication_error", "invalid x-api-key"),
    403: ("permission_error", "Your API key does not have permission to use the specified resource."),
    404: ("not_found_error", "Not found"),
    413: ("request_too_large", "Request exceeds the maximum allowed number of bytes."),
    429: ("rate_limit_error", "Number of request tokens has exceeded your per-minute rate limit"),
    500: ("api_error", "Internal server error"),
    529: ("overloaded_error", "Overloaded"),
}


def _keys(cls: Any) -> frozenset[str]:
    return frozenset(cls.__required_keys__ | cls.__optional_keys__)


# The fields each block type may have, from the SDK's request types (Anthropic refuses others).
BLOCK_FIELDS: dict[str, frozenset[str]] = {
    "text": _keys(anthropic_types.TextBlockParam),
    "image": _keys(anthropic_types.ImageBlockParam),
    "document": _keys(anthropic_types.DocumentBlockParam),
    "tool_use": _keys(anthropic_types.ToolUseBlockParam),
    "tool_result": _keys(anthropic_types.ToolResultBlockParam),
    "thinking": _keys(anthropic_types.ThinkingBlockParam),
    "redacted_thinking": _keys(anthropic_types.RedactedThinkingBlockParam),
    "server_tool_use": _keys(anthropic_types.ServerToolUseBlockParam),
    "web_search_tool_result": _keys(anthropic_types.WebSearchToolResultBlockParam),
}
# The fields each block must have: (name, expected JSON type).
BLOCK_REQUIRED: dict[str, tuple[tuple[str, type], ...]] = {
    "text": (("text", str),),
    "image": (("source", dict),),
    "document": (("source", dict),),
    "tool_use": (("id", str), ("name", str), ("input", dict)),
    "tool_result": (("tool_use_id", str),),
    "thinking": (("thinking", str), ("signature", str)),
    "redacted_thinking": (("data", str),),
    "server_tool_use": (("id", str), ("name", str), ("input", dict)),
    "web_search_tool_result": (("tool_use_id", str), ("content", object)),
}
JSON_TYPE_NAMES = {str: "a valid string", dict: "a valid dictionary", list: "a valid list", int: "a valid integer"}


@dataclass
class ReceivedRequest:
    """One request as it arrived: `body` parsed (`{"_unparsed": text}` when it was not a JSON object)."""

    body: dict[str, Any]
    raw: bytes
    headers: dict[str, str]
    """Lower-cased header names, as Starlette gives them."""
    path: str = "/v1/messages"
    """The path with its query string, if any (`/v1/messages?beta=true`)."""
    cache_breakpoints: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """Every `cache_control` as (path of the block carrying it, its value), in request order: `tools.0`,
    `system.1`, `messages.3.content.0`, `messages.2.content.0.content.1` (inside a tool_result), or
    `cache_control` (the request-level one, automatic caching)."""


@dataclass
class AnthropicReply:
    """What the model answers; the fake mints every id (`msg_<n>`, `toolu_<n>`) and thinking signature."""

    text: str | None = None
    tool_uses: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    """(tool name, input object)."""
    thinking: bool = False
    """Start the answer with a `thinking` block (`THINKING_TEXT`) carrying a fresh signature the fake remembers."""
    stop_reason: str | None = None
    """None: `tool_use` when there are tool uses, else `end_turn`."""


ResponderFn = Callable[[dict[str, Any]], AnthropicReply]


class AnthropicError(Exception):
    """An Anthropic-shaped error answer, raised while checking a request."""

    def __init__(self, status: int, type_: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.body = error_body(type_, message)


def error_body(type_: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": type_, "message": message}}


def default_error_body(status: int) -> dict[str, Any]:
    type_, message = DEFAULT_ERRORS.get(
        status, ("api_error", "Internal server error") if status >= 500 else ("invalid_request_error", "Error")
    )
    return error_body(type_, message)


def prompt_too_long_message(input_tokens: int, context_window: int, max_tokens: int) -> str:
    return f"prompt is too long: {input_tokens} tokens > {context_window - max_tokens} maximum"


def _invalid(message: str) -> AnthropicError:
    return AnthropicError(400, "invalid_request_error", message)


def _required(where: str) -> AnthropicError:
    return _invalid(f"{where}: Field required")


def _wrong_type(where: str, expected: type) -> AnthropicError:
    return _invalid(f"{where}: Input should be {JSON_TYPE_NAMES.get(expected, 'valid')}")


async def _http_error(request: Request, exc: Exception) -> Response:
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status in (404, 405):
        return JSONResponse(error_body("not_found_error", "Not Found"), status_code=404)
    return JSONResponse(default_error_body(status), status_code=status)


# -- tokens and cache segments ---------------------------------------------------------------------------------


def _block_text(block: Any) -> str:
    """The text a block contributes to the prompt count."""
    if not isinstance(block, dict):
        return ""
    kind = block.get("type")
    if kind == "text":
        return block["text"] if isinstance(block.get("text"), str) else ""
    if kind == "thinking":
        return block["thinking"] if isinstance(block.get("thinking"), str) else ""
    if kind in ("tool_use", "server_tool_use"):
        return f"{block.get('name', '')}{json.dumps(block.get('input'), sort_keys=True)}"
    if kind == "tool_result":
        content = block.get("content")
        if isinstance(content, list):
            return "".join(_block_text(part) for part in content)
        return content if isinstance(content, str) else ""
    if kind == "web_search_tool_result":
        return json.dumps(block.get("content"), sort_keys=True)
    if kind == "document":
        source = block.get("source")
        if isinstance(source, dict) and isinstance(source.get("data"), str) and source.get("type") == "text":
            return str(source["data"])
    return ""


@dataclass
class _Segment:
    """One cacheable unit of the prompt (a tool, a system block, a message's content block) in cache order."""

    key: str
    tokens: int
    breakpoint: bool


def _without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_cache_control(v) for v in value]
    return value


def _segment(value: Any, text: str, overhead: int) -> _Segment:
    key = json.dumps(_without_cache_control(value), sort_keys=True)
    marked = isinstance(value, dict) and value.get("cache_control") is not None
    if isinstance(value, dict) and value.get("type") == "tool_result" and isinstance(value.get("content"), list):
        marked = marked or any(isinstance(p, dict) and p.get("cache_control") is not None for p in value["content"])
    return _Segment(key, _tokens(text) + overhead, marked)


def _segments(body: dict[str, Any]) -> list[_Segment]:
    """The prompt in Anthropic's cache order (tools, system, messages); tokens by the chat formula per message."""
    segments: list[_Segment] = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            text = f"{tool.get('name', '')}{tool.get('description', '')}"
            text += json.dumps(tool.get("input_schema"), sort_keys=True) if "input_schema" in tool else ""
            segments.append(_segment(tool, text, 0))
    system = body.get("system")
    overhead = TOKENS_PER_MESSAGE + _tokens("system")
    if isinstance(system, str) and system:
        segments.append(_segment(system, system, overhead))
    elif isinstance(system, list):
        for index, block in enumerate(system):
            segments.append(_segment(block, _block_text(block), overhead if index == 0 else 0))
    for message in body.get("messages") or []:
        if not isinstance(message, dict):
            continue
        role = message["role"] if isinstance(message.get("role"), str) else ""
        overhead = TOKENS_PER_MESSAGE + _tokens(role)
        content = message.get("content")
        if isinstance(content, str):
            segments.append(_segment({"role": role, "content": content}, content, overhead))
        elif isinstance(content, list):
            if not content:
                segments.append(_segment({"role": role}, "", overhead))
            for index, block in enumerate(content):
                tagged = {"role": role, "block": block} if index == 0 else block
                segment = _segment(tagged, _block_text(block), overhead if index == 0 else 0)
                segment.breakpoint = _segment(block, "", 0).breakpoint
                segments.append(segment)
    if body.get("cache_control") is not None and segments:
        segments[-1].breakpoint = True
    return segments


def count_input_tokens(body: dict[str, Any]) -> int:
    """The request's prompt tokens as the fake counts them: the chat formula (3 per message + its role + 3 for
    the reply) over the system prompt and each message's block texts (text, thinking, tool name + input JSON,
    tool_result text), plus each tool's name, description and input_schema JSON."""
    return TOKENS_REPLY_PRIMING + sum(segment.tokens for segment in _segments(body))


def _reply_tokens(reply: AnthropicReply) -> int:
    total = _tokens(reply.text or "") + (_tokens(THINKING_TEXT) if reply.thinking else 0)
    for name, payload in reply.tool_uses:
        total += _tokens(name) + _tokens(json.dumps(payload))
    return max(total, 1)


def echo_reply(body: dict[str, Any]) -> AnthropicReply:
    """The default answer: a thinking block, then "echo: " and the last user message's text."""
    text = ""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str):
                text = content
            elif isinstance(content, list):
                text = "".join(
                    b["text"] for b in content if isinstance(b, dict) and b.get("type") == "text" and "text" in b
                )
            break
    return AnthropicReply(text=(ECHO_PREFIX + text)[:ECHO_MAX_CHARS], thinking=True)


class FakeAnthropicUpstream(LoopbackServer):
    """An Anthropic Messages server on 127.0.0.1; attributes are read per request, so tests may change them."""

    def __init__(self, context_window: int = DEFAULT_CONTEXT_WINDOW) -> None:
        self.context_window = context_window
        self.responder: ResponderFn | None = None
        """body → `AnthropicReply`; None: `echo_reply` (thinking + "echo: <last user text>")."""
        self.error_mid_stream_after: int | None = None
        """Send an `error` event (`mid_stream_error`) instead of the stream event with this index, then end."""
        self.mid_stream_error: dict[str, Any] = dict(MID_STREAM_ERROR)
        self.reject_unknown_block_fields = True
        """Refuse a content block with a field its type does not have (the SDK's request types list them)."""
        self.requests: list[ReceivedRequest] = []
        self.rejected: list[dict[str, Any]] = []
        """Error bodies of requests refused by a check (auth, validation, window); not those of `fail_next`."""
        self.issued_signatures: set[str] = set()
        """Every thinking `signature` this fake has handed out (the only ones it accepts back)."""
        self.thinking_by_signature: dict[str, str] = {}
        """signature → the thinking text it was issued with (an altered text is refused)."""
        self._default_context_window = context_window
        self._faults: list[tuple[int, dict[str, Any] | None]] = []
        self._counters: dict[str, int] = {}
        self.prompt_cache = BreakpointCache()
        """Anthropic's caching at `cache_control` breakpoints, reported as `cache_read_input_tokens` and
        `cache_creation_input_tokens`."""
        self._lock = threading.Lock()
        app = Starlette(
            routes=[
                Route("/v1/messages", self._messages, methods=["POST"]),
                Route("/v1/messages/count_tokens", self._count_tokens, methods=["POST"]),
            ],
            exception_handlers={HTTPException: _http_error},
        )
        super().__init__(app, "fake-anthropic", "")

    # -- test controls ----------------------------------------------------------------------------------------

    def fail_next(self, status: int = 500, body: dict[str, Any] | None = None, count: int = 1) -> None:
        """Answer the next `count` POSTs to /v1/messages with `status` and `body` (Anthropic's default by status).

        count_tokens requests do not take a fault."""
        with self._lock:
            self._faults.extend([(status, body)] * count)

    def reset(self) -> None:
        """Forget requests, rejections, faults, signatures, cached prefixes and id counters; restore defaults."""
        with self._lock:
            self.requests.clear()
            self.rejected.clear()
            self._faults.clear()
            self.issued_signatures.clear()
            self.thinking_by_signature.clear()
            self._counters.clear()
            self.prompt_cache.clear()
        self.responder = None
        self.error_mid_stream_after = None
        self.mid_stream_error = dict(MID_STREAM_ERROR)
        self.reject_unknown_block_fields = True
        self.context_window = self._default_context_window

    @staticmethod
    def count_tokens(body: dict[str, Any]) -> int:
        """The prompt tokens the fake counts for a request body (what its window check and usage use)."""
        return count_input_tokens(body)

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._counters[prefix] = self._counters.get(prefix, 0) + 1
            return f"{prefix}_{self._counters[prefix]}"

    def _new_signature(self, thinking: str) -> str:
        signature = base64.b64encode(b"\x12" + secrets.token_bytes(SIGNATURE_RANDOM_BYTES)).decode()
        with self._lock:
            self.issued_signatures.add(signature)
            self.thinking_by_signature[signature] = thinking
        return signature

    # -- checks -----------------------------------------------------------------------------------------------

    def _header_refusal(self, request: Request) -> Response | None:
        # Anthropic takes the key as `x-api-key` (LiteLLM, older SDKs) or as a bearer token (anthropic>=2.12).
        bearer = re.fullmatch(r"Bearer \S.*", request.headers.get("authorization", ""))
        if not request.headers.get("x-api-key", "").strip() and bearer is None:
            status, body = 401, error_body("authentication_error", API_KEY_MISSING)
        elif not request.headers.get("anthropic-version", "").strip():
            status, body = 400, error_body("invalid_request_error", VERSION_MISSING)
        else:
            return None
        with self._lock:
            self.rejected.append(body)
        return JSONResponse(body, status_code=status)

    def _check_body(self, body: dict[str, Any], breakpoints: list[tuple[str, dict[str, Any]]], count: bool) -> None:
        if not isinstance(body.get("model"), str) or not body["model"]:
            raise _required("model") if body.get("model") is None else _wrong_type("model", str)
        if not count:
            limit = body.get("max_tokens")
            if limit is None:
                raise _required("max_tokens")
            if not isinstance(limit, int) or isinstance(limit, bool):
                raise _wrong_type("max_tokens", int)
            if limit < 1:
                raise _invalid("max_tokens: Input should be greater than or equal to 1")
        self._check_thinking_config(body, count)
        self._check_tools(body.get("tools"), breakpoints)
        _check_system(body.get("system"), breakpoints)
        if "messages" not in body or body["messages"] is None:
            raise _required("messages")
        messages = body["messages"]
        if not isinstance(messages, list):
            raise _wrong_type("messages", list)
        if not messages:
            raise _invalid("messages: at least one message is required")
        for index, message in enumerate(messages):
            self._check_message(message, index, len(messages), breakpoints)
        _check_roles(messages)
        _check_pairing(messages)
        thinking = body.get("thinking")
        if isinstance(thinking, dict) and thinking.get("type") in ("enabled", "adaptive"):
            _check_thinking_first(messages)
        if body.get("cache_control") is not None:
            breakpoints.append(("cache_control", body["cache_control"]))
            _check_cache_control(body["cache_control"], "cache_control")
        if len(breakpoints) > MAX_CACHE_BREAKPOINTS:
            raise _invalid(
                f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
                f"Found {len(breakpoints)}."
            )

    @staticmethod
    def _check_thinking_config(body: dict[str, Any], count: bool) -> None:
        thinking = body.get("thinking")
        if thinking is None:
            return
        if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "disabled", "adaptive"):
            raise _invalid("thinking: Input tag found using 'type' does not match any of the expected tags")
        if thinking["type"] != "enabled":
            return
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or isinstance(budget, bool):
            raise _required("thinking.enabled.budget_tokens")
        if budget < MIN_THINKING_BUDGET:
            raise _invalid(
                f"thinking.enabled.budget_tokens: Input should be greater than or equal to {MIN_THINKING_BUDGET}"
            )
        if not count and budget >= body["max_tokens"]:
            raise _invalid(
                "`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our documentation at "
                "https://docs.claude.com/en/docs/build-with-claude/extended-thinking#max-tokens-and-context-window-size"
            )

    @staticmethod
    def _check_tools(tools: Any, breakpoints: list[tuple[str, dict[str, Any]]]) -> None:
        if tools is None:
            return
        if not isinstance(tools, list):
            raise _wrong_type("tools", list)
        for index, tool in enumerate(tools):
            where = f"tools.{index}"
            if not isinstance(tool, dict):
                raise _wrong_type(where, dict)
            if not isinstance(tool.get("name"), str) or not tool["name"]:
                raise _required(f"{where}.name")
            if tool.get("type", "custom") == "custom":
                if not isinstance(tool.get("input_schema"), dict):
                    raise _required(f"{where}.custom.input_schema")
                if not re.fullmatch(r"[a-zA-Z0-9_-]{1,128}", tool["name"]):
                    raise _invalid(f"{where}.custom.name: String should match pattern '^[a-zA-Z0-9_-]{{1,128}}$'")
            _record_cache_control(tool, where, breakpoints)

    def _check_message(
        self, message: Any, index: int, total: int, breakpoints: list[tuple[str, dict[str, Any]]]
    ) -> None:
        where = f"messages.{index}"
        if not isinstance(message, dict):
            raise _wrong_type(where, dict)
        role = message.get("role")
        if role is None:
            raise _required(f"{where}.role")
        if role not in MESSAGE_ROLES:
            raise _invalid(f"{where}.role: Input should be 'user' or 'assistant'")
        if self.reject_unknown_block_fields:
            for key in sorted(set(message) - {"role", "content"}):
                raise _invalid(f"{where}.{key}: Extra inputs are not permitted")
        if "content" not in message or message["content"] is None:
            raise _required(f"{where}.content")
        content = message["content"]
        final_assistant = role == "assistant" and index == total - 1
        if isinstance(content, str):
            if not content and not final_assistant:
                raise _invalid(
                    f"{where}: all messages must have non-empty content except for the optional final assistant message"
                )
            return
        if not isinstance(content, list):
            raise _wrong_type(f"{where}.content", list)
        if not content and not final_assistant:
            raise _invalid(
                f"{where}: all messages must have non-empty content except for the optional final assistant message"
            )
        allowed = USER_BLOCK_TYPES if role == "user" else ASSISTANT_BLOCK_TYPES
        for block_index, block in enumerate(content):
            block_where = f"{where}.content.{block_index}"
            self._check_block(block, block_where, BLOCK_TYPES)
            if block["type"] not in allowed:
                raise _invalid(f"{block_where}: `{block['type']}` blocks are not allowed in `{role}` messages")
            _record_cache_control(block, block_where, breakpoints)
            if block["type"] == "tool_result" and isinstance(block.get("content"), list):
                for part_index, part in enumerate(block["content"]):
                    part_where = f"{block_where}.content.{part_index}"
                    self._check_block(part, part_where, TOOL_RESULT_CONTENT_TYPES)
                    _record_cache_control(part, part_where, breakpoints)

    def _check_block(self, block: Any, where: str, allowed: tuple[str, ...]) -> None:
        if not isinstance(block, dict):
            raise _wrong_type(where, dict)
        kind = block.get("type")
        if kind is None:
            raise _invalid(f"{where}: Unable to extract tag using discriminator 'type'")
        if kind not in allowed:
            tags = ", ".join(f"'{tag}'" for tag in allowed)
            raise _invalid(
                f"{where}: Input tag '{kind}' found using 'type' does not match any of the expected tags: {tags}"
            )
        if kind == "search_result":
            return
        if self.reject_unknown_block_fields:
            for key in sorted(set(block) - BLOCK_FIELDS[kind]):
                raise _invalid(f"{where}.{kind}.{key}: Extra inputs are not permitted")
        for name, expected in BLOCK_REQUIRED[kind]:
            if name not in block or block[name] is None:
                raise _required(f"{where}.{kind}.{name}")
            if expected is not object and not isinstance(block[name], expected):
                raise _wrong_type(f"{where}.{kind}.{name}", expected)
        if kind == "text" and not block["text"]:
            raise _invalid("messages: text content blocks must be non-empty")
        if kind == "tool_result":
            content = block.get("content")
            if content is not None and not isinstance(content, str | list):
                raise _wrong_type(f"{where}.tool_result.content", list)
        if kind == "thinking":
            signature, text = block["signature"], block["thinking"]
            with self._lock:
                known = signature in self.issued_signatures and self.thinking_by_signature.get(signature) == text
            if not known:
                raise _invalid(f"{where}: Invalid `signature` in `thinking` block")

    # -- answers ----------------------------------------------------------------------------------------------

    def _content(self, reply: AnthropicReply) -> list[dict[str, Any]]:
        content: list[dict[str, Any]] = []
        if reply.thinking:
            content.append(
                {"type": "thinking", "thinking": THINKING_TEXT, "signature": self._new_signature(THINKING_TEXT)}
            )
        if reply.text is not None:
            content.append({"type": "text", "text": reply.text, "citations": None})
        for name, payload in reply.tool_uses:
            content.append({"type": "tool_use", "id": self._next_id("toolu"), "name": name, "input": payload})
        return content

    def _cache_usage(self, body: dict[str, Any], total: int, key: str) -> dict[str, int]:
        """Anthropic's caching at the request's breakpoints (`tests.support.prompt_cache.BreakpointCache`)."""
        blocks = [Block(segment.key, segment.tokens, segment.breakpoint) for segment in _segments(body)]
        usage = self.prompt_cache.serve(f"{body.get('model')}\x00{key}", blocks)
        return {
            "input_tokens": total - usage.read - usage.creation,
            "cache_creation_input_tokens": usage.creation,
            "cache_read_input_tokens": usage.read,
        }

    def _validated(self, request: Request, raw: bytes, count: bool) -> tuple[dict[str, Any], Response | None, int]:
        try:
            parsed: Any = json.loads(raw)
        except ValueError:
            parsed = None
        body: dict[str, Any] = parsed if isinstance(parsed, dict) else {"_unparsed": raw.decode("utf-8", "replace")}
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        received = ReceivedRequest(body=body, raw=raw, headers=dict(request.headers.items()), path=path)
        with self._lock:
            self.requests.append(received)
            fault = None if count or not self._faults else self._faults.pop(0)
        if fault is not None:
            status, error = fault
            return body, JSONResponse(error if error is not None else default_error_body(status), status_code=status), 0
        if (refusal := self._header_refusal(request)) is not None:
            return body, refusal, 0
        try:
            if not isinstance(parsed, dict):
                raise _invalid("There was an issue with your request body: invalid JSON")
            self._check_body(body, received.cache_breakpoints, count)
            input_tokens = count_input_tokens(body)
            if not count and input_tokens + body["max_tokens"] > self.context_window:
                raise _invalid(prompt_too_long_message(input_tokens, self.context_window, body["max_tokens"]))
        except AnthropicError as exc:
            with self._lock:
                self.rejected.append(exc.body)
            return body, JSONResponse(exc.body, status_code=exc.status), 0
        return body, None, input_tokens

    async def _count_tokens(self, request: Request) -> Response:
        _, refusal, input_tokens = self._validated(request, await request.body(), count=True)
        return refusal if refusal is not None else JSONResponse({"input_tokens": input_tokens})

    async def _messages(self, request: Request) -> Response:
        body, refusal, input_tokens = self._validated(request, await request.body(), count=False)
        if refusal is not None:
            return refusal
        responder = self.responder
        reply = responder(body) if responder is not None else echo_reply(body)
        key = request.headers.get("x-api-key") or request.headers.get("authorization") or ""
        usage = {**self._cache_usage(body, input_tokens, key), "output_tokens": _reply_tokens(reply)}
        stop_reason = reply.stop_reason or ("tool_use" if reply.tool_uses else "end_turn")
        message = {
            "id": self._next_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": body["model"],
            "content": self._content(reply),
            "stop_reason": stop_reason,
            "stop_sequence": None,
            "usage": usage,
        }
        if body.get("stream") is not True:
            return JSONResponse(message)
        return StreamingResponse(self._events(stream_events(message)), media_type="text/event-stream")

    async def _events(self, events: list[dict[str, Any]]) -> AsyncIterator[str]:
        fail_at = self.error_mid_stream_after
        for index, event in enumerate(events):
            if index == fail_at:
                yield _sse({"type": "error", "error": dict(self.mid_stream_error)})
                return
            yield _sse(event)


def _record_cache_control(block: dict[str, Any], where: str, breakpoints: list[tuple[str, dict[str, Any]]]) -> None:
    value = block.get("cache_control")
    if value is None:
        return
    breakpoints.append((where, value))
    _check_cache_control(value, f"{where}.cache_control")
    if block.get("type") == "text" and not block.get("text"):
        raise _invalid(f"{where}: cache_control cannot be set for empty text blocks")


def _check_cache_control(value: Any, where: str) -> None:
    if not isinstance(value, dict) or value.get("type") != "ephemeral":
        raise _invalid(f"{where}.type: Input should be 'ephemeral'")
    if value.get("ttl") is not None and value["ttl"] not in CACHE_TTLS:
        raise _invalid(f"{where}.ttl: Input should be '5m' or '1h'")


def _check_system(system: Any, breakpoints: list[tuple[str, dict[str, Any]]]) -> None:
    if system is None or isinstance(system, str):
        return
    if not isinstance(system, list):
        raise _invalid("system: Input should be a valid string or a valid list")
    for index, block in enumerate(system):
        where = f"system.{index}"
        if not isinstance(block, dict) or block.get("type") != "text":
            raise _invalid(f"{where}.type: Input should be 'text'")
        if not isinstance(block.get("text"), str):
            raise _required(f"{where}.text")
        if not block["text"]:
            raise _invalid("system: text content blocks must be non-empty")
        _record_cache_control(block, where, breakpoints)


def _check_roles(messages: list[dict[str, Any]]) -> None:
    if messages[0]["role"] != "user":
        raise _invalid('messages: first message must use the "user" role')
    for previous, message in itertools.pairwise(messages):
        if previous["role"] == message["role"]:
            raise _invalid('messages: roles must alternate between "user" and "assistant"')


def _ids(message: dict[str, Any], kind: str, key: str) -> list[str]:
    content = message["content"]
    if not isinstance(content, list):
        return []
    return [block[key] for block in content if block.get("type") == kind]


def _check_pairing(messages: list[dict[str, Any]]) -> None:
    """Each tool_use is answered in the next message; each tool_result answers the message right before it."""
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            uses = _ids(message, "tool_use", "id")
            following = messages[index + 1] if index + 1 < len(messages) else None
            answered = set(_ids(following, "tool_result", "tool_use_id")) if following is not None else set()
            missing = [use for use in uses if use not in answered]
            if missing:
                raise _invalid(
                    f"messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately after: "
                    f"{', '.join(missing)}. Each `tool_use` block must have a corresponding `tool_result` block in "
                    "the next message."
                )
        else:
            offered = set(_ids(messages[index - 1], "tool_use", "id")) if index > 0 else set()
            content = message["content"]
            for block_index, block in enumerate(content if isinstance(content, list) else []):
                if block.get("type") == "tool_result" and block["tool_use_id"] not in offered:
                    raise _invalid(
                        f"messages.{index}.content.{block_index}: unexpected `tool_use_id` found in `tool_result` "
                        f"blocks: {block['tool_use_id']}. Each `tool_result` block must have a corresponding "
                        "`tool_use` block in the previous message."
                    )


def _check_thinking_first(messages: list[dict[str, Any]]) -> None:
    """With thinking on, the assistant turn answered by the final tool results must start with thinking."""
    last = messages[-1]
    if last["role"] != "user" or len(messages) < 2 or not _ids(last, "tool_result", "tool_use_id"):
        return
    index = len(messages) - 2
    content = messages[index]["content"]
    first = content[0] if isinstance(content, list) and content else {"type": "text"}
    if first.get("type") not in THINKING_TYPES:
        raise _invalid(f"messages.{index}.content.0.type: " + THINKING_FIRST.format(found=first.get("type")))


def _word_pieces(text: str) -> list[str]:
    return re.findall(r"\s*\S+|\s+", text) or [""]


def _fragments(text: str) -> list[str]:
    return [text[i : i + ARGUMENT_FRAGMENT_CHARS] for i in range(0, len(text), ARGUMENT_FRAGMENT_CHARS)] or [""]


def stream_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Every event of a real stream for the final `message`, in order."""
    usage = message["usage"]
    opening = {
        **message,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**usage, "output_tokens": 1},
    }
    events: list[dict[str, Any]] = [{"type": "message_start", "message": opening}, {"type": "ping"}]
    for index, block in enumerate(message["content"]):
        kind = block["type"]
        if kind == "thinking":
            events.append(
                {
                    "type": "content_block_start",
                    "index": index,
                    "content_block": {**block, "thinking": "", "signature": ""},
                }
            )
            for piece in _word_pieces(block["thinking"]):
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "thinking_delta", "thinking": piece},
                    }
                )
            events.append(
                {
                    "type": "content_block_delta",
                    "index": index,
                    "delta": {"type": "signature_delta", "signature": block["signature"]},
                }
            )
        elif kind == "text":
            events.append({"type": "content_block_start", "index": index, "content_block": {**block, "text": ""}})
            for piece in _word_pieces(block["text"]):
                events.append(
                    {"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": piece}}
                )
        else:  # tool_use: the input arrives as JSON text in small pieces
            events.append({"type": "content_block_start", "index": index, "content_block": {**block, "input": {}}})
            for piece in _fragments(json.dumps(block["input"])):
                events.append(
                    {
                        "type": "content_block_delta",
                        "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": piece},
                    }
                )
        events.append({"type": "content_block_stop", "index": index})
    delta = {"stop_reason": message["stop_reason"], "stop_sequence": None}
    events.append({"type": "message_delta", "delta": delta, "usage": {"output_tokens": usage["output_tokens"]}})
    events.append({"type": "message_stop"})
    return events


def _sse(event: dict[str, Any]) -> str:
    return f"event: {event['type']}\ndata: {json.dumps(event)}\n\n"
