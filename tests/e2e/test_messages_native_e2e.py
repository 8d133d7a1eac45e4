"""The Messages door on an Anthropic-native upstream (`api: messages`): the official `anthropic` SDK against the
served proxy and a strict fake of Anthropic's API (`tests/support/fake_anthropic_upstream.py`), which refuses broken
alternation, unpaired tool blocks, thinking blocks whose signature it did not issue, and prompts over its window
(`prompt is too long`), and records where every `cache_control` breakpoint arrived.

Checked: the blocks reach the upstream as the client sent them (thinking signatures, `cache_control` where it
stands); the upstream's events come back whole; a long conversation compacts without one refusal, its turns
alternating; between compactions the prompt up to the last cache breakpoint is the previous one's prefix.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import pairwise
from typing import Any

import anthropic
import httpx
import pytest

from proxy.compaction.recall import RECALL_HEADER
from tests.conftest import ServeProxy
from tests.support.fake_anthropic_upstream import AnthropicReply, FakeAnthropicUpstream
from tests.support.proxy_server import ProxyServer
from tests.support.scripted_session import extends

WINDOW = 4096
TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture
def native() -> Iterator[FakeAnthropicUpstream]:
    with FakeAnthropicUpstream(context_window=WINDOW) as upstream:
        yield upstream


@pytest.fixture
def served(serve_proxy: ServeProxy, native: FakeAnthropicUpstream) -> ProxyServer:
    model = {
        "name": "claude",
        "model": "anthropic/claude-fake",
        "api_base": native.url,
        "api_key": "sk-ant-native",
        "context_window": WINDOW,
        "api": "messages",
    }
    return serve_proxy(models=[model])


@pytest.fixture
def sdk(served: ProxyServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=30) as client:
        yield client


def test_thinking_and_cache_control_reach_the_upstream_as_sent(
    sdk: anthropic.Anthropic, native: FakeAnthropicUpstream
) -> None:
    system = [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    messages: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}
    ]
    first = sdk.messages.create(model="claude", max_tokens=256, system=system, messages=messages)  # type: ignore[arg-type]
    thinking, text = first.content
    assert thinking.type == "thinking"
    assert thinking.signature in native.issued_signatures  # type: ignore[union-attr]
    assert text.text == "echo: hi"  # type: ignore[union-attr]
    messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]})
    messages.append({"role": "user", "content": "again"})
    beta = {"anthropic-beta": "interleaved-thinking-2025-05-14"}
    second = sdk.messages.create(model="claude", max_tokens=256, system=system, messages=messages, extra_headers=beta)  # type: ignore[arg-type]
    assert second.content[-1].text == "echo: again"  # type: ignore[union-attr]
    assert native.requests[-1].headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    sent = native.requests[-1]
    assert sent.body["messages"] == messages  # every block as the client sent it: signatures, cache_control
    assert sent.body["system"] == system
    assert [path for path, _ in sent.cache_breakpoints] == ["system.0", "messages.0.content.0"]
    assert native.rejected == []


def test_a_native_stream_and_tool_loop(sdk: anthropic.Anthropic, native: FakeAnthropicUpstream) -> None:
    def respond(body: dict[str, Any]) -> AnthropicReply:
        last = body["messages"][-1]["content"]
        if isinstance(last, list) and last and last[0].get("type") == "tool_result":
            return AnthropicReply(text="It is sunny.", thinking=True)
        return AnthropicReply(tool_uses=[("get_weather", {"city": "Paris"})], thinking=True)

    native.responder = respond
    messages: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    with sdk.messages.stream(model="claude", max_tokens=512, tools=[TOOL], messages=messages) as stream:  # type: ignore[list-item]
        first = stream.get_final_message()
    assert first.stop_reason == "tool_use"
    assert [block.type for block in first.content] == ["thinking", "tool_use"]
    use = first.content[1]
    messages.append({"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]})
    messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]})  # type: ignore[union-attr]
    second = sdk.messages.create(model="claude", max_tokens=512, tools=[TOOL], messages=messages)  # type: ignore[list-item]
    assert second.content[-1].text == "It is sunny."  # type: ignore[union-attr]
    assert native.requests[-1].body["messages"] == messages
    assert native.rejected == []


def without_breakpoints(message: Any) -> str:
    """A message as JSON without its `cache_control` marks: where the proxy puts one moves with the recall."""

    def bare(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: bare(item) for key, item in value.items() if key != "cache_control"}
        if isinstance(value, list):
            return [bare(item) for item in value]
        return value

    return json.dumps(bare(message), sort_keys=True)


def test_a_long_native_conversation_compacts_alternating_without_a_refusal(
    served: ProxyServer, sdk: anthropic.Anthropic, native: FakeAnthropicUpstream
) -> None:
    system = [{"type": "text", "text": "You are a careful assistant.", "cache_control": {"type": "ephemeral"}}]
    messages: list[Any] = [{"role": "user", "content": "Remember FACT-native-9. " + "filler " * 200}]
    for turn in range(25):
        answer = sdk.messages.create(model="claude", max_tokens=256, system=system, messages=messages)  # type: ignore[arg-type]
        messages.append(
            {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in answer.content]}
        )
        messages.append({"role": "user", "content": f"turn {turn}: " + "more words " * 60})
    assert native.rejected == []
    # The proxy's own calls (LiteLLM's, for the summarizer, say who they are).
    proxied = [r for r in native.requests if "litellm" not in r.headers.get("user-agent", "")]
    bodies = [request.body for request in proxied]
    assert len(bodies) == 25
    last = bodies[-1]["messages"]
    assert len(last) < len(messages)  # compacted
    assert [m["role"] for m in last] == ["user", "assistant"] * (len(last) // 2) + ["user"] * (len(last) % 2)
    assert "Earlier conversation" in json.dumps(last)
    # A cache breakpoint where the summaries end (the client's own is on its system prompt only), and one just
    # before the recall that fills the room left, for this turn only (the next turn sends what is before it again).
    summary_turns = [f"messages.{i}.content.0" for i, m in enumerate(last) if "Earlier conversation" in json.dumps(m)]
    recalled = [i for i, m in enumerate(last) if RECALL_HEADER in json.dumps(m)]
    before_recall = [f"messages.{i - 1}.content.{len(last[i - 1]['content']) - 1}" for i in recalled]
    assert [path for path, _ in proxied[-1].cache_breakpoints] == ["system.0", summary_turns[-1], *before_recall]
    # Prompt caching: each request's system prompt, up to its breakpoint, is the previous one's; and between
    # compactions each prompt extends the previous one but for its recall (the compactions are the only breaks).
    assert all(body["system"] == system for body in bodies)
    extending = sum(
        1 for before, after in pairwise(bodies) if extends(before["messages"], after["messages"], without_breakpoints)
    )
    compactions = sum(1 for r in native.requests if "litellm" in r.headers.get("user-agent", ""))
    print(f"prefix-extending requests: {extending}/{len(bodies) - 1}; summarizer calls: {compactions}")
    assert extending >= len(bodies) - 1 - 2 * max(1, compactions)


def test_prompt_is_too_long_from_the_upstream_is_healed(serve_proxy: ServeProxy, native: FakeAnthropicUpstream) -> None:
    """The model's real window is smaller than configured: Anthropic's `prompt is too long` is recognized, the
    context compacted to fit, and the same request answered; later requests fit from the start."""
    native.context_window = 3000
    model = {
        "name": "claude",
        "model": "anthropic/claude-fake",
        "api_base": native.url,
        "api_key": "sk-ant-native",
        "context_window": 8192,
        "api": "messages",
    }
    proxy = serve_proxy(models=[model])
    messages: list[Any] = []
    with anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0, timeout=30) as client:
        for turn in range(20):
            messages.append({"role": "user", "content": f"turn {turn}: " + "words " * 200})
            answer = client.messages.create(model="claude", max_tokens=256, messages=messages)
            messages.append(
                {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in answer.content]}
            )
    refusals = [body for body in native.rejected if "prompt is too long" in json.dumps(body)]
    assert 1 <= len(refusals) <= 2, native.rejected  # learned from the first, not refused on every turn
    assert max(native.count_tokens(r.body) for r in native.requests if r.body.get("max_tokens") == 256) > 2000


def test_anthropic_s_cache_reads_and_writes_reach_the_client_and_the_session_s_cost(
    sdk: anthropic.Anthropic, served: ProxyServer
) -> None:
    cache: Any = {"type": "ephemeral"}
    system: Any = [{"type": "text", "text": "You are terse and exact. " * 220, "cache_control": cache}]  # > 1,024
    messages: list[Any] = [{"role": "user", "content": "hi"}]
    headers = {"X-Session-Id": "cached"}
    first = sdk.messages.create(model="claude", max_tokens=64, system=system, messages=messages, extra_headers=headers)
    messages += [{"role": "assistant", "content": "ok"}, {"role": "user", "content": "again"}]
    second = sdk.messages.create(model="claude", max_tokens=64, system=system, messages=messages, extra_headers=headers)

    assert first.usage.cache_read_input_tokens == 0
    assert (first.usage.cache_creation_input_tokens or 0) > 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    cost = httpx.get(f"{served.url}/sessions/cached", timeout=10).json()["cost"]
    steps = cost["turns"]
    assert [step["cache_creation_tokens"] for step in steps] == [first.usage.cache_creation_input_tokens, 0]
    assert [step["cached_tokens"] for step in steps] == [0, second.usage.cache_read_input_tokens]
    usage = second.usage
    whole = usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0)
    assert steps[1]["sent_tokens"] == whole
