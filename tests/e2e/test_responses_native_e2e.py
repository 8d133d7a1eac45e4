"""The Responses door on a Responses-native upstream (`api: responses`): the official SDK against the served proxy
and a strict fake of OpenAI's Responses API (`tests/support/fake_responses_upstream.py`), which refuses altered
encrypted reasoning, unpaired tool outputs, reasoning without its following item, unknown item fields, any
`previous_response_id`, and prompts over its window.

Checked: what reaches the upstream is what the client sent, item for item, wherever the proxy did not compact;
the upstream's events and reasoning come back to the client as they came (under the proxy's response id); a
conversation that outgrows the window is compacted without one refusal; `previous_response_id` is resolved by
the proxy from its own history.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conftest import ServeProxy
from tests.support.fake_responses_upstream import FakeResponsesUpstream, ResponsesReply
from tests.support.proxy_server import ProxyServer

WINDOW = 4096
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture
def native() -> Iterator[FakeResponsesUpstream]:
    with FakeResponsesUpstream(context_window=WINDOW) as upstream:
        yield upstream


@pytest.fixture
def served(serve_proxy: ServeProxy, native: FakeResponsesUpstream) -> ProxyServer:
    model = {
        "name": "native",
        "model": "openai/fake-model",
        "api_base": native.url,
        "api_key": "sk-native",
        "context_window": WINDOW,
        "api": "responses",
    }
    return serve_proxy(models=[model], context={"summarizer_model": "native"})


@pytest.fixture
def sdk(served: ProxyServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=served.base_url, api_key="unused", max_retries=0, timeout=30) as client:
        yield client


def dump(items: Any) -> list[dict[str, Any]]:
    return [item.model_dump(exclude_none=True) for item in items]


def test_reasoning_comes_back_as_it_came_and_goes_up_again_byte_for_byte(
    sdk: openai.OpenAI, native: FakeResponsesUpstream
) -> None:
    items: list[Any] = [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}]
    first = sdk.responses.create(model="native", input=items, include=["reasoning.encrypted_content"], store=False)
    reasoning, message = first.output
    assert message.type == "message"
    assert reasoning.type == "reasoning"
    assert reasoning.encrypted_content in native.issued  # type: ignore[union-attr]
    assert first.output_text == "echo: hi"
    items += [item.model_dump(exclude_none=True) for item in first.output]
    items.append({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "again"}]})
    second = sdk.responses.create(model="native", input=items, include=["reasoning.encrypted_content"], store=False)
    assert second.output_text == "echo: again"
    sent = native.requests[-1].body
    assert sent["input"] == items  # every item, as the client sent it: ids, status, encrypted reasoning
    assert sent["include"] == ["reasoning.encrypted_content"]
    assert sent["store"] is False
    assert native.rejected == []


def test_a_native_stream_is_relayed_under_the_proxys_id(sdk: openai.OpenAI, native: FakeResponsesUpstream) -> None:
    with sdk.responses.stream(model="native", input="stream it") as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert final.output_text == "echo: stream it"
    assert final.id.startswith("resp_")
    assert final.id != "resp_1"  # the upstream's own id stays behind the proxy
    assert kinds[0] == "response.created"
    assert kinds[-1] == "response.completed"
    assert "response.output_item.done" in kinds
    stored = sdk.responses.retrieve(final.id)
    assert stored.output_text == "echo: stream it"
    assert [item.type for item in stored.output] == ["reasoning", "message"]  # as the upstream answered


def test_a_native_tool_loop_and_previous_response_id(sdk: openai.OpenAI, native: FakeResponsesUpstream) -> None:
    def respond(body: dict[str, Any]) -> ResponsesReply:
        last = body["input"][-1]
        if last.get("type") == "function_call_output":
            return ResponsesReply(text=f"It is {last['output']}.", reasoning=True)
        return ResponsesReply(function_calls=[("get_weather", '{"city":"Paris"}')], reasoning=True)

    native.responder = respond
    first = sdk.responses.create(model="native", input="Weather in Paris?", tools=[WEATHER_TOOL])  # type: ignore[list-item]
    call = next(item for item in first.output if item.type == "function_call")
    second = sdk.responses.create(
        model="native",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],  # type: ignore[union-attr]
        tools=[WEATHER_TOOL],  # type: ignore[list-item]
    )
    assert second.output_text == "It is sunny."
    assert second.previous_response_id == first.id
    sent = native.requests[-1].body
    assert "previous_response_id" not in sent  # resolved by the proxy: the whole conversation went up
    assert [item.get("type", "message") for item in sent["input"]] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    assert native.rejected == []


def test_a_long_native_conversation_compacts_without_a_refusal(
    served: ProxyServer, sdk: openai.OpenAI, native: FakeResponsesUpstream
) -> None:
    items: list[Any] = [{"role": "user", "content": "Remember FACT-native-77. " + "filler " * 200}]
    for turn in range(25):
        response = sdk.responses.create(model="native", input=items, store=False)
        items += dump(response.output)
        items.append({"role": "user", "content": f"turn {turn}: " + "more words " * 60})
    assert native.rejected == []
    with sqlite3.connect(served.config.store.path) as db:
        assert db.execute("SELECT COUNT(*) FROM summaries").fetchone()[0] > 0
    last = native.requests[-1].body["input"]
    assert len(last) < len(items)  # compacted
    summaries = [item for item in last if "Earlier conversation" in json.dumps(item)]
    assert summaries  # a summary item stands for what left
    assert all(item["role"] == "developer" for item in summaries)  # in place, as a developer message
    assert "Understood." not in json.dumps(last)  # no turn order to keep: no acknowledgements
