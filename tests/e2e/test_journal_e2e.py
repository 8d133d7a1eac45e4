"""The stream journal seen from outside: served proxies, real sockets, a real SQLite file, real SIGKILLs.

Invariant 7 (a stream event is durable before the client can see it) is pinned from both ends: a proxy killed
mid-stream keeps at least what its client saw, and a second reader of the SQLite file finds every chunk the
client holds. Around it: what a client leaving, an upstream failing and an Idempotency-Key retry leave in the
journal, tenant isolation of `GET /journal`, and `context-proxy journal list`. Every wait is bounded.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import httpx
import openai
import pytest

from proxy.cli import main as cli_main
from tests.conftest import ServeProxy
from tests.support import proxy_server
from tests.support.fake_upstream import FakeUpstream, Fault, Reply
from tests.support.proxy_server import ProxyProcess, ProxyServer, make_config

T = TypeVar("T")
Chunk = dict[str, Any]

TIMEOUT_S = 20.0
SETTLE_S = 5.0
"""How long a background outcome (a detached stream sealing or being interrupted) may take to show."""
POLL_S = 0.05
PROCESS_START_TIMEOUT_S = 60.0


def words(prefix: str, count: int) -> str:
    return " ".join(f"{prefix}{n}" for n in range(count))


LONG_REPLY = words("long", 60)
SHORT_REPLY = words("tail", 3)


def reply_by_topic(body: dict[str, Any]) -> Reply:
    """A reply chosen by the last user message: 'long' → 60 words, 'short' → 3, anything else → 30."""
    last = str(body["messages"][-1]["content"])
    if "long" in last:
        return Reply(content=LONG_REPLY)
    if "short" in last:
        return Reply(content=SHORT_REPLY)
    return Reply(content=words("mid", 30))


def payload(topic: str, *, stream: bool = True) -> dict[str, Any]:
    return {
        "model": "fake",
        "messages": [{"role": "system", "content": "Be verbose."}, {"role": "user", "content": f"tell me {topic}"}],
        "stream": stream,
    }


def chunk_text(chunk: Chunk) -> str:
    return "".join((choice.get("delta") or {}).get("content") or "" for choice in chunk.get("choices") or [])


def finish_reason(chunk: Chunk) -> str | None:
    for choice in chunk.get("choices") or []:
        if choice.get("finish_reason"):
            return str(choice["finish_reason"])
    return None


def sse_chunks(response: httpx.Response) -> Iterator[Chunk]:
    """The JSON events of an SSE response, as they arrive; stops at `[DONE]`."""
    for line in response.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[len("data: ") :]
        if data == "[DONE]":
            return
        event: Chunk = json.loads(data)
        yield event


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = SETTLE_S) -> T:
    """Poll `probe` until it returns something other than None, for at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = probe()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL_S)


def journal(http: httpx.Client, **params: str) -> list[dict[str, Any]]:
    response = http.get("/journal", params=params)
    assert response.status_code == 200, response.text
    steps: list[dict[str, Any]] = response.json()["data"]
    return steps


def step_with_status(http: httpx.Client, status: str, **params: str) -> Callable[[], dict[str, Any] | None]:
    def probe() -> dict[str, Any] | None:
        steps = journal(http, **params)
        return steps[0] if steps and steps[0]["status"] == status else None

    return probe


@contextmanager
def read_only(path: Path) -> Iterator[sqlite3.Connection]:
    connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    try:
        yield connection
    finally:
        connection.close()


@pytest.fixture
def slow_fake(fake: FakeUpstream) -> FakeUpstream:
    fake.responder = reply_by_topic
    fake.chunk_delay_s = 0.05
    return fake


# --- 1. kill -9 mid-stream -------------------------------------------------------------------------------------


def test_kill_mid_stream_keeps_what_the_client_saw_and_completes_what_had_ended(
    tmp_path: Path, slow_fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two streams in flight when the proxy is SIGKILLed: one mid-answer (→ interrupted, with at least the text
    its client saw) and one whose final chunk had been relayed while the upstream held back the end of its
    stream (→ complete after restart, its answer linked into the session's history)."""
    # A child process imports LiteLLM (seconds of CPU): on a busy machine that alone can exceed the default.
    monkeypatch.setattr(proxy_server, "START_TIMEOUT_S", PROCESS_START_TIMEOUT_S)
    slow_fake.chunk_delay_s = 0.25
    raw = make_config(tmp_path, slow_fake.url)
    first = ProxyProcess(raw, tmp_path)
    first.start()
    try:
        with (
            httpx.Client(base_url=first.url, timeout=TIMEOUT_S) as http,
            http.stream("POST", "/v1/chat/completions", json=payload("long")) as cut,
        ):
            assert cut.status_code == 200
            cut_events = sse_chunks(cut)
            seen_cut = ""
            content_chunks = 0
            while content_chunks < 10:
                text = chunk_text(next(cut_events))
                if text:
                    content_chunks += 1
                    seen_cut += text

            with http.stream("POST", "/v1/chat/completions", json=payload("short")) as ended:
                assert ended.status_code == 200
                session_id = ended.headers["x-session-id"]
                seen_ended = ""
                for chunk in sse_chunks(ended):
                    seen_ended += chunk_text(chunk)
                    if seen_ended == SHORT_REPLY and not finish_reason(chunk):
                        # The fake is now pausing before the finish chunk; the pause after it is long, so
                        # the proxy receives the answer's end but never the end of the stream.
                        slow_fake.chunk_delay_s = 60.0
                    if finish_reason(chunk):
                        break
                assert seen_ended == SHORT_REPLY
                first.kill()
    finally:
        first.kill()

    second = ProxyProcess(raw, tmp_path)
    second.start()
    try:
        with httpx.Client(base_url=second.url, timeout=TIMEOUT_S) as http:
            interrupted = journal(http, status="interrupted")
            assert len(interrupted) == 1
            assert interrupted[0]["content"].startswith(seen_cut)
            assert LONG_REPLY.startswith(interrupted[0]["content"])

            complete = journal(http, status="complete")
            assert len(complete) == 1
            assert complete[0]["content"] == SHORT_REPLY
            assert complete[0]["session_id"] == session_id
            assert complete[0]["message_id"] is not None
            assert journal(http, status="open") == []

            history = http.get(f"/sessions/{session_id}").json()
            assert history["messages"][-1]["role"] == "assistant"
            assert history["messages"][-1]["content"] == SHORT_REPLY
            assert history["messages"][-1]["id"] == complete[0]["message_id"]
    finally:
        second.stop()

    with read_only(Path(raw["store"]["path"])) as db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)


# --- 2, 3. the client leaves early ----------------------------------------------------------------------------


def read_then_leave(http: httpx.Client, topic: str, chunks: int) -> tuple[str, str]:
    """Read `chunks` content chunks of a stream, then close the connection; returns (session id, text seen)."""
    seen = ""
    with http.stream("POST", "/v1/chat/completions", json=payload(topic)) as response:
        assert response.status_code == 200
        session_id = response.headers["x-session-id"]
        content_chunks = 0
        for chunk in sse_chunks(response):
            text = chunk_text(chunk)
            if text:
                seen += text
                content_chunks += 1
                if content_chunks == chunks:
                    break
    return session_id, seen


def test_client_leaving_early_still_gets_the_answer_sealed_into_history(
    serve_proxy: ServeProxy, slow_fake: FakeUpstream
) -> None:
    proxy = serve_proxy()
    full = words("mid", 30)
    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as http:
        session_id, seen = read_then_leave(http, "mid", 3)
        assert full.startswith(seen)
        assert seen != full

        step = wait_for(step_with_status(http, "sealed"), "the detached stream to seal")
        assert step["content"] == full
        assert step["finish_reason"] == "stop"
        assert step["session_id"] == session_id

        head = http.get(f"/sessions/{session_id}").json()["messages"][-1]
        assert (head["role"], head["content"], head["id"]) == ("assistant", full, step["message_id"])


def test_client_leaving_with_finish_on_disconnect_off_interrupts_the_upstream(
    serve_proxy: ServeProxy, slow_fake: FakeUpstream
) -> None:
    proxy = serve_proxy(journal={"finish_on_disconnect": False})
    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as http:
        session_id, seen = read_then_leave(http, "long", 3)

        step = wait_for(step_with_status(http, "interrupted"), "the stream to be interrupted")
        assert step["content"].startswith(seen)
        assert LONG_REPLY.startswith(step["content"])
        assert step["content"] != LONG_REPLY
        assert step["finish_reason"] is None
        # The upstream read was cancelled: well after the reply would have ended, nothing more was journaled.
        time.sleep(0.5)
        assert http.get(f"/journal/{step['step_id']}").json()["content"] == step["content"]
        messages = http.get(f"/sessions/{session_id}").json()["messages"]
        assert [m["role"] for m in messages] == ["system", "user"]


# --- 4. the upstream drops mid-stream ---------------------------------------------------------------------------


def test_upstream_dropping_mid_stream_is_an_error_event_and_a_failed_step(
    proxy: ProxyServer, client: openai.OpenAI, slow_fake: FakeUpstream
) -> None:
    # The role chunk and two words, then the connection is cut. The chunks are spaced out so that they reach
    # the proxy before the cut does (a chunk arriving in the same read as the broken end may be lost upstream).
    slow_fake.fail_next(Fault(drop_after_chunks=3))
    received: list[str] = []
    stream = client.chat.completions.create(**payload("mid"))
    with pytest.raises(openai.APIError):
        for chunk in stream:
            received.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
    partial = "".join(received)
    assert partial == "mid0 mid1"

    with httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as http:
        failed = journal(http, status="failed")
        assert len(failed) == 1
        assert failed[0]["content"] == partial
        assert set(failed[0]["error"]) >= {"message", "type"}

    after = client.chat.completions.create(**payload("short"))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in after if chunk.choices) == SHORT_REPLY


# --- 5. Idempotency-Key ----------------------------------------------------------------------------------------


def stream_texts(client: openai.OpenAI, key: str, topic: str) -> tuple[list[str], httpx.Headers]:
    raw = client.chat.completions.with_raw_response.create(**payload(topic), extra_headers={"Idempotency-Key": key})
    texts = [chunk.choices[0].delta.content or "" for chunk in raw.parse() if chunk.choices]
    return texts, raw.headers


def test_idempotency_key_replays_from_the_journal(client: openai.OpenAI, fake: FakeUpstream) -> None:
    fake.responder = reply_by_topic
    original, headers = stream_texts(client, "k1", "mid")
    assert "".join(original) == words("mid", 30)
    assert "x-context-replay" not in headers
    calls = len(fake.requests)

    replayed, headers = stream_texts(client, "k1", "mid")
    assert replayed == original
    assert headers["x-context-replay"] == "true"

    as_json = client.chat.completions.with_raw_response.create(
        **payload("mid", stream=False), extra_headers={"Idempotency-Key": "k1"}
    )
    assert as_json.headers["x-context-replay"] == "true"
    completion = as_json.parse()
    assert completion.object == "chat.completion"
    assert completion.choices[0].message.content == "".join(original)
    assert len(fake.requests) == calls

    with pytest.raises(openai.ConflictError) as conflict:
        client.chat.completions.create(**payload("long"), extra_headers={"Idempotency-Key": "k1"})
    assert conflict.value.status_code == 409
    body = conflict.value.body
    assert isinstance(body, dict)
    assert set(body) >= {"message", "type", "param", "code"}
    assert len(fake.requests) == calls

    fresh = client.chat.completions.create(**payload("mid", stream=False))
    assert fresh.choices[0].message.content == "".join(original)
    assert len(fake.requests) == calls + 1


def test_idempotency_key_replays_a_json_original(client: openai.OpenAI, fake: FakeUpstream) -> None:
    fake.responder = reply_by_topic
    headers = {"Idempotency-Key": "json-1"}
    original = client.chat.completions.create(**payload("short", stream=False), extra_headers=headers)
    calls = len(fake.requests)

    again = client.chat.completions.with_raw_response.create(**payload("short", stream=False), extra_headers=headers)
    assert again.headers["x-context-replay"] == "true"
    assert again.parse().choices[0].message.content == original.choices[0].message.content == SHORT_REPLY
    streamed, stream_headers = stream_texts(client, "json-1", "short")
    assert stream_headers["x-context-replay"] == "true"
    assert "".join(streamed) == SHORT_REPLY
    assert len(fake.requests) == calls


# --- 6. non-stream steps, tenants -------------------------------------------------------------------------------


def test_json_responses_are_journaled_and_visible_only_to_their_tenant(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.responder = reply_by_topic
    proxy = serve_proxy(auth={"keys": ["key-alice", "key-bob"]})
    alice = openai.OpenAI(base_url=proxy.base_url, api_key="key-alice", max_retries=0, timeout=TIMEOUT_S)
    answer = alice.chat.completions.create(**payload("short", stream=False))
    assert answer.choices[0].message.content == SHORT_REPLY

    with (
        httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S, headers={"Authorization": "Bearer key-alice"}) as a,
        httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S, headers={"Authorization": "Bearer key-bob"}) as b,
    ):
        steps = journal(a)
        assert [(s["status"], s["content"]) for s in steps] == [("sealed", SHORT_REPLY)]
        step = a.get(f"/journal/{steps[0]['step_id']}").json()
        assert step["content"] == SHORT_REPLY
        assert step["finish_reason"] == "stop"

        assert journal(b) == []
        foreign = b.get(f"/journal/{steps[0]['step_id']}")
        assert foreign.status_code == 404
        assert set(foreign.json()["error"]) == {"message", "type", "param", "code"}


# --- 7. context-proxy journal list ------------------------------------------------------------------------------


def test_cli_lists_the_steps_beside_the_running_server(
    tmp_path: Path, serve_proxy: ServeProxy, slow_fake: FakeUpstream, capsys: pytest.CaptureFixture[str]
) -> None:
    proxy = serve_proxy()
    client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=TIMEOUT_S)
    client.chat.completions.create(**payload("short", stream=False))
    slow_fake.fail_next(Fault(drop_after_chunks=2))
    with pytest.raises(openai.APIError):
        list(client.chat.completions.create(**payload("mid")))
    config = tmp_path / "cli-config.json"
    config.write_text(json.dumps(make_config(tmp_path, slow_fake.url)))
    capsys.readouterr()

    assert cli_main(["journal", "list", "--config", str(config), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["data"]
    assert [(s["status"], s["content"]) for s in listed] == [("failed", "mid0"), ("sealed", SHORT_REPLY)]

    assert cli_main(["journal", "list", "--config", str(config), "--json", "--status", "sealed"]) == 0
    assert [s["status"] for s in json.loads(capsys.readouterr().out)["data"]] == ["sealed"]


# --- 8. write before relay, seen by a second reader -------------------------------------------------------------


def test_every_chunk_the_client_holds_is_already_in_the_sqlite_file(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    fake.responder = lambda body: Reply(content=words("slow", 6))
    fake.chunk_delay_s = 0.2
    proxy = serve_proxy()
    store = proxy.config.store.path
    received: list[Chunk] = []
    checked = 0
    with (
        httpx.Client(base_url=proxy.url, timeout=TIMEOUT_S) as http,
        http.stream("POST", "/v1/chat/completions", json=payload("slowly")) as response,
    ):
        assert response.status_code == 200
        for chunk in sse_chunks(response):
            received.append(chunk)
            with read_only(store) as db:
                step_id, status = db.execute("SELECT id, status FROM journal_steps ORDER BY id DESC").fetchone()
                events = db.execute(
                    "SELECT content FROM journal_events WHERE step_id = ? AND type IN ('text', 'tool_call') "
                    "ORDER BY seq",
                    (step_id,),
                ).fetchall()
            assert len(events) >= len(received), (status, len(events), len(received))
            stored_text = "".join(chunk_text(json.loads(content)) for (content,) in events)
            seen = "".join(chunk_text(c) for c in received)
            assert stored_text.startswith(seen)
            checked += 1
    assert "".join(chunk_text(c) for c in received) == words("slow", 6)
    assert checked >= 7  # the role chunk, six words, the finish chunk
