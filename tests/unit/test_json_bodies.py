"""A chat body's JSON with each message written once per conversation (`proxy.upstream.json_bodies`): always
the JSON of the whole body, whatever the conversation did since its last body."""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.upstream.json_bodies import JsonBodies

FIELDS: dict[str, Any] = {"model": "m", "stream": True, "temperature": 0.5}


def message(rng: random.Random) -> dict[str, Any]:
    text = rng.choice(["hi", "ünïcode ☀️", 'quote " and \\ slash', "x" * rng.randrange(50)])
    if rng.random() < 0.1:
        return {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "big": 2**70}]}  # past orjson
    return {"role": rng.choice(["user", "assistant", "tool"]), "content": text}


@given(st.integers(0, 2**32 - 1), st.integers(1, 12), st.sampled_from([64, 10_000, 1_000_000]))
def test_a_body_is_the_json_of_its_fields_and_messages(seed: int, requests: int, max_bytes: int) -> None:
    rng = random.Random(seed)
    bodies = JsonBodies(max_bytes)
    conversations = [[message(rng)], [message(rng)]]
    for _ in range(requests):
        which = rng.randrange(2)
        messages = conversations[which]
        change = rng.choice(["extend", "extend", "cut", "edit", "copy", "empty"])
        if change == "cut":
            messages = messages[: rng.randrange(1, len(messages) + 1)]
        elif change == "edit":
            at = rng.randrange(len(messages))
            messages = [*messages[:at], message(rng), *messages[at + 1 :]]
        elif change == "copy":
            messages = [dict(m) for m in messages]
        messages = [*messages, *(message(rng) for _ in range(rng.randint(0, 3)))]
        conversations[which] = messages
        fields = {} if change == "empty" else FIELDS
        assert json.loads(bodies.body(fields, messages)) == {**fields, "messages": messages}
    assert json.loads(bodies.body(FIELDS, [])) == {**FIELDS, "messages": []}


def test_a_re_sent_message_is_not_written_again() -> None:
    bodies = JsonBodies()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]
    bodies.body(FIELDS, messages)
    messages[1]["content"] = "changed in place"  # never done by the proxy: shows the JSON was kept
    assert json.loads(bodies.body(FIELDS, [*messages, {"role": "user", "content": "more"}]))["messages"][1] == {
        "role": "assistant",
        "content": "yo",
    }
