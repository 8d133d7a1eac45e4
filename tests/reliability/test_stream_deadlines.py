"""An upstream that drips or says nothing is cut off by the proxy's own deadlines, not only between reads.

`upstream.timeout_s` bounds each read, so an upstream sending a chunk just often enough would hold a stream (and
its step, and its Idempotency-Key) forever. `upstream.stream_deadline_s` bounds the whole stream and
`upstream.first_byte_timeout_s` the wait for its first chunk: the client hears `upstream_timeout` (an SSE error
event once the stream has started, a 504 before), the step ends `failed`, and a retry under the same key runs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests.conftest import ServeProxy
from tests.reliability.support import read_only, step_statuses
from tests.support.fake_upstream import FakeUpstream, Fault, Reply
from tests.support.proxy_server import ProxyServer

BETWEEN_READS_S = 2.0
"""The between-reads timeout, longer than any pause of the dripping upstream."""
DEADLINE_S = 1.0
FIRST_BYTE_S = 0.5
DRIP_S = 0.2
CLIENT_TIMEOUT_S = 20.0
MESSAGES: list[Any] = [{"role": "user", "content": "tell me a long story"}]


@pytest.fixture
def deadlines(serve_proxy: ServeProxy) -> Iterator[tuple[ProxyServer, openai.OpenAI]]:
    """The proxy with short deadlines, and a client of it, closed after the test: a caught error's traceback holds
    the test's frame in a reference cycle, so the client would be collected, not freed, and its pooled socket
    warn in whichever test the collector runs."""
    proxy = serve_proxy(
        upstream={
            "timeout_s": BETWEEN_READS_S,
            "stream_deadline_s": DEADLINE_S,
            "first_byte_timeout_s": FIRST_BYTE_S,
        }
    )
    with openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT_S) as client:
        yield proxy, client


def statuses(proxy: ProxyServer) -> list[tuple[str, Any]]:
    with read_only(proxy.config.store.path) as db:
        rows = db.execute("SELECT status, error FROM journal_steps ORDER BY id").fetchall()
    return [(row["status"], row["error"]) for row in rows]


@pytest.mark.time_budget(30)
def test_a_dripping_stream_ends_at_its_deadline_with_an_sse_timeout(
    deadlines: tuple[ProxyServer, openai.OpenAI], fake: FakeUpstream
) -> None:
    proxy, client = deadlines
    fake.responder = lambda body: Reply(content="word " * 200, finish_reason="stop")
    fake.chunk_delay_s = DRIP_S  # 200 chunks 0.2 s apart: 40 s, never a pause of 2 s
    seen: list[str] = []
    started = time.monotonic()
    with (
        pytest.raises(openai.APIError) as caught,
        client.chat.completions.create(
            model="fake", messages=MESSAGES, stream=True, extra_headers={"Idempotency-Key": "drip-1"}
        ) as chunks,
    ):
        for chunk in chunks:
            seen.extend(choice.delta.content or "" for choice in chunk.choices)
    elapsed = time.monotonic() - started
    error = caught.value
    assert not isinstance(error, openai.APIStatusError), "the stream had started: an SSE error event"
    assert (error.code, error.type) == ("upstream_timeout", "timeout"), error.body
    assert seen, "chunks before the deadline were relayed"
    assert elapsed < DEADLINE_S + 2 * DRIP_S + 1.0
    [(status, stored_error)] = statuses(proxy)
    assert status == "failed"
    assert '"upstream_timeout"' in stored_error

    fake.chunk_delay_s = 0.0  # the key is free: the retry runs and completes
    with client.chat.completions.create(
        model="fake", messages=MESSAGES, stream=True, extra_headers={"Idempotency-Key": "drip-1"}
    ) as chunks:
        answer = "".join(choice.delta.content or "" for chunk in chunks for choice in chunk.choices)
    assert answer == "word " * 200
    assert step_statuses(proxy.config.store.path) == {"failed": 1, "sealed": 1}


@pytest.mark.time_budget(30)
def test_a_silent_upstream_is_answered_504_at_the_first_byte_deadline(
    deadlines: tuple[ProxyServer, openai.OpenAI], fake: FakeUpstream
) -> None:
    proxy, client = deadlines
    fake.fail_next(Fault(status=200, delay_s=BETWEEN_READS_S * 0.9))  # under the between-reads timeout
    started = time.monotonic()
    with (
        pytest.raises(openai.APIStatusError) as caught,
        client.chat.completions.create(model="fake", messages=MESSAGES, stream=True) as chunks,
    ):
        for _chunk in chunks:
            pass
    elapsed = time.monotonic() - started
    assert caught.value.status_code == 504
    assert caught.value.code == "upstream_timeout"
    assert elapsed < BETWEEN_READS_S * 0.9
    assert [status for status, _error in statuses(proxy)] == ["failed"]
