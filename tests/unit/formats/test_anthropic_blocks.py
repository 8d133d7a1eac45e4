"""Anthropic content blocks ↔ chat messages (`proxy.formats.anthropic_blocks`): an assistant turn's blocks as one
chat message keeping them, and a working context back as Anthropic's `system` and alternating `messages`, each
message's own blocks as the client sent them (thinking signatures, `cache_control`)."""

from __future__ import annotations

import json
from typing import Any

from proxy.canonical.vocabulary import ITEMS, Origin
from proxy.formats.anthropic_blocks import EPHEMERAL, anthropic_request, assistant_from_blocks
from proxy.history import chain

THINKING: dict[str, Any] = {"type": "thinking", "thinking": "Check the weather tool.", "signature": "sig-abc"}
TEXT: dict[str, Any] = {"type": "text", "text": "Let me look."}
USE: dict[str, Any] = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Zürich"}}
RESULT: dict[str, Any] = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}


def test_an_assistant_turn_is_one_message_with_its_text_calls_and_blocks() -> None:
    blocks = [THINKING, TEXT, USE, {"type": "text", "text": " Done."}]
    message = assistant_from_blocks(blocks)
    assert message["role"] == "assistant"
    assert message["content"] == "Let me look. Done."
    [call] = message["tool_calls"]
    assert call["id"] == "toolu_1"
    assert call["type"] == "function"
    assert call["function"]["name"] == "weather"
    assert call["function"]["arguments"] == '{"city": "Zürich"}'  # not \u-escaped: the same text as re-sent
    assert json.loads(call["function"]["arguments"]) == {"city": "Zürich"}
    assert message[ITEMS] == blocks


def test_a_turn_is_in_its_stored_form_no_text_and_a_call_without_input_has_empty_arguments() -> None:
    """As `chain.normalize` stores it: a re-sent turn then equals its stored form as it is."""
    assert assistant_from_blocks([THINKING]) == {"role": "assistant", "content": "", ITEMS: [THINKING]}
    message = assistant_from_blocks([{"type": "tool_use", "id": "toolu_2", "name": "now"}])
    assert message["tool_calls"][0]["function"]["arguments"] == "{}"
    assert "content" not in message
    assert chain.normalize(message) == message


def test_a_working_context_goes_back_as_the_blocks_the_client_sent() -> None:
    system_blocks = [{"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}]
    user_blocks = [{"type": "text", "text": "Weather?", "cache_control": {"type": "ephemeral"}}]
    messages = [
        {"role": "system", "content": "You are Claude Code.", ITEMS: system_blocks},
        {"role": "user", "content": "Weather?", ITEMS: user_blocks},
        assistant_from_blocks([THINKING, TEXT, USE]),
        {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny", ITEMS: [RESULT]},
        {"role": "user", "content": "Thanks", ITEMS: [{"type": "text", "text": "Thanks"}]},
    ]
    system, turns = anthropic_request(messages)
    assert system == system_blocks
    assert turns == [
        {"role": "user", "content": user_blocks},
        {"role": "assistant", "content": [THINKING, TEXT, USE]},
        # the tool result and the user's text are one user turn, as Anthropic requires
        {"role": "user", "content": [RESULT, {"type": "text", "text": "Thanks"}]},
    ]


def test_plain_strings_stay_strings_and_merge_into_text_blocks_when_a_turn_has_more() -> None:
    system, turns = anthropic_request(
        [
            {"role": "system", "content": "Rules."},
            {"role": "developer", "content": "More rules."},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "one"},
            {"role": "user", "content": "two"},
        ]
    )
    assert system == [{"type": "text", "text": "Rules."}, {"type": "text", "text": "More rules."}]
    assert turns == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]},
    ]


def test_no_system_message_is_none_and_a_later_system_message_is_user_side_text() -> None:
    system, turns = anthropic_request(
        [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "Switch to plan mode."},
            {"role": "assistant", "content": "ok"},
        ]
    )
    assert system is None
    assert turns == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "Switch to plan mode."}],
        },
        {"role": "assistant", "content": "ok"},
    ]


def test_messages_from_another_door_become_blocks_from_their_chat_meaning() -> None:
    """A conversation started on the chat door (no blocks kept) continued against an Anthropic model."""
    system, turns = anthropic_request(
        [
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
            {
                "role": "assistant",
                "content": "Calling.",
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                    {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}},
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "one"},
            {"role": "tool", "tool_call_id": "c2", "content": "two"},
        ]
    )
    assert system is None
    assert turns == [
        {"role": "user", "content": [{"type": "text", "text": "a\nb"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 1}},
                {"type": "tool_use", "id": "c2", "name": "g", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
                {"type": "tool_result", "tool_use_id": "c2", "content": "two"},
            ],
        },
    ]


def test_the_proxy_s_own_messages_stand_where_they_are_and_turns_alternate() -> None:
    _system, turns = anthropic_request(
        [
            {"role": "system", "content": "Rules."},
            {"role": "user", "content": "[Summary of earlier turns] ...", "origin": Origin.SUMMARY},
            {"role": "assistant", "content": "Understood.", "origin": Origin.ACKNOWLEDGEMENT},
            {"role": "user", "content": "next question", ITEMS: [{"type": "text", "text": "next question"}]},
        ]
    )
    assert [turn["role"] for turn in turns] == ["user", "assistant", "user"]
    # The summaries' end is where the prompt stays the same until the next summary: a cache breakpoint.
    assert turns[0]["content"] == [
        {"type": "text", "text": "[Summary of earlier turns] ...", "cache_control": {"type": "ephemeral"}}
    ]
    assert turns[1]["content"] == "Understood."


def marked(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}


def test_a_breakpoint_follows_the_last_summary_only_while_the_client_leaves_room_for_one() -> None:
    summary = {"role": "user", "content": "[Summary] one", "origin": Origin.SUMMARY}
    second = {"role": "user", "content": "[Summary] two", "origin": Origin.SUMMARY}
    acknowledgement = {"role": "assistant", "content": "Understood.", "origin": Origin.ACKNOWLEDGEMENT}
    latest = {"role": "user", "content": "go on", ITEMS: [marked("go on")]}
    system = {"role": "system", "content": "Rules.", ITEMS: [marked("Rules.")]}
    tools = [{"name": "Bash", "input_schema": {}, "cache_control": {"type": "ephemeral"}}]
    context = [system, summary, acknowledgement, second, acknowledgement, latest]

    _system, turns = anthropic_request(context, tools)  # three of the client's: one more fits
    assert turns[0]["content"] == "[Summary] one"
    assert turns[2]["content"] == [marked("[Summary] two")]

    result = {"role": "tool", "tool_call_id": "toolu_1", ITEMS: [{**RESULT, "content": [marked("sunny")]}]}
    _system, turns = anthropic_request([*context[:-1], result, latest], tools)  # four already: Anthropic's limit
    assert turns[2]["content"] == "[Summary] two"

    _system, turns = anthropic_request([system, latest], tools)  # nothing of the proxy's: nothing added
    assert turns == [{"role": "user", "content": [marked("go on")]}]


def test_a_recall_gets_a_breakpoint_before_it_first_and_the_summaries_theirs_while_room_is_left() -> None:
    """What the next turn sends again ends just before the recall (for this turn only): a breakpoint there lets
    it read everything before from the cache."""
    summary = {"role": "user", "content": "[Summary] one", "origin": Origin.SUMMARY}
    acknowledgement = {"role": "assistant", "content": "Understood.", "origin": Origin.ACKNOWLEDGEMENT}
    answer = {"role": "assistant", "content": "It was Tuesday."}
    recall = {"role": "user", "content": "[Recalled] the support group", "origin": Origin.RECALL}
    latest = {"role": "user", "content": "go on"}
    system = {"role": "system", "content": "Rules.", ITEMS: [marked("Rules.")]}
    asked = {"role": "user", "content": "when?"}
    context = [system, summary, acknowledgement, asked, answer, recall, acknowledgement, latest]
    tools = [{"name": "Bash", "input_schema": {}, "cache_control": {"type": "ephemeral"}}]

    _system, turns = anthropic_request(context, tools)  # two of the client's: both fit
    assert turns[3]["content"] == [{"type": "text", "text": "It was Tuesday.", "cache_control": EPHEMERAL}]
    assert turns[0]["content"] == [{"type": "text", "text": "[Summary] one", "cache_control": EPHEMERAL}]

    many = [{**tool, "name": f"Tool{n}"} for n, tool in enumerate(tools * 2)]
    _system, turns = anthropic_request(context, many)  # three of the client's: the recall's only
    assert turns[3]["content"] == [{"type": "text", "text": "It was Tuesday.", "cache_control": EPHEMERAL}]
    assert turns[0]["content"] == "[Summary] one"


def test_an_empty_item_list_falls_back_to_the_message_s_text() -> None:
    """The Responses door's instructions carry `items: []`: continued on an Anthropic model they are its system."""
    system, turns = anthropic_request(
        [{"role": "system", "content": "Be brief.", ITEMS: []}, {"role": "user", "content": "hi", ITEMS: []}]
    )
    assert system == [{"type": "text", "text": "Be brief."}]
    assert turns == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
