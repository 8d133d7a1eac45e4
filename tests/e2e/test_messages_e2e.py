"""The Anthropic Messages door end to end: the official `anthropic` SDK against the served proxy and the strict
chat fake upstream (window, tool pairing and, where asked, strict role order enforced).

Covered: `messages.create` and `messages.stream`, a tool loop whose echoed `tool_use` lands on the stored answer,
thinking blocks kept with their turn, Claude Code's session header and `x-api-key`, `count_tokens`, a long tool
loop on a small model that compacts without a rejection, failures as Anthropic `error` events and bodies.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from typing import Any, cast

import anthropic
import httpx
import pytest

from tests.conftest import ServeProxy
from tests.reliability.support import row_counts
from tests.support.fake_upstream import FakeUpstream, Fault, Reply
from tests.support.proxy_server import ProxyServer
from tests.support.scripted_session import fact_keeping_summary, is_summarizer_request

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


@pytest.fixture
def sdk(proxy: ProxyServer) -> Iterator[anthropic.Anthropic]:
    with anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0, timeout=20) as client:
        yield client


def store(proxy: ProxyServer) -> sqlite3.Connection:
    connection = sqlite3.connect(proxy.config.store.path)
    connection.row_factory = sqlite3.Row
    return connection


def tool_reply(body: dict[str, Any]) -> Reply:
    """A tool call for a user turn, a text answer after a tool result."""
    messages = body["messages"]
    if messages[-1]["role"] == "tool":
        return Reply(content=f"The tool said: {messages[-1]['content']}")
    call = {
        "id": f"toolu_{len(messages)}",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    return Reply(tool_calls=[call], finish_reason="tool_calls")


def test_a_message_is_answered_in_anthropics_shape(sdk: anthropic.Anthropic, fake: FakeUpstream) -> None:
    raw = sdk.messages.with_raw_response.create(
        model="fake", max_tokens=100, system="Be brief.", messages=[{"role": "user", "content": "Say hello"}]
    )
    message = raw.parse()
    assert message.id.startswith("msg_")
    assert message.stop_reason == "end_turn"
    assert [block.type for block in message.content] == ["text"]
    assert message.content[0].text == "echo: Say hello"  # type: ignore[union-attr]
    assert message.usage.input_tokens > 0
    assert raw.headers["X-Session-Id"]
    assert fake.requests[-1].body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello"},
    ]
    assert fake.requests[-1].body["max_tokens"] == 100


def test_a_stream_is_anthropics_event_sequence(sdk: anthropic.Anthropic) -> None:
    with sdk.messages.stream(
        model="fake", max_tokens=100, messages=[{"role": "user", "content": "Stream please"}]
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.content[0].text == "echo: Stream please"  # type: ignore[union-attr]
    assert kinds[0] == "message_start"
    assert kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_a_tool_loop_with_thinking_lands_on_the_stored_answer(
    proxy: ProxyServer, sdk: anthropic.Anthropic, fake: FakeUpstream
) -> None:
    fake.responder = tool_reply
    headers = {"X-Claude-Code-Session-Id": "claude-session-1"}
    first = sdk.messages.create(
        model="fake",
        max_tokens=200,
        tools=[WEATHER_TOOL],
        messages=[{"role": "user", "content": "Weather?"}],
        extra_headers=headers,  # type: ignore[list-item]
    )
    assert first.stop_reason == "tool_use"
    (use,) = first.content
    assert use.type == "tool_use"
    assert use.input == {"city": "Paris"}  # type: ignore[union-attr]
    # Claude Code echoes the turn with a thinking block (from an Anthropic model) in front: kept, not sent to chat.
    assistant = [
        {"type": "thinking", "thinking": "Let me look.", "signature": "sig-abc"},
        use.model_dump(exclude_none=True),
    ]
    history: list[Any] = [
        {"role": "user", "content": [{"type": "text", "text": "Weather?"}]},
        {"role": "assistant", "content": assistant},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny"}]},  # type: ignore[union-attr]
    ]
    second = sdk.messages.create(
        model="fake", max_tokens=200, tools=[WEATHER_TOOL], messages=history, extra_headers=headers
    )  # type: ignore[list-item]
    assert second.content[0].text == "The tool said: sunny"  # type: ignore[union-attr]
    sent = fake.requests[-1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert "thinking" not in json.dumps(sent)
    with store(proxy) as db:
        assert [row["id"] for row in db.execute("SELECT id FROM sessions")] == ["claude-session-1"]
        roles = [row["role"] for row in db.execute("SELECT role FROM messages ORDER BY depth")]
        bodies = [json.loads(row["body"]) for row in db.execute("SELECT body FROM message_variants")]
    assert roles == ["user", "assistant", "tool", "assistant"]  # the echoed turn is the stored answer
    assert any(block.get("signature") == "sig-abc" for body in bodies for block in body.get("items") or [])


def test_keys_by_x_api_key_and_beta_query(serve_proxy: ServeProxy) -> None:
    proxy = serve_proxy(auth={"keys": ["k-anthropic"]})
    with anthropic.Anthropic(base_url=proxy.url, api_key="k-anthropic", max_retries=0) as client:
        assert client.beta.messages.create(
            model="fake", max_tokens=20, messages=[{"role": "user", "content": "hi"}]
        ).content
    refused = httpx.post(
        f"{proxy.url}/v1/messages",
        json={"model": "fake", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
        headers={"x-api-key": "wrong"},
        timeout=10,
    )
    assert refused.status_code == 401
    assert refused.json() == {
        "type": "error",
        "error": {"type": "authentication_error", "message": "Incorrect API key provided."},
    }


def test_count_tokens_reports_what_the_proxy_would_send(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    model = {
        "name": "small",
        "model": "openai/fake-model",
        "api_base": fake.url,
        "api_key": "k",
        "context_window": 4096,
    }
    proxy = serve_proxy(models=[model])
    with anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0) as client:
        small = client.messages.count_tokens(model="small", messages=[{"role": "user", "content": "count me"}])
        big = client.messages.count_tokens(model="small", messages=[{"role": "user", "content": "word " * 20_000}])
        schema = {"type": "object", "properties": {"command": {"type": "string", "description": "word " * 300}}}
        tools = [{"name": f"tool_{n}", "description": "word " * 200, "input_schema": schema} for n in range(2)]
        with_tools = client.messages.count_tokens(
            model="small", messages=[{"role": "user", "content": "count me"}], tools=cast(Any, tools)
        )
    assert 0 < small.input_tokens < 20
    assert big.input_tokens < 4096  # not the 20,000 the client sent: the share the proxy compacts to
    # The tools are sent with every request: they count (~1,000 tokens of descriptions and schemas here).
    assert 1_000 < with_tools.input_tokens - small.input_tokens < 1_100
    assert row_counts(proxy.config.store.path)["messages"] == 0  # counting stores nothing
    # What it counts is what the same request then sends: the proxy's count, and the upstream's within the margin.
    with anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0) as client:
        sent = client.messages.with_raw_response.create(
            model="small", max_tokens=64, messages=[{"role": "user", "content": "count me"}], tools=cast(Any, tools)
        )
    assert int(sent.headers["x-context-tokens"]) == with_tools.input_tokens
    body = fake.requests[-1].body
    assert abs(fake.prompt_tokens(body["messages"], body.get("tools")) - with_tools.input_tokens) <= 0.05 * 1_100


def test_a_long_tool_loop_on_a_small_model_compacts_without_a_rejection(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = 4096
    fake.strict_roles = True
    model = {
        "name": "small",
        "model": "openai/fake-model",
        "api_base": fake.url,
        "api_key": "k",
        "context_window": 4096,
    }
    proxy = serve_proxy(models=[model])

    def respond(body: dict[str, Any]) -> Reply:
        return fact_keeping_summary(body) if is_summarizer_request(body) else tool_reply(body)

    fake.responder = respond
    messages: list[Any] = [{"role": "user", "content": "Remember FACT-claude-42. " + "filler " * 150}]
    with anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0, timeout=30) as client:
        for turn in range(30):
            first = client.messages.create(model="small", max_tokens=256, tools=[WEATHER_TOOL], messages=messages)  # type: ignore[list-item]
            messages.append(
                {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]}
            )
            use = first.content[0]
            messages.append(
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "result " * 40}]}
            )  # type: ignore[union-attr]
            second = client.messages.create(model="small", max_tokens=256, tools=[WEATHER_TOOL], messages=messages)  # type: ignore[list-item]
            messages.append(
                {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in second.content]}
            )
            messages.append({"role": "user", "content": f"turn {turn}: continue " + "more " * 40})
    assert fake.rejected == []
    with store(proxy) as db:
        assert db.execute("SELECT COUNT(*) FROM summaries").fetchone()[0] > 0
        assert db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1
    last = [r.body["messages"] for r in fake.requests if not is_summarizer_request(r.body)][-1]
    assert any("FACT-claude-42" in json.dumps(message) for message in last)


def test_a_failure_mid_stream_is_an_error_event(proxy: ProxyServer, fake: FakeUpstream) -> None:
    fake.responder = lambda body: Reply(content="word " * 30)
    fake.fail_next(
        Fault(
            error_after_chunks=3,
            body={"error": {"message": "overloaded", "type": "server_error", "code": "overloaded"}},
        )
    )
    with httpx.stream(
        "POST",
        f"{proxy.url}/v1/messages",
        json={"model": "fake", "max_tokens": 50, "stream": True, "messages": [{"role": "user", "content": "go"}]},
        timeout=20,
    ) as response:
        text = response.read().decode()
    assert text.startswith("event: message_start")
    assert "event: error" in text
    assert "message_stop" not in text


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}, 400),
        ({"model": "fake", "max_tokens": 5, "messages": "hi"}, 400),
        ({"model": "fake", "max_tokens": 5, "messages": [{"role": "wizard", "content": "hi"}]}, 400),
        (
            {
                "model": "fake",
                "max_tokens": 5,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}
                ],
            },
            400,
        ),
        ({"model": "nope", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}, 404),
    ],
)
def test_bad_input_is_an_anthropic_error_that_stores_nothing(
    proxy: ProxyServer, body: dict[str, Any], status: int
) -> None:
    before = row_counts(proxy.config.store.path)
    response = httpx.post(f"{proxy.url}/v1/messages", json=body, timeout=10)
    assert response.status_code == status, response.text
    error = response.json()
    assert set(error) == {"type", "error"}
    assert error["type"] == "error"
    assert set(error["error"]) == {"type", "message"}
    assert row_counts(proxy.config.store.path) == before


def test_claude_codes_requests_are_served(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    """What Claude Code 2.1 sends (`bench/claude_code.py` found both): a `system` turn inside `messages`, and
    `max_tokens` sized for a Claude model (32,000), here against a 4k model; and its `HEAD /` probe."""
    model = {
        "name": "small",
        "model": "openai/fake-model",
        "api_base": fake.url,
        "api_key": "k",
        "context_window": 4096,
    }
    proxy = serve_proxy(models=[model])
    body = {
        "model": "small",
        "max_tokens": 32_000,
        "system": [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "system", "content": "Available agent types: general."},
            {"role": "user", "content": "go on"},
        ],
    }
    response = httpx.post(f"{proxy.url}/v1/messages?beta=true", json=body, timeout=20)
    assert response.status_code == 200, response.text
    sent = fake.requests[-1].body
    assert sent["max_tokens"] <= 1024  # the model's share, not Claude's 32,000
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "system", "user"]
    assert httpx.head(f"{proxy.url}/", timeout=5).status_code == 200


def words(lines: int, tag: str) -> str:
    return "".join(f"{tag} {line}: alpha beta gamma delta epsilon zeta eta theta\n" for line in range(lines))


def claude_code_sized(tool_output_lines: int) -> dict[str, Any]:
    """A request shaped as Claude Code 2.1.197 sends one: 24 tools worth ~18.6k tokens and a system prompt of
    ~7k, which leave a 32k model ~5.5k past the safety margin; the latest message is a tool output."""
    tools = [
        {"name": f"tool_{n}", "description": words(54, "use"), "input_schema": {"type": "object", "properties": {}}}
        for n in range(24)
    ]
    return {
        "model": "small",
        "max_tokens": 32_000,
        "system": [{"type": "text", "text": words(500, "rule")}],
        "tools": tools,
        "messages": [
            {"role": "user", "content": "Run the listing."},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "tool_0", "input": {}}]},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": words(tool_output_lines, "row")}
                ],
            },
        ],
    }


def test_a_client_preamble_filling_most_of_a_small_window_leaves_its_answer_the_rest(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    """Claude Code's preamble on a 32k model: its 32,000 max_tokens is lowered below the model's 4,096 to what
    the preamble leaves (a quarter of it), so the conversation keeps room for a 2.4k tool output; a tool output
    that fits beside no answer of at least 1,024 tokens is a 400 in Anthropic's shape naming the numbers."""
    model = {
        "name": "small",
        "model": "openai/fake-model",
        "api_base": fake.url,
        "api_key": "k",
        "context_window": 32_768,
    }
    fake.context_window = 32_768
    proxy = serve_proxy(models=[model])
    response = httpx.post(f"{proxy.url}/v1/messages?beta=true", json=claude_code_sized(171), timeout=30)
    assert response.status_code == 200, response.text
    sent = fake.requests[-1].body
    assert 1_024 <= sent["max_tokens"] < 1_500
    assert not fake.rejected
    response = httpx.post(f"{proxy.url}/v1/messages?beta=true", json=claude_code_sized(400), timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "most recent messages need" in error["message"]


@pytest.mark.parametrize("stream", [False, True])
def test_an_idempotency_key_retry_is_answered_from_the_journal(
    proxy: ProxyServer, fake: FakeUpstream, stream: bool
) -> None:
    body = {"model": "fake", "max_tokens": 50, "stream": stream, "messages": [{"role": "user", "content": "once"}]}
    headers = {"Idempotency-Key": f"msg-key-{stream}"}
    first = httpx.post(f"{proxy.url}/v1/messages", json=body, headers=headers, timeout=10)
    calls = len(fake.requests)
    second = httpx.post(f"{proxy.url}/v1/messages", json=body, headers=headers, timeout=10)
    assert len(fake.requests) == calls
    assert second.headers["X-Context-Replay"] == "true"
    if stream:
        assert "event: message_stop" in second.text
        assert [line for line in second.text.splitlines() if "text_delta" in line] == [
            line for line in first.text.splitlines() if "text_delta" in line
        ]
    else:
        assert first.json()["content"] == second.json()["content"]
        assert first.json()["id"] == second.json()["id"]
