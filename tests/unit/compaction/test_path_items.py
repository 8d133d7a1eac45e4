"""Pinned positions of a path (`proxy.compaction.path_items`): by the API or by `context.pin_patterns`, and with
their whole tool groups as the pin views show them."""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.compaction.groups import Cuts
from proxy.compaction.path_items import PathReader, pinned_groups, pinned_positions
from proxy.compaction.spans import CompactionRequest
from proxy.compaction.stubs import tool_stub, tool_stubs
from proxy.config.models import ModelEntry
from proxy.config.schema import SUMMARIZE, TOOL_RESULTS, ContextConfig
from proxy.history.messages import StoredMessage, StoredPath
from proxy.history.pins import Pins

ENTRY = ModelEntry(name="chat", model="openai/fake-model")

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


def forward_stubs(messages: list[dict[str, Any]], wanted: set[int]) -> dict[int, str]:
    """The stubs as named by walking the path forward, every call remembered by id (the definition)."""
    calls: dict[str, tuple[str | None, str | None]] = {}
    found: dict[int, str] = {}
    for position, message in enumerate(messages):
        if message.get("role") == "tool" and position in wanted:
            name, arguments = calls.get(str(message.get("tool_call_id")), (None, None))
            found[position] = tool_stub(str(message.get("content")), name, arguments)
        for call in message.get("tool_calls") or ():
            calls[str(call["id"])] = (str(call["function"]["name"]), call["function"]["arguments"])
    return found


def agent_message(rng: random.Random, number: int) -> dict[str, Any]:
    """A user turn, an assistant's calls (ids reused across turns, as some local servers do), or a tool output."""
    kind = rng.choice(["user", "calls", "tool", "tool"])
    if kind == "user":
        return {"role": "user", "content": f"turn {number}"}
    if kind == "calls":
        ids = rng.sample(["call_0", "call_1", "call_2"], rng.randint(1, 2))
        calls = [
            {"id": i, "type": "function", "function": {"name": f"f{number}", "arguments": f'{{"n": {number}}}'}}
            for i in ids
        ]
        return {"role": "assistant", "tool_calls": calls}
    output = "\n".join(f"line {line} of output {number}" for line in range(rng.randint(1, 30)))
    return {"role": "tool", "tool_call_id": rng.choice(["call_0", "call_1", "call_2", "call_9"]), "content": output}


@given(seed=st.integers(0, 10_000), size=st.integers(1, 40))
def test_stubs_name_the_nearest_call_before_them(seed: int, size: int) -> None:
    rng = random.Random(seed)
    messages = [agent_message(rng, number) for number in range(size)]
    wanted = {position for position in range(size) if rng.random() < 0.7}
    assert dict(tool_stubs(messages.__getitem__, wanted)) == {
        position: stub for position, stub in forward_stubs(messages, wanted).items() if position in wanted
    }


class FixedPins(Pins):
    """The session's pinned ids, as a test sets them."""

    def __init__(self) -> None:
        self.ids: frozenset[str] = frozenset()

    async def on_session(self, tenant: str, session_id: str) -> frozenset[str]:
        return self.ids


def stored(message: dict[str, Any], number: int) -> StoredMessage:
    return StoredMessage(f"id{number}", None, number, message["role"], message, 40 + number % 7, 0.0)


@pytest.mark.slow
@given(seed=st.integers(0, 10_000), requests=st.integers(1, 12))
def test_a_read_carried_over_from_the_last_equals_a_fresh_read(seed: int, requests: int) -> None:
    """A session's path grows, branches, re-sends a message as another object, changes its pins: each read
    (carrying the last one over for the shared prefix) equals what a reader that never saw the session reads."""
    rng = random.Random(seed)
    pins = FixedPins()
    config = ContextConfig(strategies=(TOOL_RESULTS, SUMMARIZE))
    reader = PathReader(config, pins)
    created = 0
    path: list[StoredMessage] = []

    def new() -> StoredMessage:
        nonlocal created
        created += 1
        return stored(agent_message(rng, created), created)

    async def run() -> None:
        nonlocal path
        for _ in range(requests):
            change = rng.choice(["extend", "extend", "branch", "resend", "pin", "same"])
            if change == "branch" and path:
                path = path[: rng.randrange(len(path))]
            elif change == "resend" and path:
                at = rng.randrange(len(path))
                path = [*path[:at], stored(dict(path[at].message), int(path[at].id[2:])), *path[at + 1 :]]
            elif change == "pin" and path:
                pins.ids = frozenset(rng.sample([s.id for s in path], min(2, len(path))))
            if change != "same":
                path = [*path, *(new() for _ in range(rng.randint(1, 4)))]
            request = CompactionRequest(
                "t", "s", [s.message for s in path], StoredPath(path), ENTRY, "cl100k_base", 10_000, 4
            )
            carried = await reader.read(request)
            fresh = await PathReader(config, pins).read(request)
            assert carried.items == fresh.items
            assert dict(carried.stubs) == dict(fresh.stubs)
            assert carried.cuts == fresh.cuts == Cuts.of(fresh.items)

    asyncio.run(run())


def test_the_remembered_reads_hold_at_most_their_tokens() -> None:
    """Each read holds its path's stored messages: many long sessions let the least recent go."""
    reader = PathReader(ContextConfig(strategies=(TOOL_RESULTS, SUMMARIZE)), max_tokens=1_000)

    async def run() -> None:
        for session in range(20):
            path = [stored({"role": "user", "content": f"q{n}"}, session * 100 + n) for n in range(5)]
            request = CompactionRequest(
                "t", f"s{session}", [s.message for s in path], StoredPath(path), ENTRY, "cl100k_base", 9, 4
            )
            await reader.read(request)
            assert reader._tokens == sum(read.tokens for read in reader._last.values()) <= 1_000

    asyncio.run(run())
    assert 0 < len(reader._last) < 20
