"""`limits.max_answer_chars` bounds what is read of an answer, not only what is relayed.

Each test serves the proxy (uvicorn on 127.0.0.1, in this process) over the strict fake upstream, whose answer is a
single 24 MB body sent piece by piece: the process's resident size is sampled while the proxy handles it.
1. A non-stream answer far past the limit is a 502 `answer_too_large` as soon as its first bytes pass the cap:
   the body is neither read whole nor stored (before: parsed whole, refused, and its 24 MB stored in the step).
2. One SSE event far past the limit cuts the stream off with `answer_too_large` after what arrived before it
   (kept in the journal); the event is not gathered whole.
(An answer between the limit and the byte cap keeps the limit's worth in its failed step: test_event_loop.py.)
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import httpx
import pytest

from proxy.upstream.bounded_bodies import answer_byte_cap
from tests.conftest import ServeProxy
from tests.reliability.support import assert_openai_error, read_only, sse_events
from tests.reliability.test_header_size import peak_rss, rss_bytes
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.proxy_server import ProxyServer

LIMIT = 2048
HUGE_CHARS = 24 * 1024 * 1024
PIECE = b"x" * 65536
WAIT_S = 30.0
GROWTH_BYTES = 12 * 1024 * 1024
"""How much the process may grow while refusing a 24 MB answer: a fraction of it (reading it whole costs ~3×)."""
ANSWERED_WITHIN_S = 5.0


@pytest.fixture
def limited(serve_proxy: ServeProxy) -> ProxyServer:
    proxy = serve_proxy(limits={"max_answer_chars": LIMIT})
    # Both kinds of call once, so that the lazy imports of a first call are not counted as the attack's.
    for stream in (False, True):
        body = {"model": "fake", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=WAIT_S).status_code == 200
    return proxy


def chunk(delta: dict[str, object], finish_reason: str | None = None) -> bytes:
    body = {
        "id": "chatcmpl-huge",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


def stored_step(proxy: ProxyServer) -> dict[str, object]:
    """The last step: the one the test's attack made."""
    with read_only(proxy.config.store.path) as db:
        return dict(db.execute("SELECT status, content, error FROM journal_steps ORDER BY id DESC").fetchone())


def test_the_byte_cap_admits_every_answer_within_the_limit() -> None:
    assert answer_byte_cap(LIMIT) >= len(json.dumps("\u2603" * LIMIT))


def huge_text() -> Iterator[bytes]:
    """`HUGE_CHARS` of text, made a piece at a time (the fake upstream runs in this process too)."""
    for _ in range(HUGE_CHARS // len(PIECE)):
        yield PIECE


def huge_completion() -> Iterator[bytes]:
    yield b'{"id": "chatcmpl-huge", "object": "chat.completion", "created": 1, "model": "fake", "choices": '
    yield b'[{"index": 0, "message": {"role": "assistant", "content": "'
    yield from huge_text()
    yield b'"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}'


def huge_event_stream() -> Iterator[bytes]:
    yield chunk({"role": "assistant", "content": ""}) + chunk({"content": "before the flood"})
    yield b'data: {"id": "chatcmpl-huge", "object": "chat.completion.chunk", "created": 1, "model": "fake", '
    yield b'"choices": [{"index": 0, "delta": {"content": "'
    yield from huge_text()
    yield b'"}, "finish_reason": null}]}\n\n'
    yield chunk({}, "stop") + b"data: [DONE]\n\n"


@pytest.mark.time_budget(90)
def test_a_huge_non_stream_answer_is_a_502_read_only_up_to_the_cap(limited: ProxyServer, fake: FakeUpstream) -> None:
    fake.fail_next(Fault(status=200, raw_parts=huge_completion))
    body = {"model": "fake", "messages": [{"role": "user", "content": "say a lot"}]}
    before = rss_bytes()
    with peak_rss() as peak, httpx.Client(timeout=WAIT_S) as client:
        started = time.monotonic()
        response = client.post(f"{limited.base_url}/chat/completions", json=body)
        elapsed = time.monotonic() - started
    assert response.status_code == 502, response.text[:500]
    error = assert_openai_error(response.json())
    assert error["code"] == "answer_too_large"
    assert "limits.max_answer_chars" in error["message"]
    assert elapsed < ANSWERED_WITHIN_S
    assert peak[0] - before < GROWTH_BYTES, f"RSS grew {(peak[0] - before) / 2**20:.1f} MiB"
    step = stored_step(limited)
    assert step["status"] == "failed"
    assert not step["content"]
    assert json.loads(str(step["error"]))["code"] == "answer_too_large"


@pytest.mark.time_budget(90)
def test_one_huge_sse_event_cuts_the_stream_off_with_what_came_before_kept(
    limited: ProxyServer, fake: FakeUpstream
) -> None:
    fake.fail_next(Fault(status=200, raw_parts=huge_event_stream, media_type="text/event-stream"))
    body = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": "say a lot"}]}
    before = rss_bytes()
    with (
        peak_rss() as peak,
        httpx.stream("POST", f"{limited.base_url}/chat/completions", json=body, timeout=WAIT_S) as response,
    ):
        assert response.status_code == 200
        received = list(sse_events(response))
    assert peak[0] - before < GROWTH_BYTES, f"RSS grew {(peak[0] - before) / 2**20:.1f} MiB"
    assert "[DONE]" not in received
    last = received[-1]
    assert isinstance(last, dict)
    assert assert_openai_error(last)["code"] == "answer_too_large"
    step = stored_step(limited)
    assert step["status"] == "failed"
    assert step["content"] == "before the flood"
