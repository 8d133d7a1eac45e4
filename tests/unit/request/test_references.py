"""References the proxy writes into a client's summary, and finding the last one in a request
(`proxy.request.references`): carried over a tenant's requests, the same as looking through each whole."""

from __future__ import annotations

import random
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from proxy.request.references import RECENT_SCANS, References, reference, reference_in, referenced

IDS = [f"{n:064x}" for n in range(1, 6)]


def test_a_reference_names_its_message_and_nothing_else_does() -> None:
    token = reference(IDS[0])
    assert referenced(token) == IDS[0]
    assert referenced(token[:-2] + "zz") != IDS[0]
    assert referenced("ctxinf1.short") is None
    assert referenced(42) is None


def message(rng: random.Random) -> dict[str, Any]:
    role = rng.choice(["user", "user", "assistant", "tool"])
    text = f"turn {rng.randrange(1000)}"
    if role == "user" and rng.random() < 0.2:
        text += f" summary: {reference(rng.choice(IDS))}"
    if rng.random() < 0.3:
        return {"role": role, "content": [{"type": "text", "text": text}]}
    return {"role": role, "content": text}


@given(st.integers(0, 2**32 - 1), st.integers(1, 15))
def test_found_over_a_tenants_requests_as_looked_through_whole(seed: int, requests: int) -> None:
    """Requests extend, cut, edit and re-send (as new objects) what a tenant's earlier requests held, two
    conversations interleaved; each finds what a scan of the whole request finds."""
    rng = random.Random(seed)
    references = References()
    conversations: list[list[dict[str, Any]]] = [[message(rng)], [message(rng)]]
    for _ in range(requests):
        which = rng.randrange(2)
        messages = conversations[which]
        change = rng.choice(["extend", "extend", "cut", "edit", "copy"])
        if change == "cut" and len(messages) > 1:
            messages = messages[: rng.randrange(1, len(messages))]
        elif change == "edit":
            at = rng.randrange(len(messages))
            messages = [*messages[:at], message(rng), *messages[at + 1 :]]
        elif change == "copy":
            messages = [dict(m) for m in messages]
        messages = [*messages, *(message(rng) for _ in range(rng.randint(0, 3)))]
        conversations[which] = messages
        assert references.find("tenant", messages) == reference_in(messages)
        assert references.find("other", messages) == reference_in(messages)
        assert len(references._scans) <= RECENT_SCANS  # what the scans hold is bounded like a door's requests
