"""An Anthropic Messages request as the canonical conversation (`proxy.doors.messages.input`): content blocks as
chat messages that keep their blocks, `tool_result` blocks as tool messages, `system` as a system message, the
fields a chat upstream takes, the request for an Anthropic upstream (`NativeRequest`), and every refusal naming
its param as Anthropic's own errors do (`messages.0.content.1`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.canonical.conversation import Conversation
from proxy.canonical.vocabulary import ITEMS, chat_messages
from proxy.config.schema import RequestLimits
from proxy.doors.messages.input import input_messages, parse_messages_request, result_text
from proxy.errors import InvalidRequest, PayloadTooLarge
from proxy.formats.anthropic_blocks import anthropic_request

LIMITS = RequestLimits()


def parse(body: dict[str, Any], *, counting: bool = False) -> Conversation:
    return parse_messages_request(json.dumps(body).encode(), LIMITS, counting=counting)


def refusal(body: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        parse(body)
    return refused.value


# What Claude Code sends after a tool round: system blocks with cache_control, the user's question, the assistant
# turn with its thinking (signed) and tool_use, and the tool_result with the next text in one user turn.
SYSTEM: list[dict[str, Any]] = [
    {"type": "text", "text": "You are Claude Code."},
    {"type": "text", "text": "Be concise.", "cache_control": {"type": "ephemeral"}},
]
THINKING: dict[str, Any] = {"type": "thinking", "thinking": "Read the file first.", "signature": "EqQBCkYIBx"}
USE: dict[str, Any] = {"type": "tool_use", "id": "toolu_01", "name": "Read", "input": {"file_path": "/repo/a.py"}}
RESULT: dict[str, Any] = {
    "type": "tool_result",
    "tool_use_id": "toolu_01",
    "content": [{"type": "text", "text": "print('hi')"}],
}
CLAUDE_CODE: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "max_tokens": 32000,
    "system": SYSTEM,
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "What does a.py do?"}]},
        {"role": "assistant", "content": [THINKING, {"type": "text", "text": "Reading it."}, USE]},
        {
            "role": "user",
            "content": [RESULT, {"type": "text", "text": "Also check b.py", "cache_control": {"type": "ephemeral"}}],
        },
    ],
    "tools": [
        {"name": "Read", "description": "Reads a file.", "input_schema": {"type": "object", "properties": {}}},
        {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
    ],
    "thinking": {"type": "enabled", "budget_tokens": 10000},
    "metadata": {"user_id": "user_abc_session_1"},
    "stream": True,
}


def test_a_claude_code_request_is_the_chat_conversation_keeping_every_block() -> None:
    conversation = parse(CLAUDE_CODE)
    turns = CLAUDE_CODE["messages"]
    assert conversation.messages == [
        {"role": "system", "content": "You are Claude Code.\nBe concise.", ITEMS: SYSTEM},
        {"role": "user", "content": "What does a.py do?", ITEMS: turns[0]["content"]},
        {
            "role": "assistant",
            "content": "Reading it.",
            "tool_calls": [
                {
                    "id": "toolu_01",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path": "/repo/a.py"}'},
                }
            ],
            ITEMS: turns[1]["content"],
        },
        {"role": "tool", "tool_call_id": "toolu_01", "content": "print('hi')", ITEMS: [RESULT]},
        {"role": "user", "content": "Also check b.py", ITEMS: [turns[2]["content"][1]]},
    ]
    # For an Anthropic upstream, the turns go back exactly as they came: signatures, cache_control and all.
    system, messages = anthropic_request(conversation.messages)
    assert system == SYSTEM
    assert messages == turns


def test_a_claude_code_request_s_fields() -> None:
    conversation = parse(CLAUDE_CODE)
    assert conversation.model == "claude-sonnet-4-5"
    assert conversation.stream is True
    assert conversation.max_output == 32000
    assert conversation.max_output_param == "max_tokens"
    assert conversation.fit_output is True  # Claude Code asks for its Claude model's limit
    assert conversation.door_state == {"door": "messages"}
    assert conversation.continues is None
    assert conversation.params == {
        "max_tokens": 32000,
        "user": "user_abc_session_1",
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "Read",
                    "parameters": {"type": "object", "properties": {}},
                    "description": "Reads a file.",
                },
            }
        ],  # the server tool is Anthropic's to run
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert conversation.identity == {key: value for key, value in CLAUDE_CODE.items() if key != "stream"}
    assert conversation.native is not None
    assert conversation.native.api == "messages"
    assert set(conversation.native.body) == {"max_tokens", "tools", "thinking", "metadata"}


def test_a_chat_upstream_sees_no_thinking() -> None:
    sent = chat_messages(parse(CLAUDE_CODE).messages)
    assert "thinking" not in json.dumps(sent)
    assert "signature" not in json.dumps(sent)


def test_a_string_and_text_blocks_are_the_same_message() -> None:
    as_string, as_blocks = input_messages(
        [
            {"role": "user", "content": "line one\nline two"},
            {"role": "user", "content": [{"type": "text", "text": "line one"}, {"type": "text", "text": "line two"}]},
        ]
    )
    assert as_string == {"role": "user", "content": "line one\nline two"}
    assert chat_messages([as_blocks]) == [as_string]


def test_several_tool_results_are_tool_messages_in_order_before_the_user_s_text() -> None:
    uses = [{**USE, "id": "toolu_a"}, {**USE, "id": "toolu_b"}]
    messages = input_messages(
        [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": uses},
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_a", "content": "A"},
                    {"type": "tool_result", "tool_use_id": "toolu_b", "content": "B", "is_error": True},
                ],
            },
        ]
    )
    assert "content" not in messages[1]  # as stored: no content beside tool calls
    assert [call["id"] for call in messages[1]["tool_calls"]] == ["toolu_a", "toolu_b"]
    assert [(message["role"], message.get("tool_call_id"), message["content"]) for message in messages[2:]] == [
        ("tool", "toolu_a", "A"),
        ("tool", "toolu_b", "[error] B"),
    ]


@pytest.mark.parametrize(
    ("block", "text"),
    [
        ({"type": "tool_result", "tool_use_id": "t", "content": "plain"}, "plain"),
        ({"type": "tool_result", "tool_use_id": "t"}, ""),
        (
            {
                "type": "tool_result",
                "tool_use_id": "t",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            "a\nb",
        ),
        ({"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}, ""),
        ({"type": "tool_result", "tool_use_id": "t", "content": "boom", "is_error": True}, "[error] boom"),
    ],
)
def test_result_text(block: dict[str, Any], text: str) -> None:
    assert result_text(block) == text


def test_images_and_documents_become_chat_parts() -> None:
    [message] = input_messages(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Compare:"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                    {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
                    {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}},
                ],
            }
        ]
    )
    assert message["content"] == [
        {"type": "text", "text": "Compare:"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        {"type": "text", "text": "[document]"},
    ]
    assert len(message[ITEMS]) == 4


def test_system_as_a_string_and_a_system_turn_inside_messages() -> None:
    conversation = parse(
        {
            "model": "m",
            "max_tokens": 100,
            "system": "Be brief.",
            "messages": [
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "text", "text": "Plan mode is on."}]},
                {"role": "system", "content": ""},
            ],
        }
    )
    assert conversation.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "Plan mode is on.", ITEMS: [{"type": "text", "text": "Plan mode is on."}]},
        {"role": "system", "content": ""},
    ]
    assert parse(
        {"model": "m", "max_tokens": 1, "system": "", "messages": [{"role": "user", "content": "x"}]}
    ).messages == [{"role": "user", "content": "x"}]


def test_chat_fields() -> None:
    params = parse(
        {
            "model": "m",
            "max_tokens": 100,
            "messages": [{"role": "user", "content": "hi"}],
            "temperature": 0.3,
            "top_p": 0.8,
            "top_k": 5,
            "stop_sequences": ["END"],
            "stream": False,
        }
    ).params
    assert params == {"max_tokens": 100, "temperature": 0.3, "top_p": 0.8, "stop": ["END"]}


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "Read"}, {"type": "function", "function": {"name": "Read"}}),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto"),
        ("any", None),
    ],
)
def test_tool_choice(choice: Any, expected: Any) -> None:
    body = {**CLAUDE_CODE, "tool_choice": choice}
    assert parse(body).params.get("tool_choice") == expected


def test_a_count_tokens_request_needs_no_max_tokens() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert parse(body, counting=True).max_output == 1
    assert refusal(body).param == "max_tokens"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"max_tokens": 10, "messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": "m", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": True, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": "10", "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
        ({"model": "m", "max_tokens": 10, "messages": []}, "messages"),
        ({"model": "m", "max_tokens": 10, "messages": {"role": "user"}}, "messages"),
        ({"model": "m", "max_tokens": 10, "messages": ["hi"]}, "messages.0"),
        ({"model": "m", "max_tokens": 10, "messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        ({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        ({"model": "m", "max_tokens": 10, "messages": [{"role": "user"}]}, "messages.0.content"),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, {"text": "b"}]}],
            },
            "messages.0.content.1",
        ),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [
                    {"role": "user", "content": "q"},
                    {"role": "assistant", "content": [{"type": "tool_use", "name": "Read"}]},
                ],
            },
            "messages.1.content.0",
        ),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [{"role": "assistant", "content": [{"type": "text", "text": 1}]}],
            },
            "messages.0.content.0.text",
        ),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}],
            },
            "messages.0.content.0.tool_use_id",
        ),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}]}
                ],
            },
            "messages",  # a result for a call never made
        ),
        ({"model": "m", "max_tokens": 10, "system": 5, "messages": [{"role": "user", "content": "x"}]}, "system"),
        ({"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        (
            {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": "x"}], "tools": {"name": "x"}},
            "tools",
        ),
        (
            {
                "model": "m",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": "x"}],
                "tools": [{"input_schema": {}}],
            },
            "tools.0.name",
        ),
    ],
)
def test_invalid_requests_are_refused_naming_the_param(body: dict[str, Any], param: str) -> None:
    refused = refusal(body)
    assert refused.param == param
    assert refused.status == 400


def test_an_orphan_tool_result_is_refused_with_anthropic_s_words() -> None:
    refused = refusal(
        {
            "model": "m",
            "max_tokens": 10,
            "messages": [
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": "x"}]}
            ],
        }
    )
    assert "toolu_x" in refused.message
    assert "tool_use" in refused.message


def test_a_user_text_block_without_string_text_is_refused_naming_the_block() -> None:
    refused = refusal(
        {"model": "m", "max_tokens": 10, "messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]}
    )
    assert refused.param == "messages.0.content.0.text"


TOOL_USE = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]}


@pytest.mark.parametrize(
    "after",
    [
        {"role": "user", "content": "next"},
        {"role": "user", "content": [{"type": "text", "text": "no result"}]},
        {"role": "assistant", "content": "x"},
    ],
)
@pytest.mark.parametrize("counting", [False, True])
def test_a_tool_use_the_next_message_does_not_answer_is_refused_with_anthropic_s_words(
    after: dict[str, Any], counting: bool
) -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "system": "s",
        "messages": [{"role": "user", "content": "hi"}, TOOL_USE, after],
    }
    with pytest.raises(InvalidRequest) as refused:
        parse(body, counting=counting)
    assert refused.value.param == "messages.1"
    assert refused.value.message == (
        "messages.1: `tool_use` ids were found without `tool_result` blocks immediately after: toolu_1. "
        "Each `tool_use` block must have a corresponding `tool_result` block in the next message."
    )


def test_a_tool_use_at_the_end_or_answered_next_is_accepted() -> None:
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}
    answered = [
        {"role": "user", "content": "hi"},
        TOOL_USE,
        {"role": "user", "content": [result, {"type": "text", "text": "go"}]},
    ]
    assert [m["role"] for m in parse({"model": "m", "max_tokens": 10, "messages": answered}).messages] == [
        "user",
        "assistant",
        "tool",
        "user",
    ]
    trailing = [{"role": "user", "content": "hi"}, TOOL_USE]
    assert len(parse({"model": "m", "max_tokens": 10, "messages": trailing}).messages) == 2


@pytest.mark.parametrize("system", ["x" * 1025, [{"type": "text", "text": "x" * 1025}]])
def test_max_message_chars_applies_to_the_system_prompt(system: Any) -> None:
    limits = RequestLimits(max_message_chars=1024)
    raw = json.dumps(
        {"model": "m", "max_tokens": 10, "system": system, "messages": [{"role": "user", "content": "hi"}]}
    )
    for counting in (False, True):
        with pytest.raises(PayloadTooLarge) as too_large:
            parse_messages_request(raw.encode(), limits, counting=counting)
        assert too_large.value.param == "system"


def test_a_system_text_block_without_string_text_is_refused_naming_it() -> None:
    body = {
        "model": "m",
        "max_tokens": 10,
        "system": [{"type": "text", "text": 1}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert refusal(body).param == "system.0.text"


def test_nan_in_a_messages_body_is_refused() -> None:
    raw = b'{"model": "m", "max_tokens": 10, "temperature": NaN, "messages": [{"role": "user", "content": "hi"}]}'
    with pytest.raises(InvalidRequest) as refused:
        parse_messages_request(raw, LIMITS)
    assert refused.value.param == "temperature"


@pytest.mark.parametrize(
    ("metadata", "param", "message"),
    [
        ({"user_id": "u", "x": [0] * 1000}, "metadata.x", "metadata.x: Extra inputs are not permitted"),
        ({"user_id": "u" * 257}, "metadata.user_id", "metadata.user_id: String should have at most 256 characters"),
        ({"user_id": 5}, "metadata.user_id", "metadata.user_id: Input should be a valid string, not a number"),
        ("u", "metadata", "metadata: Input should be a valid dictionary, not a string"),
    ],
)
def test_metadata_is_bounded_as_anthropic_bounds_it(metadata: Any, param: str, message: str) -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "metadata": metadata}
    refused = refusal(body)
    assert (refused.status, refused.param, refused.message) == (400, param, message)


def test_a_user_id_of_256_characters_is_passed_on() -> None:
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    conversation = parse({**body, "metadata": {"user_id": "u" * 256}})
    assert conversation.params["user"] == "u" * 256
