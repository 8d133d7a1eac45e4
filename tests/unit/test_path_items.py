"""Pinned positions of a path (`proxy.compaction.path_items`): by the API or by `context.pin_patterns`, and with
their whole tool groups as the pin views show them."""

from __future__ import annotations

import re
from typing import Any

from proxy.compaction.path_items import pinned_groups, pinned_positions
from proxy.history.messages import StoredMessage

CALL = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
MESSAGES: list[dict[str, Any]] = [
    {"role": "user", "content": "the launch code is in the blue folder"},
    {"role": "assistant", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "c1", "content": "folder: blue"},
    {"role": "assistant", "content": "done"},
]
PATH = [
    StoredMessage(f"m{position}", None, position, message["role"], message, 10, 0.0)
    for position, message in enumerate(MESSAGES)
]
LAUNCH = (re.compile("launch code"),)


def test_positions_are_pinned_by_the_api_or_a_pattern_and_the_api_wins() -> None:
    assert pinned_positions(PATH, {"m3"}, LAUNCH) == {0: "pattern", 3: "api"}
    assert pinned_positions(PATH, {"m0"}, LAUNCH) == {0: "api"}
    assert pinned_positions(PATH, frozenset(), ()) == {}
    other_texts = [{"role": "user", "content": "nothing"}, *MESSAGES[1:]]
    assert pinned_positions(PATH, frozenset(), LAUNCH, other_texts) == {}


def test_a_pin_takes_its_whole_tool_group() -> None:
    assert pinned_groups(PATH, {"m2"}, ()) == {1: "api", 2: "api"}
    assert pinned_groups(PATH, {"m1"}, LAUNCH) == {0: "pattern", 1: "api", 2: "api"}
