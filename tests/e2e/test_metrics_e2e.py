"""`GET /metrics` after real conversations: each counter and histogram agrees with what the fake upstream
received and what the store holds (the exposition text parsed with prometheus_client's own parser)."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ServeProxy
from tests.e2e.test_compaction_e2e import SMALL_WINDOW, model_entries
from tests.e2e.test_responses_socket_e2e import answer
from tests.support.exposition import Exposition
from tests.support.fake_upstream import FakeUpstream
from tests.support.proxy_server import ProxyServer
from tests.support.scripted_session import ScriptedSession, empty_summary, install_responder, is_summarizer_request

CHAT = "/v1/chat/completions"
KEY = "sk-proxy-metrics"


def start(serve_proxy: ServeProxy, fake: FakeUpstream, **sections: Any) -> ProxyServer:
    # No pre-compaction: every summary is written on the request path, so the counts are settled at each answer.
    context = {"summarizer_model": "summarizer", "precompact_ratio": "off"}
    return serve_proxy(models=model_entries(fake.url), context=context, **sections)


def scrape(proxy: ProxyServer, key: str | None = None) -> Exposition:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    response = httpx.get(f"{proxy.url}/metrics", headers=headers, timeout=10)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=")
    return Exposition.parse(response.text)


def store_rows(proxy: ProxyServer, sql: str) -> list[sqlite3.Row]:
    with sqlite3.connect(proxy.config.store.path) as connection:
        connection.row_factory = sqlite3.Row
        return connection.execute(sql).fetchall()


def test_a_conversation_with_compactions_is_counted_as_the_upstream_and_the_store_saw_it(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake)
    proxy = start(serve_proxy, fake)
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30) as client:
        ScriptedSession(client, fake, "agent", tool_every=3, stream_every=4).run(24)
        with pytest.raises(openai.BadRequestError):
            client.chat.completions.create(model="small", messages=[])  # refused before any model is known

    metrics = scrape(proxy)

    chat = [r.body for r in fake.requests if not is_summarizer_request(r.body)]
    summarizer = [r.body for r in fake.requests if is_summarizer_request(r.body)]
    streamed = sum(1 for body in chat if body.get("stream"))
    assert summarizer
    assert 0 < streamed < len(chat)
    assert metrics.value("context_proxy_requests_total", route=CHAT, model="small", status="200") == len(chat)
    assert metrics.value("context_proxy_requests_total", route=CHAT, model="none", status="400") == 1
    assert metrics.value("context_proxy_request_duration_seconds_count", route=CHAT) == len(chat) + 1
    assert metrics.value("context_proxy_stream_first_byte_seconds_count", route=CHAT, model="small") == streamed
    assert metrics.value("context_proxy_upstream_seconds_count", model="small", stream="true") == streamed
    assert metrics.value("context_proxy_upstream_seconds_count", model="small", stream="false") == len(chat) - streamed
    assert metrics.value("context_proxy_added_seconds_count", model="small") == len(chat)
    for histogram, labels in (
        ("context_proxy_upstream_seconds", {"model": "small", "stream": "false"}),
        ("context_proxy_stream_first_byte_seconds", {"route": CHAT, "model": "small"}),
    ):
        count = metrics.value(f"{histogram}_count", **labels)
        assert metrics.value(f"{histogram}_bucket", **labels, le="+Inf") == count
        assert 0 < metrics.value(f"{histogram}_sum", **labels) < 60 * count

    steps = store_rows(proxy, "SELECT status, context, usage FROM journal_steps")
    contexts = [json.loads(row["context"]) for row in steps]
    usages = [json.loads(row["usage"]) for row in steps if row["usage"]]
    assert metrics.value("context_proxy_journal_steps_total", status="sealed") == len(steps) == len(chat)
    assert (
        metrics.value("context_proxy_journal_events_total")
        == store_rows(proxy, "SELECT COUNT(*) AS n FROM journal_events")[0]["n"]
    )
    assert metrics.value("context_proxy_context_tokens_total", model="small") == sum(
        c["prompt_tokens"] for c in contexts
    )
    saved = sum(max(0, c["history_tokens"] - c["prompt_tokens"]) for c in contexts)
    assert saved > 0
    assert metrics.value("context_proxy_compaction_saved_tokens_total", model="small") == saved
    assert metrics.value("context_proxy_prompt_tokens_total", model="small") == sum(u["prompt_tokens"] for u in usages)
    assert metrics.value("context_proxy_completion_tokens_total", model="small") == sum(
        u["completion_tokens"] for u in usages
    )

    events = store_rows(proxy, "SELECT strategy, generated_by FROM compaction_events WHERE event = 'complete'")
    llm = sum(1 for e in events if e["generated_by"] == "llm")
    assert llm == len(summarizer)
    assert metrics.value("context_proxy_compactions_total", strategy="summarize", outcome="llm") == llm
    assert metrics.value("context_proxy_compactions_total", strategy="tool-results", outcome="rule") == sum(
        1 for e in events if e["strategy"] == "tool-results"
    )
    assert metrics.total("context_proxy_compactions_total") == len(events)
    assert metrics.value("context_proxy_summarizer_seconds_count", outcome="ok") == len(summarizer)
    assert metrics.value("context_proxy_active_streams") == 0
    assert metrics.value("context_proxy_sessions") == 1
    # Bounded labels: routes are templates and models configured names; no session id anywhere.
    assert "agent" not in {value for (_, series) in metrics.samples for _, value in series}


def test_requests_on_a_websocket_are_counted_and_timed_as_streams(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    """Each request on a Responses socket is a request of the socket's route, its first event a stream's first
    byte, a refused one counted with its status and no first byte."""
    proxy = start(serve_proxy, fake)
    route = "/v1/responses"
    before = scrape(proxy)
    with (
        openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30) as client,
        client.responses.connect() as connection,
    ):
        for text in ("first", "second"):
            connection.response.create(model="small", input=text)
            assert answer(connection)[-1]["type"] == "response.completed"
        connection.response.create(model="nope", input="hi")
        assert answer(connection)[-1]["type"] == "error"
    metrics = scrape(proxy)
    assert before.total("context_proxy_requests_total", route=route) == 0
    assert metrics.value("context_proxy_requests_total", route=route, model="small", status="200") == 2
    assert metrics.value("context_proxy_requests_total", route=route, model="nope", status="404") == 0
    assert metrics.total("context_proxy_requests_total", route=route, status="404") == 1
    assert metrics.value("context_proxy_request_duration_seconds_count", route=route) == 3
    assert metrics.value("context_proxy_stream_first_byte_seconds_count", route=route, model="small") == 2
    first_byte = metrics.value("context_proxy_stream_first_byte_seconds_sum", route=route, model="small")
    assert 0 < first_byte <= metrics.value("context_proxy_request_duration_seconds_sum", route=route)


def test_a_failing_summarizer_is_counted_as_fallbacks_and_errors(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    fake.context_window = SMALL_WINDOW
    install_responder(fake, empty_summary)
    proxy = start(serve_proxy, fake)
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=30) as client:
        ScriptedSession(client, fake, "fallback", tool_every=2).run(20)

    metrics = scrape(proxy)

    attempts = sum(1 for r in fake.requests if is_summarizer_request(r.body))
    assert attempts > 0
    assert metrics.value("context_proxy_summarizer_seconds_count", outcome="error") == attempts
    assert metrics.value("context_proxy_summarizer_seconds_count", outcome="ok") == 0
    fallbacks = store_rows(proxy, "SELECT COUNT(*) AS n FROM compaction_events WHERE generated_by = 'fallback'")
    assert (
        metrics.value("context_proxy_compactions_total", strategy="summarize", outcome="fallback")
        == fallbacks[0]["n"]
        > 0
    )


def test_an_unknown_model_and_unmatched_routes_keep_the_labels_bounded(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    proxy = start(serve_proxy, fake)
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=10) as client:
        for name in ("made-up-1", "made-up-2"):
            with pytest.raises(openai.NotFoundError):
                client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}])
    for path in ("/nowhere/1", "/nowhere/2", "/sessions/secret-session-id"):
        httpx.get(f"{proxy.url}{path}", timeout=10)

    metrics = scrape(proxy)

    assert metrics.value("context_proxy_requests_total", route=CHAT, model="other", status="404") == 2
    assert metrics.value("context_proxy_requests_total", route="other", model="none", status="404") == 2
    assert (
        metrics.value("context_proxy_requests_total", route="/sessions/{session_id}", model="none", status="404") == 1
    )
    assert metrics.label_values("context_proxy_requests_total", "model") == {"other", "none"}


def test_with_auth_a_scrape_needs_a_key_unless_the_config_says_otherwise(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    keyed = start(serve_proxy, fake, auth={"keys": [KEY]})
    refused = httpx.get(f"{keyed.url}/metrics", timeout=10)
    assert refused.status_code == 401
    assert refused.json()["error"]["type"] == "invalid_request_error"
    assert httpx.get(f"{keyed.url}/metrics", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
    assert scrape(keyed, KEY).value("context_proxy_requests_total", route="/metrics", model="none", status="401") == 2

    open_scrape = start(serve_proxy, fake, auth={"keys": [KEY]}, metrics={"require_key": False})
    assert scrape(open_scrape).value("context_proxy_sessions") == 0
    # Everything else still needs the key.
    assert httpx.get(f"{open_scrape.url}/sessions", timeout=10).status_code == 401


def test_metrics_can_be_turned_off(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    proxy = start(serve_proxy, fake, metrics={"enabled": False})
    response = httpx.get(f"{proxy.url}/metrics", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "unknown_url"
