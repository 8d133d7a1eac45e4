"""A canonical answer as Anthropic's Messages API gives it (`proxy.doors.messages.output`): the `message` object
of a chat completion, the event sequence rendered from chat chunks, and errors in Anthropic's shape with the
type its SDKs and Claude Code act on. Objects and events are validated with the Anthropic SDK's own types."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from proxy.canonical.types import Chunk
from proxy.doors.event_streams import Event
from proxy.doors.messages.output import (
    MessageEvents,
    MessageShape,
    anthropic_error,
    anthropic_usage,
    completed_message,
    error_body,
    tool_input,
)
from proxy.errors import (
    AuthenticationFailed,
    ContextTooLarge,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    StoreUnavailable,
    UpstreamError,
)

SHAPE = MessageShape(step_id=0x1F, model="claude-sonnet-4-5", prompt_tokens=900)
EVENTS: TypeAdapter[Any] = TypeAdapter(RawMessageStreamEvent)
USAGE: dict[str, Any] = {
    "prompt_tokens": 1200,
    "completion_tokens": 40,
    "total_tokens": 1240,
    "prompt_tokens_details": {"cached_tokens": 1000},
}


def completion(content: str | None, calls: Sequence[tuple[str, str, str]] = (), finish: str | None = "stop") -> Chunk:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in calls
        ]
    return {"object": "chat.completion", "choices": [{"index": 0, "message": message, "finish_reason": finish}]}


def test_a_completion_is_a_message_with_the_proxy_s_id() -> None:
    answer = {**completion("Reading it.", [("toolu_01", "Read", '{"file_path": "/repo/a.py"}')], "tool_calls")}
    answer["usage"] = USAGE
    body = completed_message(SHAPE, answer)
    message = Message.model_validate(body)
    assert message.id == "msg_000000000000001f"
    assert message.model == "claude-sonnet-4-5"
    assert message.stop_reason == "tool_use"
    assert body["content"] == [
        {"type": "text", "text": "Reading it."},
        # the client echoes this id in its tool_result: it must be the call's own
        {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "/repo/a.py"}},
    ]
    assert body["usage"] == {  # Anthropic's input_tokens: what the cache neither read nor wrote
        "input_tokens": 200,
        "output_tokens": 40,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 1000,
    }


@pytest.mark.parametrize(
    ("finish", "stop"),
    [
        ("stop", "end_turn"),
        ("tool_calls", "tool_use"),
        ("length", "max_tokens"),
        ("content_filter", "refusal"),
        (None, "end_turn"),
        ("something_new", "end_turn"),
    ],
)
def test_stop_reasons(finish: str | None, stop: str) -> None:
    body = completed_message(SHAPE, completion("x", finish=finish))
    assert body["stop_reason"] == stop
    Message.model_validate(body)


def test_without_the_upstream_s_usage_input_is_the_proxy_s_own_count() -> None:
    assert anthropic_usage(None, 900) == {
        "input_tokens": 900,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
    assert completed_message(SHAPE, completion("x"))["usage"]["input_tokens"] == 900


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("", {}),
        ("not json", {"arguments": "not json"}),
        ("[1, 2]", {"value": [1, 2]}),  # `input` must be an object
        ("3", {"value": 3}),
    ],
)
def test_tool_input_is_always_an_object(arguments: str, expected: Any) -> None:
    assert tool_input(arguments) == expected


# --- the event sequence ---------------------------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> Chunk:
    out: Chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        out["usage"] = usage
    return out


def call(index: int, call_id: str | None = None, name: str | None = None, arguments: str = "") -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    delta: dict[str, Any] = {"index": index, "function": function}
    if call_id is not None:
        delta["id"] = call_id
    return delta


def render(chunks: list[Chunk]) -> list[Event]:
    events = MessageEvents(SHAPE)
    rendered = [*events.start(), *events.feed(chunks), *events.finish()]
    for event in rendered:
        EVENTS.validate_python(event)
    return rendered


def test_a_text_and_tool_use_stream() -> None:
    events = render(
        [
            chunk({"role": "assistant", "content": "Read"}),
            chunk({"content": "ing it."}),
            chunk({"tool_calls": [call(0, "toolu_01", "Read", "")]}),
            chunk({"tool_calls": [call(0, arguments='{"file_path":')]}),
            chunk({"tool_calls": [call(0, arguments=' "/repo/a.py"}')]}),
            chunk({}, "tool_calls"),
            chunk({}, usage=USAGE),
        ]
    )
    assert events == [
        {
            "type": "message_start",
            "message": {
                "id": "msg_000000000000001f",
                "type": "message",
                "role": "assistant",
                "model": "claude-sonnet-4-5",
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 900,
                    "output_tokens": 0,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                },
            },
        },
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Read"}},
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "ing it."}},
        {"type": "content_block_stop", "index": 0},
        {
            "type": "content_block_start",
            "index": 1,
            "content_block": {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {}},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": '{"file_path":'},
        },
        {
            "type": "content_block_delta",
            "index": 1,
            "delta": {"type": "input_json_delta", "partial_json": ' "/repo/a.py"}'},
        },
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": {
                "input_tokens": 200,
                "output_tokens": 40,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 1000,
            },
        },
        {"type": "message_stop"},
    ]


def test_parallel_tool_calls_are_one_block_each() -> None:
    events = render(
        [
            chunk({"tool_calls": [call(0, "toolu_a", "Read", '{"a":1}'), call(1, "toolu_b", "Grep", '{"b":2}')]}),
            chunk({}, "tool_calls"),
        ]
    )
    starts = [event for event in events if event["type"] == "content_block_start"]
    assert [(event["index"], event["content_block"]["id"]) for event in starts] == [(0, "toolu_a"), (1, "toolu_b")]
    deltas = [event for event in events if event["type"] == "content_block_delta"]
    assert [(event["index"], event["delta"]["partial_json"]) for event in deltas] == [(0, '{"a":1}'), (1, '{"b":2}')]
    stops = [event["index"] for event in events if event["type"] == "content_block_stop"]
    assert stops == [0, 1]


def test_an_empty_answer_and_a_cut_off_one() -> None:
    assert [event["type"] for event in render([chunk({}, "stop")])] == [
        "message_start",
        "message_delta",
        "message_stop",
    ]
    cut = render([chunk({"content": "Once"}), chunk({}, "length")])
    assert cut[-2]["delta"]["stop_reason"] == "max_tokens"


def test_a_failure_after_the_start_closes_the_open_block_and_is_an_error_event() -> None:
    events = MessageEvents(SHAPE)
    rendered = [*events.start(), *events.feed([chunk({"content": "Part"})])]
    rendered += events.fail(UpstreamError("Overloaded", status=529, error_type="overloaded_error"))
    assert rendered[-2:] == [
        {"type": "content_block_stop", "index": 0},
        {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
    ]
    assert MessageEvents(SHAPE).fail(RuntimeError("sk-secret")) == [
        {
            "type": "error",
            "error": {
                "type": "api_error",
                "message": "The proxy failed unexpectedly (RuntimeError); the failure was logged.",
            },
        }
    ]


def test_a_native_event_keeps_everything_but_the_message_id() -> None:
    upstream: dict[str, Any] = {
        "type": "message_start",
        "message": {
            "id": "msg_upstream",
            "type": "message",
            "role": "assistant",
            "content": [],
            "usage": {"input_tokens": 5},
        },
    }
    renamed = MessageEvents(SHAPE).native(upstream)
    assert renamed == {"type": "message_start", "message": {**upstream["message"], "id": "msg_000000000000001f"}}
    assert upstream["message"]["id"] == "msg_upstream"  # not changed in place: the journal holds it
    delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "thinking_delta", "thinking": "hm"}}
    assert MessageEvents(SHAPE).native(delta) == delta


# --- errors ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (InvalidRequest("max_tokens: Field required", param="max_tokens"), 400, "invalid_request_error"),
        (ContextTooLarge("prompt is too long"), 400, "invalid_request_error"),
        (AuthenticationFailed("invalid x-api-key"), 401, "authentication_error"),
        (UpstreamError("forbidden", status=403), 403, "permission_error"),
        (NotFound("model not found"), 404, "not_found_error"),
        (PayloadTooLarge("too large"), 413, "request_too_large"),
        (UpstreamError("slow down", status=429, headers={"Retry-After": "3"}), 429, "rate_limit_error"),
        (UpstreamError("boom", status=500), 500, "api_error"),
        (UpstreamError("bad gateway", status=502), 502, "api_error"),
        (UpstreamError("timed out", status=504), 504, "timeout_error"),
        (UpstreamError("overloaded", status=529), 529, "overloaded_error"),
        (UpstreamError("unprocessable", status=422), 422, "invalid_request_error"),
    ],
)
def test_errors_take_anthropic_s_shape_and_type_by_status(error: Exception, status: int, kind: str) -> None:
    got_status, body, _headers = anthropic_error(error)
    assert got_status == status
    assert body == {"type": "error", "error": {"type": kind, "message": str(error)}}


def test_an_error_keeps_its_headers() -> None:
    assert anthropic_error(UpstreamError("slow down", status=429, headers={"Retry-After": "3"}))[2] == {
        "Retry-After": "3"
    }
    assert anthropic_error(StoreUnavailable("store down", retry_after_s=2.4))[2] == {"Retry-After": "2"}


def test_an_unexpected_exception_is_a_500_that_leaks_nothing() -> None:
    status, body, headers = anthropic_error(KeyError("sk-ant-secret"))
    assert (status, headers) == (500, {})
    assert body["error"]["type"] == "api_error"
    assert "sk-ant-secret" not in json.dumps(body)


def test_an_error_without_a_message_still_says_something() -> None:
    assert error_body(400, None) == {"type": "error", "error": {"type": "invalid_request_error", "message": "error"}}
