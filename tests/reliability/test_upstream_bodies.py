"""Big or malformed upstream answers cost the proxy a bounded amount, and reach the client as a short error.

A fake upstream on loopback answers with a 10 MB or 50 MB error body, an SSE body to a non-stream call, a
stream of lines that are not JSON, or JSON of the wrong shape. The proxy runs in its own process (a stall of its
event loop must not stall the test), logging at DEBUG; a thread probes its `/healthz` the whole time. Each case
asserts the client gets an OpenAI-shaped error with the upstream's status (or 502) and no Python exception text,
the journal step ends `failed`, `/healthz` never waited a second, and nothing relayed, stored or logged is
longer than the cap on an upstream's text (`proxy.upstream.redaction.MAX_TEXT_CHARS`).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.upstream.redaction import CUT_MARK, MAX_TEXT_CHARS
from tests.reliability.support import assert_openai_error, read_only
from tests.support.fake_anthropic_upstream import FakeAnthropicUpstream
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.proxy_server import ProxyProcess, make_config

CLIENT_TIMEOUT_S = 15.0
HEALTH_LIMIT_S = 1.0
PROBE_EVERY_S = 0.05
SLACK_CHARS = 1024
"""A log line or stored row may hold the capped text and a little of the proxy's own around it."""
SECRET = "sk-upstream-secret"
MB = 1_000_000


def error_text(size: int) -> bytes:
    words = b"upstream exploded at step 12 of the batch; "
    return (f"key {SECRET} refused. ".encode() + words * (size // len(words)))[:size]


def sse(*payloads: str) -> bytes:
    return "".join(f"data: {payload}\n\n" for payload in payloads).encode()


CHUNK = json.dumps(
    {
        "id": "c",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": {"content": "hi"}}],
    }
)


@dataclass(frozen=True)
class Case:
    name: str
    stream: bool
    fault: Fault
    status: int
    """The HTTP status the client gets; 200 when the failure arrives as an SSE error event."""


CASES = [
    Case("10MB-error-json", False, Fault(status=500, raw_body=error_text(10 * MB), media_type="text/plain"), 500),
    Case("10MB-error-stream", True, Fault(status=500, raw_body=error_text(10 * MB), media_type="text/plain"), 500),
    Case("50MB-error-json", False, Fault(status=503, raw_body=error_text(50 * MB), media_type="text/plain"), 503),
    Case("sse-to-json", False, Fault(status=200, raw_body=sse(*[CHUNK] * 20_000), media_type="text/event-stream"), 502),
    Case(
        "non-json-lines",
        True,
        Fault(status=200, raw_body=sse(*["not json at all"] * 50, "[DONE]"), media_type="text/event-stream"),
        200,
    ),
    Case(
        "wrong-shape-chunk",
        True,
        Fault(status=200, raw_body=sse('{"choices": "nope"}', "[DONE]"), media_type="text/event-stream"),
        200,
    ),
    Case("wrong-shape-json", False, Fault(status=200, raw_body=b'{"choices": "nope"}'), 502),
]


class HealthProbe:
    """`/healthz` asked every `PROBE_EVERY_S` from a thread; the slowest answer (or a failure's wait) is kept."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-probe", daemon=True)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(CLIENT_TIMEOUT_S)

    def _run(self) -> None:
        with httpx.Client(timeout=CLIENT_TIMEOUT_S) as http:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    ok = http.get(f"{self.url}/healthz").status_code == 200
                except httpx.HTTPError:
                    ok = False
                waited = time.monotonic() - started
                self.worst_s = max(self.worst_s, waited if ok else CLIENT_TIMEOUT_S)
                self._stop.wait(PROBE_EVERY_S)


def call(url: str, stream: bool, session: str) -> tuple[int, dict[str, Any], list[str]]:
    """The status, the OpenAI error the client got (as JSON or as the stream's error event), and the stream's
    other `data:` payloads."""
    body = {"model": "fake", "stream": stream, "messages": [{"role": "user", "content": "hello"}]}
    headers = {"X-Session-Id": session}
    with (
        httpx.Client(timeout=CLIENT_TIMEOUT_S) as http,
        http.stream("POST", f"{url}/v1/chat/completions", json=body, headers=headers) as answer,
    ):
        if answer.status_code != 200 or not stream:
            return answer.status_code, json.loads(answer.read()), []
        error: dict[str, Any] = {}
        others: list[str] = []
        for line in answer.iter_lines():
            if not line.startswith("data: "):
                continue
            payload = line[len("data: ") :]
            parsed = json.loads(payload) if payload != "[DONE]" else None
            if isinstance(parsed, dict) and "error" in parsed:
                error = parsed
            else:
                others.append(payload)
        return answer.status_code, error, others


def stored_texts(path: Path) -> list[str]:
    with read_only(path) as db:
        rows = [*db.execute("SELECT * FROM journal_steps"), *db.execute("SELECT * FROM journal_events")]
    return [value for row in rows for value in tuple(row) if isinstance(value, str)]


@pytest.mark.time_budget(90)
@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_big_or_malformed_upstream_answer_is_a_short_error(tmp_path: Path, fake: FakeUpstream, case: Case) -> None:
    raw = make_config(tmp_path, fake.url, upstream={"timeout_s": 10, "num_retries": 0})
    session = f"bodies-{case.name}"
    with ProxyProcess(raw, tmp_path, log_level="debug") as proxy:
        # LiteLLM's first call in a process imports for ~0.5 s: not what is measured here.
        assert call(proxy.url, False, f"{session}-warm")[0] == 200
        with HealthProbe(proxy.url) as probe:
            fake.fail_next(case.fault)
            started = time.monotonic()
            status, body, others = call(proxy.url, case.stream, session)
            elapsed = time.monotonic() - started
            time.sleep(3 * PROBE_EVERY_S)
        with httpx.Client(base_url=proxy.url, timeout=CLIENT_TIMEOUT_S) as http:
            steps = http.get("/journal", params={"session_id": session}).json()["data"]

    assert status == case.status, body
    error = assert_openai_error(body)
    message = error["message"]
    assert len(message) <= MAX_TEXT_CHARS
    assert SECRET not in message
    assert "Traceback" not in message, message
    assert "object has no attribute" not in message, message
    if case.status in (200, 502):
        assert error["type"] == "upstream_error", error
        assert len(message) < 200, message
    else:
        assert message.endswith(CUT_MARK), message[-200:]
    assert not [payload for payload in others if payload == "[DONE]"], "a failed stream ends without [DONE]"
    assert [step["status"] for step in steps] == ["failed"], steps
    assert probe.worst_s < HEALTH_LIMIT_S, f"/healthz waited {probe.worst_s:.2f} s (the call took {elapsed:.2f} s)"

    too_long = [len(text) for text in stored_texts(proxy.config_path.parent / "store.db") if len(text) > MAX_TEXT_CHARS]
    assert not too_long, f"stored texts of {too_long} characters"
    log = proxy.log_path.read_text(errors="replace")
    assert SECRET not in log
    long_lines = [len(line) for line in log.splitlines() if len(line) > MAX_TEXT_CHARS + SLACK_CHARS]
    assert not long_lines, f"log lines of {long_lines} characters"


@pytest.mark.time_budget(90)
def test_a_big_error_body_on_a_translated_route_is_read_bounded_too(tmp_path: Path) -> None:
    """An `anthropic/` model without `api: messages` goes through LiteLLM's translation; its error body is read
    through the same bounded transport as the pass-through route's (before: whole, ~8 µs a byte on the loop)."""
    with FakeAnthropicUpstream() as native:
        model = {"name": "fake", "model": "anthropic/claude-fake", "api_base": native.url, "api_key": SECRET}
        raw = make_config(tmp_path, native.url, models=[model], upstream={"timeout_s": 10, "num_retries": 0})
        with ProxyProcess(raw, tmp_path, log_level="debug") as proxy:
            assert call(proxy.url, False, "translated-warm")[0] == 200
            streamed = call(proxy.url, True, "translated-stream")  # streams go through the bounded transport too
            assert streamed[:2] == (200, {}), streamed
            assert streamed[2][-1] == "[DONE]"
            with HealthProbe(proxy.url) as probe:
                text = error_text(2 * MB).decode()
                native.fail_next(500, {"type": "error", "error": {"type": "api_error", "message": text}})
                del text
                status, body, _others = call(proxy.url, False, "translated")
                time.sleep(3 * PROBE_EVERY_S)
    assert status == 500, body
    message = assert_openai_error(body)["message"]
    assert len(message) <= MAX_TEXT_CHARS
    assert SECRET not in message
    assert probe.worst_s < HEALTH_LIMIT_S, f"/healthz waited {probe.worst_s:.2f} s"
