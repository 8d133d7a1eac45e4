"""A Responses request as the canonical conversation (`proxy.doors.responses.input`): input items as chat messages
that keep their items — a run of output items as one assistant message, tool outputs as tool messages — with
`instructions` counted, `previous_response_id` as the continuation, and every refusal naming its param."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.canonical.conversation import Continuation
from proxy.canonical.vocabulary import ITEMS, chat_messages
from proxy.config.schema import RequestLimits
from proxy.doors.resent import RECENT_LISTS, ResentLists
from proxy.doors.responses import input as responses_input
from proxy.doors.responses.input import ResponsesRequest, echoed, parse_responses_request, parse_socket_event
from proxy.doors.responses.items import input_conversion, input_messages
from proxy.errors import InvalidRequest, PayloadTooLarge
from proxy.formats.responses_items import input_items

LIMITS = RequestLimits()


def parse(body: dict[str, Any], limits: RequestLimits = LIMITS) -> ResponsesRequest:
    return parse_responses_request(json.dumps(body).encode(), limits)


def refusal(body: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        parse(body)
    return refused.value


def user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


# What Codex CLI sends on its second turn: instructions, its developer and environment messages, the first
# exchange (reasoning with encrypted content, a shell call, its output, a custom apply_patch call and output,
# the answer) and the new question.
REASONING: dict[str, Any] = {
    "type": "reasoning",
    "id": "rs_1",
    "summary": [{"type": "summary_text", "text": "**Listing files**"}],
    "content": None,
    "encrypted_content": "gAAAAB-opaque",
}
SHELL_CALL: dict[str, Any] = {
    "type": "function_call",
    "id": "fc_1",
    "name": "shell",
    "arguments": '{"command":["ls"]}',
    "call_id": "call_shell",
}
SHELL_OUTPUT: dict[str, Any] = {"type": "function_call_output", "call_id": "call_shell", "output": "main.py\nREADME.md"}
PATCH_CALL: dict[str, Any] = {
    "type": "custom_tool_call",
    "id": "ctc_1",
    "status": "completed",
    "call_id": "call_patch",
    "name": "apply_patch",
    "input": "*** Begin Patch\n*** Add File: NOTES.md\n+hi\n*** End Patch",
}
PATCH_OUTPUT: dict[str, Any] = {
    "type": "custom_tool_call_output",
    "call_id": "call_patch",
    "output": "Success. Updated: NOTES.md",
}
ANSWER: dict[str, Any] = {
    "type": "message",
    "id": "msg_1",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Added NOTES.md.", "annotations": []}],
}
CODEX_INPUT = [
    {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "<permissions>"}]},
    user("<environment_context>cwd=/repo</environment_context>"),
    user("add a notes file"),
    REASONING,
    SHELL_CALL,
    SHELL_OUTPUT,
    PATCH_CALL,
    PATCH_OUTPUT,
    ANSWER,
    user("thanks; now run the tests"),
]
CODEX_BODY: dict[str, Any] = {
    "model": "gpt-5-codex",
    "instructions": "You are Codex, a coding agent.",
    "input": CODEX_INPUT,
    "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
    "tool_choice": "auto",
    "parallel_tool_calls": False,
    "reasoning": {"effort": "medium", "summary": "auto"},
    "store": False,
    "stream": True,
    "include": ["reasoning.encrypted_content"],
    "prompt_cache_key": "0199-thread",
}


def test_a_codex_request_is_the_chat_conversation_keeping_every_item() -> None:
    parsed = parse(CODEX_BODY)
    messages = parsed.conversation.messages
    assert messages == [
        {"role": "system", "content": "You are Codex, a coding agent.", ITEMS: []},
        {"role": "developer", "content": "<permissions>", ITEMS: [CODEX_INPUT[0]]},
        {"role": "user", "content": "<environment_context>cwd=/repo</environment_context>", ITEMS: [CODEX_INPUT[1]]},
        {"role": "user", "content": "add a notes file", ITEMS: [CODEX_INPUT[2]]},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_shell",
                    "type": "function",
                    "function": {"name": "shell", "arguments": '{"command":["ls"]}'},
                }
            ],
            ITEMS: [REASONING, SHELL_CALL],  # the reasoning stays with the call that follows it
        },
        {"role": "tool", "tool_call_id": "call_shell", "content": "main.py\nREADME.md", ITEMS: [SHELL_OUTPUT]},
        {
            "role": "assistant",
            "tool_calls": [
                {
                    "id": "call_patch",
                    "type": "function",
                    "function": {"name": "apply_patch", "arguments": json.dumps({"input": PATCH_CALL["input"]})},
                }
            ],
            ITEMS: [PATCH_CALL],
        },
        {"role": "tool", "tool_call_id": "call_patch", "content": "Success. Updated: NOTES.md", ITEMS: [PATCH_OUTPUT]},
        {"role": "assistant", "content": "Added NOTES.md.", ITEMS: [ANSWER]},
        {"role": "user", "content": "thanks; now run the tests", ITEMS: [CODEX_INPUT[9]]},
    ]
    # For a Responses-native upstream, the items go back exactly as they came (encrypted reasoning included).
    assert input_items(messages) == CODEX_INPUT


def test_a_codex_request_s_delivery_session_and_native_fields() -> None:
    parsed = parse(CODEX_BODY)
    conversation = parsed.conversation
    assert conversation.model == "gpt-5-codex"
    assert conversation.stream is True
    assert conversation.instructions == 1
    assert conversation.door_state == {
        "door": "responses",
        "store": False,
        "request": echoed(CODEX_BODY),
        "input_from": 1,
    }
    assert conversation.continues is None
    assert parsed.session_key == "0199-thread"
    assert conversation.identity == {key: value for key, value in CODEX_BODY.items() if key != "stream"}
    assert conversation.native is not None
    assert conversation.native.api == "responses"
    assert set(conversation.native.body) == set(CODEX_BODY) - {"model", "input", "stream"}
    assert conversation.params["reasoning_effort"] == "medium"
    assert conversation.params["stream_options"] == {"include_usage": True}
    assert parsed.body == CODEX_BODY


def test_a_run_of_output_items_is_one_assistant_message_and_a_user_item_ends_it() -> None:
    said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]}
    second_call = {**SHELL_CALL, "call_id": "call_2", "id": "fc_2"}
    messages = input_messages([user("go"), REASONING, said, SHELL_CALL, second_call, user("stop"), said])
    assert [message["role"] for message in messages] == ["user", "assistant", "user", "assistant"]
    run = messages[1]
    assert run["content"] == "Checking."
    assert [call["id"] for call in run["tool_calls"]] == ["call_shell", "call_2"]
    assert run[ITEMS] == [REASONING, said, SHELL_CALL, second_call]
    assert messages[3][ITEMS] == [said]


def test_an_easy_input_message_and_text_parts_are_the_same_message() -> None:
    """The SDK sends a string, Codex sends input_text parts: they must be the same node in the history."""
    easy, typed, parts = input_messages(
        [
            {"role": "user", "content": "line one\nline two"},
            {"type": "message", "role": "user", "content": "line one\nline two"},
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "line one"}, {"type": "input_text", "text": "line two"}],
            },
        ]
    )
    assert chat_messages([easy]) == chat_messages([typed]) == chat_messages([parts])
    assert easy == {
        "role": "user",
        "content": "line one\nline two",
        ITEMS: [{"role": "user", "content": "line one\nline two"}],
    }


def test_an_assistant_easy_input_message_with_string_content_is_accepted() -> None:
    parsed = parse(
        {
            "model": "m",
            "input": [
                {"role": "user", "content": "Hi, I am Ann."},
                {"role": "assistant", "content": "Hello Ann!"},
                {"role": "user", "content": "What is my name?"},
            ],
        }
    )
    assert parsed.conversation.messages[1] == {
        "role": "assistant",
        "content": "Hello Ann!",
        ITEMS: [{"role": "assistant", "content": "Hello Ann!"}],
    }


def test_images_and_files_become_chat_parts() -> None:
    [message] = input_messages(
        [
            {
                "type": "message",
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is in these?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,iVBOR", "detail": "high"},
                    {"type": "input_image", "file_id": "file-img"},
                    {"type": "input_file", "file_id": "file-pdf", "filename": "a.pdf"},
                ],
            }
        ]
    )
    assert message["content"] == [
        {"type": "text", "text": "What is in these?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR", "detail": "high"}},
        {"type": "image_url", "image_url": {"url": "file-img"}},
        {"type": "file", "file": {"file_id": "file-pdf", "filename": "a.pdf"}},
    ]


def test_a_tool_output_of_parts_is_its_text_and_an_unknown_item_is_kept_as_it_came() -> None:
    output = {
        "type": "function_call_output",
        "call_id": "call_shell",
        "output": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
    }
    reference = {"type": "item_reference", "id": "msg_0"}
    messages = input_messages([SHELL_CALL, output, reference])
    assert messages[1] == {"role": "tool", "tool_call_id": "call_shell", "content": "a\nb", ITEMS: [output]}
    assert messages[2] == {"role": "user", "content": "", ITEMS: [reference]}
    assert chat_messages(messages[2:]) == []  # nothing in chat terms: a chat upstream does not see it


def test_a_string_input_is_one_user_message() -> None:
    parsed = parse({"model": "m", "input": "Hello", "instructions": "Be brief."})
    assert parsed.conversation.messages == [
        {"role": "system", "content": "Be brief.", ITEMS: []},
        {"role": "user", "content": "Hello"},
    ]
    assert parsed.conversation.instructions == 1
    assert parsed.conversation.stream is False
    assert parsed.conversation.door_state["store"] is True
    assert parsed.session_key is None


@pytest.mark.parametrize("instructions", [None, ""])
def test_no_instructions_count_none(instructions: str | None) -> None:
    body: dict[str, Any] = {"model": "m", "input": "hi"}
    if instructions is not None:
        body["instructions"] = instructions
    conversation = parse(body).conversation
    assert conversation.instructions == 0
    assert conversation.door_state["input_from"] == 0
    assert conversation.messages == [{"role": "user", "content": "hi"}]


def test_previous_response_id_is_the_continuation() -> None:
    conversation = parse({"model": "m", "input": "more", "previous_response_id": "resp_00000000000000a1"}).conversation
    assert conversation.continues == Continuation(0xA1, "responses", "resp_00000000000000a1", "previous_response_id")


def test_a_previous_response_id_alone_continues_with_no_input_of_its_own() -> None:
    """The Agents SDK's compaction session compacts with `previous_response_id` and no `input`."""
    conversation = parse({"model": "m", "previous_response_id": "resp_00000000000000a1"}).conversation
    assert conversation.messages == []
    assert conversation.continues == Continuation(0xA1, "responses", "resp_00000000000000a1", "previous_response_id")
    assert refusal({"model": "m"}).message == "Missing required parameter: 'input'."


def test_a_previous_response_id_the_proxy_did_not_issue_continues_no_step() -> None:
    conversation = parse({"model": "m", "input": "more", "previous_response_id": "resp_abc"}).conversation
    assert conversation.continues == Continuation(None, "responses", "resp_abc", "previous_response_id")


def test_a_tool_output_without_its_call_is_refused_unless_a_previous_response_may_hold_the_call() -> None:
    body = {"model": "m", "input": [SHELL_OUTPUT]}
    refused = refusal(body)
    assert refused.param == "input"
    assert "call_shell" in refused.message
    continued = parse({**body, "previous_response_id": "resp_0000000000000001"}).conversation
    assert continued.messages[0]["role"] == "tool"


def test_max_output_tokens_is_the_output_to_reserve() -> None:
    conversation = parse({"model": "m", "input": "hi", "max_output_tokens": 2048}).conversation
    assert conversation.max_output == 2048
    assert conversation.max_output_param == "max_output_tokens"
    assert conversation.params["max_tokens"] == 2048
    assert parse({"model": "m", "input": "hi"}).conversation.max_output is None


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi"}, "model"),
        ({"model": "", "input": "hi"}, "model"),
        ({"model": "m"}, "input"),
        ({"model": "m", "input": 3}, "input"),
        ({"model": "m", "input": []}, "input"),
        ({"model": "m", "input": "hi", "instructions": ["a"]}, "instructions"),
        ({"model": "m", "input": [], "instructions": "only rules"}, "input"),
        ({"model": "m", "input": [{"role": "developer", "content": "only rules"}]}, "input"),
        ({"model": "m", "input": [user("a"), "b"]}, "input[1]"),
        ({"model": "m", "input": [{"content": "no type, no role"}]}, "input"),
        ({"model": "m", "input": [{"type": "message", "role": "tool", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"type": "message", "role": "user", "content": 5}]}, "input[0].content"),
        (
            {"model": "m", "input": [{"type": "message", "role": "user", "content": [{"text": "x"}]}]},
            "input[0].content[0]",
        ),
        ({"model": "m", "input": [user("a"), {**SHELL_CALL, "call_id": 1}]}, "input[1].call_id"),
        ({"model": "m", "input": [user("a"), {**SHELL_CALL, "name": None}]}, "input[1].name"),
        ({"model": "m", "input": [user("a"), {**SHELL_CALL, "arguments": {"command": "ls"}}]}, "input[1].arguments"),
        ({"model": "m", "input": [user("a"), {**PATCH_CALL, "input": None}]}, "input[1].input"),
        ({"model": "m", "input": [{**SHELL_OUTPUT, "call_id": None}]}, "input[0].call_id"),
        ({"model": "m", "input": [SHELL_CALL, {**SHELL_OUTPUT, "output": 3}]}, "input[1].output"),
        ({"model": "m", "input": [SHELL_CALL, {**SHELL_OUTPUT, "output": [{"text": "x"}]}]}, "input[1].output[0]"),
        ({"model": "m", "input": "hi", "previous_response_id": 7}, "previous_response_id"),
        ({"model": "m", "input": "hi", "store": "yes"}, "store"),
        ({"model": "m", "input": "hi", "stream": 1}, "stream"),
        ({"model": "m", "input": "hi", "max_output_tokens": 15}, "max_output_tokens"),
        ({"model": "m", "input": "hi", "max_output_tokens": True}, "max_output_tokens"),
        ({"model": "m", "input": "hi", "max_output_tokens": 100.5}, "max_output_tokens"),
        ({"model": "m", "input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ],
)
def test_invalid_requests_are_refused_naming_the_param(body: dict[str, Any], param: str) -> None:
    refused = refusal(body)
    assert refused.param == param
    assert refused.status == 400


def test_the_body_must_be_a_json_object() -> None:
    with pytest.raises(InvalidRequest):
        parse_responses_request(b"[1, 2]", LIMITS)
    with pytest.raises(InvalidRequest):
        parse_responses_request(b"{not json", LIMITS)


def test_the_request_limits_apply_to_input_items() -> None:
    limits = RequestLimits(max_body_bytes=1 << 20, max_messages=2, max_message_chars=1024, max_answer_chars=1024)
    with pytest.raises(InvalidRequest) as too_many:
        parse({"model": "m", "input": [user("a"), user("b"), user("c")]}, limits)
    assert too_many.value.param == "input"
    assert too_many.value.code == "array_above_max_length"
    with pytest.raises(PayloadTooLarge) as too_large:
        parse({"model": "m", "input": [user("a"), user("x" * 2000)]}, limits)
    assert too_large.value.param == "input[1]"


def test_echoed_keeps_only_the_fields_a_response_repeats() -> None:
    assert echoed(CODEX_BODY) == {
        "instructions": "You are Codex, a coding agent.",
        "reasoning": {"effort": "medium", "summary": "auto"},
        "store": False,
        "prompt_cache_key": "0199-thread",
        "tools": CODEX_BODY["tools"],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
    }


@pytest.mark.parametrize("role", [{"a": 1}, ["user"], 1, True])
@pytest.mark.parametrize("kind", ["message", "other_item", None])
def test_an_item_role_that_is_not_a_string_is_refused_naming_it(role: Any, kind: str | None) -> None:
    item = {"role": role, "content": "x"} if kind is None else {"type": kind, "role": role, "content": "x"}
    assert refusal({"model": "m", "input": [user("hi"), item]}).param == "input[1].role"


@pytest.mark.parametrize(
    ("part", "param"),
    [
        ({"type": "banana", "text": "x"}, "input[0].content[0].type"),
        ({"type": "image_url", "image_url": {"url": "u"}}, "input[0].content[0].type"),
        ({"type": "input_text", "text": 5}, "input[0].content[0].text"),
        ({"type": "input_text"}, "input[0].content[0].text"),
        ({"type": "refusal", "refusal": ["no"]}, "input[0].content[0].refusal"),
        ({"type": "input_image", "image_url": {"url": "u"}}, "input[0].content[0].image_url"),
        ({"type": "input_audio", "input_audio": "AAAA"}, "input[0].content[0].input_audio"),
    ],
)
def test_a_content_part_the_door_cannot_take_is_refused_naming_it(part: dict[str, Any], param: str) -> None:
    assert refusal({"model": "m", "input": [{"role": "user", "content": [part]}]}).param == param


def test_a_tool_output_part_with_text_that_is_not_a_string_is_refused() -> None:
    output = {**SHELL_OUTPUT, "output": [{"type": "input_text", "text": None}]}
    assert refusal({"model": "m", "input": [user("hi"), SHELL_CALL, output]}).param == "input[2].output[0].text"


@pytest.mark.parametrize(
    "after",
    [[user("next")], [{"role": "developer", "content": "d"}], [{"role": "assistant", "content": "x"}, user("next")]],
)
def test_a_call_the_conversation_goes_on_past_unanswered_is_refused_with_openai_s_words(
    after: list[dict[str, Any]],
) -> None:
    refused = refusal({"model": "m", "input": [user("hi"), SHELL_CALL, *after]})
    assert refused.param == "input"
    assert refused.message == "No tool output found for function call call_shell."
    custom = {"type": "custom_tool_call", "call_id": "call_patch", "name": "apply_patch", "input": "*** Begin"}
    refused = refusal({"model": "m", "input": [user("hi"), custom, *after]})
    assert refused.message == "No tool output found for custom tool call call_patch."
    continued = {"model": "m", "input": [SHELL_CALL, *after], "previous_response_id": "resp_0000000000000001"}
    assert refusal(continued).message == "No tool output found for function call call_shell."


def test_a_call_answered_later_or_at_the_end_is_accepted() -> None:
    later = [user("hi"), SHELL_CALL, {"role": "assistant", "content": "x"}, SHELL_OUTPUT, user("next")]
    assert len(parse({"model": "m", "input": later}).conversation.messages) == 4
    assert len(parse({"model": "m", "input": [user("hi"), SHELL_CALL]}).conversation.messages) == 2


@pytest.mark.parametrize("field", ["input", "instructions"])
def test_max_message_chars_applies_to_a_string_input_and_the_instructions(field: str) -> None:
    limits = RequestLimits(max_message_chars=1024)
    body = {"model": "m", "input": "hi", field: "x" * 1025}
    with pytest.raises(PayloadTooLarge) as too_large:
        parse(body, limits)
    assert too_large.value.param == field
    assert too_large.value.code == "message_too_large"
    parse({**body, field: "x" * 1024}, limits)


def test_infinity_in_a_responses_body_is_refused() -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_responses_request(b'{"model": "m", "input": "hi", "temperature": Infinity}', LIMITS)
    assert refused.value.param == "temperature"


def socket_event(**body: Any) -> bytes:
    return json.dumps({"type": "response.create", "model": "m", **body}).encode()


def test_a_socket_event_re_sending_an_earlier_ones_input_converts_only_what_is_new(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Codex opens a socket per turn and sends the whole input first: read after the door's kept events, as an
    HTTP request is, the items the last turn sent are neither parsed nor converted again, and their messages are
    the very objects they were."""
    converted: list[int] = []

    def counting(elements: Any, first: int) -> Any:
        converted.append(len(elements))
        return input_conversion(elements, first)

    monkeypatch.setattr(responses_input, "input_conversion", counting)
    lists = ResentLists().of("tenant")
    first = parse_socket_event(socket_event(input=[user("one")]), LIMITS, lists).conversation
    call = {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"}
    items = [user("one"), call, {"type": "function_call_output", "call_id": "c1", "output": "ok"}, user("two")]
    second = parse_socket_event(socket_event(input=items), LIMITS, lists).conversation

    assert converted == [1, 3]
    assert second.messages[0] is first.messages[0]


def test_a_socket_event_continuing_a_response_is_not_kept() -> None:
    """It holds only what is new since the response: no later event begins with it, and kept, the several Codex
    sends in a turn would push out the whole input its next turn is read after."""
    lists = ResentLists().of("tenant")
    parse_socket_event(socket_event(input=[user("one")]), LIMITS, lists)
    output = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
    for _ in range(RECENT_LISTS):
        parse_socket_event(socket_event(input=[output], previous_response_id="resp_0000000000000001"), LIMITS, lists)

    assert len(lists.earlier()) == 1
