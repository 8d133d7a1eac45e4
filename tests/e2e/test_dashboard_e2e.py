"""The dashboard's JSON views over a served proxy: a compacted session as rows with markers, a marker's
summary and originals, the tokens per turn, the streams in flight, paging, tenants, and bad input (a 4xx that
changes nothing)."""

from __future__ import annotations

import hashlib
import sqlite3
import threading
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ServeProxy
from tests.e2e.test_compaction_e2e import SMALL_BUDGET, SMALL_WINDOW, model_entries
from tests.support.fake_upstream import FakeUpstream, Reply
from tests.support.proxy_server import ProxyServer
from tests.support.scripted_session import ScriptedSession, install_responder

KEY, OTHER_KEY = "sk-dash-one", "sk-dash-two"


def start(serve_proxy: ServeProxy, fake: FakeUpstream, keys: list[str] | None = None) -> ProxyServer:
    """The compaction tests' models and a "huge" one (a 1M window) on the fake; summaries on the request path."""
    huge = {**model_entries(fake.url)[0], "name": "huge", "context_window": 1_000_000}
    return serve_proxy(
        models=[*model_entries(fake.url), huge],
        context={"summarizer_model": "summarizer", "precompact_ratio": "off"},
        auth={"keys": keys or [KEY, OTHER_KEY]},
    )


def store_long_session(proxy: ProxyServer, fake: FakeUpstream, key: str, session_id: str) -> None:
    """A session of 10,000 messages, sent in one request to the huge model."""
    fake.context_window = 1_000_000
    fake.responder = lambda body: Reply(content="ok")
    messages = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"message {n}"} for n in range(9_999)]
    response = httpx.post(
        f"{proxy.url}/v1/chat/completions",
        json={"model": "huge", "messages": messages},
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session_id},
        timeout=120,
    )
    assert response.status_code == 200, response.text


def get(proxy: ProxyServer, path: str, key: str | None = KEY, status: int = 200) -> Any:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(f"{proxy.url}{path}", headers=headers, timeout=20)
    assert response.status_code == status, response.text
    return response.json()


def converse(proxy: ProxyServer, fake: FakeUpstream, session_id: str, turns: int, **options: Any) -> ScriptedSession:
    with openai.OpenAI(base_url=proxy.base_url, api_key=KEY, max_retries=0, timeout=30) as client:
        session = ScriptedSession(client, fake, session_id, **options)
        session.run(turns)
    return session


def store_snapshot(proxy: ProxyServer) -> str:
    """A digest of every table's rows: equal before and after means nothing was written."""
    with sqlite3.connect(proxy.config.store.path) as connection:
        tables = [row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        digest = hashlib.sha256()
        for table in sorted(tables):
            for row in connection.execute(f'SELECT * FROM "{table}"'):  # names from sqlite_master
                digest.update(repr(row).encode())
        return digest.hexdigest()


def read_stream(proxy: ProxyServer, key: str, session_id: str) -> int:
    """Ask for a streamed answer and read it to its end; its status."""
    with httpx.stream(
        "POST",
        f"{proxy.url}/v1/chat/completions",
        json={"model": "small", "stream": True, "messages": [{"role": "user", "content": "go"}]},
        headers={"Authorization": f"Bearer {key}", "X-Session-Id": session_id},
        timeout=60,
    ) as response:
        for _ in response.iter_bytes():
            pass
        return response.status_code


def test_a_compacted_session_reads_as_rows_where_each_span_is_one_marker(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    proxy = start(serve_proxy, fake)
    session = converse(proxy, fake, "agent", 24, tool_every=3, stream_every=4)

    listing = get(proxy, "/sessions")
    (line,) = listing["data"]
    assert line["id"] == "agent"
    assert line["usage"]["budget"] == SMALL_BUDGET
    assert line["usage"]["severity"] in ("green", "yellow", "red")
    assert line["usage"]["text"].endswith(f"[{line['usage']['summaries_in_context']}S]")

    overview = get(proxy, "/ui/api/sessions/agent")
    assert overview["message_count"] == len(session.messages)
    spans = overview["spans"]
    assert spans
    assert overview["usage"]["summaries_in_context"] == len(spans)
    assert all(s["strategy"] == "summarize" and s["tokens_after"] < s["tokens_before"] for s in spans)

    rows = get(proxy, "/ui/api/sessions/agent/rows?limit=500")
    assert rows["total"] == overview["row_count"] == len(rows["rows"])
    covered = 0
    expected = 0
    for row in rows["rows"]:
        if row["kind"] == "span":
            assert row["span"]["start"] == expected
            expected = row["span"]["end"]
            covered += row["span"]["messages"]
        else:
            assert row["message"]["position"] == expected
            expected += 1
    assert expected == len(session.messages)
    assert covered == sum(s["messages"] for s in spans)
    stubbed = [r["message"] for r in rows["rows"] if r["kind"] == "message" and r["message"]["stubbed"]]
    assert stubbed
    assert all(m["role"] == "tool" and m["stub"].startswith("[tool output stubbed") for m in stubbed)

    first = spans[0]
    opened = get(proxy, f"/ui/api/sessions/agent/spans/{first['id']}?limit=5")
    assert opened["span"]["content"].startswith("[Earlier conversation summary]") or opened["span"]["content"]
    assert opened["total"] == first["messages"]
    assert [m["position"] for m in opened["messages"]] == list(range(first["start"], first["start"] + 5))
    assert opened["has_more"]
    assert opened["messages"][0]["content"] == session.messages[first["start"]]["content"]
    rest = get(proxy, f"/ui/api/sessions/agent/spans/{first['id']}?limit=500&offset=5")
    assert not rest["has_more"]
    assert len(rest["messages"]) == first["messages"] - 5

    plot = get(proxy, "/ui/api/sessions/agent/turns")
    chat_requests = sum(len(turn.chat_requests) for turn in session.turns)
    assert len(plot["turns"]) == chat_requests
    assert all(t["prompt_tokens"] <= t["budget"] == SMALL_BUDGET for t in plot["turns"])
    marks = plot["compactions"]
    assert {m["strategy"] for m in marks} == {"summarize", "tool-results"}
    compacted_turns = {m["turn"] for m in marks if m["strategy"] == "summarize"}
    for turn in compacted_turns:  # a summarizing compaction marks the turn whose prompt it shrank
        before, after = plot["turns"][turn - 1], plot["turns"][turn]
        assert after["summaries"] >= 1
        assert after["prompt_tokens"] < before["prompt_tokens"] + 200
    cost = plot["cost"]  # the cost plot's points: one per plotted turn, the same steps
    assert [t["step_id"] for t in cost["turns"]] == [t["step_id"] for t in plot["turns"]]
    assert cost["summarizer_calls"] >= 1
    assert sum(t["summarizer_tokens"] for t in cost["turns"]) > 0
    assert all(t["sent_tokens"] > 0 for t in cost["turns"])


def test_rows_page_through_a_ten_thousand_message_session(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    proxy = start(serve_proxy, fake)
    store_long_session(proxy, fake, KEY, "long")

    first = get(proxy, "/ui/api/sessions/long/rows?limit=100")
    assert (first["total"], len(first["rows"]), first["has_more"]) == (10_000, 100, True)
    last = get(proxy, "/ui/api/sessions/long/rows?limit=100&offset=9950")
    assert [r["message"]["position"] for r in last["rows"]] == list(range(9_950, 10_000))
    assert last["rows"][-1]["message"]["content"] == "ok"
    assert not last["has_more"]
    assert get(proxy, "/ui/api/sessions/long")["message_count"] == 10_000


def test_a_stream_in_flight_is_listed_with_what_it_streamed_so_far(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    proxy = start(serve_proxy, fake)
    fake.responder = lambda body: Reply(content="partial answer " * 20)
    fake.chunk_delay_s = 0.1
    results: list[int] = []
    worker = threading.Thread(target=lambda: results.append(read_stream(proxy, KEY, "live")))
    worker.start()
    try:
        for _ in range(100):
            flying = get(proxy, "/ui/api/streams")["data"]
            if flying and flying[0]["chars"] > 0:
                break
            threading.Event().wait(0.05)
        (entry,) = flying
        assert (entry["session_id"], entry["model"], entry["stream"]) == ("live", "small", True)
        assert entry["tail"].startswith("partial")
        threading.Event().wait(0.5)
        (later,) = get(proxy, "/ui/api/streams")["data"]
        assert later["step_id"] == entry["step_id"]
        assert later["chars"] > entry["chars"]
        assert later["events"] > entry["events"]
        assert get(proxy, "/ui/api/streams", key=OTHER_KEY)["data"] == []  # another tenant sees nothing
    finally:
        worker.join(30)
    assert results == [200]
    assert get(proxy, "/ui/api/streams")["data"] == []


def test_a_tenant_sees_only_its_own_sessions_and_the_views_need_a_key(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    install_responder(fake)
    proxy = start(serve_proxy, fake)
    converse(proxy, fake, "mine", 2)

    assert get(proxy, "/sessions", key=OTHER_KEY)["data"] == []
    for path in (
        "/ui/api/sessions/mine",
        "/ui/api/sessions/mine/rows",
        "/ui/api/sessions/mine/turns",
        "/ui/api/sessions/mine/spans/1",
    ):
        assert get(proxy, path, key=OTHER_KEY, status=404)["error"]["code"] == "session_not_found"
        assert get(proxy, path, key=None, status=401)["error"]["type"] == "invalid_request_error"
    assert get(proxy, "/ui/api/streams", key=None, status=401)
    # The page and its assets hold no data: they load without a key, and the page then asks for one.
    page = httpx.get(f"{proxy.url}/ui/", timeout=10)
    assert page.status_code == 200
    assert "text/html" in page.headers["content-type"]
    assert httpx.get(f"{proxy.url}/ui/static/app.js", timeout=10).status_code == 200
    assert httpx.get(f"{proxy.url}/ui", timeout=10, follow_redirects=False).headers["location"] == "/ui/"


@pytest.mark.parametrize(
    ("method", "path", "status", "param"),
    [
        ("GET", "/ui/api/sessions/mine/rows?limit=0", 400, "limit"),
        ("GET", "/ui/api/sessions/mine/rows?limit=501", 400, "limit"),
        ("GET", "/ui/api/sessions/mine/rows?offset=-1", 400, "offset"),
        ("GET", "/ui/api/sessions/mine/rows?offset=99999999999999999999", 400, "offset"),
        ("GET", "/ui/api/sessions/mine/spans/abc", 400, "span_id"),
        ("GET", "/ui/api/sessions/mine/spans/99999999999999999999", 400, "span_id"),
        ("GET", "/ui/api/sessions/mine/spans/12345", 404, None),
        ("GET", "/ui/api/sessions/nobody", 404, None),
        ("GET", "/ui/api/nothing-here", 404, None),
        ("GET", "/ui/static/../../config.py", 404, None),
        ("GET", "/ui/static/missing.js", 404, None),
        ("POST", "/ui/api/sessions/mine", 405, None),
        ("DELETE", "/ui/api/sessions/mine/rows", 405, None),
        ("POST", "/ui/", 405, None),
    ],
)
def test_bad_input_on_the_dashboards_endpoints_is_a_4xx_that_changes_nothing(
    serve_proxy: ServeProxy, fake: FakeUpstream, method: str, path: str, status: int, param: str | None
) -> None:
    install_responder(fake)
    proxy = start(serve_proxy, fake)
    converse(proxy, fake, "mine", 2)
    before = store_snapshot(proxy)

    response = httpx.request(method, f"{proxy.url}{path}", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)

    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["message"]
    assert error["param"] == param
    assert store_snapshot(proxy) == before
