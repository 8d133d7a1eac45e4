"""`UpstreamRouter`: each `UpstreamCall` goes to the client of its request's own API when its model speaks that API,
and as chat otherwise; a native client takes only a request in its own API."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest

from proxy.canonical.types import NativeRequest
from proxy.canonical.vocabulary import EVENT, RESPONSE
from proxy.config.models import ModelEntry
from proxy.config.schema import UpstreamConfig
from proxy.upstream.anthropic_client import AnthropicClient
from proxy.upstream.protocol import UpstreamCall
from proxy.upstream.router import UpstreamRouter
from tests.support.fake_anthropic_upstream import FakeAnthropicUpstream

KEY = "sk-ant-router-test-key"
MESSAGES = [{"role": "user", "content": "hi"}]
NATIVE = NativeRequest("messages", {"max_tokens": 64, "metadata": {"user_id": "u-1"}})


@pytest.fixture
def fake() -> Iterator[FakeAnthropicUpstream]:
    with FakeAnthropicUpstream() as server:
        yield server


@pytest.fixture
def native_entry(fake: FakeAnthropicUpstream) -> ModelEntry:
    return ModelEntry("claude-native", "anthropic/claude-fake", fake.url, KEY, 100_000, 1024, api="messages")


@pytest.fixture
def chat_entry(fake: FakeAnthropicUpstream) -> ModelEntry:
    return ModelEntry("claude-chat", "anthropic/claude-fake", fake.url, KEY, 100_000, 1024)


@pytest.fixture
async def router(native_entry: ModelEntry, chat_entry: ModelEntry) -> AsyncIterator[UpstreamRouter]:
    upstream = UpstreamRouter(UpstreamConfig(timeout_s=10, num_retries=0), (native_entry, chat_entry))
    yield upstream
    await upstream.aclose()


async def test_a_native_request_to_a_model_of_its_api_goes_in_that_api(
    router: UpstreamRouter, native_entry: ModelEntry, fake: FakeAnthropicUpstream
) -> None:
    answer = await router.complete(UpstreamCall(native_entry, MESSAGES, {"max_tokens": 64}, NATIVE))
    assert answer[RESPONSE]["type"] == "message"  # the upstream's own answer, kept whole
    assert fake.requests[-1].body["metadata"] == {"user_id": "u-1"}  # the request's own fields, as sent

    stream = await router.open_stream(UpstreamCall(native_entry, MESSAGES, {"max_tokens": 64}, NATIVE))
    chunks = [chunk async for chunk in stream]
    assert chunks[0][EVENT]["type"] == "message_start"


@pytest.mark.parametrize("native", [NATIVE, None], ids=["a chat model", "no native request"])
async def test_any_other_call_goes_as_chat(
    router: UpstreamRouter,
    native_entry: ModelEntry,
    chat_entry: ModelEntry,
    fake: FakeAnthropicUpstream,
    native: NativeRequest | None,
) -> None:
    entry = chat_entry if native is not None else native_entry
    answer = await router.complete(UpstreamCall(entry, MESSAGES, {"max_tokens": 64}, native))
    assert answer["object"] == "chat.completion"
    assert RESPONSE not in answer
    assert "metadata" not in fake.requests[-1].body


async def test_a_native_client_refuses_a_call_without_a_request_in_its_api(native_entry: ModelEntry) -> None:
    client = AnthropicClient(UpstreamConfig(timeout_s=10))
    try:
        with pytest.raises(ValueError, match="messages client"):
            await client.complete(UpstreamCall(native_entry, MESSAGES, {"max_tokens": 64}))
        with pytest.raises(ValueError, match="messages client"):
            await client.open_stream(UpstreamCall(native_entry, MESSAGES, {}, NativeRequest("responses", {})))
    finally:
        await client.aclose()
