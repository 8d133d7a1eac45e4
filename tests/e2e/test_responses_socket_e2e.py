"""Responses WebSocket mode end to end: the official `openai` SDK's `responses.connect()` against the served proxy
and the strict fake upstream. One socket carries many turns, one at a time, each answered by the same events as
the HTTP stream; a response the client did not store is continued on the socket that answered it; a bad event
is an `error` event and the socket stays open; a wrong key is refused at the handshake."""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import ServeProxy
from tests.e2e.test_responses_e2e import assert_read_back_cut
from tests.support import proxy_server
from tests.support.fake_upstream import FakeUpstream, Reply
from tests.support.proxy_server import ProxyProcess, ProxyServer, make_config

TURNS = 20
ENDINGS = ("response.completed", "response.failed", "response.incomplete", "error")
VOLATILE = re.compile(r"(resp|msg|fc|ctc|rs)_[0-9a-f_]+")


@pytest.fixture
def sdk(proxy: ProxyServer) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=20) as client:
        yield client


def answer(connection: Any) -> list[dict[str, Any]]:
    """The events of one response, up to its last."""
    events: list[dict[str, Any]] = []
    for event in connection:
        events.append(event.model_dump(exclude_none=True))
        if event.type in ENDINGS:
            return events
    raise AssertionError("the socket closed before the response ended")


def normalized(events: list[dict[str, Any]]) -> list[Any]:
    """Events without what differs between two responses of the same content: ids and timestamps."""

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {key: clean(item) for key, item in value.items() if key not in ("created_at", "completed_at")}
        if isinstance(value, list):
            return [clean(item) for item in value]
        if isinstance(value, str):
            return VOLATILE.sub("<id>", value)
        return value

    return [clean(event) for event in events]


def test_twenty_turns_over_one_socket_continue_unstored_responses(
    sdk: openai.OpenAI, proxy: ProxyServer, fake: FakeUpstream
) -> None:
    previous: str | None = None
    with sdk.responses.connect(extra_headers={"X-Session-Id": "socket"}) as connection:
        for turn in range(TURNS):
            arguments: dict[str, Any] = {
                "model": "fake",
                "input": [{"role": "user", "content": f"turn {turn}"}],
                "store": False,
                "instructions": "Be brief.",
            }
            if previous is not None:
                arguments["previous_response_id"] = previous
            connection.response.create(**arguments)
            events = answer(connection)
            assert events[0]["type"] == "response.created"
            assert events[-1]["type"] == "response.completed", events[-1]
            previous = events[-1]["response"]["id"]
            assert events[-1]["response"]["output"][0]["content"][0]["text"] == f"echo: turn {turn}"
    # Each turn sent the whole conversation upstream: the stored one, continued, then the new input.
    assert fake.requests[-1].body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert len(fake.requests[-1].body["messages"]) == 1 + 2 * TURNS - 1
    session = httpx.get(f"{proxy.url}/sessions/socket", timeout=10).json()
    assert [m["content"] for m in session["messages"] if m["role"] == "user"] == [f"turn {t}" for t in range(TURNS)]


def test_socket_events_are_the_http_stream_s_events(sdk: openai.OpenAI) -> None:
    body = {"model": "fake", "input": [{"role": "user", "content": "Same words"}], "instructions": "Be brief."}
    with sdk.responses.create(**body, stream=True, extra_headers={"X-Session-Id": "over-http"}) as stream:
        over_http = [event.model_dump(exclude_none=True) for event in stream]
    with sdk.responses.connect(extra_headers={"X-Session-Id": "over-socket"}) as connection:
        connection.response.create(**body)
        over_socket = answer(connection)
    assert normalized(over_socket) == normalized(over_http)


def test_a_bad_event_is_an_error_event_and_the_socket_stays_open(sdk: openai.OpenAI, proxy: ProxyServer) -> None:
    with sdk.responses.connect() as connection:
        connection.send({"type": "session.update"})  # type: ignore[arg-type]
        [refused] = answer(connection)
        assert refused["type"] == "error"
        assert refused["status"] == 400
        connection.response.create(model="nope", input="hi")
        [missing] = answer(connection)
        assert missing["status"] == 404
        assert missing["error"]["code"] == "model_not_found"
        connection.response.create(model="fake", input="still here")
        assert answer(connection)[-1]["type"] == "response.completed"
    with sqlite3.connect(proxy.config.store.path) as db:
        assert db.execute("SELECT COUNT(*) FROM journal_steps").fetchone()[0] == 1


def test_a_wrong_key_is_refused_at_the_handshake(serve_proxy: ServeProxy) -> None:
    proxy = serve_proxy(auth={"keys": ["k1"]})
    with (
        openai.OpenAI(base_url=proxy.base_url, api_key="wrong", max_retries=0) as client,
        pytest.raises(Exception, match="401"),
        client.responses.connect() as connection,
    ):
        connection.response.create(model="fake", input="hi")
    with (
        openai.OpenAI(base_url=proxy.base_url, api_key="k1", max_retries=0) as client,
        client.responses.connect() as connection,
    ):
        connection.response.create(model="fake", input="hi")
        assert answer(connection)[-1]["type"] == "response.completed"


def test_a_warm_up_is_answered_at_once_and_the_next_request_continues_it(
    sdk: openai.OpenAI, proxy: ProxyServer, fake: FakeUpstream
) -> None:
    """Codex warms its socket before each turn with the turn's request and `generate: false`, then sends only
    what is new with the warm-up's id as `previous_response_id`."""
    history = [{"role": "user", "content": "first question"}]
    body: dict[str, Any] = {"model": "fake", "instructions": "Be brief.", "store": False, "input": history}
    with sdk.responses.connect(extra_headers={"X-Session-Id": "warm"}) as connection:
        connection.send({"type": "response.create", **body, "generate": False})  # type: ignore[arg-type]
        warm = answer(connection)
        assert [event["type"] for event in warm] == ["response.created", "response.in_progress", "response.completed"]
        assert warm[-1]["response"]["output"] == []
        assert fake.requests == []  # no model call
        connection.response.create(**{**body, "input": [], "previous_response_id": warm[-1]["response"]["id"]})
        events = answer(connection)
    assert events[-1]["type"] == "response.completed", events[-1]
    assert fake.requests[-1].body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "first question"},
    ]


def test_a_warm_up_of_the_developer_message_alone_is_continued_by_the_turn(
    sdk: openai.OpenAI, fake: FakeUpstream
) -> None:
    """Codex 0.171.0 warms each turn's socket with its developer message alone; refused, it opened another socket
    and sent the whole input again on every turn."""
    developer = {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]}
    body: dict[str, Any] = {"model": "fake", "store": False, "input": [developer]}
    with sdk.responses.connect(extra_headers={"X-Session-Id": "warm-developer"}) as connection:
        connection.send({"type": "response.create", **body, "generate": False})  # type: ignore[arg-type]
        warm = answer(connection)
        assert warm[-1]["type"] == "response.completed", warm[-1]
        assert fake.requests == []
        question = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "first question"}]}
        connection.response.create(**{**body, "input": [question], "previous_response_id": warm[-1]["response"]["id"]})
        events = answer(connection)
    assert events[-1]["type"] == "response.completed", events[-1]
    assert fake.requests[-1].body["messages"] == [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": "first question"},
    ]


def test_a_warm_up_with_nothing_in_it_is_refused(sdk: openai.OpenAI) -> None:
    with sdk.responses.connect() as connection:
        connection.send({"type": "response.create", "model": "fake", "input": [], "generate": False})  # type: ignore[arg-type]
        [refused] = answer(connection)
    assert refused["type"] == "error"
    assert refused["status"] == 400


def test_an_unknown_previous_response_asks_for_the_whole_input(sdk: openai.OpenAI) -> None:
    """Codex resends the whole request when told `previous_response_not_found` (a new socket knows nothing)."""
    with sdk.responses.connect() as connection:
        connection.response.create(model="fake", input=[], previous_response_id="resp_00000000000000ff", store=False)
        [refused] = answer(connection)
    assert refused["type"] == "error"
    assert refused["error"]["code"] == refused["code"] == "previous_response_not_found"
    assert refused["status"] == 404


def test_a_socket_response_cut_by_kill_9_reads_back_as_what_the_client_saw(
    tmp_path: Path, fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an HTTP stream: after `kill -9` mid-response and a restart, the response reads back `cancelled` with at
    least the text its client saw over the socket, and the journal shows the step interrupted."""
    monkeypatch.setattr(proxy_server, "START_TIMEOUT_S", 60.0)  # a child process imports LiteLLM first
    long_reply = " ".join(f"w{n}" for n in range(60))
    fake.responder = lambda body: Reply(content=long_reply)
    fake.chunk_delay_s = 0.25
    raw = make_config(tmp_path, fake.url)
    first = ProxyProcess(raw, tmp_path)
    first.start()
    seen, response_id = "", ""
    try:
        with (
            openai.OpenAI(base_url=f"{first.url}/v1", api_key="unused", max_retries=0) as client,
            client.responses.connect() as connection,
        ):
            connection.response.create(model="fake", input="tell me a long story")
            for event in connection:
                if event.type == "response.created":
                    response_id = event.response.id
                if event.type == "response.output_text.delta":
                    seen += event.delta
                    if len(seen.split()) >= 10:
                        first.kill()
                        break
    finally:
        first.kill()
    assert_read_back_cut(raw, tmp_path, response_id, seen, long_reply)
