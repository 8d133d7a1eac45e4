"""Responses items ↔ chat messages (`proxy.formats.responses_items`): which items are the model's output, a run of
them as one assistant message, and a working context back as input items — each message's own items as the
client sent them, so a Responses-native upstream sees exactly what it issued (ids, encrypted reasoning)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.canonical.types import Message
from proxy.canonical.vocabulary import ITEMS, Origin
from proxy.formats.responses_items import (
    assistant_message,
    input_items,
    is_output,
    item_kind,
    output_text,
    qualified_name,
)

REASONING: dict[str, Any] = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "Look first."}],
    "encrypted_content": "gAAAA-opaque",
}
CALL: dict[str, Any] = {
    "id": "fc_1",
    "type": "function_call",
    "call_id": "call_1",
    "name": "shell",
    "arguments": '{"command":["ls"]}',
    "status": "completed",
}
PATCH: dict[str, Any] = {
    "id": "ctc_1",
    "type": "custom_tool_call",
    "call_id": "call_2",
    "name": "apply_patch",
    "input": "*** Begin Patch\n*** End Patch",
}
SAID: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "status": "completed",
    "content": [{"type": "output_text", "text": "Listing.", "annotations": []}],
}


@pytest.mark.parametrize(
    ("item", "kind"),
    [
        ({"type": "message", "role": "user", "content": "hi"}, "message"),
        ({"role": "user", "content": "hi"}, "message"),  # EasyInputMessage: no type
        ({"type": "function_call_output", "call_id": "c", "output": "ok"}, "function_call_output"),
        ({"content": "no role, no type"}, ""),
        ({"type": 5, "role": "user"}, ""),
    ],
)
def test_item_kind(item: dict[str, Any], kind: str) -> None:
    assert item_kind(item) == kind


@pytest.mark.parametrize(
    ("item", "output"),
    [
        (SAID, True),
        ({"role": "assistant", "content": "easy"}, True),
        ({"role": "user", "content": "hi"}, False),
        ({"type": "message", "role": "developer", "content": "rules"}, False),
        (REASONING, True),
        (CALL, True),
        (PATCH, True),
        ({"type": "web_search_call", "id": "ws_1", "status": "completed"}, True),  # hosted tools ride along
        ({"type": "local_shell_call", "id": "lsh_1", "call_id": "c"}, True),
        ({"type": "function_call_output", "call_id": "call_1", "output": "x"}, False),
        ({"type": "custom_tool_call_output", "call_id": "call_2", "output": "x"}, False),
        ({"type": "local_shell_call_output", "id": "lsh_1", "output": "x"}, False),
        ({"type": "item_reference", "id": "msg_0"}, False),
    ],
)
def test_is_output_says_which_items_belong_to_an_assistant_turn(item: dict[str, Any], output: bool) -> None:
    assert is_output(item) is output


def test_a_run_of_output_items_is_one_assistant_message_keeping_them_all() -> None:
    run = [REASONING, SAID, CALL, PATCH]
    message = assistant_message(run)
    assert message["role"] == "assistant"
    assert message["content"] == "Listing."
    assert message["tool_calls"] == [
        {"id": "call_1", "type": "function", "function": {"name": "shell", "arguments": '{"command":["ls"]}'}},
        {
            "id": "call_2",
            "type": "function",
            "function": {"name": "apply_patch", "arguments": json.dumps({"input": "*** Begin Patch\n*** End Patch"})},
        },
    ]
    assert message[ITEMS] == run
    assert message[ITEMS] is not run  # a copy: the caller's list may change later


def test_a_run_without_text_or_calls_has_empty_content_and_no_tool_calls() -> None:
    message = assistant_message([REASONING])
    assert message["content"] == ""  # as stored (`chain.normalize`)
    assert "tool_calls" not in message
    assert message[ITEMS] == [REASONING]


def test_texts_and_refusals_of_a_run_are_joined_in_order() -> None:
    first = {**SAID, "content": [{"type": "output_text", "text": "A"}, {"type": "refusal", "refusal": "B"}]}
    second = {"role": "assistant", "content": "C"}
    assert assistant_message([first, second])["content"] == "ABC"


def test_a_namespaced_call_is_named_namespace__name() -> None:
    call = {**CALL, "namespace": "github", "name": "create_issue"}
    assert qualified_name(call) == "github__create_issue"
    assert assistant_message([call])["tool_calls"][0]["function"]["name"] == "github__create_issue"
    assert qualified_name({"name": "shell", "namespace": ""}) == "shell"
    assert qualified_name({"name": "shell", "namespace": None}) == "shell"


def test_output_text_reads_strings_text_and_refusal_parts_only() -> None:
    assert output_text("plain") == ["plain"]
    assert output_text(None) == []
    parts = [
        {"type": "output_text", "text": "one"},
        {"type": "refusal", "refusal": "two"},
        {"type": "input_text", "text": "not the model's"},
        {"type": "output_text", "text": 3},
        "not a part",
    ]
    assert output_text(parts) == ["one", "two"]


def test_input_items_give_back_each_message_s_own_items_as_they_came() -> None:
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]}
    output = {"type": "function_call_output", "call_id": "call_1", "output": "a.py"}
    messages: list[Message] = [
        {"role": "system", "content": "Be brief.", ITEMS: []},  # instructions travel as `instructions`
        {"role": "user", "content": "list files", ITEMS: [user]},
        assistant_message([REASONING, CALL]),
        {"role": "tool", "tool_call_id": "call_1", "content": "a.py", ITEMS: [output]},
    ]
    assert input_items(messages) == [user, REASONING, CALL, output]


def test_messages_without_items_become_message_items() -> None:
    messages: list[Message] = [
        {"role": "user", "content": "[Summary of turns 1-4] ...", "origin": Origin.SUMMARY},
        {"role": "assistant", "content": "Understood.", "origin": Origin.ACKNOWLEDGEMENT},
        {"role": "assistant", "content": None, "tool_calls": []},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "c"}]},
        {"role": "tool", "tool_call_id": "call_9", "content": None},
    ]
    assert input_items(messages) == [
        {"type": "message", "role": "user", "content": "[Summary of turns 1-4] ..."},
        {"type": "message", "role": "assistant", "content": "Understood."},
        {"type": "message", "role": "assistant", "content": ""},
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": "a"}, {"type": "input_text", "text": "b"}],
        },
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "c"}]},
        {"type": "function_call_output", "call_id": "call_9", "output": ""},
    ]
