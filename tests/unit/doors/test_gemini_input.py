"""`proxy.doors.gemini.input`: a Gemini request's contents, system instruction, tools and generation config as
the canonical chat conversation, and the requests Google refuses refused before anything is stored."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.canonical.vocabulary import ITEMS
from proxy.config.schema import RequestLimits
from proxy.doors.gemini.input import chat_messages, count_request_conversation, parse_generate_request
from proxy.doors.resent import ResentLists
from proxy.errors import InvalidRequest

LIMITS = RequestLimits()


def parsed(body: dict[str, Any], *, stream: bool = False) -> Any:
    return parse_generate_request(json.dumps(body).encode(), "gemini-model", stream, LIMITS)


def refusal(body: dict[str, Any]) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as refused:
        parsed(body)
    assert refused.value.status == 400
    return refused.value


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "parts": [{"text": text}]}


def without_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{key: value for key, value in message.items() if key != ITEMS} for message in messages]


def test_the_model_is_the_paths_and_the_system_instruction_a_system_message() -> None:
    conversation = parsed(
        {"model": "ignored", "systemInstruction": {"parts": [{"text": "Be brief."}]}, "contents": [user("hi")]}
    )
    assert conversation.model == "gemini-model"
    assert without_items(conversation.messages) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hi"},
    ]
    assert conversation.door_state == {"door": "gemini"}
    assert parsed({"systemInstruction": "Plain.", "contents": [user("hi")]}).messages[0] == {
        "role": "system",
        "content": "Plain.",
    }


def test_a_function_calling_turn_pairs_calls_and_responses_by_id() -> None:
    call = {"functionCall": {"id": "c1", "name": "ls", "args": {"path": "."}}, "thoughtSignature": "c2ln"}
    thought = {"text": "Let me look.", "thought": True}
    contents = [
        user("List the files."),
        {"role": "model", "parts": [thought, {"text": "Looking."}, call]},
        {"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "ls", "response": {"output": "a.txt"}}}]},
    ]
    messages = chat_messages(contents)
    assert without_items(messages) == [
        {"role": "user", "content": "List the files."},
        {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path":"."}'}}],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a.txt"},
    ]
    assert messages[1][ITEMS] == [thought, {"text": "Looking."}, call]  # thoughts and signatures kept, not sent


def test_calls_without_ids_are_named_by_function_and_order_and_answered_in_the_next_turn() -> None:
    contents = [
        user("Two reads."),
        {
            "role": "model",
            "parts": [
                {"functionCall": {"name": "read", "args": {"f": "a"}}},
                {"functionCall": {"name": "read", "args": {"f": "b"}}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"name": "read", "response": {"content": "A"}}},
                {"functionResponse": {"name": "read", "response": {"content": "B"}}},
                {"text": "Now compare them."},
            ],
        },
    ]
    messages = without_items(chat_messages(contents))
    assert [call["id"] for call in messages[1]["tool_calls"]] == ["read#0", "read#1"]
    assert messages[1]["content"] is None
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "read#0", "content": "A"},
        {"role": "tool", "tool_call_id": "read#1", "content": "B"},
        {"role": "user", "content": "Now compare them."},
    ]


def test_a_results_error_says_so_and_any_other_response_is_json() -> None:
    contents = [
        user("go"),
        {
            "role": "model",
            "parts": [{"functionCall": {"id": "a", "name": "f"}}, {"functionCall": {"id": "b", "name": "g"}}],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"id": "a", "name": "f", "response": {"error": "no such file"}}},
                {"functionResponse": {"id": "b", "name": "g", "response": {"rows": [1, 2]}}},
            ],
        },
    ]
    messages = chat_messages(contents)
    assert [message["content"] for message in messages[2:]] == ["[error] no such file", '{"rows": [1, 2]}']


def test_an_image_is_a_chat_image_part() -> None:
    image = {"inlineData": {"mimeType": "image/png", "data": "iVBOR"}}
    (message,) = chat_messages([{"role": "user", "parts": [{"text": "What is this?"}, image]}])
    assert message["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
    ]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "contents"),
        ({"contents": []}, "contents"),
        ({"contents": ["hi"]}, "contents[0]"),
        ({"contents": [{"role": "system", "parts": [{"text": "x"}]}]}, "contents[0].role"),
        ({"contents": [{"role": "user"}]}, "contents[0].parts"),
        ({"contents": [{"role": "user", "parts": [{"text": 3}]}]}, "contents[0].parts[0].text"),
        (
            {"contents": [{"role": "model", "parts": [{"functionCall": {"args": {}}}]}]},
            "contents[0].parts[0].functionCall.name",
        ),
        ({"contents": [user("hi")], "generationConfig": {"maxOutputTokens": 0}}, "generationConfig.maxOutputTokens"),
        ({"contents": [user("hi")], "generationConfig": {"temperature": "hot"}}, "generationConfig.temperature"),
        (
            {"contents": [user("hi")], "tools": [{"functionDeclarations": [{"description": "x"}]}]},
            "tools[0].function_declarations[0].name",
        ),
    ],
)
def test_what_google_refuses_is_refused_naming_the_field(body: dict[str, Any], param: str) -> None:
    assert refusal(body).param == param


def test_a_call_the_conversation_goes_on_past_unanswered_is_refused_and_one_at_the_end_is_not() -> None:
    call = {"role": "model", "parts": [{"functionCall": {"id": "c9", "name": "ls"}}]}
    assert refusal({"contents": [user("a"), call, user("b")]}).param == "contents[1]"
    assert parsed({"contents": [user("a"), call]}).messages[-1]["tool_calls"][0]["id"] == "c9"
    orphan = {"role": "user", "parts": [{"functionResponse": {"id": "zz", "name": "ls", "response": {}}}]}
    assert refusal({"contents": [orphan]}).param == "contents"


def test_a_resent_conversation_is_converted_once_and_is_the_same_objects() -> None:
    resent = ResentLists().of("tenant")
    first = [user("one"), {"role": "model", "parts": [{"text": "two"}]}]
    body = json.dumps({"contents": first}).encode()
    earlier = parse_generate_request(body, "m", False, LIMITS, resent)
    longer = json.dumps({"contents": [*first, user("three")]}).encode()
    later = parse_generate_request(longer, "m", False, LIMITS, resent)
    assert later.messages[:2] == earlier.messages
    assert all(a is b for a, b in zip(later.messages, earlier.messages, strict=False))


def test_count_tokens_takes_contents_or_a_whole_generate_request() -> None:
    plain = count_request_conversation({"contents": [user("hi")]}, "m", LIMITS)
    whole = count_request_conversation(
        {"generateContentRequest": {"contents": [user("hi")], "systemInstruction": "Sys."}}, "m", LIMITS
    )
    assert without_items(plain.messages) == [{"role": "user", "content": "hi"}]
    assert [message["role"] for message in whole.messages] == ["system", "user"]
    with pytest.raises(InvalidRequest):
        count_request_conversation({}, "m", LIMITS)


def test_gemini_clis_session_context_is_a_system_message_so_a_resumed_session_is_the_same_conversation() -> None:
    context = {"text": "<session_context>\nToday is Monday. Files: a.txt\n</session_context>"}
    later = {"text": "<session_context>\nToday is Monday. Files: a.txt, b.txt\n</session_context>"}
    first = chat_messages([{"role": "user", "parts": [context, {"text": "Create b.txt."}]}])
    resumed = chat_messages([{"role": "user", "parts": [later, {"text": "Create b.txt."}]}])
    assert [message["role"] for message in first] == ["system", "user"]
    assert first[1] == resumed[1] == {"role": "user", "content": "Create b.txt.", ITEMS: [{"text": "Create b.txt."}]}
    assert first[0][ITEMS] == [context]
    quoted = chat_messages(
        [user("a"), {"role": "model", "parts": [{"text": "b"}]}, {"role": "user", "parts": [context]}]
    )
    assert quoted[-1]["role"] == "user"  # only the conversation's opening part is the client's context


def test_a_response_sent_twice_in_one_turn_is_one_tool_message() -> None:
    response = {"functionResponse": {"id": "c1", "name": "ls", "response": {"output": "a.txt"}}}
    contents = [user("ls"), {"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "ls"}}]}]
    once = chat_messages([*contents, {"role": "user", "parts": [response]}])
    twice = chat_messages([*contents, {"role": "user", "parts": [response, dict(response)]}])
    assert without_items(twice) == without_items(once)
    assert [message["role"] for message in twice] == ["user", "assistant", "tool"]


def test_a_call_answered_again_in_a_masked_form_in_the_same_turn_is_one_tool_message() -> None:
    """Gemini CLI 0.61.0 resuming a session whose old outputs it masked sends a call's response in both forms."""
    original = {"functionResponse": {"id": "c1", "name": "ls", "response": {"output": "a.txt"}}}
    masked_output = "<tool_output_masked>\na.txt\n\nOutput too large. Full output available at: /tmp/o.txt\n"
    masked = {"functionResponse": {"id": "c1", "name": "ls", "response": {"output": masked_output}}}
    contents = [user("ls"), {"role": "model", "parts": [{"functionCall": {"id": "c1", "name": "ls"}}]}]
    both = chat_messages([*contents, {"role": "user", "parts": [masked, original, masked]}])
    assert [message["role"] for message in both] == ["user", "assistant", "tool"]
    assert both[-1]["content"] == masked_output
