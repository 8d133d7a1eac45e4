"""A canonical answer as the Responses API gives it (`proxy.doors.responses.output`): the `response` object of a
chat completion, the event stream rendered from chat chunks (in the order `client.responses.stream()` checks),
a Responses-native upstream's own response under the proxy's id, and a failure as `response.failed`. Objects and
events are validated with the OpenAI SDK's own types, as a client would parse them."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from proxy.canonical.types import Chunk
from proxy.doors.event_streams import Event
from proxy.doors.responses.fields import ToolNames
from proxy.doors.responses.output import (
    EventStream,
    ResponseShape,
    completed_response,
    custom_input,
    native_event,
    native_response,
    output_items,
    responses_usage,
    status_of,
)
from proxy.errors import UpstreamError

STEP = 0x2A
TOOLS = ToolNames(
    custom=frozenset({"apply_patch", "github__comment"}),
    namespaced={"github__create_issue": ("github", "create_issue"), "github__comment": ("github", "comment")},
)
REQUEST = {
    "instructions": "Be brief.",
    "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "metadata": {"k": "v"},
    "max_output_tokens": 1000,
}
EVENTS: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)


def sdk_view(body: Event) -> Event:
    """The body as the SDK's types validate it. openai 2.54 declares `usage.input_tokens_details.cache_write_tokens`
    required, which the proxy does not send (the SDK parses responses without validating, so clients do not
    notice); it is filled in here so that everything else is validated strictly."""
    copy: Event = json.loads(json.dumps(body))
    for holder in (copy, copy.get("response")):
        usage = holder.get("usage") if isinstance(holder, dict) else None
        if isinstance(usage, dict):
            usage["input_tokens_details"].setdefault("cache_write_tokens", 0)
    return copy


def sdk_response(body: Event) -> Response:
    return Response.model_validate(sdk_view(body))


def shape(request: dict[str, Any] | None = None, tools: ToolNames = TOOLS) -> ResponseShape:
    return ResponseShape(STEP, 1_700_000_000.9, "coder", REQUEST if request is None else request, tools)


def completion(
    content: str | None, calls: Sequence[tuple[str, str, str]] = (), finish: str = "stop", usage: Any = None
) -> Chunk:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in calls
        ]
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


USAGE = {
    "prompt_tokens": 120,
    "completion_tokens": 30,
    "total_tokens": 150,
    "prompt_tokens_details": {"cached_tokens": 100},
    "completion_tokens_details": {"reasoning_tokens": 12},
}


def test_a_completion_is_a_response_object_with_the_proxy_s_ids() -> None:
    response = completed_response(
        shape(), completion("Hello.", [("call_1", "shell", '{"command":["ls"]}')], "tool_calls", USAGE)
    )
    parsed = sdk_response(response)
    assert parsed.id == "resp_000000000000002a"
    assert parsed.created_at == 1_700_000_000
    assert parsed.status == "completed"
    assert parsed.model == "coder"
    assert parsed.output_text == "Hello."
    assert response["output"] == [
        {
            "id": "msg_2a_0",
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Hello.", "annotations": []}],
        },
        {
            "id": "fc_2a_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_1",
            "name": "shell",
            "arguments": '{"command":["ls"]}',
        },
    ]
    assert response["usage"] == {
        "input_tokens": 120,
        "input_tokens_details": {"cached_tokens": 100},
        "output_tokens": 30,
        "output_tokens_details": {"reasoning_tokens": 12},
        "total_tokens": 150,
    }


def test_a_response_repeats_the_request_s_fields() -> None:
    response = completed_response(shape(), completion("ok"))
    assert response["instructions"] == "Be brief."
    assert response["metadata"] == {"k": "v"}
    assert response["max_output_tokens"] == 1000
    assert response["tools"] == REQUEST["tools"]
    assert response["parallel_tool_calls"] is False
    assert response["store"] is True  # not sent: OpenAI's default
    assert response["previous_response_id"] is None
    bare = completed_response(shape({}), completion("ok"))
    assert (bare["tools"], bare["tool_choice"], bare["parallel_tool_calls"]) == ([], "auto", True)
    assert completed_response(shape({"store": False}), completion("ok"))["store"] is False


def test_custom_and_namespaced_calls_go_back_as_the_client_s_tools() -> None:
    calls = [
        ("call_p", "apply_patch", json.dumps({"input": "*** Begin Patch\n*** End Patch"})),
        ("call_i", "github__create_issue", '{"title":"bug"}'),
        ("call_c", "github__comment", json.dumps({"input": "LGTM"})),
    ]
    output = completed_response(shape(), completion(None, calls, "tool_calls"))["output"]
    sdk_response(completed_response(shape(), completion(None, calls, "tool_calls")))
    assert output == [
        {
            "id": "ctc_2a_0",
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": "call_p",
            "name": "apply_patch",
            "input": "*** Begin Patch\n*** End Patch",
        },
        {
            "id": "fc_2a_1",
            "type": "function_call",
            "status": "completed",
            "call_id": "call_i",
            "name": "create_issue",
            "arguments": '{"title":"bug"}',
            "namespace": "github",
        },
        {
            "id": "ctc_2a_2",
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": "call_c",
            "name": "comment",
            "input": "LGTM",
            "namespace": "github",
        },
    ]


@pytest.mark.parametrize(
    ("finish", "status", "details"),
    [
        ("stop", "completed", None),
        ("tool_calls", "completed", None),
        ("length", "incomplete", {"reason": "max_output_tokens"}),
        ("content_filter", "incomplete", {"reason": "content_filter"}),
    ],
)
def test_status_follows_the_finish_reason(finish: str, status: str, details: Any) -> None:
    response = completed_response(shape(), completion("partial", finish=finish))
    assert response["status"] == status
    assert response["incomplete_details"] == details
    assert status_of(finish) == status
    sdk_response(response)


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"input": "raw text"}', "raw text"),
        ("not json", "not json"),  # a model that wrote the input bare
        ('{"other": 1}', '{"other": 1}'),
        ('{"input": 5}', '{"input": 5}'),
        ('["input"]', '["input"]'),
    ],
)
def test_custom_input(arguments: str, expected: str) -> None:
    assert custom_input(arguments) == expected


def test_usage_is_none_without_one_and_totals_when_the_upstream_gave_none() -> None:
    assert responses_usage(None) is None
    assert responses_usage({}) is None
    usage = responses_usage({"prompt_tokens": 5, "completion_tokens": 7})
    assert usage is not None
    assert usage["total_tokens"] == 12
    assert usage["input_tokens_details"] == {"cached_tokens": 0}


def test_output_items_put_text_first_and_number_calls_after_it() -> None:
    calls = [{"id": "c", "function": {"name": "shell", "arguments": "{}"}}]
    assert [item["id"] for item in output_items(shape(), "hi", calls)] == ["msg_2a_0", "fc_2a_1"]
    assert [item["id"] for item in output_items(shape(), None, calls)] == ["fc_2a_0"]
    assert output_items(shape(), "", None) == []


# --- native responses -----------------------------------------------------------------------------------------


def test_a_native_response_is_kept_whole_under_the_proxy_s_id() -> None:
    upstream = {"id": "resp_upstream", "object": "response", "status": "completed", "output": [{"x": 1}], "extra": 2}
    assert native_response(shape(), upstream) == {**upstream, "id": "resp_000000000000002a"}
    continued = shape({"previous_response_id": "resp_0000000000000029"})
    assert native_response(continued, upstream)["previous_response_id"] == "resp_0000000000000029"


def test_a_native_event_has_its_response_renamed_and_is_otherwise_as_it_came() -> None:
    created = {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_up", "status": "in_progress"}}
    assert native_event(shape(), created) == {
        **created,
        "response": {"id": "resp_000000000000002a", "status": "in_progress"},
    }
    delta = {"type": "response.output_text.delta", "sequence_number": 4, "item_id": "msg_up", "delta": "Hi"}
    assert native_event(shape(), delta) == delta
    assert EventStream(shape()).native(delta) == delta


# --- the event stream -----------------------------------------------------------------------------------------


def chunk(delta: dict[str, Any], finish: str | None = None, usage: Any = None) -> Chunk:
    out: Chunk = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    if usage is not None:
        out["usage"] = usage
    return out


def call_delta(index: int, call_id: str | None = None, name: str | None = None, arguments: str = "") -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    delta: dict[str, Any] = {"index": index, "type": "function", "function": function}
    if call_id is not None:
        delta["id"] = call_id
    return delta


def render(chunks: list[Chunk], stream: EventStream | None = None) -> list[Event]:
    stream = stream or EventStream(shape())
    return [*stream.start(), *stream.feed(chunks), *stream.finish()]


def check_stream(events: list[Event]) -> None:
    """What every client relies on: numbered in order, each event one the SDK parses."""
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    for event in events:
        EVENTS.validate_python(sdk_view(event))


def test_a_text_stream() -> None:
    events = render(
        [
            chunk({"role": "assistant", "content": "Hel"}),
            chunk({"content": "lo."}),
            chunk({}, "stop"),
            chunk({}, usage=USAGE),
        ]
    )
    check_stream(events)
    assert [event["type"] for event in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == []
    assert [event["delta"] for event in events if event["type"] == "response.output_text.delta"] == ["Hel", "lo."]
    assert events[6]["text"] == "Hello."
    assert events[8]["item"]["content"][0]["text"] == "Hello."
    final = sdk_response(events[-1]["response"])
    assert final.output_text == "Hello."
    assert final.usage is not None
    assert final.usage.output_tokens == 30
    assert {event["item_id"] for event in events[3:8]} == {"msg_2a_0"}
    assert events[2]["item"]["id"] == events[8]["item"]["id"] == "msg_2a_0"


def test_a_streamed_answer_ends_as_the_same_response_a_json_answer_is() -> None:
    calls = [("call_1", "shell", '{"command":["ls"]}')]
    stream_events = render(
        [
            chunk({"content": "Listing."}),
            chunk({"tool_calls": [call_delta(0, "call_1", "shell", "")]}),
            chunk({"tool_calls": [call_delta(0, arguments='{"command":')]}),
            chunk({"tool_calls": [call_delta(0, arguments='["ls"]}')]}),
            chunk({}, "tool_calls", USAGE),
        ]
    )
    check_stream(stream_events)
    assert stream_events[-1]["response"] == completed_response(
        shape(), completion("Listing.", calls, "tool_calls", USAGE)
    )


def test_a_tool_call_stream_closes_the_text_and_streams_its_arguments() -> None:
    events = render(
        [
            chunk({"content": "Checking."}),
            chunk({"tool_calls": [call_delta(0, "call_1", "shell", '{"command":')]}),
            chunk({"tool_calls": [call_delta(0, arguments='["ls"]}')]}),
            chunk({"tool_calls": [call_delta(1, "call_2", "github__create_issue", "{}")]}),
            chunk({}, "tool_calls"),
        ]
    )
    check_stream(events)
    kinds = [event["type"] for event in events]
    added = [event for event in events if event["type"] == "response.output_item.added"]
    assert [(event["output_index"], event["item"]["type"]) for event in added] == [
        (0, "message"),
        (1, "function_call"),
        (2, "function_call"),
    ]
    # the text item is done before the first call is announced
    assert kinds.index("response.output_item.done") < kinds.index("response.output_item.added", 3)
    deltas = [event for event in events if event["type"] == "response.function_call_arguments.delta"]
    assert [(event["item_id"], event["delta"]) for event in deltas] == [
        ("fc_2a_1", '{"command":'),
        ("fc_2a_1", '["ls"]}'),
        ("fc_2a_2", "{}"),
    ]
    dones = [event for event in events if event["type"] == "response.function_call_arguments.done"]
    assert [(event["name"], event["arguments"]) for event in dones] == [
        ("shell", '{"command":["ls"]}'),
        ("create_issue", "{}"),
    ]
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert final["output"][2]["namespace"] == "github"
    assert final["output"][1]["status"] == "completed"


def test_a_custom_tool_s_input_is_sent_whole_when_the_call_ends() -> None:
    """Codex applies a patch from `response.output_item.done`; the SDK accumulates custom_tool_call_input."""
    patch = json.dumps({"input": "*** Begin Patch\n*** End Patch"})
    events = render(
        [
            chunk({"tool_calls": [call_delta(0, "call_p", "apply_patch", patch[:10])]}),
            chunk({"tool_calls": [call_delta(0, arguments=patch[10:])]}),
            chunk({}, "tool_calls"),
        ]
    )
    check_stream(events)
    kinds = [event["type"] for event in events]
    assert "response.function_call_arguments.delta" not in kinds
    assert kinds[2:] == [
        "response.output_item.added",
        "response.custom_tool_call_input.delta",
        "response.custom_tool_call_input.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[2]["item"]["input"] == ""
    assert events[3]["delta"] == events[4]["input"] == "*** Begin Patch\n*** End Patch"
    assert events[5]["item"] == {
        "id": "ctc_2a_0",
        "type": "custom_tool_call",
        "status": "completed",
        "call_id": "call_p",
        "name": "apply_patch",
        "input": "*** Begin Patch\n*** End Patch",
    }


def test_a_stream_cut_at_max_output_tokens_ends_incomplete() -> None:
    events = render([chunk({"content": "Once upon"}), chunk({}, "length")])
    check_stream(events)
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_an_empty_answer_still_opens_and_completes() -> None:
    events = render([chunk({}, "stop")])
    check_stream(events)
    assert [event["type"] for event in events] == ["response.created", "response.in_progress", "response.completed"]
    assert events[-1]["response"]["output"] == []


def test_a_failure_closes_what_was_open_and_ends_with_response_failed() -> None:
    stream = EventStream(shape())
    events = [*stream.start(), *stream.feed([chunk({"content": "Partial"})])]
    error = UpstreamError("Rate limit reached.", status=429, code="rate_limit_exceeded")  # Codex retries on it
    events += stream.fail(error)
    check_stream(events)
    assert [event["type"] for event in events[-4:]] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.failed",
    ]
    failed = events[-1]["response"]
    assert failed["status"] == "failed"
    assert failed["error"] == {"code": "rate_limit_exceeded", "message": "Rate limit reached."}
    assert failed["output"][0]["content"][0]["text"] == "Partial"
    assert sdk_response(failed).error is not None


def test_a_failure_without_a_code_names_its_type_and_leaks_nothing_of_an_unexpected_one() -> None:
    timeout = EventStream(shape()).fail(UpstreamError("The upstream timed out.", status=504, code="upstream_timeout"))
    assert timeout[-1]["response"]["error"] == {"code": "upstream_timeout", "message": "The upstream timed out."}
    typed = EventStream(shape()).fail(UpstreamError("overloaded", status=503, error_type="overloaded_error"))
    assert typed[-1]["response"]["error"]["code"] == "overloaded_error"
    internal = EventStream(shape()).fail(RuntimeError("secret key sk-123 in a traceback"))
    assert internal[-1]["response"]["error"]["code"] == "internal_error"
    assert "sk-123" not in json.dumps(internal)


def test_the_stream_is_deterministic_so_a_replay_says_the_same() -> None:
    chunks = [
        chunk({"content": "a"}),
        chunk({"tool_calls": [call_delta(0, "c", "shell", "{}")]}),
        chunk({}, "tool_calls"),
    ]
    assert render(chunks) == render(chunks)
