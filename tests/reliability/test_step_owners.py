"""A second process starting on the same store leaves the first one's live stream alone (issue 12, item 2).

The first proxy serves a slow stream; while its step is open, `python -m proxy serve` starts on the same SQLite
file and runs its startup recovery. The step belongs to a live process, so it stays open: the first client still
gets every chunk and `[DONE]`, the step is sealed and the answer joins the history. Both processes are owners
while they run; the second one's clean shutdown removes only its own row.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from tests.conftest import ServeProxy
from tests.reliability.support import chunk_text, read_only, sse_events
from tests.support.fake_upstream import FakeUpstream, Reply
from tests.support.proxy_server import ProxyProcess, make_config

ANSWER = " ".join(f"w{n}" for n in range(30))
SLOW_CHUNK_S = 0.5
"""Long enough for the stream to outlive the second process's start (its LiteLLM import) by far; dropped to 0
once the second process is serving."""
CLIENT_TIMEOUT_S = 30.0


def long_answer(body: dict[str, Any]) -> Reply:
    return Reply(content=ANSWER)


def open_steps(path: Path) -> list[int]:
    with read_only(path) as db:
        return [int(row[0]) for row in db.execute("SELECT id FROM journal_steps WHERE status = 'open'")]


def test_a_second_process_starting_leaves_a_live_stream_open(
    tmp_path: Path, fake: FakeUpstream, serve_proxy: ServeProxy
) -> None:
    fake.responder = long_answer
    fake.chunk_delay_s = SLOW_CHUNK_S
    first = serve_proxy()
    store = first.config.store.path
    body = {
        "model": "fake",
        "stream": True,
        "messages": [{"role": "user", "content": "tell me a long story"}],
    }
    seen, events = "", []
    second_dir = tmp_path / "second"
    second_dir.mkdir()
    second = ProxyProcess(make_config(tmp_path, fake.url), second_dir)
    try:
        with (
            httpx.Client(base_url=first.url, timeout=CLIENT_TIMEOUT_S) as http,
            http.stream("POST", "/v1/chat/completions", json=body, headers={"X-Session-Id": "live"}) as response,
        ):
            assert response.status_code == 200
            stream = sse_events(response)
            events.append(next(stream))
            (step_id,) = open_steps(store)

            second.start()  # returns once it is healthy: its startup recovery has run
            assert open_steps(store) == [step_id]
            with read_only(store) as db:
                assert db.execute("SELECT COUNT(*) FROM journal_owners").fetchone()[0] == 2

            fake.chunk_delay_s = 0.0
            events.extend(stream)
    finally:
        second.stop()

    assert events[-1] == "[DONE]", events[-3:]
    for event in events[:-1]:
        assert isinstance(event, dict)
        assert "error" not in event, event
        seen += chunk_text(event)
    assert seen == ANSWER

    with read_only(store) as db:
        step = db.execute("SELECT status, content, message_id FROM journal_steps WHERE id = ?", (step_id,)).fetchone()
        assert (step["status"], step["content"]) == ("sealed", ANSWER)
        assert step["message_id"] is not None
        node = db.execute("SELECT role, body FROM messages WHERE id = ?", (step["message_id"],)).fetchone()
        head = db.execute("SELECT head_id FROM sessions WHERE id = 'live'").fetchone()
        owners = db.execute("SELECT COUNT(*) FROM journal_owners").fetchone()[0]
    assert node["role"] == "assistant"
    assert json.loads(node["body"])["content"] == ANSWER
    assert head["head_id"] == step["message_id"]
    assert owners == 1  # the second process released its row; the first still serves
