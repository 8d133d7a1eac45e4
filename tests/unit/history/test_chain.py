"""Normalization and ids of the message chain: what an SDK echoes back must land on the stored node."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.history import chain
from proxy.history.messages import StoredMessage

TOOL_CALL: dict[str, Any] = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def node(message: dict[str, Any], parent: str = "p" * 64) -> str:
    return chain.message_id(parent, chain.normalize(message))


def test_sdk_echo_of_a_text_answer_hashes_like_the_answer_built_from_the_response() -> None:
    built = {"role": "assistant", "content": "hi"}
    echoed: dict[str, Any] = {
        "role": "assistant",
        "content": "hi",
        "refusal": None,
        "annotations": [],
        "audio": None,
        "function_call": None,
        "tool_calls": None,
    }
    assert node(echoed) == node(built)
    assert chain.normalize(echoed) == built


@pytest.mark.parametrize("content", [None, ""])
def test_tool_call_answer_with_empty_or_null_content_is_one_node(content: str | None) -> None:
    built = {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL]}
    echoed = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "tool_calls": [{**TOOL_CALL, "index": 0}],
    }
    assert node(echoed) == node(built)
    assert chain.normalize(built) == {"role": "assistant", "tool_calls": [TOOL_CALL]}


def test_tool_calls_that_differ_in_arguments_or_id_are_different_nodes() -> None:
    base = {"role": "assistant", "tool_calls": [TOOL_CALL]}
    other_args = {
        "role": "assistant",
        "tool_calls": [{**TOOL_CALL, "function": {"name": "f", "arguments": "{1}"}}],
    }
    other_id = {"role": "assistant", "tool_calls": [{**TOOL_CALL, "id": "c2"}]}
    assert len({node(base), node(other_args), node(other_id)}) == 3


def test_tool_call_type_defaults_to_function() -> None:
    untyped = {"id": "c1", "function": {"name": "f", "arguments": "{}"}}
    assert node({"role": "assistant", "tool_calls": [untyped]}) == node(
        {"role": "assistant", "tool_calls": [TOOL_CALL]}
    )


def test_tool_result_keeps_its_call_id() -> None:
    result = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    assert chain.normalize(result) == result
    assert node(result) != node({**result, "tool_call_id": "c2"})


def test_empty_assistant_answer_keeps_empty_content() -> None:
    assert chain.normalize({"role": "assistant", "content": None}) == {"role": "assistant", "content": ""}
    assert node({"role": "assistant", "content": None}) == node({"role": "assistant", "content": ""})


def test_text_parts_are_not_the_plain_string_but_their_null_keys_drop() -> None:
    parts = {"role": "user", "content": [{"type": "text", "text": "hi"}]}
    with_nulls = {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": None}]}
    assert node(parts) != node({"role": "user", "content": "hi"})
    assert node(with_nulls) == node(parts)
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "u", "detail": None}}]}
    assert chain.normalize(image)["content"] == [{"type": "image_url", "image_url": {"url": "u"}}]


def test_key_order_is_irrelevant() -> None:
    a = {"role": "user", "name": "bob", "content": [{"type": "text", "text": "x"}]}
    b = {"content": [{"text": "x", "type": "text"}], "name": "bob", "role": "user"}
    assert node(a) == node(b)


def test_a_different_parent_makes_a_different_node() -> None:
    message = {"role": "user", "content": "same"}
    assert node(message, "a" * 64) != node(message, "b" * 64)


def test_ids_are_tenant_specific_from_the_root_on() -> None:
    normals = [
        chain.normalize({"role": "user", "content": "hi"}),
        chain.normalize({"role": "assistant", "content": "yo"}),
    ]
    ours, theirs = chain.chain_ids("a", normals), chain.chain_ids("b", normals)
    assert not set(ours) & set(theirs)
    assert all(len(node_id) == 64 for node_id in ours)


def test_chain_ids_continue_after_a_given_node() -> None:
    normals = [chain.normalize({"role": "user", "content": str(i)}) for i in range(4)]
    whole = chain.chain_ids("t", normals)
    assert chain.chain_ids("t", normals[2:], after=whole[1]) == whole[2:]


def test_content_is_hashed_as_text_even_with_a_lone_surrogate() -> None:
    assert node({"role": "user", "content": "\ud800"}) != node({"role": "user", "content": "\ud801"})


@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "hi", "name": "x"},
        {"role": "assistant", "content": None, "tool_calls": [TOOL_CALL], "refusal": None},
        {"role": "assistant", "content": None},
        {"role": "user", "content": [{"type": "text", "text": "a", "x": None}]},
        {"role": "assistant", "function_call": {"name": "f", "arguments": "{}"}, "content": None},
    ],
)
def test_normalize_is_idempotent(message: dict[str, Any]) -> None:
    once = chain.normalize(message)
    assert chain.normalize(once) == once


def test_derived_session_id_follows_the_anchor_and_the_tenant() -> None:
    session = chain.derived_session_id("t", "a" * 64)
    assert session.startswith("s-")
    assert len(session) == 26
    assert chain.derived_session_id("t", "a" * 64) == session
    assert chain.derived_session_id("other", "a" * 64) != session
    assert chain.derived_session_id("t", "b" * 64) != session


def test_a_system_message_is_identified_by_its_place_not_its_text() -> None:
    first = chain.normalize({"role": "system", "content": "Time: 10:00"})
    later = chain.normalize({"role": "system", "content": "Time: 10:01"})
    assert chain.message_id("p", first) == chain.message_id("p", later)
    assert chain.encode("p", first)[1] != chain.encode("p", later)[1]  # each is stored as it was sent
    developer = chain.normalize({"role": "developer", "content": "Time: 10:00"})
    assert chain.message_id("p", developer) != chain.message_id("p", first)


@pytest.mark.parametrize(
    "resent",
    [
        "line one  \nline two\t\n",
        "\n\nline one\nline two",
        "line one\r\nline two",
        "line one\n   \nline two".replace("\n   \n", "\n"),
    ],
)
def test_whitespace_a_tool_changes_when_it_restores_history_keeps_the_id(resent: str) -> None:
    original = chain.normalize({"role": "user", "content": "line one\nline two"})
    variant = chain.normalize({"role": "user", "content": resent})
    assert chain.message_id("p", variant) == chain.message_id("p", original)
    parts = chain.normalize({"role": "user", "content": [{"type": "text", "text": resent}]})
    original_parts = chain.normalize({"role": "user", "content": [{"type": "text", "text": "line one\nline two"}]})
    assert chain.message_id("p", parts) == chain.message_id("p", original_parts)


@pytest.mark.parametrize(
    "different",
    ["  line one\nline two", "line one\n\nline two", "line one line two", "line one\n    line two"],
)
def test_whitespace_that_carries_meaning_changes_the_id(different: str) -> None:
    original = chain.normalize({"role": "user", "content": "line one\nline two"})
    assert chain.message_id("p", chain.normalize({"role": "user", "content": different})) != chain.message_id(
        "p", original
    )


def test_the_conversation_ends_before_trailing_system_messages() -> None:
    def path(*roles: str) -> list[StoredMessage]:
        return [StoredMessage(str(at), None, at, role, {"role": role}, 1, 0.0) for at, role in enumerate(roles)]

    assert chain.conversation_end(path("system", "user", "assistant", "user", "system")) == 3
    assert chain.conversation_end(path("system", "user")) == 1
    assert chain.conversation_end(path("system", "developer")) == 1
