"""`proxy.doors.gemini.output`: a chat answer as a `GenerateContentResponse` and its stream, usage as
`usageMetadata`, errors in Google's shape."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.doors.gemini.output import (
    ResponseShape,
    ResponseStream,
    completed_response,
    google_error,
    usage_metadata,
)
from proxy.errors import AuthenticationFailed, InvalidRequest, NotFound, PayloadTooLarge, UpstreamError

SHAPE = ResponseShape(step_id=42, model="fake", prompt_tokens=11)
USAGE = {
    "prompt_tokens": 2000,
    "completion_tokens": 30,
    "prompt_tokens_details": {"cached_tokens": 1536},
    "completion_tokens_details": {"reasoning_tokens": 10},
}


def chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        body = {"choices": [], "usage": usage}
    return body


def test_a_completion_is_one_candidate_with_text_thoughts_and_function_calls() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}
    message = {"role": "assistant", "content": "Looking.", "reasoning_content": "Hmm.", "tool_calls": [call]}
    completion = {"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}], "usage": USAGE}
    response = completed_response(SHAPE, completion)
    (candidate,) = response["candidates"]
    assert candidate["content"] == {
        "role": "model",
        "parts": [
            {"text": "Hmm.", "thought": True},
            {"text": "Looking."},
            {"functionCall": {"id": "call_1", "name": "ls", "args": {"path": "."}}},
        ],
    }
    assert candidate["finishReason"] == "STOP"
    assert (response["responseId"], response["modelVersion"]) == (f"{42:016x}", "fake")
    assert response["usageMetadata"] == {
        "promptTokenCount": 2000,
        "candidatesTokenCount": 20,
        "totalTokenCount": 2030,
        "cachedContentTokenCount": 1536,
        "thoughtsTokenCount": 10,
    }


def test_a_length_stop_is_max_tokens_and_a_missing_usage_is_the_proxys_count() -> None:
    completion = {"choices": [{"message": {"content": "cut"}, "finish_reason": "length"}]}
    response = completed_response(SHAPE, completion)
    assert response["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert response["usageMetadata"]["promptTokenCount"] == 11
    assert usage_metadata(None, 5)["cachedContentTokenCount"] == 0


def test_a_models_arguments_that_are_not_an_object_are_kept() -> None:
    call = {"id": "c", "function": {"name": "f", "arguments": "not json"}}
    completion = {"choices": [{"message": {"tool_calls": [call]}, "finish_reason": "tool_calls"}]}
    parts = completed_response(SHAPE, completion)["candidates"][0]["content"]["parts"]
    assert parts == [{"functionCall": {"id": "c", "name": "f", "args": {"arguments": "not json"}}}]


def test_a_stream_is_a_response_per_text_delta_and_the_calls_whole_at_the_end() -> None:
    renderer = ResponseStream(SHAPE)
    events = renderer.start()
    events += renderer.feed([chunk({"role": "assistant", "content": "Hel"}), chunk({"content": "lo"})])
    first = {"index": 0, "id": "call_7", "type": "function", "function": {"name": "ls", "arguments": '{"pa'}}
    events += renderer.feed([chunk({"tool_calls": [first]})])
    events += renderer.feed([chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'th": "."}'}}]})])
    events += renderer.feed([chunk({}, "tool_calls"), chunk({}, usage=USAGE)])
    events += renderer.finish()
    texts = [event["candidates"][0]["content"]["parts"][0]["text"] for event in events[:2]]
    assert texts == ["Hel", "lo"]
    assert all("usageMetadata" not in event and "finishReason" not in event["candidates"][0] for event in events[:2])
    last = events[-1]
    assert len(events) == 3
    assert last["candidates"][0]["content"]["parts"] == [
        {"functionCall": {"id": "call_7", "name": "ls", "args": {"path": "."}}}
    ]
    assert last["candidates"][0]["finishReason"] == "STOP"
    assert last["usageMetadata"]["cachedContentTokenCount"] == 1536


def test_a_text_stream_ends_with_a_response_holding_only_the_finish_and_usage() -> None:
    renderer = ResponseStream(SHAPE)
    renderer.feed([chunk({"content": "Hi"}), chunk({}, "stop")])
    (last,) = renderer.finish()
    assert last["candidates"] == [{"index": 0, "finishReason": "STOP"}]
    assert last["usageMetadata"]["promptTokenCount"] == 11


@pytest.mark.parametrize(
    ("error", "status", "name"),
    [
        (InvalidRequest("bad"), 400, "INVALID_ARGUMENT"),
        (AuthenticationFailed("who"), 401, "UNAUTHENTICATED"),
        (NotFound("none"), 404, "NOT_FOUND"),
        (PayloadTooLarge("big"), 413, "INVALID_ARGUMENT"),
        (UpstreamError("slow down", status=429), 429, "RESOURCE_EXHAUSTED"),
        (UpstreamError("gone", status=503), 503, "UNAVAILABLE"),
    ],
)
def test_errors_are_googles_shape_with_their_status(error: Exception, status: int, name: str) -> None:
    code, body, _headers = google_error(error)
    assert code == status
    assert body == {"error": {"code": status, "message": str(error), "status": name}}


def test_an_unexpected_failure_leaks_nothing() -> None:
    code, body, _headers = google_error(RuntimeError("secret detail"))
    assert (code, body["error"]["status"]) == (500, "INTERNAL")
    assert "secret" not in body["error"]["message"]


def test_a_chat_models_reasoning_streams_as_thought_parts_before_its_text() -> None:
    renderer = ResponseStream(SHAPE)
    events = renderer.feed([chunk({"reasoning_content": "Think."}), chunk({"content": "Answer."}), chunk({}, "stop")])
    parts = [event["candidates"][0]["content"]["parts"][0] for event in events]
    assert parts == [{"text": "Think.", "thought": True}, {"text": "Answer."}]
