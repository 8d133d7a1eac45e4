"""The client's own compaction in the Responses API (Codex's remote compaction), answered by the proxy with the
official SDK against the served proxy and the strict fake upstream: a trailing `compaction_trigger` and
`POST /v1/responses/compact` get exactly one `compaction` item at once, with no model call; that item, sent back
at the head of a later input, stands for the whole stored conversation, which the upstream gets again; the
session keeps every original; a changed item or another tenant's is refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream
from tests.support.proxy_server import ProxyServer

TRIGGER = {"type": "compaction_trigger"}
INSTRUCTIONS = "Be brief."


@pytest.fixture
def sdk(proxy: ProxyServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=20) as client:
        yield client


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def converse(sdk: openai.OpenAI, session: str, turns: int) -> list[Any]:
    """A thread the way Codex keeps it: the whole input every turn, each answer's items appended."""
    history: list[Any] = []
    for turn in range(turns):
        history.append(user(f"turn {turn}: remember FACT_{turn}"))
        response = sdk.responses.create(
            model="fake", instructions=INSTRUCTIONS, input=history, extra_headers={"X-Session-Id": session}
        )
        history.extend(item.model_dump(exclude_none=True) for item in response.output)
    return history


def test_a_trigger_is_answered_with_one_compaction_item_that_later_stands_for_the_whole_conversation(
    sdk: openai.OpenAI, proxy: ProxyServer, fake: FakeUpstream
) -> None:
    history = converse(sdk, "thread", 3)
    calls = len(fake.requests)
    compacted = sdk.responses.create(
        model="fake",
        instructions=INSTRUCTIONS,
        input=[*history, user("turn 3"), TRIGGER],  # type: ignore[list-item]
        extra_headers={"X-Session-Id": "thread"},
    )
    assert len(fake.requests) == calls  # no model call
    [item] = compacted.output
    assert item.type == "compaction"
    assert item.encrypted_content
    # Codex's next input: the user turns it keeps, the item, and what is new.
    kept = [message for message in history if message.get("role") == "user"]
    item_param = item.model_dump(exclude_none=True)
    answer = sdk.responses.create(
        model="fake",
        instructions=INSTRUCTIONS,
        input=[*kept, item_param, user("what was FACT_0?")],
        extra_headers={"X-Session-Id": "thread"},
    )
    assert answer.status == "completed"
    sent = fake.requests[-1].body["messages"]
    assert sent[0] == {"role": "system", "content": INSTRUCTIONS}
    texts = [message.get("content") for message in sent]
    assert texts[1] == "turn 0: remember FACT_0"  # the whole stored conversation, once
    assert texts.count("turn 0: remember FACT_0") == 1
    assert "turn 3" in texts
    assert texts[-1] == "what was FACT_0?"
    session = httpx.get(f"{proxy.url}/sessions/thread", timeout=10).json()
    users = [m["content"] for m in session["messages"] if m["role"] == "user"]
    assert users == [*(f"turn {t}: remember FACT_{t}" for t in range(3)), "turn 3", "what was FACT_0?"]


def test_the_compact_endpoint_answers_one_compaction_item(sdk: openai.OpenAI, fake: FakeUpstream) -> None:
    history = converse(sdk, "compact-endpoint", 2)
    calls = len(fake.requests)
    compacted = sdk.responses.compact(
        model="gpt-5.5",  # any model name: the proxy checks it, so use a configured one below
        input=history,
        extra_body={"model": "fake"},
        extra_headers={"X-Session-Id": "compact-endpoint"},
    )
    assert len(fake.requests) == calls
    assert compacted.object == "response.compaction"
    assert [item.type for item in compacted.output] == ["compaction"]
    later = sdk.responses.create(
        model="fake",
        input=[*(item.model_dump(exclude_none=True) for item in compacted.output), user("and now?")],
        extra_headers={"X-Session-Id": "compact-endpoint"},
    )
    assert later.status == "completed"
    assert fake.requests[-1].body["messages"][0]["content"] == "turn 0: remember FACT_0"


def test_a_trigger_over_the_socket_gets_the_item_as_an_output_item(sdk: openai.OpenAI, fake: FakeUpstream) -> None:
    history = converse(sdk, "socket-compaction", 1)
    with sdk.responses.connect(extra_headers={"X-Session-Id": "socket-compaction"}) as connection:
        connection.response.create(model="fake", input=[*history, TRIGGER], store=False)  # type: ignore[list-item]
        events = []
        for event in connection:
            events.append(event)
            if event.type in ("response.completed", "error"):
                break
    done = [event.item for event in events if event.type == "response.output_item.done"]
    assert [item.type for item in done] == ["compaction"]
    assert events[-1].type == "response.completed"
    assert len(fake.requests) == 1


def test_a_changed_item_or_another_tenant_s_is_refused(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    proxy = serve_proxy(auth={"keys": ["alice-key", "bob-key"]})
    with openai.OpenAI(base_url=proxy.base_url, api_key="alice-key", max_retries=0) as alice:
        history = converse(alice, "alice", 1)
        item = alice.responses.create(model="fake", input=[*history, TRIGGER]).output[0]  # type: ignore[list-item]
        token = item.model_dump()["encrypted_content"]
        changed = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        with pytest.raises(openai.APIStatusError) as refused:
            alice.responses.create(
                model="fake",
                input=[{"type": "compaction", "encrypted_content": changed}, user("x")],  # type: ignore[list-item]
            )
        assert refused.value.status_code in (400, 404)
    with openai.OpenAI(base_url=proxy.base_url, api_key="bob-key", max_retries=0) as bob:
        with pytest.raises(openai.NotFoundError) as foreign:
            bob.responses.create(
                model="fake",
                input=[{"type": "compaction", "encrypted_content": token}, user("x")],  # type: ignore[list-item]
            )
        assert "compaction_not_found" in str(foreign.value)
