"""Pins and compaction events through the served proxy: `/sessions/{id}/pins` and `/sessions/{id}/events`.

Conversations are sent with the official OpenAI SDK to a real uvicorn in front of the strict fake upstream; the
store is read back through the routes and with a plain `sqlite3` connection. Every refused request must leave
the pins table exactly as it was.
"""

from __future__ import annotations

import json
import re
import sqlite3
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from proxy.auth import OPEN_TENANT
from tests.conftest import ServeProxy
from tests.support.proxy_server import ProxyServer

TIMEOUT = 10


def _converse(
    client: openai.OpenAI, messages: list[dict[str, Any]], session: str, headers: dict[str, str] | None = None
) -> list[str]:
    """Send `messages` in session `session`; the ids of the session's path afterwards (answer included)."""
    sdk: list[ChatCompletionMessageParam] = messages  # type: ignore[assignment]  # plain dicts, as clients send
    client.chat.completions.create(
        model="fake", messages=sdk, extra_headers={"X-Session-Id": session, **(headers or {})}
    )
    return [m["id"] for m in _view(client, session)["messages"]]


def _view(client: openai.OpenAI, session: str) -> dict[str, Any]:
    response = httpx.get(f"{_root(client)}/sessions/{session}", headers=_auth(client), timeout=TIMEOUT)
    response.raise_for_status()
    view: dict[str, Any] = response.json()
    return view


def _root(client: openai.OpenAI) -> str:
    return str(client.base_url).rstrip("/").removesuffix("/v1")


def _auth(client: openai.OpenAI) -> dict[str, str]:
    return {"Authorization": f"Bearer {client.api_key}"}


def _pins(
    proxy: ProxyServer, session: str, method: str = "GET", body: Any = None, key: str | None = None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    content = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    return httpx.request(
        method, f"{proxy.url}/sessions/{session}/pins", content=content, headers=headers, timeout=TIMEOUT
    )


def _stored_pins(proxy: ProxyServer) -> list[tuple[str, str, str]]:
    with sqlite3.connect(proxy.config.store.path) as db:
        rows = db.execute("SELECT tenant, session_id, message_id FROM pins ORDER BY 1, 2, 3").fetchall()
    return [tuple(row) for row in rows]


def _conversation(turns: int = 3) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"turn {turn}: the plan has step {turn * 3}"})
        messages.append({"role": "assistant", "content": f"noted step {turn * 3}"})
    messages.append({"role": "user", "content": "and now?"})
    return messages


TOOL_TURN: list[dict[str, Any]] = [
    {"role": "system", "content": "You use tools."},
    {"role": "user", "content": "weather in Paris and Oslo?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_paris", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Paris"}'}},
            {"id": "call_oslo", "type": "function", "function": {"name": "weather", "arguments": '{"city":"Oslo"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_paris", "content": "sunny"},
    {"role": "tool", "tool_call_id": "call_oslo", "content": "snow"},
    {"role": "assistant", "content": "Paris is sunny, Oslo has snow."},
    {"role": "user", "content": "thanks"},
]


def test_pin_list_and_unpin(proxy: ProxyServer, client: openai.OpenAI) -> None:
    ids = _converse(client, _conversation(), "work")

    pinned = _pins(proxy, "work", "POST", {"message_ids": [ids[1], ids[3]]})
    assert pinned.status_code == 200, pinned.text
    view = pinned.json()
    assert view["session_id"] == "work"
    assert [(p["message_id"], p["position"], p["role"], p["pinned_by"]) for p in view["pins"]] == [
        (ids[1], 1, "user", "api"),
        (ids[3], 3, "user", "api"),
    ]
    assert all(p["tokens"] > 0 for p in view["pins"])
    assert _pins(proxy, "work", "POST", {"message_ids": [ids[3], ids[1]]}).json() == view  # idempotent
    assert _pins(proxy, "work").json() == view
    assert [m["pinned"] for m in _view(client, "work")["messages"]] == [i in (1, 3) for i in range(len(ids))]
    assert len(_stored_pins(proxy)) == 2

    unpinned = _pins(proxy, "work", "DELETE", {"message_ids": [ids[1]]})
    assert unpinned.status_code == 200, unpinned.text
    assert unpinned.json()["removed"] == 1
    assert [p["message_id"] for p in unpinned.json()["pins"]] == [ids[3]]
    one = httpx.delete(f"{proxy.url}/sessions/work/pins/{ids[3]}", timeout=TIMEOUT)
    assert one.status_code == 200, one.text
    assert one.json() == {"session_id": "work", "pins": [], "removed": 1}
    assert _stored_pins(proxy) == []
    assert not any(m["pinned"] for m in _view(client, "work")["messages"])


def test_a_pin_holds_as_the_session_goes_on(proxy: ProxyServer, client: openai.OpenAI) -> None:
    messages = _conversation(1)
    ids = _converse(client, messages, "long")
    assert _pins(proxy, "long", "POST", {"message_ids": [ids[1]]}).status_code == 200
    messages += [{"role": "assistant", "content": "echo: and now?"}, {"role": "user", "content": "more"}]
    longer = _converse(client, messages, "long")
    assert longer[: len(ids)] == ids
    assert [p["message_id"] for p in _pins(proxy, "long").json()["pins"]] == [ids[1]]


@pytest.mark.parametrize("pick", [2, 3, 4])
def test_any_message_of_a_tool_group_pins_the_whole_group(proxy: ProxyServer, client: openai.OpenAI, pick: int) -> None:
    ids = _converse(client, TOOL_TURN, "tools")
    view = _pins(proxy, "tools", "POST", {"message_ids": [ids[pick]]}).json()
    assert [p["position"] for p in view["pins"]] == [2, 3, 4]  # the call and both results
    assert sorted(row[2] for row in _stored_pins(proxy)) == sorted(ids[2:5])

    unpinned = _pins(proxy, "tools", "DELETE", {"message_ids": [ids[3]]}).json()
    assert (unpinned["pins"], unpinned["removed"]) == ([], 3)


def test_pattern_pins_are_shown_and_cannot_be_unpinned(serve_proxy: ServeProxy) -> None:
    proxy = serve_proxy(context={"pin_patterns": [r"\bstep 3\b"]})
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=20) as client:
        ids = _converse(client, _conversation(), "patterns")
        shown = _pins(proxy, "patterns").json()["pins"]
        assert [(p["position"], p["pinned_by"]) for p in shown] == [(3, "pattern"), (4, "pattern")]
        assert [m["pinned"] for m in _view(client, "patterns")["messages"]][3:5] == [True, True]

        both = _pins(proxy, "patterns", "POST", {"message_ids": [ids[3], ids[1]]}).json()["pins"]
        assert [(p["position"], p["pinned_by"]) for p in both] == [(1, "api"), (3, "api"), (4, "pattern")]
        after = _pins(proxy, "patterns", "DELETE", {"message_ids": [ids[3], ids[4]]}).json()
        assert after["removed"] == 1
        assert [(p["position"], p["pinned_by"]) for p in after["pins"]] == [(1, "api"), (3, "pattern"), (4, "pattern")]


@pytest.mark.parametrize(
    ("body", "wording"),
    [
        (b"not json", "could not parse"),
        (b"\xff\xfe", "UTF-8"),
        (["abc"], "JSON object"),
        ({}, "non-empty array"),
        ({"message_ids": []}, "non-empty array"),
        ({"message_ids": "abc"}, "non-empty array"),
        ({"message_ids": [1]}, "message_ids[0]"),
        ({"message_ids": ["ok", None]}, "message_ids[1]"),
        ({"message_ids": [""]}, "message_ids[0]"),
        ({"message_ids": [f"id-{i}" for i in range(1_001)]}, "at most 1000"),
    ],
)
@pytest.mark.parametrize("method", ["POST", "DELETE"])
def test_a_bad_body_is_a_400_and_changes_nothing(
    proxy: ProxyServer, client: openai.OpenAI, body: Any, wording: str, method: str
) -> None:
    ids = _converse(client, _conversation(), "bodies")
    _pins(proxy, "bodies", "POST", {"message_ids": [ids[1]]}).raise_for_status()
    before = _stored_pins(proxy)

    response = _pins(proxy, "bodies", method, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert wording in error["message"]
    assert _stored_pins(proxy) == before


def test_ids_off_the_current_path_are_a_400_naming_them(proxy: ProxyServer, client: openai.OpenAI) -> None:
    ids = _converse(client, _conversation(), "main")
    other = _converse(client, [{"role": "user", "content": "elsewhere"}], "other")
    edited = [*_conversation()[:3], {"role": "user", "content": "an edited turn"}]
    branched = _converse(client, edited, "main")  # the head moves to a branch without ids[3:]
    assert branched[:3] == ids[:3]
    _pins(proxy, "main", "POST", {"message_ids": [ids[1]]}).raise_for_status()
    before = _stored_pins(proxy)

    for missing in (other[0], ids[4], "no-such-id"):
        response = _pins(proxy, "main", "POST", {"message_ids": [ids[2], missing]})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("message_not_found", "message_ids")
        assert f"'{missing}'" in error["message"]
        assert f"'{ids[2]}'" not in error["message"]
    response = _pins(proxy, "main", "DELETE", {"message_ids": [ids[1], "no-such-id"]})
    assert response.status_code == 400
    assert "'no-such-id'" in response.json()["error"]["message"]
    assert _stored_pins(proxy) == before


def test_a_pin_set_over_the_budget_is_pins_too_large(proxy: ProxyServer, client: openai.OpenAI) -> None:
    # Sent unchanged (mode off), so the path may outgrow the 50-token budget the session remembers.
    ids = _converse(client, _conversation(), "tight", {"X-Context-Mode": "off", "X-Context-Budget": "50"})
    assert _pins(proxy, "tight", "POST", {"message_ids": [ids[1]]}).status_code == 200
    before = _stored_pins(proxy)

    response = _pins(proxy, "tight", "POST", {"message_ids": [ids[3], ids[5]]})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"], error["type"]) == ("pins_too_large", "message_ids", "invalid_request_error")
    for pinned in (ids[1], ids[3], ids[5]):
        assert f"'{pinned}'" in error["message"]
    needed = re.search(r"need (\d+) tokens, but the input budget for model 'fake' is 50 tokens", error["message"])
    assert needed is not None
    assert int(needed[1]) > 50
    assert _stored_pins(proxy) == before


def test_unknown_and_foreign_sessions_are_404s(serve_proxy: ServeProxy) -> None:
    proxy = serve_proxy(auth={"keys": ["key-alice", "key-bob"]})
    with openai.OpenAI(base_url=proxy.base_url, api_key="key-alice", max_retries=0, timeout=20) as alice:
        ids = _converse(alice, _conversation(), "alices")
    body = {"message_ids": [ids[1]]}
    for method in ("GET", "POST", "DELETE"):
        assert _pins(proxy, "alices", method, body).status_code == 401
        for session, key in (("alices", "key-bob"), ("nobody", "key-alice")):
            response = _pins(proxy, session, method, None if method == "GET" else body, key=key)
            assert response.status_code == 404, (method, session, response.text)
            assert response.json()["error"]["code"] == "session_not_found"
    bob = {"Authorization": "Bearer key-bob"}
    assert httpx.delete(f"{proxy.url}/sessions/alices/pins/{ids[1]}", headers=bob, timeout=TIMEOUT).status_code == 404
    assert httpx.get(f"{proxy.url}/sessions/alices/events", headers=bob, timeout=TIMEOUT).status_code == 404
    assert _stored_pins(proxy) == []
    assert _pins(proxy, "alices", "POST", body, key="key-alice").status_code == 200


def _add_event(proxy: ProxyServer, tenant: str, session: str, event: str, strategy: str = "llm") -> None:
    with sqlite3.connect(proxy.config.store.path) as db:
        db.execute(
            "INSERT INTO compaction_events (tenant, session_id, event, strategy, range_start, range_end, "
            "tokens_before, background, created_at) VALUES (?, ?, ?, ?, 1, 5, 900, 1, 1000.0)",
            (tenant, session, event, strategy),
        )


def test_events_are_listed_per_session_oldest_first(proxy: ProxyServer, client: openai.OpenAI) -> None:
    _converse(client, _conversation(), "busy")
    for event in ("start", "complete", "start", "error"):
        _add_event(proxy, OPEN_TENANT, "busy", event)
    _add_event(proxy, OPEN_TENANT, "another", "start")
    _add_event(proxy, "someone-else", "busy", "start")

    first = httpx.get(f"{proxy.url}/sessions/busy/events?limit=3", timeout=TIMEOUT).json()
    rest = httpx.get(f"{proxy.url}/sessions/busy/events?limit=3&offset=3", timeout=TIMEOUT).json()
    assert (first["session_id"], first["more"], rest["more"]) == ("busy", True, False)
    assert [e["event"] for e in first["events"] + rest["events"]] == ["start", "complete", "start", "error"]
    event = first["events"][0]
    assert (event["range_start"], event["range_end"], event["tokens_before"], event["background"]) == (1, 5, 900, True)
    assert "tenant" not in event

    assert httpx.get(f"{proxy.url}/sessions/nobody/events", timeout=TIMEOUT).status_code == 404
    bad = httpx.get(f"{proxy.url}/sessions/busy/events?limit=0", timeout=TIMEOUT)
    assert (bad.status_code, bad.json()["error"]["param"]) == (400, "limit")
