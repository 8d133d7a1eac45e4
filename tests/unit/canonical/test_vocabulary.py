"""The in-band vocabulary (`proxy.canonical.vocabulary`): `chat_messages` is the one place the proxy's own keys are
taken out before a chat upstream sees a conversation, and `origin` how a proxy-written message is recognized."""

from __future__ import annotations

import copy
import operator
from typing import Any

import pytest

from proxy.canonical.pieces import Pieces
from proxy.canonical.types import Message, RawList
from proxy.canonical.vocabulary import ANSWER, ITEMS, ORIGIN, Origin, chat_messages, origin
from proxy.upstream.json_body import client_run

REASONING: dict[str, Any] = {"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAAA"}


def test_messages_without_the_proxy_s_keys_pass_unchanged() -> None:
    messages: list[Message] = [
        {"role": "system", "content": "Rules."},
        {"role": "user", "content": "hi", "name": "ann"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function", "function": {}}]},
        {"role": "tool", "tool_call_id": "c", "content": ""},
    ]
    assert chat_messages(messages) == messages


@pytest.mark.parametrize("key", [ITEMS, ANSWER, ORIGIN])
def test_every_in_band_key_is_stripped(key: str) -> None:
    value: Any = {ITEMS: [{"type": "message"}], ANSWER: {"role": "assistant"}, ORIGIN: Origin.SUMMARY}[key]
    message = {"role": "user", "content": "text", "name": "ann", key: value}
    assert chat_messages([message]) == [{"role": "user", "content": "text", "name": "ann"}]


def test_all_keys_together_are_stripped_and_the_input_is_left_as_it_was() -> None:
    messages: list[Message] = [
        {"role": "assistant", "content": "ok", ITEMS: [REASONING], ANSWER: {"x": 1}, ORIGIN: Origin.ACKNOWLEDGEMENT}
    ]
    before = copy.deepcopy(messages)
    assert chat_messages(messages) == [{"role": "assistant", "content": "ok"}]
    assert messages == before  # the stored messages keep their items


@pytest.mark.parametrize(
    "message",
    [
        {"role": "assistant", "content": None, ITEMS: [REASONING]},  # a reasoning item alone
        {"role": "assistant", "content": "", ITEMS: [{"type": "web_search_call", "id": "ws_1"}]},
        {"role": "user", "content": "", ITEMS: [{"type": "item_reference", "id": "msg_1"}]},
        {"role": "system", "content": "", ITEMS: []},  # empty instructions
        {"role": "assistant", "content": None, "tool_calls": [], ITEMS: [REASONING]},
    ],
)
def test_a_message_that_is_only_items_says_nothing_in_chat_terms_and_is_dropped(message: Message) -> None:
    assert chat_messages([{"role": "user", "content": "q"}, message]) == [{"role": "user", "content": "q"}]


def test_a_message_of_items_is_kept_when_it_has_content_tool_calls_or_is_a_tool_output() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    messages: list[Message] = [
        {"role": "assistant", "content": "text", ITEMS: [REASONING]},
        {"role": "assistant", "content": None, "tool_calls": [call], ITEMS: [REASONING]},
        # a tool output answers a call even when empty: dropping it would orphan the call
        {"role": "tool", "tool_call_id": "call_1", "content": "", ITEMS: [{"type": "function_call_output"}]},
    ]
    assert chat_messages(messages) == [
        {"role": "assistant", "content": "text"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": ""},
    ]


def test_a_proxy_message_without_items_is_kept_even_when_empty() -> None:
    acknowledgement = {"role": "assistant", "content": "", ORIGIN: Origin.ACKNOWLEDGEMENT}
    assert chat_messages([acknowledgement]) == [{"role": "assistant", "content": ""}]


def test_order_is_kept() -> None:
    messages: list[Message] = [
        {"role": "user", "content": str(index), ITEMS: []} if index % 2 else {"role": "user", "content": str(index)}
        for index in range(6)
    ]
    assert [message["content"] for message in chat_messages(messages)] == ["0", "1", "2", "3", "4", "5"]


def test_the_client_s_own_run_at_the_end_is_passed_as_it_is_and_the_rest_is_looked_at() -> None:
    sent: list[Message] = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    raw = RawList(Pieces.of(b""), sent, [0, 0])
    summary = {"role": "user", "content": "[summary]", ORIGIN: Origin.SUMMARY}
    # Equal to a client's message but another object: not the client's run, so looked at.
    marked_copy = {"role": "user", "content": "q", ITEMS: []}
    messages = [summary, marked_copy, *sent]
    run = client_run(messages, raw)
    assert run == 2
    result = chat_messages(messages, run)
    assert result == [{"role": "user", "content": "[summary]"}, {"role": "user", "content": "q"}, *sent]
    assert all(map(operator.is_, result[2:], sent))
    assert client_run(result, raw) == run  # the run keeps its place at the end: one count serves the body too
    shorter = [summary, *sent[1:]]
    assert chat_messages(shorter, client_run(shorter, raw)) == [{"role": "user", "content": "[summary]"}, sent[1]]


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        ({"role": "user", "content": "[summary]", ORIGIN: Origin.SUMMARY}, "summary"),
        ({"role": "user", "content": "[marker]", ORIGIN: Origin.MARKER}, "marker"),
        ({"role": "assistant", "content": "ok", ORIGIN: Origin.ACKNOWLEDGEMENT}, "acknowledgement"),
        ({"role": "user", "content": "passages", ORIGIN: Origin.RECALL}, "recall"),
        ({"role": "user", "content": "[Summary of earlier turns] looks like one"}, None),  # never by its text
        ({"role": "user", "content": "x", ORIGIN: 3}, None),
        ({"role": "user", "content": "x", ORIGIN: None}, None),
    ],
)
def test_origin(message: Message, expected: str | None) -> None:
    assert origin(message) == expected
