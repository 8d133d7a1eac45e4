"""The fake Anthropic upstream itself, driven by the official `anthropic` SDK: its answers parse (JSON, raw event
streams, and `messages.stream`, which accumulates the events), and it refuses what Anthropic refuses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.support.fake_anthropic_upstream import (
    THINKING_TEXT,
    AnthropicReply,
    FakeAnthropicUpstream,
    error_body,
    prompt_too_long_message,
)

WEATHER_TOOL: Any = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
HEADERS = {"x-api-key": "test-key", "anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def anthropic_server() -> Iterator[FakeAnthropicUpstream]:
    with FakeAnthropicUpstream(context_window=2048) as server:
        yield server


@pytest.fixture
def upstream(anthropic_server: FakeAnthropicUpstream) -> Iterator[FakeAnthropicUpstream]:
    anthropic_server.reset()
    yield anthropic_server
    anthropic_server.reset()


@pytest.fixture
def sdk(upstream: FakeAnthropicUpstream) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=upstream.url, api_key="test-key", max_retries=0, timeout=10) as client:
        yield client


@pytest.fixture
def http(upstream: FakeAnthropicUpstream) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=upstream.url, headers=HEADERS, timeout=10) as client:
        yield client


def as_param(blocks: list[Any]) -> list[Any]:
    """Answer blocks as the next request's assistant content (what a client echoes back)."""
    return [block.model_dump(exclude_none=True, exclude={"parsed_output"}) for block in blocks]


def user(text: str) -> Any:
    return {"role": "user", "content": text}


def error_of(answer: httpx.Response) -> tuple[int, str, str]:
    body = answer.json()
    assert body["type"] == "error"
    return answer.status_code, body["error"]["type"], body["error"]["message"]


def test_create_default_answer(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream) -> None:
    message = sdk.messages.create(model="m", max_tokens=100, messages=[user("hello there")])

    assert message.id == "msg_1"
    assert message.stop_reason == "end_turn"
    thinking, text = message.content
    assert thinking.type == "thinking"
    assert thinking.thinking == THINKING_TEXT
    assert thinking.signature in upstream.issued_signatures
    assert text.type == "text"
    assert text.text == "echo: hello there"
    body = {"model": "m", "max_tokens": 100, "messages": [user("hello there")]}
    assert message.usage.input_tokens == upstream.count_tokens(body)
    assert message.usage.cache_read_input_tokens == 0
    assert message.usage.output_tokens > 0
    received = upstream.requests[0]
    assert received.path == "/v1/messages"
    assert received.headers["anthropic-version"]
    assert json.loads(received.raw) == received.body


def test_stream_text_and_final_message(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream) -> None:
    with sdk.messages.stream(model="m", max_tokens=100, messages=[user("one two three")]) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()

    assert pieces == ["echo:", " one", " two", " three"]
    assert final.content[0].type == "thinking"
    assert final.content[0].signature in upstream.issued_signatures
    assert final.content[1].type == "text"
    assert final.content[1].text == "echo: one two three"
    assert final.stop_reason == "end_turn"
    assert final.usage.output_tokens > 1


def test_raw_stream_event_order(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream) -> None:
    upstream.responder = lambda body: AnthropicReply(text="ok", tool_uses=[("get_weather", {"city": "Oslo"})])
    events = list(
        sdk.messages.create(model="m", max_tokens=100, messages=[user("go")], tools=[WEATHER_TOOL], stream=True)
    )

    kinds = [event.type for event in events]
    assert kinds[:4] == ["message_start", "content_block_start", "content_block_delta", "content_block_stop"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    partial = "".join(
        event.delta.partial_json
        for event in events
        if event.type == "content_block_delta" and event.delta.type == "input_json_delta"
    )
    assert json.loads(partial) == {"city": "Oslo"}
    delta = events[-2]
    assert delta.type == "message_delta"
    assert delta.delta.stop_reason == "tool_use"


def test_sse_framing_has_ping_and_names_each_event(http: httpx.Client) -> None:
    body = {"model": "m", "max_tokens": 50, "messages": [user("hi")], "stream": True}
    with http.stream("POST", "/v1/messages", json=body) as answer:
        text = answer.read().decode()
    assert answer.headers["content-type"].startswith("text/event-stream")
    blocks = [block for block in text.split("\n\n") if block]
    names = []
    for block in blocks:
        event_line, data_line = block.split("\n")
        names.append(event_line.removeprefix("event: "))
        assert names[-1] == json.loads(data_line.removeprefix("data: "))["type"]
    assert names[:2] == ["message_start", "ping"]
    assert "signature_delta" in text


def weather_then_answer(body: dict[str, Any]) -> AnthropicReply:
    results = [
        block
        for message in body["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"
    ]
    if not results:
        return AnthropicReply(tool_uses=[("get_weather", {"city": "Oslo"})], thinking=True)
    return AnthropicReply(text="results: " + ", ".join(str(block["content"]) for block in results))


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop_with_thinking(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream, stream: bool) -> None:
    upstream.responder = weather_then_answer
    history: list[Any] = [user("weather in Oslo?")]
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    if stream:
        with sdk.messages.stream(
            model="m", max_tokens=1500, messages=history, tools=[WEATHER_TOOL], thinking=thinking
        ) as events:
            first: Any = events.get_final_message()
    else:
        first = sdk.messages.create(
            model="m", max_tokens=1500, messages=history, tools=[WEATHER_TOOL], thinking=thinking
        )
    assert first.stop_reason == "tool_use"
    call = first.content[1]
    assert (call.type, call.id, call.name, call.input) == ("tool_use", "toolu_1", "get_weather", {"city": "Oslo"})
    history.append({"role": "assistant", "content": as_param(first.content)})
    history.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}]})

    second = sdk.messages.create(model="m", max_tokens=1500, messages=history, tools=[WEATHER_TOOL], thinking=thinking)

    assert second.content[0].type == "text"
    assert second.content[0].text == "results: sunny"
    assert upstream.rejected == []

    # Dropping the thinking block of the tool turn is refused while thinking is on.
    history[1]["content"] = history[1]["content"][1:]
    with pytest.raises(anthropic.BadRequestError, match="Expected `thinking` or `redacted_thinking`"):
        sdk.messages.create(model="m", max_tokens=1500, messages=history, tools=[WEATHER_TOOL], thinking=thinking)


def test_thinking_echoed_unchanged_is_accepted(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream) -> None:
    first = sdk.messages.create(model="m", max_tokens=100, messages=[user("one")])
    history = [user("one"), {"role": "assistant", "content": as_param(first.content)}, user("two")]

    second = sdk.messages.create(model="m", max_tokens=100, messages=history)

    assert second.content[1].type == "text"
    assert second.content[1].text == "echo: two"
    assert upstream.rejected == []
    assert len(upstream.issued_signatures) == 2


@pytest.mark.parametrize("tamper", ["text", "signature"])
def test_altered_thinking_is_refused(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream, tamper: str) -> None:
    first = sdk.messages.create(model="m", max_tokens=100, messages=[user("one")])
    content = as_param(first.content)
    if tamper == "text":
        content[0]["thinking"] += " And more."
    else:
        content[0]["signature"] = "Eq" + content[0]["signature"][2:-4] + "AAAA"

    with pytest.raises(anthropic.BadRequestError) as caught:
        sdk.messages.create(
            model="m", max_tokens=100, messages=[user("one"), {"role": "assistant", "content": content}, user("two")]
        )

    assert caught.value.status_code == 400
    assert upstream.rejected == [
        error_body("invalid_request_error", "messages.1.content.0: Invalid `signature` in `thinking` block")
    ]


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([user("a"), user("b")], 'messages: roles must alternate between "user" and "assistant"'),
        ([{"role": "assistant", "content": "a"}, user("b")], 'messages: first message must use the "user" role'),
        ([], "messages: at least one message is required"),
        ([{"role": "system", "content": "a"}], "messages.0.role: Input should be 'user' or 'assistant'"),
    ],
)
def test_broken_roles_are_refused(
    sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream, messages: list[Any], message: str
) -> None:
    with pytest.raises(anthropic.BadRequestError):
        sdk.messages.create(model="m", max_tokens=10, messages=messages)
    assert upstream.rejected == [error_body("invalid_request_error", message)]


def test_orphan_tool_result_is_refused(http: httpx.Client) -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_nowhere", "content": "42"}
    messages = [user("a"), {"role": "assistant", "content": "b"}, {"role": "user", "content": [result]}]
    answer = http.post("/v1/messages", json={"model": "m", "max_tokens": 10, "messages": messages})
    status, kind, message = error_of(answer)
    assert (status, kind) == (400, "invalid_request_error")
    assert message.startswith(
        "messages.2.content.0: unexpected `tool_use_id` found in `tool_result` blocks: toolu_nowhere."
    )


def test_unanswered_tool_use_is_refused(http: httpx.Client) -> None:
    use = {"type": "tool_use", "id": "toolu_a", "name": "get_weather", "input": {}}
    for tail in ([], [user("never mind")]):
        messages = [user("a"), {"role": "assistant", "content": [use]}, *tail]
        answer = http.post("/v1/messages", json={"model": "m", "max_tokens": 10, "messages": messages})
        status, _, message = error_of(answer)
        assert status == 400
        assert message.startswith(
            "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_a."
        )


def test_too_long_prompt_is_refused(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream) -> None:
    body: dict[str, Any] = {"model": "m", "messages": [user("word " * 1000)], "system": "Be brief."}
    tokens = upstream.count_tokens(body)
    assert 1000 < tokens < 2048
    sdk.messages.create(**body, max_tokens=2048 - tokens)

    with pytest.raises(anthropic.BadRequestError, match="prompt is too long"):
        sdk.messages.create(**body, max_tokens=2048 - tokens + 1)
    assert upstream.rejected == [
        error_body("invalid_request_error", prompt_too_long_message(tokens, 2048, 2048 - tokens + 1))
    ]
    assert prompt_too_long_message(tokens, 2048, 100) == f"prompt is too long: {tokens} tokens > 1948 maximum"


def test_cache_breakpoints_are_recorded_and_read(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream) -> None:
    cache: Any = {"type": "ephemeral"}
    tools: Any = [{**WEATHER_TOOL, "cache_control": cache}]
    system: Any = [{"type": "text", "text": "You are terse. " * 300, "cache_control": cache}]  # over 1,024 tokens
    turn: Any = {"role": "user", "content": [{"type": "text", "text": "first " * 50, "cache_control": cache}]}

    first = sdk.messages.create(model="m", max_tokens=50, tools=tools, system=system, messages=[turn])
    history = [turn, {"role": "assistant", "content": "ok"}, user("second")]
    history[2] = {"role": "user", "content": [{"type": "text", "text": "second", "cache_control": cache}]}
    second = sdk.messages.create(model="m", max_tokens=50, tools=tools, system=system, messages=history)

    assert upstream.requests[0].cache_breakpoints == [
        ("tools.0", {"type": "ephemeral"}),
        ("system.0", {"type": "ephemeral"}),
        ("messages.0.content.0", {"type": "ephemeral"}),
    ]
    assert upstream.requests[1].cache_breakpoints[-1] == ("messages.2.content.0", {"type": "ephemeral"})
    assert first.usage.cache_read_input_tokens == 0
    assert first.usage.cache_creation_input_tokens is not None
    assert first.usage.cache_creation_input_tokens > 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    whole = upstream.count_tokens(upstream.requests[1].body)
    usage = second.usage
    assert usage.input_tokens + (usage.cache_creation_input_tokens or 0) + (usage.cache_read_input_tokens or 0) == whole


def test_too_many_breakpoints_are_refused(http: httpx.Client, upstream: FakeAnthropicUpstream) -> None:
    cache = {"type": "ephemeral"}
    blocks = [{"type": "text", "text": f"part {n}", "cache_control": cache} for n in range(5)]
    answer = http.post("/v1/messages", json={"model": "m", "max_tokens": 10, "messages": [user("x")], "system": blocks})
    assert error_of(answer) == (
        400,
        "invalid_request_error",
        "A maximum of 4 blocks with cache_control may be provided. Found 5.",
    )
    assert len(upstream.requests[0].cache_breakpoints) == 5


def test_count_tokens(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream) -> None:
    counted = sdk.messages.count_tokens(model="m", messages=[user("how many tokens?")], system="Be brief.")

    body = {"model": "m", "messages": [user("how many tokens?")], "system": "Be brief."}
    assert counted.input_tokens == upstream.count_tokens(body)
    assert upstream.requests[0].path.startswith("/v1/messages/count_tokens")


def test_error_mid_stream(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream) -> None:
    upstream.error_mid_stream_after = 3
    seen: list[str] = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        for event in sdk.messages.create(model="m", max_tokens=50, messages=[user("hi")], stream=True):
            seen.append(event.type)

    # Events 0-2 are message_start, ping (which the SDK swallows) and content_block_start.
    assert seen == ["message_start", "content_block_start"]
    assert caught.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}


def test_missing_key_is_401_and_missing_version_is_400(upstream: FakeAnthropicUpstream) -> None:
    body = {"model": "m", "max_tokens": 10, "messages": [user("hi")]}
    with httpx.Client(base_url=upstream.url, timeout=10) as bare:
        no_key = bare.post("/v1/messages", json=body, headers={"anthropic-version": "2023-06-01"})
        no_version = bare.post("/v1/messages", json=body, headers={"x-api-key": "k"})
    assert error_of(no_key) == (401, "authentication_error", "x-api-key header is required")
    assert error_of(no_version) == (400, "invalid_request_error", "anthropic-version: header is required")

    # The SDK sends its key as a bearer token (anthropic>=2.12); without any key it gets the 401 too.
    keyless = anthropic.Anthropic(
        base_url=upstream.url,
        api_key="k",
        max_retries=0,
        timeout=10,
        default_headers={"Authorization": anthropic.Omit()},  # type: ignore[dict-item]  # Omit removes it
    )
    with keyless, pytest.raises(anthropic.AuthenticationError, match="x-api-key header is required"):
        keyless.messages.create(model="m", max_tokens=10, messages=[user("hi")])
    assert len(upstream.rejected) == 3


def test_fail_next_is_one_shot(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream) -> None:
    upstream.fail_next(429)
    with pytest.raises(anthropic.RateLimitError):
        sdk.messages.create(model="m", max_tokens=10, messages=[user("hi")])
    upstream.fail_next(529, count=2)
    for _ in range(2):
        with pytest.raises(anthropic.APIStatusError) as caught:
            sdk.messages.create(model="m", max_tokens=10, messages=[user("hi")])
        assert caught.value.status_code == 529

    answer = sdk.messages.create(model="m", max_tokens=10, messages=[user("hi")])
    assert answer.content[1].type == "text"
    assert upstream.rejected == []


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"max_tokens": 10, "messages": [user("x")]}, "model: Field required"),
        ({"model": "m", "messages": [user("x")]}, "max_tokens: Field required"),
        ({"model": "m", "max_tokens": 0, "messages": [user("x")]}, "max_tokens: Input should be greater than or"),
        ({"model": "m", "max_tokens": 10}, "messages: Field required"),
        (
            {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "telepathy"}]}]},
            "messages.0.content.0: Input tag 'telepathy' found using 'type' does not match",
        ),
        (
            {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
            "messages.0.content.0.text.text: Field required",
        ),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "x", "x_note": 1}]}],
            },
            "messages.0.content.0.text.x_note: Extra inputs are not permitted",
        ),
        ({"model": "m", "max_tokens": 10, "messages": [user("x")], "system": [{"type": "image"}]}, "system.0.type"),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [user("x")],
                "thinking": {"type": "enabled", "budget_tokens": 2000},
            },
            "`max_tokens` must be greater than `thinking.budget_tokens`",
        ),
    ],
)
def test_invalid_requests_get_anthropic_errors(
    http: httpx.Client, upstream: FakeAnthropicUpstream, body: dict[str, Any], message: str
) -> None:
    answer = http.post("/v1/messages", json=body)

    status, kind, text = error_of(answer)
    assert (status, kind) == (400, "invalid_request_error")
    assert text.startswith(message)
    assert upstream.rejected == [answer.json()]


def test_reset_forgets_everything(sdk: anthropic.Anthropic, upstream: FakeAnthropicUpstream) -> None:
    sdk.messages.create(model="m", max_tokens=10, messages=[user("hi")])
    upstream.fail_next(500)
    upstream.error_mid_stream_after = 1
    upstream.reset()

    assert (upstream.requests, upstream.rejected, upstream.issued_signatures) == ([], [], set())
    assert upstream.error_mid_stream_after is None
    assert sdk.messages.create(model="m", max_tokens=10, messages=[user("hi")]).id == "msg_1"
