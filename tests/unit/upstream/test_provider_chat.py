"""The translated route (`proxy.upstream.provider_chat`) against the strict fake Anthropic upstream: it answers
exactly as `litellm.acompletion` does for the same answers, keeps the upstream's status, and never shows the key."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from proxy import environment
from proxy.config.models import ModelEntry
from proxy.config.schema import UpstreamConfig
from proxy.errors import UpstreamError
from proxy.upstream.litellm_client import LiteLLMUpstream, openai_json
from proxy.upstream.protocol import UpstreamCall
from tests.support.fake_anthropic_upstream import AnthropicReply, FakeAnthropicUpstream
from tests.unit.upstream.test_upstream import WEATHER_TOOL

KEY = "sk-ant-upstream-secret"
CACHED_SYSTEM: dict[str, Any] = {
    "role": "system",
    "content": [{"type": "text", "text": "be brief and exact " * 1200, "cache_control": {"type": "ephemeral"}}],
}


@pytest.fixture
def native() -> Iterator[FakeAnthropicUpstream]:
    with FakeAnthropicUpstream() as server:
        yield server


@pytest.fixture
def entry(native: FakeAnthropicUpstream) -> ModelEntry:
    return ModelEntry("claude", "anthropic/claude-fake", native.url, KEY, 100_000, 1024)


@pytest.fixture
async def upstream(entry: ModelEntry) -> AsyncIterator[LiteLLMUpstream]:
    client = LiteLLMUpstream(UpstreamConfig(timeout_s=10), (entry,))
    yield client
    await client.aclose()


async def acompletion(entry: ModelEntry, messages: list[Any], params: dict[str, Any], stream: bool = False) -> Any:
    litellm = environment.litellm()
    # LiteLLM imports its MCP module for any tools= unless told not to (as `LiteLLMUpstream` tells it).
    return await litellm.acompletion(
        model=entry.model,
        messages=messages,
        api_base=entry.api_base,
        api_key=KEY,
        _skip_mcp_handler=True,
        stream=stream,
        **params,
    )


async def through_acompletion(entry: ModelEntry, messages: list[Any], params: dict[str, Any]) -> dict[str, Any]:
    response = await acompletion(entry, messages, params)
    return openai_json(response.model_dump(exclude_none=True))


async def stream_through_acompletion(entry: ModelEntry, messages: list[Any], params: dict[str, Any]) -> list[Any]:
    wrapper = await acompletion(entry, messages, params, stream=True)
    return [openai_json(chunk.model_dump(exclude_none=True)) async for chunk in wrapper]


def comparable(completion: dict[str, Any]) -> dict[str, Any]:
    """A completion without what each call mints (its id and clock; the fake mints thinking signatures)."""
    kept = {key: value for key, value in completion.items() if key not in ("id", "created")}
    for choice in kept["choices"]:
        message = choice["message"]
        message.pop("thinking_blocks", None)
        for call in message.get("tool_calls") or ():
            call.pop("id", None)
    return kept


def test_anthropic_takes_the_translated_route_gemini_and_bedrock_stay_on_acompletion() -> None:
    entries = (
        ModelEntry("a", "anthropic/claude-fake", "http://127.0.0.1:9", KEY),
        ModelEntry("g", "gemini/gemini-2.0-flash", None, KEY),
        ModelEntry("b", "bedrock/anthropic.claude-3-haiku-20240307-v1:0", None, KEY),
        ModelEntry("o", "openai/gpt-4o", "http://127.0.0.1:9", KEY),
    )
    upstream = LiteLLMUpstream(UpstreamConfig(), entries)
    routes = {entry.name: upstream.route(entry) for entry in entries}
    translated = routes["a"].translated
    assert translated is not None
    assert translated.url == "http://127.0.0.1:9/v1/messages"
    assert routes["g"].translated is None
    assert routes["g"].direct is None
    assert routes["b"].translated is None
    assert routes["b"].direct is None
    assert routes["o"].translated is None
    assert routes["o"].direct is not None


async def test_a_text_answer_is_the_one_acompletion_gives(
    native: FakeAnthropicUpstream, entry: ModelEntry, upstream: LiteLLMUpstream
) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    params = {"max_tokens": 64, "temperature": 0.2}
    ours = await upstream.complete(UpstreamCall(entry, messages, params))
    assert native.requests[-1].headers["user-agent"].startswith("litellm/")
    theirs = await through_acompletion(entry, messages, params)
    assert ours["choices"][0]["message"]["content"] == "echo: hello there"
    assert comparable(ours) == comparable(theirs)
    assert native.requests[0].body == native.requests[1].body
    assert native.rejected == []


async def test_tool_calls_arrive_as_acompletion_gives_them(
    native: FakeAnthropicUpstream, entry: ModelEntry, upstream: LiteLLMUpstream
) -> None:
    native.responder = lambda body: AnthropicReply(tool_uses=[("get_weather", {"city": "Paris"})])
    messages = [{"role": "user", "content": "weather in Paris?"}]
    params = {"max_tokens": 64, "tools": [WEATHER_TOOL], "tool_choice": "auto"}
    ours = await upstream.complete(UpstreamCall(entry, messages, params))
    theirs = await through_acompletion(entry, messages, params)
    choice = ours["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert comparable(ours) == comparable(theirs)
    assert native.requests[0].body == native.requests[1].body


async def test_cached_tokens_are_counted_as_acompletion_counts_them(
    native: FakeAnthropicUpstream, entry: ModelEntry, upstream: LiteLLMUpstream
) -> None:
    messages: list[dict[str, Any]] = [CACHED_SYSTEM, {"role": "user", "content": "hello"}]
    written = await upstream.complete(UpstreamCall(entry, messages, {"max_tokens": 64}))
    read = await upstream.complete(UpstreamCall(entry, messages, {"max_tokens": 64}))
    theirs = await through_acompletion(entry, messages, {"max_tokens": 64})
    assert written["usage"]["cache_creation_input_tokens"] > 0
    assert read["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert read["usage"]["cache_read_input_tokens"] == written["usage"]["cache_creation_input_tokens"]
    assert comparable(read) == comparable(theirs)


@pytest.mark.parametrize("stream", [False, True], ids=["whole answer", "stream"])
@pytest.mark.parametrize("status", [400, 429, 500, 529])
async def test_a_refusal_keeps_its_status_and_never_shows_the_key(
    native: FakeAnthropicUpstream, entry: ModelEntry, upstream: LiteLLMUpstream, status: int, stream: bool
) -> None:
    native.fail_next(status, {"type": "error", "error": {"type": "api_error", "message": f"bad key {KEY} here"}})
    send = upstream.open_stream if stream else upstream.complete
    with pytest.raises(UpstreamError) as raised:
        await send(UpstreamCall(entry, [{"role": "user", "content": "hi"}], {"max_tokens": 64}))
    assert raised.value.status == status
    assert KEY not in str(raised.value)
    assert KEY not in repr(vars(raised.value))
    assert len(native.requests) == 1  # num_retries is 0: one POST


def comparable_chunks(chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chunks without what each call mints (ids, clock, thinking signatures), each stream's id checked to be one."""
    assert len({chunk["id"] for chunk in chunks}) == 1
    kept = []
    for chunk in chunks:
        chunk = {key: value for key, value in chunk.items() if key not in ("id", "created")}
        for choice in chunk.get("choices") or ():
            delta = choice["delta"]
            delta.pop("thinking_blocks", None)
            for call in delta.get("tool_calls") or ():
                call.pop("id", None)
        kept.append(chunk)
    return kept


STREAMS = {
    "text": (None, [{"role": "user", "content": "hello there"}], {"max_tokens": 64, "temperature": 0.2}),
    "tool calls": (
        AnthropicReply(tool_uses=[("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Oslo"})]),
        [{"role": "user", "content": "weather in Paris and Oslo?"}],
        {"max_tokens": 64, "tools": [WEATHER_TOOL]},
    ),
    "thinking": (
        AnthropicReply(text="it is so", thinking=True),
        [{"role": "user", "content": "why?"}],
        {"max_tokens": 64},
    ),
    "text and a call": (
        AnthropicReply(text="let me look", tool_uses=[("get_weather", {"city": "Rome"})]),
        [{"role": "user", "content": "weather in Rome?"}],
        {"max_tokens": 64, "tools": [WEATHER_TOOL], "tool_choice": "auto"},
    ),
    "cut at max_tokens": (
        AnthropicReply(text="a long answer", stop_reason="max_tokens"),
        [{"role": "user", "content": "go"}],
        {"max_tokens": 3},
    ),
}


@pytest.mark.parametrize("usage", [True, False], ids=["with usage", "without usage"])
@pytest.mark.parametrize("case", list(STREAMS))
async def test_a_stream_arrives_as_acompletion_relays_it(
    native: FakeAnthropicUpstream, entry: ModelEntry, upstream: LiteLLMUpstream, case: str, usage: bool
) -> None:
    reply, messages, params = STREAMS[case]
    if reply is not None:
        native.responder = lambda body: reply
    if usage:
        params = {**params, "stream_options": {"include_usage": True}}
    ours = [chunk async for chunk in await upstream.open_stream(UpstreamCall(entry, messages, params))]
    theirs = await stream_through_acompletion(entry, messages, params)
    assert comparable_chunks(ours) == comparable_chunks(theirs)
    assert native.requests[0].body == native.requests[1].body
    assert native.requests[0].body["stream"] is True
    assert native.rejected == []


async def test_a_streams_cached_tokens_are_counted_as_acompletion_counts_them(
    native: FakeAnthropicUpstream, entry: ModelEntry, upstream: LiteLLMUpstream
) -> None:
    messages: list[dict[str, Any]] = [CACHED_SYSTEM, {"role": "user", "content": "hello"}]
    params = {"max_tokens": 64, "stream_options": {"include_usage": True}}
    await upstream.complete(UpstreamCall(entry, messages, {"max_tokens": 64}))  # writes the cache
    ours = [chunk async for chunk in await upstream.open_stream(UpstreamCall(entry, messages, params))]
    theirs = await stream_through_acompletion(entry, messages, params)
    assert ours[-1]["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert comparable_chunks(ours) == comparable_chunks(theirs)


async def test_an_error_event_mid_stream_is_the_upstreams_refusal(
    native: FakeAnthropicUpstream, entry: ModelEntry, upstream: LiteLLMUpstream
) -> None:
    native.error_mid_stream_after = 3
    chunks = await upstream.open_stream(UpstreamCall(entry, [{"role": "user", "content": "hi"}], {"max_tokens": 64}))
    with pytest.raises(UpstreamError) as raised:
        async for _chunk in chunks:
            pass
    assert raised.value.status >= 500
    assert KEY not in str(raised.value)
