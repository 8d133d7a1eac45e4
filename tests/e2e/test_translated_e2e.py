"""A model served through LiteLLM's Anthropic translation (`anthropic/…` without `api: messages`): the official
OpenAI and Anthropic SDKs against the served proxy and the strict fake of Anthropic's API. Streams and whole
answers take the translated route (`proxy.upstream.provider_chat`): a tool-using conversation goes on for many
turns with every request accepted by the fake, tool calls and usage arriving as the SDKs expect."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import ServeProxy
from tests.support.fake_anthropic_upstream import AnthropicReply, FakeAnthropicUpstream
from tests.support.proxy_server import ProxyServer

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.fixture
def native() -> Iterator[FakeAnthropicUpstream]:
    with FakeAnthropicUpstream(context_window=200_000) as upstream:
        yield upstream


@pytest.fixture
def served(serve_proxy: ServeProxy, native: FakeAnthropicUpstream) -> ProxyServer:
    model = {"name": "claude", "model": "anthropic/claude-fake", "api_base": native.url, "api_key": "sk-ant-fake"}
    return serve_proxy(models=[model])


def weather_or_answer(body: dict[str, Any]) -> AnthropicReply:
    """A call for every user question, a text answer once the tool's result is in."""
    last = body["messages"][-1]
    answered = isinstance(last["content"], list) and any(
        block.get("type") == "tool_result" for block in last["content"]
    )
    if answered:
        return AnthropicReply(text="It is sunny there.")
    return AnthropicReply(text="Let me look.", tool_uses=[("get_weather", {"city": f"city {len(body['messages'])}"})])


def test_a_streamed_tool_conversation_through_the_chat_door(served: ProxyServer, native: FakeAnthropicUpstream) -> None:
    native.responder = weather_or_answer
    messages: list[Any] = [{"role": "system", "content": "Be brief."}]
    with openai.OpenAI(base_url=f"{served.url}/v1", api_key="unused", max_retries=0, timeout=30) as client:
        for turn in range(12):
            messages.append({"role": "user", "content": f"question {turn}: what is the weather?"})
            for _ in range(2):  # the call, then the answer once its result is in
                stream = client.chat.completions.create(
                    model="claude", messages=messages, tools=[TOOL], stream=True, stream_options={"include_usage": True}
                )
                text, calls, finish, usage = "", {}, None, None
                for chunk in stream:
                    usage = chunk.usage or usage
                    for choice in chunk.choices:
                        text += choice.delta.content or ""
                        finish = choice.finish_reason or finish
                        for call in choice.delta.tool_calls or ():
                            entry = calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                            entry["name"] += (call.function and call.function.name) or ""
                            entry["arguments"] += (call.function and call.function.arguments) or ""
                assert usage is not None
                assert usage.prompt_tokens > 0
                if finish == "tool_calls":
                    assert text == "Let me look."
                    assert len(calls) == 1
                    call = calls[0]
                    assert json.loads(call["arguments"]) == {
                        "city": f"city {len(native.requests[-1].body['messages'])}"
                    }
                    messages.append(
                        {
                            "role": "assistant",
                            "content": text,
                            "tool_calls": [
                                {
                                    "id": call["id"],
                                    "type": "function",
                                    "function": {"name": call["name"], "arguments": call["arguments"]},
                                }
                            ],
                        }
                    )
                    messages.append({"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 °C"})
                else:
                    assert finish == "stop"
                    assert text == "It is sunny there."
                    messages.append({"role": "assistant", "content": text})
    assert len(native.requests) == 24
    assert all(request.body["stream"] is True for request in native.requests)
    assert native.rejected == []


def test_the_messages_door_streams_through_the_translation(served: ProxyServer, native: FakeAnthropicUpstream) -> None:
    with anthropic.Anthropic(base_url=served.url, api_key="unused", max_retries=0, timeout=30) as client:
        messages: list[Any] = []
        for turn in range(5):
            messages.append({"role": "user", "content": f"hello {turn}"})
            with client.messages.stream(model="claude", max_tokens=256, messages=messages) as stream:
                final = stream.get_final_message()
            text = "".join(block.text for block in final.content if block.type == "text")
            assert text == f"echo: hello {turn}"
            assert final.usage.input_tokens > 0
            messages.append({"role": "assistant", "content": text})
    assert native.rejected == []
