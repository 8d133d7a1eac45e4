"""The fake upstream must look like OpenAI to the official SDK, or end-to-end tests prove nothing."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

from tests.support.fake_upstream import FakeUpstream, Fault, Reply

USER_TEXT = "tell me a story about the sea"
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": USER_TEXT},
]
TOOL_CALL: dict[str, Any] = {
    "id": "call_weather_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'},
}


@pytest.fixture(scope="module")
def upstream() -> Iterator[FakeUpstream]:
    with FakeUpstream() as server:
        yield server


@pytest.fixture
def fake(upstream: FakeUpstream) -> FakeUpstream:
    upstream.reset()
    return upstream


@pytest.fixture
def client(fake: FakeUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=fake.url, api_key="test", max_retries=0) as sdk:
        yield sdk


def sse_events(response: httpx.Response) -> list[str]:
    return [line.removeprefix("data: ") for line in response.iter_lines() if line]


def sdk_messages(messages: list[dict[str, Any]]) -> list[ChatCompletionMessageParam]:
    return cast("list[ChatCompletionMessageParam]", messages)


def complete(client: openai.OpenAI, messages: list[dict[str, Any]] = MESSAGES, **params: Any) -> ChatCompletion:
    completion = client.chat.completions.create(model="gpt-test", messages=sdk_messages(messages), **params)
    assert isinstance(completion, ChatCompletion)
    return completion


def stream_chunks(client: openai.OpenAI, received: list[ChatCompletionChunk], **params: Any) -> None:
    """Collects chunks into `received` as they arrive, so a test still sees them when the stream breaks."""
    stream = client.chat.completions.create(model="gpt-test", messages=sdk_messages(MESSAGES), stream=True, **params)
    for chunk in stream:
        received.append(chunk)


def read_stream(url: str, body: dict[str, Any]) -> bytes:
    with httpx.stream("POST", f"{url}/chat/completions", json=body) as response:
        return response.read()


def test_non_stream_completion_has_openai_shape(client: openai.OpenAI) -> None:
    completion = complete(client)

    assert completion.id == "chatcmpl-fake-1"
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-test"
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == "echo: " + USER_TEXT
    assert choice.message.tool_calls is None
    assert choice.finish_reason == "stop"
    assert completion.usage is not None
    assert completion.usage.prompt_tokens == FakeUpstream.count_tokens(MESSAGES)
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens


def test_stream_text_and_usage(client: openai.OpenAI) -> None:
    chunks: list[ChatCompletionChunk] = []
    stream_chunks(client, chunks, stream_options={"include_usage": True})

    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) >= 3
    assert "".join(pieces) == "echo: " + USER_TEXT
    assert chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.prompt_tokens == FakeUpstream.count_tokens(MESSAGES)


def test_stream_wire_format(fake: FakeUpstream) -> None:
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", f"{fake.url}/chat/completions", json=body) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = [e for e in raw.split("\n\n") if e]
    assert all(e.startswith("data: ") for e in events)
    first = json.loads(events[0].removeprefix("data: "))
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "", "refusal": None}
    assert "usage" not in first


async def test_async_client_stream(fake: FakeUpstream) -> None:
    async with openai.AsyncOpenAI(base_url=fake.url, api_key="test", max_retries=0) as sdk:
        stream = await sdk.chat.completions.create(model="m", messages=sdk_messages(MESSAGES), stream=True)
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "echo: " + USER_TEXT


def test_tool_calls_non_stream(fake: FakeUpstream, client: openai.OpenAI) -> None:
    fake.responder = lambda body: Reply(tool_calls=[TOOL_CALL])
    choice = complete(client).choices[0]

    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert choice.message.tool_calls is not None
    call = choice.message.tool_calls[0]
    assert call.type == "function"
    assert call.model_dump() == TOOL_CALL


def accumulate_tool_calls(chunks: Iterable[ChatCompletionChunk]) -> dict[int, dict[str, str]]:
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        for part in chunk.choices[0].delta.tool_calls or [] if chunk.choices else []:
            call = calls.setdefault(part.index, {"id": "", "name": "", "arguments": ""})
            if part.id:
                assert part.type == "function"
                call["id"] = part.id
            if part.function and part.function.name:
                call["name"] = part.function.name
            if part.function and part.function.arguments:
                call["arguments"] += part.function.arguments
    return calls


def test_tool_calls_stream(fake: FakeUpstream, client: openai.OpenAI) -> None:
    second = {"id": "call_2", "type": "function", "function": {"name": "noop", "arguments": "{}"}}
    fake.responder = lambda body: Reply(content="Checking.", tool_calls=[TOOL_CALL, second])
    chunks: list[ChatCompletionChunk] = []
    stream_chunks(client, chunks)

    assert "".join(c.choices[0].delta.content or "" for c in chunks) == "Checking."
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert accumulate_tool_calls(chunks) == {
        0: {"id": "call_weather_1", "name": "get_weather", "arguments": TOOL_CALL["function"]["arguments"]},
        1: {"id": "call_2", "name": "noop", "arguments": "{}"},
    }


def test_context_window_exceeded(fake: FakeUpstream, client: openai.OpenAI) -> None:
    prompt = FakeUpstream.count_tokens(MESSAGES)
    fake.context_window = prompt - 1
    with pytest.raises(openai.BadRequestError) as caught:
        complete(client)
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"
    assert f"maximum context length is {prompt - 1} tokens" in caught.value.message
    assert f"resulted in {prompt} tokens" in caught.value.message

    fake.context_window = prompt + 10
    with pytest.raises(openai.BadRequestError) as caught:
        complete(client, max_tokens=11)
    assert caught.value.code == "context_length_exceeded"
    expected = f"you requested {prompt + 11} tokens ({prompt} in the messages, 11 in the completion)"
    assert expected in caught.value.message

    usage = complete(client, max_completion_tokens=10).usage
    assert usage is not None
    assert usage.prompt_tokens == prompt


def test_count_tokens_follows_openai_formula() -> None:
    # 3 per message + "user" (1) + "hello world" (2) + 3 priming.
    assert FakeUpstream.count_tokens([{"role": "user", "content": "hello world"}]) == 9
    named = [{"role": "user", "name": "bob", "content": [{"type": "text", "text": "hello world"}]}]
    assert FakeUpstream.count_tokens(named) == 9 + 1 + 1


ASSISTANT_CALLING: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        (
            [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "call_x", "content": "42"}],
            "must be a response to a preceeding message with 'tool_calls'",
        ),
        (
            [ASSISTANT_CALLING, {"role": "tool", "tool_call_id": "call_other", "content": "42"}],
            "must be a response to a preceeding message with 'tool_calls'",
        ),
        (
            [
                ASSISTANT_CALLING,
                {"role": "tool", "tool_call_id": "call_weather_1", "content": "21C"},
                {"role": "user", "content": "and tomorrow?"},
                {"role": "tool", "tool_call_id": "call_weather_1", "content": "21C"},
            ],
            "must be a response to a preceeding message with 'tool_calls'",
        ),
        (
            [ASSISTANT_CALLING, {"role": "user", "content": "well?"}],
            "did not have response messages: call_weather_1",
        ),
    ],
)
def test_unpaired_tool_messages_rejected(client: openai.OpenAI, messages: list[dict[str, Any]], fragment: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        complete(client, messages)
    assert fragment in caught.value.message
    assert caught.value.param == "messages"
    assert caught.value.code is None


def test_paired_tool_messages_accepted(client: openai.OpenAI) -> None:
    messages = [
        {"role": "user", "content": "weather?"},
        ASSISTANT_CALLING,
        {"role": "tool", "tool_call_id": "call_weather_1", "content": "21C"},
        {"role": "user", "content": "thanks"},
    ]
    assert complete(client, messages).choices[0].message.content == "echo: thanks"


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"messages": MESSAGES}, None),
        ({"model": "m"}, "missing_required_parameter"),
        ({"model": "m", "messages": []}, "empty_array"),
        ({"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}, "invalid_value"),
        ({"model": "m", "messages": MESSAGES, "stream_options": {"include_usage": True}}, None),
    ],
)
def test_required_fields(fake: FakeUpstream, body: dict[str, Any], code: str | None) -> None:
    response = httpx.post(f"{fake.url}/chat/completions", json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == code


def test_rate_limit_fault_then_recovery(fake: FakeUpstream, client: openai.OpenAI) -> None:
    fake.fail_next(Fault(status=429, headers={"retry-after": "7"}))
    with pytest.raises(openai.RateLimitError) as caught:
        complete(client)
    assert caught.value.response.headers["retry-after"] == "7"
    assert caught.value.code == "rate_limit_exceeded"
    assert caught.value.type == "requests"

    assert complete(client).choices
    assert len(fake.requests) == 2


def test_server_error_faults_are_counted(fake: FakeUpstream, client: openai.OpenAI) -> None:
    fake.fail_next(Fault(status=500), count=2)
    for _ in range(2):
        with pytest.raises(openai.InternalServerError) as caught:
            complete(client)
        assert caught.value.type == "server_error"
    assert complete(client).choices


def test_delay_fault_provokes_timeout(fake: FakeUpstream) -> None:
    fake.fail_next(Fault(status=200, delay_s=0.5))
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{fake.url}/chat/completions", json={"model": "m", "messages": MESSAGES}, timeout=0.1)


def test_drop_mid_stream(fake: FakeUpstream, client: openai.OpenAI) -> None:
    fake.fail_next(Fault(drop_after_chunks=2))
    received: list[ChatCompletionChunk] = []
    with pytest.raises(httpx.RemoteProtocolError):
        stream_chunks(client, received)
    assert len(received) == 2


def test_stream_faults_skip_non_stream_requests(fake: FakeUpstream) -> None:
    fake.fail_next(Fault(drop_after_chunks=0))
    body: dict[str, Any] = {"model": "m", "messages": MESSAGES}
    assert httpx.post(f"{fake.url}/chat/completions", json=body).status_code == 200
    with pytest.raises(httpx.RemoteProtocolError):
        read_stream(fake.url, body | {"stream": True})
    assert read_stream(fake.url, body | {"stream": True}).endswith(b"data: [DONE]\n\n")


def test_malformed_event_mid_stream(fake: FakeUpstream) -> None:
    fake.fail_next(Fault(malformed_after_chunks=1))
    body = {"model": "m", "messages": MESSAGES, "stream": True}
    with httpx.stream("POST", f"{fake.url}/chat/completions", json=body) as response:
        events = sse_events(response)
    assert len(events) == 2
    assert json.loads(events[0])["object"] == "chat.completion.chunk"
    with pytest.raises(json.JSONDecodeError):
        json.loads(events[1])


def test_requests_log_bodies_and_headers(fake: FakeUpstream, client: openai.OpenAI) -> None:
    complete(client, extra_headers={"X-Trace": "abc"}, temperature=0.5)
    fake.context_window = 1
    with pytest.raises(openai.BadRequestError):
        complete(client)

    assert len(fake.requests) == 2
    first = fake.requests[0]
    assert first.body["messages"] == MESSAGES
    assert first.body["temperature"] == 0.5
    assert first.headers["authorization"] == "Bearer test"
    assert first.headers["x-trace"] == "abc"
    assert fake.requests[1].body["model"] == "gpt-test"


def test_models_endpoint(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["fake-model"]


def test_stop_and_restart_on_same_url() -> None:
    server = FakeUpstream()
    with server:
        url = server.url
        assert httpx.get(f"{url}/models").status_code == 200
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/models")
    with server:
        assert server.url == url
        assert httpx.get(f"{url}/models").status_code == 200


def test_a_repeated_long_prefix_is_reported_cached_like_openai(client: openai.OpenAI) -> None:
    long = [{"role": "system", "content": "Keep every fact. " * 400}, {"role": "user", "content": "hi"}]
    first = complete(client, long)
    longer = [*long, {"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    second = complete(client, longer)
    assert first.usage is not None
    assert second.usage is not None
    assert first.usage.prompt_tokens_details is not None
    assert second.usage.prompt_tokens_details is not None
    assert first.usage.prompt_tokens_details.cached_tokens == 0
    cached = second.usage.prompt_tokens_details.cached_tokens or 0
    assert 1024 <= cached <= first.usage.prompt_tokens
    assert (cached - 1024) % 128 == 0
