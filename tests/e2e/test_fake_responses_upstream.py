"""The fake Responses upstream itself, driven by the official `openai` SDK: its answers parse (JSON, raw event
streams, and `responses.stream`, which checks the event order), and it refuses what OpenAI refuses."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.support.fake_responses_upstream import (
    CONTEXT_EXCEEDED_MESSAGE,
    FakeResponsesUpstream,
    ResponsesReply,
    context_exceeded_body,
)

WEATHER_TOOL: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
PATCH_TOOL: Any = {"type": "custom", "name": "apply_patch", "description": "Apply a patch."}


@pytest.fixture(scope="module")
def responses_server() -> Iterator[FakeResponsesUpstream]:
    with FakeResponsesUpstream(context_window=2048) as server:
        yield server


@pytest.fixture
def upstream(responses_server: FakeResponsesUpstream) -> Iterator[FakeResponsesUpstream]:
    responses_server.reset()
    yield responses_server
    responses_server.reset()


@pytest.fixture
def sdk(upstream: FakeResponsesUpstream) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=upstream.url, api_key="test-key", max_retries=0, timeout=10) as client:
        yield client


@pytest.fixture
def http(upstream: FakeResponsesUpstream) -> Iterator[httpx.Client]:
    headers = {"Authorization": "Bearer test-key"}
    with httpx.Client(base_url=upstream.url, headers=headers, timeout=10) as client:
        yield client


def as_input(items: list[Any]) -> list[Any]:
    """Output items as the next request's input items (what a client echoes back)."""
    return [item.model_dump(exclude_none=True) for item in items]


def user(text: str) -> Any:
    """A user message item (typed Any: the SDK's input unions do not take plain dicts)."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def test_non_stream_default_answer_parses(sdk: openai.OpenAI, upstream: FakeResponsesUpstream) -> None:
    response = sdk.responses.create(model="m", input="hello there", include=["reasoning.encrypted_content"])

    assert response.id == "resp_1"
    assert response.status == "completed"
    assert response.output_text == "echo: hello there"
    reasoning, message = response.output
    assert reasoning.type == "reasoning"
    assert reasoning.id == "rs_1"
    assert reasoning.summary[0].text == "thinking..."
    assert reasoning.encrypted_content in upstream.issued
    assert message.type == "message"
    assert message.id == "msg_1"
    usage = response.usage
    assert usage is not None
    assert usage.input_tokens == upstream.count_tokens({"input": "hello there"})
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens > 0
    assert usage.input_tokens_details.cached_tokens == 0
    (received,) = upstream.requests
    assert json.loads(received.raw) == received.body
    assert received.body["input"] == "hello there"
    assert received.headers["authorization"] == "Bearer test-key"


def test_stream_has_the_full_event_order(sdk: openai.OpenAI, upstream: FakeResponsesUpstream) -> None:
    upstream.responder = lambda body: ResponsesReply(
        text="two words", function_calls=[("get_weather", '{"city": "Paris, France"}')], reasoning=True
    )
    events: list[Any] = list(
        sdk.responses.create(model="m", input=[user("weather?")], tools=[WEATHER_TOOL], stream=True)
    )

    assert [event.sequence_number for event in events] == list(range(len(events)))
    args = '{"city": "Paris, France"}'
    fragments = [args[i : i + 8] for i in range(0, len(args), 8)]
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        *["response.function_call_arguments.delta"] * len(fragments),
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == args
    completed = events[-1]
    assert completed.type == "response.completed"
    assert [item.type for item in completed.response.output] == ["reasoning", "message", "function_call"]
    call = completed.response.output[2]
    assert (call.id, call.call_id, call.name, call.arguments) == ("fc_1", "call_1", "get_weather", args)
    assert completed.response.usage is not None
    raw = upstream.requests[0].raw.decode()
    assert '"stream": true' in raw or '"stream":true' in raw


def test_sse_framing_names_each_event(http: httpx.Client) -> None:
    with http.stream("POST", "/responses", json={"model": "m", "input": "hi", "stream": True}) as answer:
        text = answer.read().decode()
    assert answer.headers["content-type"].startswith("text/event-stream")
    blocks = [block for block in text.split("\n\n") if block]
    for block in blocks:
        event_line, data_line = block.split("\n")
        assert event_line.removeprefix("event: ") == json.loads(data_line.removeprefix("data: "))["type"]
    assert "[DONE]" not in text


def test_stream_helper_accumulates_text_and_calls(sdk: openai.OpenAI, upstream: FakeResponsesUpstream) -> None:
    upstream.responder = lambda body: ResponsesReply(
        text="Let me check.", function_calls=[("get_weather", '{"city":"Oslo"}')], custom_calls=[("apply_patch", "x")]
    )
    with sdk.responses.stream(model="m", input=[user("go")], tools=[WEATHER_TOOL, PATCH_TOOL]) as stream:
        texts = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()

    assert "".join(texts) == "Let me check."
    assert final.output_text == "Let me check."
    assert [item.type for item in final.output] == ["message", "function_call", "custom_tool_call"]
    custom = final.output[2]
    assert custom.type == "custom_tool_call"
    assert (custom.id, custom.call_id, custom.input) == ("ctc_1", "call_2", "x")


def test_reasoning_blob_echoed_unchanged_is_accepted(sdk: openai.OpenAI, upstream: FakeResponsesUpstream) -> None:
    first = sdk.responses.create(model="m", input=[user("one")], store=False)
    history = [user("one"), *as_input(first.output), user("two")]

    second = sdk.responses.create(model="m", input=history, store=False)

    assert second.output_text == "echo: two"
    assert upstream.rejected == []
    assert len(upstream.issued) == 2


@pytest.mark.parametrize("tamper", ["altered", "unknown"])
def test_altered_or_unknown_reasoning_blob_is_refused(
    sdk: openai.OpenAI, upstream: FakeResponsesUpstream, tamper: str
) -> None:
    first = sdk.responses.create(model="m", input=[user("one")])
    items = as_input(first.output)
    blob = items[0]["encrypted_content"]
    items[0]["encrypted_content"] = blob[:-4] + ("AAAA" if not blob.endswith("AAAA") else "BBBB")
    if tamper == "unknown":
        items[0]["encrypted_content"] = "gAAAAABnot-one-of-ours"

    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model="m", input=[user("one"), *items, user("two")])

    assert caught.value.code == "invalid_encrypted_content"
    assert upstream.rejected[-1]["error"]["code"] == "invalid_encrypted_content"


def test_orphan_function_call_output_is_refused(sdk: openai.OpenAI, upstream: FakeResponsesUpstream) -> None:
    orphan: Any = {"type": "function_call_output", "call_id": "call_nowhere", "output": "42"}

    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model="m", input=[user("hi"), orphan])

    assert caught.value.status_code == 400
    assert upstream.rejected == [
        {
            "error": {
                "message": "No tool call found for function call output with call_id call_nowhere.",
                "type": "invalid_request_error",
                "param": "input",
                "code": None,
            }
        }
    ]


def test_output_before_its_call_is_refused(http: httpx.Client) -> None:
    call = {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"}
    output = {"type": "function_call_output", "call_id": "call_a", "output": "ok"}
    answer = http.post("/responses", json={"model": "m", "input": [user("hi"), output, call]})
    assert answer.status_code == 400
    assert "No tool call found" in answer.json()["error"]["message"]


def test_unanswered_call_is_refused(http: httpx.Client, upstream: FakeResponsesUpstream) -> None:
    call = {"type": "function_call", "call_id": "call_a", "name": "f", "arguments": "{}"}
    answer = http.post("/responses", json={"model": "m", "input": [user("hi"), call]})
    assert answer.status_code == 400
    assert answer.json()["error"]["message"] == "No tool output found for function call call_a."

    upstream.require_tool_outputs = False
    assert http.post("/responses", json={"model": "m", "input": [user("hi"), call]}).status_code == 200


def test_too_long_input_gets_the_context_error(sdk: openai.OpenAI, upstream: FakeResponsesUpstream) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model="m", input="word " * 3000)

    assert caught.value.code == "context_length_exceeded"
    assert caught.value.message == f"Error code: 400 - {context_exceeded_body()}"
    assert upstream.rejected == [context_exceeded_body()]
    assert context_exceeded_body()["error"]["message"] == CONTEXT_EXCEEDED_MESSAGE


def test_max_output_tokens_takes_room_from_the_window(sdk: openai.OpenAI, upstream: FakeResponsesUpstream) -> None:
    body: dict[str, Any] = {"model": "m", "input": "word " * 1000, "instructions": "Be brief."}
    tokens = upstream.count_tokens(body)
    assert 1000 < tokens < 2048
    sdk.responses.create(**body, max_output_tokens=2048 - tokens)

    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(**body, max_output_tokens=2048 - tokens + 1)
    assert caught.value.code == "context_length_exceeded"


def test_previous_response_id_is_refused(sdk: openai.OpenAI, upstream: FakeResponsesUpstream) -> None:
    first = sdk.responses.create(model="m", input="one", store=True)

    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(model="m", input="two", previous_response_id=first.id)

    assert caught.value.code == "previous_response_not_found"
    assert caught.value.param == "previous_response_id"


def weather_then_answer(body: dict[str, Any]) -> ResponsesReply:
    outputs = [
        item for item in body["input"] if item.get("type") in ("function_call_output", "custom_tool_call_output")
    ]
    if not outputs:
        return ResponsesReply(
            function_calls=[("get_weather", '{"city":"Oslo"}')], custom_calls=[("apply_patch", "+x")], reasoning=True
        )
    return ResponsesReply(text="results: " + ", ".join(str(item["output"]) for item in outputs))


@pytest.mark.parametrize("stream", [False, True])
def test_tool_loop(sdk: openai.OpenAI, upstream: FakeResponsesUpstream, stream: bool) -> None:
    upstream.responder = weather_then_answer
    history: list[Any] = [user("weather in Oslo?")]
    first: Any
    tools: list[Any] = [WEATHER_TOOL, PATCH_TOOL]

    if stream:
        with sdk.responses.stream(model="m", input=history, tools=tools) as events:
            first = events.get_final_response()
    else:
        first = sdk.responses.create(model="m", input=history, tools=tools)
    reasoning, call, custom = first.output
    assert call.type == "function_call"
    assert custom.type == "custom_tool_call"
    history += as_input(first.output)
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "sunny"})
    history.append({"type": "custom_tool_call_output", "call_id": custom.call_id, "output": "patched"})

    second = sdk.responses.create(model="m", input=history, tools=tools)

    assert second.output_text == "results: sunny, patched"
    assert upstream.rejected == []
    assert upstream.requests[1].body["input"][1]["encrypted_content"] == reasoning.encrypted_content


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({"input": "hi"}, "model", "missing_required_parameter"),
        ({"model": "m"}, "input", "missing_required_parameter"),
        ({"model": "m", "input": 3}, "input", "invalid_type"),
        ({"model": "m", "input": [{"type": "telepathy"}]}, "input[0].type", "invalid_value"),
        ({"model": "m", "input": [{"type": "message", "role": "robot", "content": "x"}]}, "input[0].role", None),
        ({"model": "m", "input": [{"type": "message", "role": "user"}]}, "input[0].content", None),
        (
            {"model": "m", "input": [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}]},
            "input[0].content[0].type",
            "invalid_value",
        ),
        (
            {"model": "m", "input": [user("x"), {"type": "function_call", "call_id": "c", "name": "f"}]},
            "input[1].arguments",
            "missing_required_parameter",
        ),
        ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id", None),
        ({"model": "m", "input": [{"type": "reasoning", "id": "rs_9"}]}, "input[0].summary", None),
        ({"model": "m", "input": [{"type": "custom_tool_call", "call_id": "c", "name": "p"}]}, "input[0].input", None),
        ({"model": "m", "input": "x", "max_output_tokens": 5}, "max_output_tokens", "integer_below_min_value"),
        (
            {"model": "m", "input": [{"role": "user", "content": "x", "x_proxy_note": 1}]},
            "input[0].x_proxy_note",
            "unknown_parameter",
        ),
    ],
)
def test_invalid_requests_get_openai_errors(
    http: httpx.Client, upstream: FakeResponsesUpstream, body: dict[str, Any], param: str, code: str | None
) -> None:
    answer = http.post("/responses", json=body)

    assert answer.status_code == 400
    error = answer.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    if code is not None:
        assert error["code"] == code
    assert upstream.rejected == [answer.json()]


def test_reasoning_alone_is_refused(http: httpx.Client) -> None:
    reasoning = {"type": "reasoning", "id": "rs_1", "summary": []}
    answer = http.post("/responses", json={"model": "m", "input": [user("a"), reasoning, user("b")]})
    assert answer.status_code == 400
    assert "without its required following item" in answer.json()["error"]["message"]


def test_item_reference_is_unknown(http: httpx.Client) -> None:
    answer = http.post("/responses", json={"model": "m", "input": [{"type": "item_reference", "id": "msg_1"}]})
    assert answer.status_code == 404


def test_missing_bearer_is_401(upstream: FakeResponsesUpstream) -> None:
    with httpx.Client(base_url=upstream.url, timeout=10) as bare:
        answer = bare.post("/responses", json={"model": "m", "input": "hi"})
        models = bare.get("/models", headers={"Authorization": "Basic abc"})
    assert answer.status_code == 401
    assert models.status_code == 401
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert len(upstream.requests) == 1


def test_models_lists_one(sdk: openai.OpenAI) -> None:
    assert [model.id for model in sdk.models.list()] == ["fake-model"]


def test_fail_next_is_one_shot(sdk: openai.OpenAI, upstream: FakeResponsesUpstream) -> None:
    upstream.fail_next(429)
    with pytest.raises(openai.RateLimitError):
        sdk.responses.create(model="m", input="hi")
    upstream.fail_next(500, {"error": {"message": "boom", "type": "server_error", "param": None, "code": None}})
    with pytest.raises(openai.InternalServerError, match="boom"):
        sdk.responses.create(model="m", input="hi")

    assert sdk.responses.create(model="m", input="hi").output_text == "echo: hi"
    assert upstream.rejected == []


def test_error_mid_stream_sends_response_failed(sdk: openai.OpenAI, upstream: FakeResponsesUpstream) -> None:
    upstream.error_mid_stream_after = 3
    events: list[Any] = list(sdk.responses.create(model="m", input="hi", stream=True))

    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.failed",
    ]
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.sequence_number == 3
    assert failed.response.status == "failed"
    assert failed.response.error is not None
    assert failed.response.error.code == "server_error"


def test_a_repeated_long_prefix_is_reported_cached_like_openai(
    sdk: openai.OpenAI, upstream: FakeResponsesUpstream
) -> None:
    upstream.context_window = 100_000
    instructions = "Keep every fact. " * 400
    first = sdk.responses.create(model="m", instructions=instructions, input="hi")
    second = sdk.responses.create(model="m", instructions=instructions, input="hi again")
    assert first.usage is not None
    assert second.usage is not None
    assert first.usage.input_tokens_details.cached_tokens == 0
    assert 1024 <= second.usage.input_tokens_details.cached_tokens <= first.usage.input_tokens
