"""History through the served proxy: what the client sent is what the store holds (invariant 1).

The client is the official OpenAI SDK re-sending its whole conversation each turn, as real tools do; the
store is read back through `GET /sessions/{id}` and with a plain `sqlite3` connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import ServeProxy
from tests.support.fake_upstream import FakeUpstream, Reply
from tests.support.proxy_server import ProxyServer


def _turns(client: openai.OpenAI, count: int, session: str | None = None) -> tuple[list[dict[str, Any]], str]:
    """A conversation of `count` user turns; returns what the client holds at the end and its session id."""
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    session_id = session or ""
    for turn in range(count):
        history.append({"role": "user", "content": f"turn {turn}: tell me about item {turn * 7}"})
        headers = {"X-Session-Id": session} if session else {}
        raw = client.chat.completions.with_raw_response.create(
            model="fake", messages=_sdk(history), extra_headers=headers
        )
        session_id = raw.headers["x-session-id"]
        answer = raw.parse().choices[0].message
        history.append(answer.model_dump(exclude_none=True))  # the SDK's own echo, with its extra fields
    return history, session_id


def _sdk(history: list[dict[str, Any]]) -> list[ChatCompletionMessageParam]:
    return history  # type: ignore[return-value]  # plain dicts are what clients send


def _stored(proxy: ProxyServer, session_id: str, key: str | None = None) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(f"{proxy.url}/sessions/{session_id}", headers=headers, timeout=10)
    response.raise_for_status()
    view: dict[str, Any] = response.json()
    return view


def _meaning(message: dict[str, Any]) -> dict[str, Any]:
    return {key: message[key] for key in ("role", "content") if message.get(key) is not None}


def test_fifty_turns_are_stored_exactly_as_sent(proxy: ProxyServer, client: openai.OpenAI) -> None:
    history, session_id = _turns(client, 50)
    view = _stored(proxy, session_id)
    assert [_meaning(m) for m in view["messages"]] == [_meaning(m) for m in history]
    assert len(view["messages"]) == 101  # system + 50 × (user, assistant): every answer stored once
    with sqlite3.connect(proxy.config.store.path) as db:
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 101
        assert db.execute("SELECT COUNT(*) FROM sessions").fetchone()[0] == 1
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_an_edited_turn_branches_and_loses_nothing(proxy: ProxyServer, client: openai.OpenAI) -> None:
    history, session_id = _turns(client, 4)
    edited = [*history[:3], {"role": "user", "content": "turn 1, edited: something else"}]
    raw = client.chat.completions.with_raw_response.create(
        model="fake", messages=_sdk(edited), extra_headers={"X-Session-Id": session_id}
    )
    assert raw.headers["x-session-id"] == session_id
    view = _stored(proxy, session_id)
    assert [m["content"] for m in view["messages"]] == [
        *[m["content"] for m in edited],
        "echo: turn 1, edited: something else",
    ]
    with sqlite3.connect(proxy.config.store.path) as db:
        contents = {row[0] for row in db.execute("SELECT json_extract(body, '$.content') FROM messages")}
        parents = db.execute(
            "SELECT COUNT(*) FROM messages WHERE parent_id = (SELECT parent_id FROM messages "
            "WHERE json_extract(body, '$.content') = 'turn 1, edited: something else')"
        ).fetchone()[0]
    assert {m["content"] for m in history} <= contents  # the original branch is intact
    assert parents == 2  # the edited turn and the original one share their parent


def test_a_regenerated_answer_is_kept_beside_the_first(
    proxy: ProxyServer, client: openai.OpenAI, fake: FakeUpstream
) -> None:
    history, session_id = _turns(client, 1)
    fake.responder = lambda body: Reply(content="a different answer")
    client.chat.completions.create(
        model="fake", messages=_sdk(history[:-1]), extra_headers={"X-Session-Id": session_id}
    )
    with sqlite3.connect(proxy.config.store.path) as db:
        answers = {
            row[0]
            for row in db.execute("SELECT json_extract(body, '$.content') FROM messages WHERE role = 'assistant'")
        }
    assert answers == {history[-1]["content"], "a different answer"}
    assert _stored(proxy, session_id)["messages"][-1]["content"] == "a different answer"


def test_concurrent_sessions_store_every_turn_once(proxy: ProxyServer) -> None:
    sessions, turns = 30, 4

    async def converse(index: int, client: openai.AsyncOpenAI) -> list[dict[str, Any]]:
        history: list[dict[str, Any]] = [{"role": "system", "content": f"session {index}"}]
        for turn in range(turns):
            history.append({"role": "user", "content": f"s{index} t{turn}"})
            if turn % 2:
                stream = await client.chat.completions.create(model="fake", messages=_sdk(history), stream=True)
                text = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
                history.append({"role": "assistant", "content": text})
            else:
                answer = await client.chat.completions.create(model="fake", messages=_sdk(history))
                history.append({"role": "assistant", "content": answer.choices[0].message.content})
        return history

    async def converse_all() -> list[list[dict[str, Any]]]:
        async with openai.AsyncOpenAI(base_url=proxy.base_url, api_key="x", max_retries=0, timeout=30) as client:
            return await asyncio.gather(*(converse(i, client) for i in range(sessions)))

    histories = asyncio.run(converse_all())
    listed = httpx.get(f"{proxy.url}/sessions?limit=500", timeout=10).json()["data"]
    assert len(listed) == sessions
    assert {s["message_count"] for s in listed} == {1 + 2 * turns}
    with sqlite3.connect(proxy.config.store.path) as db:
        # One node for the system prompts at the same place (each its own variant), one per other message.
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 1 + sessions * 2 * turns
        assert db.execute("SELECT COUNT(*) FROM message_variants").fetchone()[0] == sessions - 1
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    by_system = {s["id"]: s for s in listed}
    for session in by_system:
        view = _stored(proxy, session)
        history = next(h for h in histories if h[0]["content"] == view["messages"][0]["content"])
        assert [_meaning(m) for m in view["messages"]] == [_meaning(m) for m in history]


def test_one_key_never_sees_another_keys_sessions(serve_proxy: ServeProxy) -> None:
    proxy = serve_proxy(auth={"keys": ["key-alice", "key-bob"]})
    alice = openai.OpenAI(base_url=proxy.base_url, api_key="key-alice", max_retries=0)
    bob = openai.OpenAI(base_url=proxy.base_url, api_key="key-bob", max_retries=0)
    _history, alice_session = _turns(alice, 2, session="shared-name")
    _turns(bob, 1, session="shared-name")  # the same session name, but Bob's own session

    assert len(_stored(proxy, alice_session, "key-alice")["messages"]) == 5
    assert len(_stored(proxy, alice_session, "key-bob")["messages"]) == 3  # Bob's "shared-name", not Alice's
    for path in ("/sessions", f"/sessions/{alice_session}", "/journal"):
        assert httpx.get(f"{proxy.url}{path}", timeout=10).status_code == 401
        assert httpx.get(f"{proxy.url}{path}", headers={"Authorization": "Bearer nope"}, timeout=10).status_code == 401
    derived = _turns(alice, 1)[1]
    response = httpx.get(f"{proxy.url}/sessions/{derived}", headers={"Authorization": "Bearer key-bob"}, timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "session_not_found"
    bobs = httpx.get(f"{proxy.url}/sessions", headers={"Authorization": "Bearer key-bob"}, timeout=10).json()
    assert [s["id"] for s in bobs["data"]] == ["shared-name"]


def test_sessions_are_paginated(proxy: ProxyServer, client: openai.OpenAI) -> None:
    for index in range(5):
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": f"hello {index}"}])
    first = httpx.get(f"{proxy.url}/sessions?limit=2", timeout=10).json()
    rest = httpx.get(f"{proxy.url}/sessions?limit=2&offset=2", timeout=10).json()
    last = httpx.get(f"{proxy.url}/sessions?limit=2&offset=4", timeout=10).json()
    assert (first["has_more"], rest["has_more"], last["has_more"]) == (True, True, False)
    ids = [s["id"] for page in (first, rest, last) for s in page["data"]]
    assert len(set(ids)) == 5


@pytest.mark.parametrize("query", ["limit=0", "limit=abc", "offset=-1", "limit=100000"])
def test_bad_pagination_is_a_400(proxy: ProxyServer, query: str) -> None:
    response = httpx.get(f"{proxy.url}/sessions?{query}", timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["param"] in ("limit", "offset")


def test_unknown_session_is_an_openai_404(proxy: ProxyServer) -> None:
    response = httpx.get(f"{proxy.url}/sessions/no-such-session", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "session_not_found"
