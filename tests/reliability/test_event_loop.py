"""Issue 12, item 1: no request can stall the others, and one request's size is bounded.

The work a big request causes (parsing its body, hashing and counting its messages, counting a long answer at
its seal) runs off the event loop. Proven without timing: the work is made to wait, inside the proxy, until
`/healthz` has answered. Run on the event loop, it would hold `/healthz` until the test gives up, so these tests
fail on code that computes inline; off the loop, `/healthz` answers while the work waits.

Limits (`limits:`): too many messages is a 400, one message too large a 413, an answer too large is cut off
with `answer_too_large` (an SSE error event, or a 502) and its step keeps what came (up to the limit); none of
the refusals writes anything.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from typing import Any

import httpx
import openai
import pytest

from proxy import tokens
from proxy.canonical.pieces import Received
from proxy.doors import chat as chat_door
from tests.conftest import ServeProxy
from tests.reliability.support import assert_openai_error, read_only, row_counts, sse_events, step_statuses
from tests.support.fake_upstream import FakeUpstream, Fault, Reply
from tests.support.proxy_server import ProxyServer

BIG = 200_000
"""Characters: well past the size where work leaves the event loop."""
WAIT_S = 10.0
"""How long the held work waits for `/healthz`; a held event loop makes `/healthz` miss it."""
HEALTHZ_TIMEOUT_S = 5.0


class Gate:
    """Holds the work it is put in front of until the test says `/healthz` answered (or WAIT_S passes)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()
        self.held_until_healthz: bool | None = None

    def hold(self) -> None:
        if self.entered.is_set():
            return  # only the first time
        self.entered.set()
        self.held_until_healthz = self.released.wait(WAIT_S)


def healthz_during(proxy: ProxyServer, gate: Gate, request: Callable[[], Any]) -> Any:
    """Run `request` in a thread; once the gate holds its work, `/healthz` must answer. Returns its result."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = request()
        except Exception as exc:  # reported below
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    try:
        assert gate.entered.wait(WAIT_S), "the gated work never ran"
        answer = httpx.get(f"{proxy.url}/healthz", timeout=HEALTHZ_TIMEOUT_S)
        assert answer.status_code == 200
        gate.released.set()
    finally:
        gate.released.set()
        worker.join(WAIT_S * 3)
    assert gate.held_until_healthz is True
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


WIDE_WINDOW = 1_000_000


@pytest.fixture
def wide(serve_proxy: ServeProxy, fake: FakeUpstream, tmp_path: Any) -> ProxyServer:
    """A proxy whose model takes a BIG message whole."""
    fake.context_window = WIDE_WINDOW
    model = {"name": "fake", "model": "openai/fake-model", "api_base": fake.url, "context_window": WIDE_WINDOW}
    return serve_proxy(models=[model])


@pytest.fixture
def gate() -> Gate:
    return Gate()


@pytest.fixture
def gated_counting(gate: Gate, monkeypatch: pytest.MonkeyPatch) -> Gate:
    """Counting a message of BIG characters or more waits at the gate."""
    count = tokens.count_message

    def held(message: Mapping[str, Any], encoding: str = tokens.DEFAULT_ENCODING) -> int:
        if len(tokens.content_text(message.get("content"))) >= BIG:
            gate.hold()
        return count(message, encoding)

    monkeypatch.setattr(tokens, "count_message", held)
    return gate


def chat(proxy: ProxyServer, body: Mapping[str, Any]) -> httpx.Response:
    return httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=WAIT_S * 3)


@pytest.mark.time_budget(60)
def test_a_big_body_is_parsed_off_the_event_loop(
    wide: ProxyServer, gate: Gate, monkeypatch: pytest.MonkeyPatch
) -> None:
    parse = chat_door.parse_chat_request

    def held(raw: Received, *args: Any) -> Any:
        if raw.fresh >= BIG:
            gate.hold()
        return parse(raw, *args)

    monkeypatch.setattr(chat_door, "parse_chat_request", held)
    body = {"model": "fake", "messages": [{"role": "user", "content": "many words " * (BIG // 10)}]}
    response = healthz_during(wide, gate, lambda: chat(wide, body))
    assert response.status_code == 200, response.text


@pytest.mark.time_budget(60)
def test_a_big_message_is_counted_off_the_event_loop(wide: ProxyServer, gated_counting: Gate) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "x" * BIG}]}
    response = healthz_during(wide, gated_counting, lambda: chat(wide, body))
    assert response.status_code == 200, response.text


@pytest.mark.time_budget(60)
@pytest.mark.parametrize("stream", [False, True])
def test_a_long_answer_is_counted_off_the_event_loop_at_its_seal(
    wide: ProxyServer, fake: FakeUpstream, gated_counting: Gate, stream: bool
) -> None:
    proxy = wide
    fake.responder = lambda body: Reply(content="y" * BIG, finish_reason="stop")
    body = {"model": "fake", "stream": stream, "messages": [{"role": "user", "content": "write a lot"}]}

    def ask() -> str:
        response = chat(proxy, body)
        assert response.status_code == 200, response.text
        return response.text

    text = healthz_during(proxy, gated_counting, ask)
    assert ("[DONE]" in text) if stream else (json.loads(text)["choices"][0]["message"]["content"] == "y" * BIG)
    with read_only(proxy.config.store.path) as db:
        answers = db.execute("SELECT COUNT(*) FROM messages WHERE role = 'assistant'").fetchone()[0]
    assert answers == 1  # sealed into history


# --- limits -------------------------------------------------------------------------------------------------------


def small_limits(serve_proxy: ServeProxy) -> ProxyServer:
    return serve_proxy(limits={"max_messages": 50, "max_message_chars": 4096, "max_answer_chars": 2048})


@pytest.mark.time_budget(60)
def test_too_many_messages_is_a_400_that_writes_nothing(serve_proxy: ServeProxy) -> None:
    proxy = small_limits(serve_proxy)
    before = row_counts(proxy.config.store.path)
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": "a"} for i in range(51)]
    response = chat(proxy, {"model": "fake", "messages": messages})
    assert response.status_code == 400
    error = assert_openai_error(response.json())
    assert error["code"] == "array_above_max_length"
    assert error["param"] == "messages"
    assert "at most 50 (limits.max_messages)" in error["message"]
    assert row_counts(proxy.config.store.path) == before
    assert chat(proxy, {"model": "fake", "messages": messages[:49]}).status_code == 200


def test_the_default_limit_refuses_800000_tiny_messages(proxy: ProxyServer) -> None:
    """Their 2.4 M values pass `limits.max_body_values` before the scan reaches `limits.max_messages`."""
    before = row_counts(proxy.config.store.path)
    response = chat(proxy, {"model": "fake", "messages": [{"role": "user", "content": "a"}] * 800_000})
    assert response.status_code == 400
    assert assert_openai_error(response.json())["code"] == "too_many_values"
    assert row_counts(proxy.config.store.path) == before


@pytest.mark.time_budget(60)
@pytest.mark.parametrize(
    "message",
    [
        {"role": "user", "content": "z" * 5000},
        {"role": "user", "content": [{"type": "text", "text": "z" * 2500}, {"type": "text", "text": "z" * 2500}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "z" * 5000}}],
        },
    ],
    ids=["text", "parts", "tool-arguments"],
)
def test_a_message_too_large_is_a_413_that_writes_nothing(serve_proxy: ServeProxy, message: dict[str, Any]) -> None:
    proxy = small_limits(serve_proxy)
    before = row_counts(proxy.config.store.path)
    messages = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}, message]
    response = chat(proxy, {"model": "fake", "messages": messages})
    assert response.status_code == 413
    error = assert_openai_error(response.json())
    assert error["code"] == "message_too_large"
    assert error["param"] == "messages[2]"
    assert "4096" in error["message"]
    assert row_counts(proxy.config.store.path) == before


@pytest.mark.time_budget(60)
def test_a_streamed_answer_too_large_is_cut_off_and_its_step_keeps_what_came(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    proxy = small_limits(serve_proxy)
    fake.responder = lambda body: Reply(content="word " * 5000, finish_reason="stop")
    body = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": "go on forever"}]}
    with httpx.stream("POST", f"{proxy.base_url}/chat/completions", json=body, timeout=WAIT_S) as response:
        assert response.status_code == 200
        events = list(sse_events(response))
    assert "[DONE]" not in events
    last = events[-1]
    assert isinstance(last, dict)
    assert assert_openai_error(last)["code"] == "answer_too_large"
    relayed = "".join(
        (choice.get("delta") or {}).get("content") or ""
        for event in events[:-1]
        if isinstance(event, dict)
        for choice in event.get("choices") or []
    )
    assert 2048 - 100 < len(relayed) <= 2048  # cut off at the limit, not a group later
    with read_only(proxy.config.store.path) as db:
        step = db.execute("SELECT status, content, error FROM journal_steps").fetchone()
        answers = db.execute("SELECT COUNT(*) FROM messages WHERE role = 'assistant'").fetchone()[0]
    assert step["status"] == "failed"
    assert step["content"] == relayed  # what the client saw is what the journal kept
    assert json.loads(step["error"])["code"] == "answer_too_large"
    assert answers == 0  # a cut-off answer does not join the conversation


@pytest.mark.time_budget(60)
def test_a_whole_answer_too_large_is_a_502_and_its_step_keeps_the_limits_worth(
    serve_proxy: ServeProxy, fake: FakeUpstream
) -> None:
    proxy = small_limits(serve_proxy)
    fake.responder = lambda body: Reply(content="word " * 1000, finish_reason="stop")
    client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=WAIT_S)
    with client, pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "say a lot"}])
    assert caught.value.status_code == 502
    assert caught.value.code == "answer_too_large"
    with read_only(proxy.config.store.path) as db:
        step = db.execute("SELECT status, content FROM journal_steps").fetchone()
    assert step["status"] == "failed"
    assert step["content"] == ("word " * 1000)[:2048]  # never the whole oversized answer


@pytest.mark.time_budget(30)
def test_a_whole_call_has_a_total_deadline(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    proxy = serve_proxy(upstream={"timeout_s": 5.0, "stream_deadline_s": 0.5})
    fake.fail_next(Fault(status=200, delay_s=3.0))
    response = chat(proxy, {"model": "fake", "messages": [{"role": "user", "content": "slowly"}]})
    assert response.status_code == 504
    assert "upstream.stream_deadline_s" in assert_openai_error(response.json())["message"]
    assert step_statuses(proxy.config.store.path) == {"failed": 1}
