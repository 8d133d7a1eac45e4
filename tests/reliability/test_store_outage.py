"""A PostgreSQL outage heals by itself: while the server is down every request fails fast with a 503 that says
so and `/healthz` reports the store unreachable; once it is back, the proxy serves again without a restart and
no turn answered before the outage is lost. The test stops and starts a PostgreSQL server of its own."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.errors import StoreUnavailable
from proxy.store.database import Database
from proxy.store.outage import Outage
from tests.reliability.support import assert_openai_error, sse_events
from tests.support.fake_upstream import FakeUpstream, Reply
from tests.support.postgres_server import PostgresServer
from tests.support.proxy_server import ProxyServer, make_config

FAIL_FAST_S = 1.0
"""What a request may take while the outage is known (the back-off admits one probe at a time)."""
FIRST_FAILURE_S = 4.0
"""The first request to meet the outage: it finds a dead connection, and the server refuses a new one."""
HEAL_S = 20.0


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of the test's own: stopping the session's would break the other tests."""
    with PostgresServer() as server:
        yield server


def ask(client: httpx.Client, answered: list[dict[str, str]], i: int) -> httpx.Response:
    body = {"model": "fake", "messages": [*answered, {"role": "user", "content": f"question {i}"}]}
    return client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "outage"})


@pytest.mark.time_budget(150)
def test_a_postgresql_outage_fails_fast_with_503_and_heals_without_a_restart(
    own_postgres: PostgresServer, fake: FakeUpstream, tmp_path: Path
) -> None:
    config = make_config(tmp_path, fake.url, store={"url": own_postgres.url, "pool_size": 4})
    answered: list[dict[str, str]] = []

    def answer_turn(client: httpx.Client, i: int) -> None:
        response = ask(client, answered, i)
        assert response.status_code == 200, response.text
        answered.extend([{"role": "user", "content": f"question {i}"}, response.json()["choices"][0]["message"]])

    with ProxyServer(config, tmp_path) as proxy, httpx.Client(base_url=proxy.url, timeout=30) as client:
        for i in range(3):
            answer_turn(client, i)
        assert client.get("/healthz").json()["store"] == "ok"

        own_postgres.pause()
        started = time.monotonic()
        first = ask(client, answered, 3)
        assert first.status_code == 503, first.text
        assert time.monotonic() - started < FIRST_FAILURE_S
        assert first.json()["error"]["code"] == "store_unavailable"
        assert "Retry-After" in first.headers
        assert own_postgres.url.split("@")[1].split("/")[0] not in first.text  # no host or port for clients
        for _ in range(5):
            started = time.monotonic()
            refused = ask(client, answered, 3)
            assert refused.status_code == 503, refused.text
            assert time.monotonic() - started < FAIL_FAST_S
        health = client.get("/healthz")
        assert health.status_code == 503
        assert health.json()["store"] == "unreachable"

        own_postgres.resume()
        deadline = time.monotonic() + HEAL_S
        while client.get("/healthz").status_code != 200:
            assert time.monotonic() < deadline, "the proxy did not see the store come back"
            time.sleep(0.1)
        for i in range(3, 6):  # the store's writer, reads and locks all work again
            answer_turn(client, i)
        session = client.get("/sessions/outage").json()
        contents = [message["content"] for message in session["messages"]]
        assert contents == [message["content"] for message in answered]


async def test_the_writer_outlives_a_lost_server_and_reconnects(own_postgres: PostgresServer) -> None:
    """The unit under the proxy: a write that meets the outage fails as `StoreUnavailable`, never stops the
    writer, and writes succeed once the server is back."""
    database = await Database.open(own_postgres.url)
    try:
        await database.write(lambda c: c.execute("CREATE TABLE items (id BIGINT PRIMARY KEY)"))
        await database.write(lambda c: c.execute("INSERT INTO items (id) VALUES (1)"))
        own_postgres.pause()
        for _ in range(3):
            with pytest.raises(StoreUnavailable):
                await database.write(lambda c: c.execute("INSERT INTO items (id) VALUES (2)"))
        assert database.unreachable() is not None
        own_postgres.resume()
        deadline = time.monotonic() + HEAL_S
        while True:
            try:
                await database.write(lambda c: c.execute("INSERT INTO items (id) VALUES (3)"))
                break
            except StoreUnavailable:
                assert time.monotonic() < deadline
                await asyncio.sleep(0.1)
        rows = await database.fetchall("SELECT id FROM items ORDER BY id")
        assert [row[0] for row in rows] == [1, 3]
        assert database.unreachable() is None
    finally:
        await database.close()


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_outage_admits_one_probe_per_back_off_window_and_ends_on_success() -> None:
    clock = Clock()
    outage = Outage(clock)
    outage.admit()  # no outage: everyone passes
    error = outage.failed("connection refused")
    assert error.status == 503
    assert error.headers["Retry-After"] == "1"
    assert outage.reason == "connection refused"
    with pytest.raises(StoreUnavailable):
        outage.admit()
    clock.now += 0.3
    outage.admit()  # the window is over: this caller probes...
    with pytest.raises(StoreUnavailable):
        outage.admit()  # ...and the others still fail fast
    outage.failed("connection refused")  # the probe failed: a longer wait
    clock.now += 0.3
    with pytest.raises(StoreUnavailable):
        outage.admit()
    clock.now += 0.3
    outage.admit()
    outage.recovered()
    assert outage.reason is None
    outage.admit()
    outage.admit()


SETTLE_S = 20.0
"""How long after the store is back a step this process ended may still say `open`."""
STREAMS = 3


def stream_until_the_end(url: str, body: dict[str, Any], started: threading.Event) -> list[Any]:
    """Every SSE payload of one stream; `started` is set once its first chunk arrived."""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.status_code == 200, response.read()
        received: list[Any] = []
        for event in sse_events(response):
            received.append(event)
            started.set()
        return received


def open_steps(server: PostgresServer) -> list[str]:
    return server.psql("SELECT id FROM journal_steps WHERE status = 'open' ORDER BY id").split()


@pytest.mark.time_budget(150)
def test_steps_cut_off_by_an_outage_are_settled_once_the_store_is_back_and_their_error_says_what_was_kept(
    own_postgres: PostgresServer, fake: FakeUpstream, tmp_path: Path
) -> None:
    """Issue 41, item 7: three streams and a non-stream call are under way when PostgreSQL stops. Each client
    hears which journal step holds its request and what of the answer was kept (not "nothing was saved"), and
    once the store is back the replica ends those steps `failed` by itself: none stays `open` (in flight in
    `/journal` and the dashboard) for as long as the process lives."""
    fake.chunk_delay_s = 0.05
    fake.responder = lambda body: Reply(content="word " * 200, finish_reason="stop")  # ~10 s a stream
    fake.delay = lambda body: 0.0 if body.get("stream") else 2.0  # the non-stream answer arrives in the outage
    config = make_config(tmp_path, fake.url, store={"url": own_postgres.url, "pool_size": 4})
    with ProxyServer(config, tmp_path) as proxy, ThreadPoolExecutor(STREAMS + 1) as pool:
        started = [threading.Event() for _ in range(STREAMS)]
        streams = [
            pool.submit(
                stream_until_the_end,
                proxy.url,
                {"model": "fake", "stream": True, "messages": [{"role": "user", "content": f"stream {n}"}]},
                started[n],
            )
            for n in range(STREAMS)
        ]
        body = {"model": "fake", "messages": [{"role": "user", "content": "no stream"}]}
        single = pool.submit(httpx.post, f"{proxy.url}/v1/chat/completions", json=body, timeout=60)
        for event in started:
            assert event.wait(20)
        deadline = time.monotonic() + 20
        while len(own_postgres.psql("SELECT id FROM journal_steps").split()) < STREAMS + 1:
            assert time.monotonic() < deadline, "the non-stream call's step was not begun"
            time.sleep(0.05)
        own_postgres.pause()
        received = [stream.result(timeout=60) for stream in streams]
        answered = single.result(timeout=60)
        time.sleep(1)
        own_postgres.resume()
        deadline = time.monotonic() + SETTLE_S
        while open_steps(own_postgres):
            assert time.monotonic() < deadline, (
                f"steps still open after the store came back: {open_steps(own_postgres)}"
            )
            time.sleep(0.2)
        journal = httpx.get(f"{proxy.url}/journal", params={"limit": 10}, timeout=30).json()["data"]

    statuses = dict(
        line.split("|") for line in own_postgres.psql("SELECT id, status FROM journal_steps ORDER BY id").split()
    )
    assert sorted(statuses.values()) == ["failed"] * (STREAMS + 1)
    assert {step["status"] for step in journal} == {"failed"}
    errors = {int(step["step_id"]): step["error"] for step in journal}
    for events in received:
        error = assert_openai_error(events[-1])
        assert error["code"] == "store_unavailable"
        assert "nothing of this request was saved" not in error["message"]
        assert "relayed before this point is kept" in error["message"]
        step_id = next(step for step in errors if f"journal step {step}" in error["message"])
        assert errors[step_id]["message"] == error["message"]  # the step keeps what its client was told
        relayed = "".join(event["choices"][0]["delta"].get("content") or "" for event in events[:-1])
        kept = next(step for step in journal if step["step_id"] == step_id)["content"]
        assert (kept or "") == relayed  # what was relayed is what the step kept, no more
    assert answered.status_code == 503, answered.text
    error = assert_openai_error(answered.json())
    assert error["code"] == "store_unavailable"
    assert "nothing of this request was saved" not in error["message"]
    assert "the answer was not saved" in error["message"]
    assert any(f"journal step {step}" in error["message"] for step in errors)
