"""The LiteLLM boundary against the real fake upstream: parameters arrive unchanged, errors keep their shape."""

from __future__ import annotations

import asyncio
import copy
import time
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest

from proxy.config.models import ModelEntry
from proxy.config.schema import UpstreamConfig
from proxy.errors import ProxyError, UpstreamError, openai_error
from proxy.upstream.failures import upstream_error
from proxy.upstream.litellm_client import LiteLLMUpstream
from proxy.upstream.protocol import UpstreamCall
from tests.support.fake_upstream import FakeUpstream, Fault, Reply, default_error_body, error_body
from tests.support.proxy_server import free_port

Upstream = LiteLLMUpstream

UPSTREAM_KEY = "sk-upstream-secret"
MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "hello there"},
]
TOOL_CALL: dict[str, Any] = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
}
WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def entry_for(url: str) -> ModelEntry:
    return ModelEntry("fake", "openai/fake-model", url, UPSTREAM_KEY, 8192, 1024)


@pytest.fixture
def entry(fake: FakeUpstream) -> ModelEntry:
    return entry_for(fake.url)


@pytest.fixture
async def upstream(entry: ModelEntry) -> AsyncIterator[Upstream]:
    client = LiteLLMUpstream(UpstreamConfig(timeout_s=10), (entry,))
    yield client
    await client.aclose()  # its connection pools are cached per event loop until closed


async def collect(chunks: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    return [chunk async for chunk in chunks]


def text_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


# --- success ------------------------------------------------------------------------------------------------


async def test_complete_returns_openai_json(upstream: Upstream, entry: ModelEntry, fake: FakeUpstream) -> None:
    response = await upstream.complete(UpstreamCall(entry, MESSAGES, {}))

    assert response["object"] == "chat.completion"
    assert response["id"] == "chatcmpl-fake-1"
    assert response["model"] == "fake-model"
    # The upstream's own message, as it sent it (OpenAI's `refusal: null` included).
    assert response["choices"][0]["message"] == {
        "role": "assistant",
        "content": "echo: hello there",
        "refusal": None,
        "annotations": [],
    }
    assert response["choices"][0]["finish_reason"] == "stop"
    assert response["usage"]["prompt_tokens"] == fake.count_tokens(MESSAGES)
    assert "provider_specific_fields" not in response
    assert "provider_specific_fields" not in response["choices"][0]["message"]
    assert len(fake.requests) == 1
    assert fake.requests[-1].headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
    assert fake.requests[-1].body["model"] == "fake-model"


async def test_stream_yields_the_upstream_chunks(upstream: Upstream, entry: ModelEntry, fake: FakeUpstream) -> None:
    chunks = await collect(await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True})))

    assert text_of(chunks) == "echo: hello there"
    assert {c["id"] for c in chunks} == {"chatcmpl-fake-1"}
    assert {c["model"] for c in chunks} == {"fake-model"}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert fake.requests[-1].body["stream"] is True


async def test_stream_usage_chunk_keeps_empty_choices(
    upstream: Upstream, entry: ModelEntry, fake: FakeUpstream
) -> None:
    params = {"stream": True, "stream_options": {"include_usage": True}}
    chunks = await collect(await upstream.open_stream(UpstreamCall(entry, MESSAGES, params)))

    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["prompt_tokens"] == fake.count_tokens(MESSAGES)
    assert chunks[-1]["usage"]["completion_tokens"] > 0
    assert fake.requests[-1].body["stream_options"] == {"include_usage": True}


async def test_streamed_tool_calls_arrive_in_fragments(
    upstream: Upstream, entry: ModelEntry, fake: FakeUpstream
) -> None:
    fake.responder = lambda body: Reply(tool_calls=[TOOL_CALL])
    chunks = await collect(
        await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True, "tools": [WEATHER_TOOL]}))
    )

    calls = [call for c in chunks if c["choices"] for call in c["choices"][0]["delta"].get("tool_calls") or []]
    assert calls[0]["id"] == "call_1"
    assert calls[0]["function"]["name"] == "get_weather"
    assert "".join(call["function"].get("arguments") or "" for call in calls) == TOOL_CALL["function"]["arguments"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


# --- parameters and messages reach the upstream unchanged ---------------------------------------------------

CLIENT_PARAMS: dict[str, Any] = {
    "temperature": 0.3,
    "top_p": 0.9,
    "tools": [WEATHER_TOOL],
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "response_format": {
        "type": "json_schema",
        "json_schema": {
            "name": "answer",
            "strict": True,
            "schema": {
                "type": "object",
                "properties": {"a": {"type": "integer"}},
                "required": ["a"],
                "additionalProperties": False,
            },
        },
    },
    "stop": ["\n\n", "END"],
    "seed": 1234,
    "n": 2,
    "user": "user-42",
    "metadata": {"team": "blue", "run": "7"},
    "logprobs": True,
    "top_logprobs": 3,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.25,
    "logit_bias": {"50256": -100, "1234": 5},
    "parallel_tool_calls": False,
    "reasoning_effort": "low",
    "store": True,
    "prompt_cache_key": "cache-key-1",
    "max_tokens": 50,
    "max_completion_tokens": 60,
    "foo_custom": {"nested": [1, "two", None, True]},
}


async def test_every_client_parameter_arrives_unchanged(
    upstream: Upstream, entry: ModelEntry, fake: FakeUpstream
) -> None:
    sent = copy.deepcopy(CLIENT_PARAMS)
    await upstream.complete(UpstreamCall(entry, MESSAGES, sent))

    received = fake.requests[-1].body
    assert sent == CLIENT_PARAMS, "the proxy must not mutate the client's parameters"
    assert {key: received.get(key) for key in CLIENT_PARAMS} == CLIENT_PARAMS
    assert received["messages"] == MESSAGES
    assert set(received) == {*CLIENT_PARAMS, "model", "messages", "stream"}
    assert received["stream"] is False


async def test_every_client_parameter_arrives_unchanged_when_streaming(
    upstream: Upstream, entry: ModelEntry, fake: FakeUpstream
) -> None:
    params = {**CLIENT_PARAMS, "n": 1, "stream": True, "stream_options": {"include_usage": True}}
    await collect(await upstream.open_stream(UpstreamCall(entry, MESSAGES, params)))

    received = fake.requests[-1].body
    assert {key: received.get(key) for key in params} == params
    assert set(received) == {*params, "model", "messages"}


RICH_MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": [{"type": "text", "text": "You are terse."}]},
    {
        "role": "user",
        "name": "ann",
        "content": [
            {"type": "text", "text": "What is in this picture, and the weather?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            TOOL_CALL,
            {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "12:00"}]},
    {"role": "assistant", "content": "It is 21 °C at noon — ☀️.", "name": "bot"},
    {"role": "user", "content": "thanks"},
]


async def test_closing_closes_the_clients_litellm_cached_for_this_event_loop(fake: FakeUpstream) -> None:
    """LiteLLM keeps a client per event loop and closes it only once evicted, on whatever loop evicts it: a
    process that served on this loop would keep its connections open (every test's proxy is one such loop).
    (A `hosted_vllm/` model goes through `acompletion`; an `openai/` one is posted straight.)"""
    entry = ModelEntry("fake", "hosted_vllm/fake-model", fake.url, UPSTREAM_KEY, 8192, 1024)
    upstream = LiteLLMUpstream(UpstreamConfig(timeout_s=10), (entry,))
    await upstream.complete(UpstreamCall(entry, [{"role": "user", "content": "hi"}], {}))
    cache = upstream._litellm.in_memory_llm_clients_cache.cache_dict
    suffix = f"-{id(asyncio.get_running_loop())}"
    mine = [client for key, client in cache.items() if key.endswith(suffix)]
    assert mine

    await upstream.aclose()

    assert not [key for key in cache if key.endswith(suffix)]
    # `_client`: the handler's `client` property would open a new one in place of a closed one.
    http_clients = [getattr(client, "_client", None) for client in mine]
    assert http_clients
    assert all(isinstance(client, httpx.AsyncClient) and client.is_closed for client in http_clients)


async def test_litellm_gets_messages_of_its_own_to_change(fake: FakeUpstream) -> None:
    """Some of LiteLLM's provider transforms rewrite a message in place; the proxy's messages are shared with the
    client's next request (`proxy.doors.resent`), so what LiteLLM changes must not reach them."""
    entry = ModelEntry("fake", "hosted_vllm/fake-model", fake.url, UPSTREAM_KEY, 8192, 1024)
    upstream = LiteLLMUpstream(UpstreamConfig(timeout_s=10), (entry,))
    real = upstream._litellm.acompletion

    async def rewriting(**kwargs: Any) -> Any:
        kwargs["messages"][0]["content"] = "rewritten by the provider transform"
        return await real(**kwargs)

    upstream._litellm = SimpleNamespace(**{**vars(upstream._litellm), "acompletion": rewriting})
    messages = [{"role": "user", "content": "hi"}]
    try:
        await upstream.complete(UpstreamCall(entry, messages, {}))
    finally:
        await upstream.aclose()
    assert messages == [{"role": "user", "content": "hi"}]
    assert fake.requests[-1].body["messages"][0]["content"] == "rewritten by the provider transform"


def without_null_content(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """LiteLLM drops `"content": null` from assistant tool-call messages; nothing else may differ."""
    return [
        {k: v for k, v in m.items() if not (k == "content" and v is None and m.get("tool_calls"))} for m in messages
    ]


@pytest.mark.parametrize("stream", [False, True])
async def test_messages_arrive_unchanged(
    upstream: Upstream, entry: ModelEntry, fake: FakeUpstream, stream: bool
) -> None:
    sent = copy.deepcopy(RICH_MESSAGES)
    if stream:
        await collect(await upstream.open_stream(UpstreamCall(entry, sent, {"stream": True})))
    else:
        await upstream.complete(UpstreamCall(entry, sent, {}))

    assert sent == RICH_MESSAGES
    assert without_null_content(fake.requests[-1].body["messages"]) == without_null_content(RICH_MESSAGES)


async def test_developer_message_arrives_unchanged(upstream: Upstream, entry: ModelEntry, fake: FakeUpstream) -> None:
    messages = [{"role": "developer", "content": "Prefer metric units.", "name": "ops"}, MESSAGES[1]]
    await upstream.complete(UpstreamCall(entry, messages, {}))
    assert fake.requests[-1].body["messages"] == messages


# --- upstream errors keep status, type, code, param and Retry-After -----------------------------------------


@pytest.mark.parametrize(
    ("status", "error_type", "code"),
    [
        (400, "invalid_request_error", None),
        (401, "invalid_request_error", "invalid_api_key"),
        (403, "invalid_request_error", "unsupported_country_region_territory"),
        (404, "invalid_request_error", "model_not_found"),
        (429, "requests", "rate_limit_exceeded"),
        (500, "server_error", None),
        (503, "server_error", "service_unavailable"),
    ],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_upstream_error_statuses_are_kept(
    upstream: Upstream,
    entry: ModelEntry,
    fake: FakeUpstream,
    status: int,
    error_type: str,
    code: str | None,
    stream: bool,
) -> None:
    fake.fail_next(Fault(status=status))
    with pytest.raises(UpstreamError) as caught:
        if stream:
            await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True}))
        else:
            await upstream.complete(UpstreamCall(entry, MESSAGES, {}))

    error = caught.value
    expected = error_body_of(status)
    assert (error.status, error.type, error.code, error.param) == (status, error_type, code, None)
    assert error.message == expected["message"]
    assert openai_error(error)[1] == {"error": expected}
    assert len(fake.requests) == 1, "num_retries=0: one upstream attempt only"


@pytest.mark.parametrize(("status", "attempts"), [(500, 2), (429, 2), (400, 1)])
async def test_num_retries_retries_a_refusal_worth_retrying(
    entry: ModelEntry, fake: FakeUpstream, status: int, attempts: int
) -> None:
    upstream = LiteLLMUpstream(UpstreamConfig(timeout_s=10, num_retries=1), (entry,))
    try:
        fake.fail_next(Fault(status=status))
        if attempts == 1:
            with pytest.raises(UpstreamError):
                await upstream.complete(UpstreamCall(entry, MESSAGES, {}))
        else:
            response = await upstream.complete(UpstreamCall(entry, MESSAGES, {}))
            assert response["choices"][0]["message"]["content"] == "echo: hello there"
        assert len(fake.requests) == attempts
    finally:
        await upstream.aclose()


def error_body_of(status: int) -> dict[str, Any]:
    body: dict[str, Any] = default_error_body(status)["error"]
    return body


async def test_param_of_an_upstream_400_is_kept(upstream: Upstream, entry: ModelEntry, fake: FakeUpstream) -> None:
    body = error_body("Invalid value for 'temperature'.", "invalid_request_error", "temperature", "invalid_value")
    fake.fail_next(Fault(status=400, body=body))
    with pytest.raises(UpstreamError) as caught:
        await upstream.complete(UpstreamCall(entry, MESSAGES, {"temperature": 0.1}))
    assert openai_error(caught.value) == (400, body, {})


async def test_context_length_exceeded_is_kept(upstream: Upstream, entry: ModelEntry, fake: FakeUpstream) -> None:
    fake.context_window = 30
    messages = [{"role": "user", "content": "word " * 100}]
    for attempt in ("complete", "stream"):
        with pytest.raises(UpstreamError) as caught:
            if attempt == "stream":
                await upstream.open_stream(UpstreamCall(entry, messages, {"stream": True}))
            else:
                await upstream.complete(UpstreamCall(entry, messages, {}))
        error = caught.value
        assert (error.status, error.type, error.code, error.param) == (
            400,
            "invalid_request_error",
            "context_length_exceeded",
            "messages",
        )
        assert error.message.startswith("This model's maximum context length is 30 tokens.")


@pytest.mark.parametrize("stream", [False, True])
async def test_retry_after_is_kept(upstream: Upstream, entry: ModelEntry, fake: FakeUpstream, stream: bool) -> None:
    fake.fail_next(Fault(status=429, headers={"Retry-After": "17"}))
    with pytest.raises(UpstreamError) as caught:
        if stream:
            await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True}))
        else:
            await upstream.complete(UpstreamCall(entry, MESSAGES, {}))
    status, body, headers = openai_error(caught.value)
    assert status == 429
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert headers == {"Retry-After": "17"}


async def test_unreachable_upstream_is_502() -> None:
    entry = entry_for(f"http://127.0.0.1:{free_port()}/v1")
    upstream = LiteLLMUpstream(UpstreamConfig(timeout_s=5), (entry,))
    try:
        for attempt in ("complete", "stream"):
            with pytest.raises(UpstreamError) as caught:
                if attempt == "stream":
                    await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True}))
                else:
                    await upstream.complete(UpstreamCall(entry, MESSAGES, {}))
            error = caught.value
            assert (error.status, error.type, error.code) == (502, "upstream_error", "upstream_unreachable")
            assert UPSTREAM_KEY not in error.message
    finally:
        await upstream.aclose()


@pytest.mark.parametrize("stream", [False, True])
async def test_slow_upstream_is_504(entry: ModelEntry, fake: FakeUpstream, stream: bool) -> None:
    upstream = LiteLLMUpstream(UpstreamConfig(timeout_s=0.2), (entry,))
    delay_s = 0.8
    fake.fail_next(Fault(status=200, delay_s=delay_s))
    started = time.monotonic()
    with pytest.raises(UpstreamError) as caught:
        try:
            if stream:
                await collect(await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True})))
            else:
                await upstream.complete(UpstreamCall(entry, MESSAGES, {}))
        finally:
            await upstream.aclose()
    error = caught.value  # a 504 before the fake's answer came: the timeout, not the answer, ended the call
    assert (error.status, error.type, error.code) == (504, "timeout", "upstream_timeout")
    # Let the fake finish the abandoned answer, so it cannot take the next test's completion id.
    await asyncio.sleep(max(0.0, started + delay_s + 0.1 - time.monotonic()))


async def drain_until_error(stream: AsyncIterator[dict[str, Any]]) -> tuple[list[dict[str, Any]], UpstreamError]:
    """The chunks a failing stream yields before it raises, and the error it raises."""
    received: list[dict[str, Any]] = []
    with pytest.raises(UpstreamError) as caught:
        async for chunk in stream:
            received.append(chunk)
    return received, caught.value


async def test_stream_dropped_mid_way_raises_while_iterating(
    upstream: Upstream, entry: ModelEntry, fake: FakeUpstream
) -> None:
    fake.fail_next(Fault(drop_after_chunks=2))
    stream = await upstream.open_stream(
        UpstreamCall(entry, [{"role": "user", "content": "one two three four five"}], {"stream": True})
    )
    received, error = await drain_until_error(stream)
    assert len(received) == 2
    assert (error.status, error.type, error.code) == (502, "upstream_error", "upstream_unreachable")
    assert "mid-stream" in error.message


async def test_chunks_received_before_a_drop_survive_a_late_reader(
    upstream: Upstream, entry: ModelEntry, fake: FakeUpstream
) -> None:
    fake.fail_next(Fault(drop_after_chunks=2))
    stream = await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True}))
    await asyncio.sleep(0.1)  # the relay starts reading only after the journal step has begun
    received, _error = await drain_until_error(stream)
    assert len(received) == 2


async def test_malformed_stream_event_is_incomplete(upstream: Upstream, entry: ModelEntry, fake: FakeUpstream) -> None:
    fake.fail_next(Fault(malformed_after_chunks=3))
    stream = await upstream.open_stream(
        UpstreamCall(entry, [{"role": "user", "content": "one two three four five"}], {"stream": True})
    )
    received, error = await drain_until_error(stream)
    assert len(received) == 3
    assert (error.status, error.type, error.code) == (502, "upstream_error", "upstream_stream_incomplete")


async def test_stream_cut_after_the_last_chunk_without_done_is_still_complete_when_finished(
    upstream: Upstream, entry: ModelEntry, fake: FakeUpstream
) -> None:
    # All chunks (including finish_reason) arrived; only [DONE] is missing: the answer is whole.
    fake.fail_next(Fault(malformed_after_chunks=100))
    chunks = await collect(await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True})))
    assert text_of(chunks) == "echo: hello there"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_streams_in_a_row_share_one_connection(upstream: Upstream, entry: ModelEntry, fake: FakeUpstream) -> None:
    """The end of a stream is read after `[DONE]`, so its connection is kept for the next call (a new one would
    cost the next stream's first chunk a connect)."""
    for _ in range(3):
        chunks = await collect(await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True})))
        assert text_of(chunks) == "echo: hello there"
    assert len({request.peer for request in fake.requests}) == 1


async def test_what_follows_done_is_neither_relayed_nor_waited_for(
    upstream: Upstream, entry: ModelEntry, fake: FakeUpstream
) -> None:
    trailing = 'data: {"id":"x","object":"chat.completion.chunk","created":1,"model":"m","choices":[]}\n\n'
    fake.fail_next(Fault(after_done=trailing * 100))
    chunks = await collect(await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True})))
    assert text_of(chunks) == "echo: hello there"
    assert {c["id"] for c in chunks} == {"chatcmpl-fake-1"}


async def test_upstream_recovers_after_a_failure(upstream: Upstream, entry: ModelEntry, fake: FakeUpstream) -> None:
    fake.fail_next(Fault(drop_after_chunks=1))
    with pytest.raises(UpstreamError):
        await collect(await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True})))
    chunks = await collect(await upstream.open_stream(UpstreamCall(entry, MESSAGES, {"stream": True})))
    assert text_of(chunks) == "echo: hello there"


# --- upstream_error as a function ---------------------------------------------------------------------------


def test_upstream_error_is_returned_unchanged() -> None:
    original = UpstreamError("x", status=418, error_type="teapot", code="short")
    assert upstream_error(original) is original


def test_unknown_exception_becomes_502_without_losing_its_message() -> None:
    error = upstream_error(ValueError("litellm.APIError: APIError: OpenAIException - something odd"))
    assert isinstance(error, ProxyError)
    assert (error.status, error.type, error.code) == (502, "server_error", None)
    assert error.message == "something odd"


def test_connection_failure_in_the_cause_chain_is_unreachable() -> None:
    try:
        try:
            raise ConnectionRefusedError("refused")
        except OSError as inner:
            raise RuntimeError("Connection error.") from inner
    except RuntimeError as outer:
        error = upstream_error(outer, mid_stream=True)
    assert (error.status, error.code) == (502, "upstream_unreachable")
    assert "mid-stream" in error.message
