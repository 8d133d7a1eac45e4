"""`proxy.canonical.tool_pairs`: a tool output answers a call made before it, and a conversation goes on past a
call only once it is answered; checked past a prefix that passed as over the whole."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.canonical import tool_pairs


def _call(*ids: str) -> dict[str, Any]:
    return {"role": "assistant", "tool_calls": [{"id": call_id, "function": {"name": "f"}} for call_id in ids]}


def _output(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "r"}


USER_TURN = {"role": "user", "content": "u"}


@pytest.mark.parametrize(
    ("messages", "adjacent", "expected"),
    [
        ([USER_TURN, _call("a"), _output("a"), USER_TURN], True, None),
        ([USER_TURN, _call("a", "b"), _output("b"), USER_TURN], True, (1, ["a"])),
        ([USER_TURN, _call("a"), USER_TURN, _output("a")], True, (1, ["a"])),
        ([USER_TURN, _call("a"), USER_TURN, _output("a")], False, None),
        ([USER_TURN, _call("a"), USER_TURN], False, (1, ["a"])),
        ([USER_TURN, _call("a")], True, None),
        ([USER_TURN, _call("a", "b"), _output("a")], True, None),
        ([USER_TURN, _call("a"), _output("a"), _call("b"), {"role": "system", "content": "s"}], True, (3, ["b"])),
    ],
)
def test_unanswered_calls_are_those_the_conversation_goes_on_past(
    messages: list[dict[str, Any]], adjacent: bool, expected: tuple[int, list[str]] | None
) -> None:
    assert tool_pairs.unanswered_calls(messages, adjacent=adjacent) == expected


_PAIR_MESSAGES = st.one_of(
    st.just(USER_TURN),
    st.lists(st.sampled_from("abc"), min_size=1, max_size=2, unique=True).map(lambda ids: _call(*ids)),
    st.sampled_from("abcd").map(_output),
)


def passes(messages: list[dict[str, Any]]) -> bool:
    return tool_pairs.unanswered_output(messages) is None and tool_pairs.unanswered_calls(messages) is None


@settings(max_examples=400, deadline=None)
@given(st.lists(_PAIR_MESSAGES, max_size=9), st.lists(_PAIR_MESSAGES, max_size=9), st.data())
def test_the_pair_checks_after_a_checked_prefix_find_what_a_whole_check_finds(
    before: list[dict[str, Any]], after: list[dict[str, Any]], data: st.DataObject
) -> None:
    """A request that begins with part of a list that passed both checks is checked only past it (`start`),
    with the same outcome as a check of the whole. Passing is kept by prefixes, so the list drawn is cut to its
    longest passing prefix: every passing list can still be drawn, and no draw is thrown away."""
    before = next(before[:end] for end in range(len(before), -1, -1) if passes(before[:end]))
    start = data.draw(st.integers(0, len(before)))
    messages = [*before[:start], *after]
    assert tool_pairs.unanswered_output(messages, start) == tool_pairs.unanswered_output(messages)
    assert tool_pairs.unanswered_calls(messages, start=start) == tool_pairs.unanswered_calls(messages)


@settings(max_examples=400, deadline=None)
@given(st.lists(_PAIR_MESSAGES, max_size=9), st.lists(_PAIR_MESSAGES, max_size=9), st.data())
def test_calls_answered_anywhere_after_a_checked_prefix_are_found_as_over_the_whole(
    before: list[dict[str, Any]], after: list[dict[str, Any]], data: st.DataObject
) -> None:
    """Without `adjacent` (Responses items: an output may come after other messages), `start` is a prefix of a
    list that passed, past which that list held no tool output: checked only from its last message that is not
    a tool output on, with the same outcome."""
    before = next(
        before[:end]
        for end in range(len(before), -1, -1)
        if tool_pairs.unanswered_calls(before[:end], adjacent=False) is None
    )
    last_output = max((index + 1 for index, message in enumerate(before) if message["role"] == "tool"), default=0)
    start = data.draw(st.integers(last_output, len(before)))
    messages = [*before[:start], *after]
    found = tool_pairs.unanswered_calls(messages, adjacent=False)
    assert tool_pairs.unanswered_calls(messages, adjacent=False, start=start) == found


def test_shown_ids_are_few_and_short() -> None:
    assert tool_pairs.shown_ids(["a", "b"]) == "a, b"
    shown = tool_pairs.shown_ids(["x" * 100] * 12)
    assert shown.endswith(" (and 2 more)")
    assert shown.count("x" * tool_pairs.MAX_SHOWN_ID_CHARS + ",") == tool_pairs.MAX_SHOWN_IDS - 1
