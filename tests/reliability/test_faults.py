"""Upstream failures reach the client as OpenAI errors, and leave the journal and history consistent.

Each case plays one conversation: a good first turn, then a second turn whose upstream call fails in one way
(429 with Retry-After, 500, 503, a refused connection, a read timeout before the answer or mid-stream, a stream
cut before [DONE], a stream turning into malformed JSON). The client must see the right SDK exception class,
status and code — as an HTTP status before a stream starts, as an SSE error event after. Then the store must
show the failure and nothing half-written: the step is `failed` with the error (and any partial text the client
saw), the session's head is the user's second message rather than a partial answer, no step is left open, the
file passes `PRAGMA integrity_check` — and the same second turn, sent again, succeeds without duplicating it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import ServeProxy
from tests.reliability.support import integrity, read_only, step_statuses
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.proxy_server import ProxyServer, free_port

UPSTREAM_TIMEOUT_S = 2.0
SLOW_S = 3.0
"""Longer than the proxy's upstream timeout."""
CLIENT_TIMEOUT_S = 20.0
SYSTEM = {"role": "system", "content": "You are terse."}
FIRST = {"role": "user", "content": "first question about the harbour"}
SECOND = {"role": "user", "content": "second question about the lighthouse keeper and his boat"}


def echo(message: dict[str, str]) -> str:
    return "echo: " + message["content"]


@dataclass(frozen=True)
class Case:
    name: str
    stream: bool
    error: type[openai.APIError]
    code: str | None
    error_type: str
    status: int | None = None
    """The HTTP status; None when the error arrives as an SSE event after a 200."""
    fault: Fault | None = None
    chunk_delay_s: float = 0.0
    model: str = "fake"
    retry_after: str | None = None


def both(name: str, **kwargs: Any) -> list[Case]:
    return [Case(f"{name}-{'stream' if stream else 'json'}", stream, **kwargs) for stream in (False, True)]


CASES = [
    *both(
        "429",
        error=openai.RateLimitError,
        status=429,
        code="rate_limit_exceeded",
        error_type="requests",
        fault=Fault(status=429, headers={"Retry-After": "7"}),
        retry_after="7",
    ),
    *both(
        "500",
        error=openai.InternalServerError,
        status=500,
        code=None,
        error_type="server_error",
        fault=Fault(status=500),
    ),
    *both(
        "503",
        error=openai.InternalServerError,
        status=503,
        code="service_unavailable",
        error_type="server_error",
        fault=Fault(status=503),
    ),
    *both(
        "refused",
        error=openai.InternalServerError,
        status=502,
        code="upstream_unreachable",
        error_type="upstream_error",
        model="dead",
    ),
    *both(
        "read-timeout",
        error=openai.InternalServerError,
        status=504,
        code="upstream_timeout",
        error_type="timeout",
        fault=Fault(status=200, delay_s=SLOW_S),
    ),
    Case("stalled-mid-stream", True, openai.APIError, "upstream_timeout", "timeout", chunk_delay_s=SLOW_S),
    Case(
        "dropped-stream",
        True,
        openai.APIError,
        "upstream_unreachable",
        "upstream_error",
        fault=Fault(drop_after_chunks=2),
    ),
    Case(
        "malformed-stream",
        True,
        openai.APIError,
        "upstream_stream_incomplete",
        "upstream_error",
        fault=Fault(malformed_after_chunks=2),
    ),
]


def model_entry(name: str, api_base: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": "openai/fake-model",
        "api_base": api_base,
        "api_key": "sk-upstream-secret",
        "context_window": 8192,
        "max_output": 1024,
    }


def sdk(messages: list[dict[str, str]]) -> list[ChatCompletionMessageParam]:
    return [dict(m) for m in messages]  # type: ignore[misc]


def ask(
    client: openai.OpenAI, messages: list[dict[str, str]], *, model: str, stream: bool, session: str, seen: list[str]
) -> str:
    """One turn; the text of every chunk received is appended to `seen` as it arrives (kept when it fails)."""
    headers = {"X-Session-Id": session}
    if not stream:
        completion = client.chat.completions.create(model=model, messages=sdk(messages), extra_headers=headers)
        answer = completion.choices[0].message.content or ""
        seen.append(answer)
        return answer
    with client.chat.completions.create(
        model=model, messages=sdk(messages), stream=True, extra_headers=headers
    ) as chunks:
        for chunk in chunks:
            seen.extend(choice.delta.content or "" for choice in chunk.choices)
    return "".join(seen)


def session_messages(http: httpx.Client, session: str) -> list[dict[str, Any]]:
    response = http.get(f"/sessions/{session}")
    assert response.status_code == 200, response.text
    return [{"role": m["role"], "content": m["content"]} for m in response.json()["messages"]]


def journal_steps(http: httpx.Client, session: str) -> list[dict[str, Any]]:
    response = http.get("/journal", params={"session_id": session})
    assert response.status_code == 200, response.text
    return sorted(response.json()["data"], key=lambda step: step["step_id"])


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_fault_reaches_the_client_and_leaves_the_store_consistent(
    serve_proxy: ServeProxy, fake: FakeUpstream, case: Case, request: pytest.FixtureRequest
) -> None:
    proxy: ProxyServer = serve_proxy(
        models=[model_entry("fake", fake.url), model_entry("dead", f"http://127.0.0.1:{free_port()}/v1")],
        upstream={"timeout_s": UPSTREAM_TIMEOUT_S},
    )
    client = openai.OpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0, timeout=CLIENT_TIMEOUT_S)
    request.addfinalizer(client.close)  # the caught error's traceback holds this frame: collected, not freed
    session = f"fault-{case.name}"
    first_turn = [SYSTEM, FIRST]
    assert ask(client, first_turn, model="fake", stream=case.stream, session=session, seen=[]) == echo(FIRST)
    second_turn = [*first_turn, {"role": "assistant", "content": echo(FIRST)}, SECOND]

    if case.fault is not None:
        fake.fail_next(case.fault)
    fake.chunk_delay_s = case.chunk_delay_s
    seen: list[str] = []
    with pytest.raises(case.error) as caught:
        ask(client, second_turn, model=case.model, stream=case.stream, session=session, seen=seen)
    fake.chunk_delay_s = 0.0
    error = caught.value

    # The client hears the failure as OpenAI would report it.
    assert type(error) is case.error
    assert error.code == case.code, error.body
    assert error.type == case.error_type, error.body
    assert isinstance(error.body, dict)
    assert set(error.body) == {"message", "type", "param", "code"}, error.body
    if case.status is None:
        assert not isinstance(error, openai.APIStatusError), "the stream had started: an SSE error event"
        assert seen, "the error came after the first chunks"
        assert echo(SECOND).startswith("".join(seen))
    else:
        assert isinstance(error, openai.APIStatusError)
        assert error.status_code == case.status
        assert seen == []
    if case.retry_after is not None:
        assert isinstance(error, openai.APIStatusError)
        assert error.response.headers["retry-after"] == case.retry_after

    with httpx.Client(base_url=proxy.url, timeout=CLIENT_TIMEOUT_S) as http:
        # The failed step is recorded with its error and the partial text the client saw; nothing left open.
        steps = journal_steps(http, session)
        assert [step["status"] for step in steps] == ["sealed", "failed"]
        failed = steps[-1]
        assert failed["error"]["code"] == case.code
        assert failed["error"]["type"] == case.error_type
        assert failed["message_id"] is None
        assert (failed["content"] or "").startswith("".join(seen))
        # No half-written history: the head is the user's second message, not a partial answer.
        assert session_messages(http, session) == second_turn

        # The next request works, and the re-sent second message is not stored twice.
        seen_again: list[str] = []
        answer = ask(client, second_turn, model="fake", stream=case.stream, session=session, seen=seen_again)
        assert answer == echo(SECOND)
        assert session_messages(http, session) == [*second_turn, {"role": "assistant", "content": answer}]
        assert [step["status"] for step in journal_steps(http, session)] == ["sealed", "failed", "sealed"]

    path = proxy.config.store.path
    with read_only(path) as db:
        assert db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == len(second_turn) + 1
    assert "open" not in step_statuses(path)
    assert integrity(path) == "ok"
