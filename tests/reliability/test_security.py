"""Secrets and tenants: keys never leak, every endpoint demands a key, and one key never sees another's data.

1. The upstream key (`sk-upstream-secret`, from make_config) and the proxy's client keys appear nowhere they
   could be read back: not in the proxy's logs (captured at DEBUG for the whole test), not in the SQLite
   files (the .db and its -wal/-shm, read as bytes), not in any response body or header — including upstream
   401/500 errors, a stream cut mid-way, auth failures and bad input. The client key is never forwarded.
2. With `auth.keys` set, every endpoint but /healthz refuses a missing, malformed or wrong key with an
   OpenAI-shaped 401 — before looking anything up (a real id and a made-up one answer the same) and without
   writing anything.
3. Two keys are two tenants: neither lists, reads, summarizes or journals the other's sessions (404 for the
   other's ids, absent from lists), even under the same X-Session-Id.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import ServeProxy
from tests.reliability.support import assert_openai_error, row_counts
from tests.support.fake_upstream import FakeUpstream, Fault
from tests.support.proxy_server import ProxyServer, free_port

UPSTREAM_KEY = "sk-upstream-secret"
KEY_A = "key-a-7d1f0c9e4b"
KEY_B = "key-b-52aa61b3c8"
NEAR_MISS = KEY_A[:-1] + "X"
SECRETS = (UPSTREAM_KEY, KEY_A, KEY_B, NEAR_MISS)
TIMEOUT_S = 20.0
MARKER_A = "tenant-a-private-lighthouse"
MARKER_B = "tenant-b-private-orchard"


def model(name: str, api_base: str) -> dict[str, Any]:
    return {
        "name": name,
        "model": "openai/fake-model",
        "api_base": api_base,
        "api_key": UPSTREAM_KEY,
        "context_window": 8192,
        "max_output": 1024,
    }


@pytest.fixture
def secured(serve_proxy: ServeProxy, fake: FakeUpstream) -> ProxyServer:
    return serve_proxy(
        auth={"keys": [KEY_A, KEY_B]},
        models=[model("fake", fake.url), model("dead", f"http://127.0.0.1:{free_port()}/v1")],
        upstream={"timeout_s": 2},
        context={"preserve_recent": 2},
    )


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def chat_body(text: str, *, stream: bool = False, model_name: str = "fake") -> dict[str, Any]:
    return {
        "model": model_name,
        "stream": stream,
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": f"{text} one"},
            {"role": "assistant", "content": "noted one"},
            {"role": "user", "content": f"{text} two"},
            {"role": "assistant", "content": "noted two"},
            {"role": "user", "content": f"{text} three"},
        ],
    }


class Recorder:
    """Every response the test receives, as text (status line, headers, body), to search for secrets."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def add(self, response: httpx.Response) -> httpx.Response:
        response.read()
        headers = "\n".join(f"{name}: {value}" for name, value in response.headers.items())
        self.texts.append(f"{response.status_code}\n{headers}\n{response.text}")
        return response


def store_files(proxy: ProxyServer) -> list[Path]:
    store = proxy.config.store.path
    return sorted(p for p in store.parent.iterdir() if p.name.startswith(store.name))


# --- 1. secrets ---------------------------------------------------------------------------------------------------


@pytest.mark.time_budget(90)
def test_keys_never_reach_logs_store_or_error_bodies(
    secured: ProxyServer, fake: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="proxy")
    seen = Recorder()
    chat = f"{secured.base_url}/chat/completions"
    with httpx.Client(timeout=TIMEOUT_S) as http:
        # Success, both ways; then upstream failures before and after the stream starts.
        for stream in (False, True):
            ok = seen.add(http.post(chat, json=chat_body(MARKER_A, stream=stream), headers=bearer(KEY_A)))
            assert ok.status_code == 200, ok.text
        for fault in (
            Fault(status=401),
            Fault(status=403),
            Fault(status=500),
            Fault(status=429),
            Fault(drop_after_chunks=2),
            Fault(malformed_after_chunks=1),
        ):
            fake.fail_next(fault)
            failed = seen.add(
                http.post(chat, json=chat_body("faulty", stream=fault.breaks_stream), headers=bearer(KEY_A))
            )
            if fault.breaks_stream:
                assert '"error"' in failed.text
            else:
                assert failed.status_code == fault.status
                assert_openai_error(failed.json())
        fake.fail_next(Fault(status=200, delay_s=3))
        assert seen.add(http.post(chat, json=chat_body("slow"), headers=bearer(KEY_B))).status_code == 504
        unreachable = seen.add(http.post(chat, json=chat_body("gone", model_name="dead"), headers=bearer(KEY_B)))
        assert unreachable.status_code == 502
        # Auth failures and bad input.
        for headers in ({}, bearer(NEAR_MISS), {"Authorization": KEY_A}, {"Authorization": f"Basic {KEY_A}"}):
            refused = seen.add(http.post(chat, json=chat_body("x"), headers=headers))
            assert refused.status_code == 401
            assert_openai_error(refused.json())
        for raw, extra in (
            (b"{", {}),
            (b'{"model": "fake"}', {}),
            (json.dumps(chat_body("x")).encode(), {"X-Context-Budget": "lots"}),
        ):
            bad = seen.add(http.post(chat, content=raw, headers={**bearer(KEY_A), **extra}))
            assert bad.status_code == 400
            assert_openai_error(bad.json())
        # The inspection endpoints, read and refused.
        for path in ("/sessions", "/journal", "/v1/models", "/sessions/nope", "/journal/999999"):
            seen.add(http.get(f"{secured.url}{path}", headers=bearer(KEY_A)))
            seen.add(http.get(f"{secured.url}{path}", headers=bearer(NEAR_MISS)))
        session_id = http.get(f"{secured.url}/sessions", headers=bearer(KEY_A)).json()["data"][0]["id"]
        seen.add(http.get(f"{secured.url}/sessions/{session_id}", headers=bearer(KEY_A)))
        seen.add(http.post(f"{secured.url}/sessions/{session_id}/summarize", headers=bearer(KEY_A)))

    # The upstream got its own key and never a client's.
    assert fake.requests
    for received in fake.requests:
        assert received.headers["authorization"] == f"Bearer {UPSTREAM_KEY}"
        forwarded = json.dumps(received.headers) + json.dumps(received.body)
        assert KEY_A not in forwarded
        assert KEY_B not in forwarded

    files = store_files(secured)
    assert secured.config.store.path in files
    logged = caplog.text + "\n".join(
        f"{record.getMessage()} {record.exc_text or ''} {record.exc_info!r}" for record in caplog.records
    )
    assert MARKER_A in b"".join(p.read_bytes() for p in files).decode("utf-8", "replace"), "the store was read"
    for secret in SECRETS:
        for text in seen.texts:
            assert secret not in text, text[:500]
        assert secret not in logged
        for file in files:
            assert secret.encode() not in file.read_bytes(), file.name


# --- 2. every endpoint wants a key --------------------------------------------------------------------------------

BAD_AUTH: list[dict[str, str]] = [
    {},
    {"Authorization": ""},
    {"Authorization": "Bearer"},
    {"Authorization": "Bearer \t x"},
    {"Authorization": KEY_A},
    {"Authorization": f"Basic {KEY_A}"},
    {"Authorization": f"Bearer {NEAR_MISS}"},
    {"Authorization": f"Bearer {KEY_A.upper()}"},
    {"Authorization": f"Bearer {KEY_A}{KEY_B}"},
    {"Authorization": f"Bearer {KEY_A[:-3]}"},
    {"X-Api-Key": KEY_A},
]


@pytest.fixture
def tenant_a(secured: ProxyServer) -> tuple[str, int]:
    """A session and a journal step of tenant A: real ids, so a refusal cannot be a 404 in disguise."""
    with httpx.Client(base_url=secured.url, timeout=TIMEOUT_S) as http:
        response = http.post("/v1/chat/completions", json=chat_body(MARKER_A), headers=bearer(KEY_A))
        assert response.status_code == 200, response.text
        session_id = response.headers["x-session-id"]
        step_id = http.get("/journal", headers=bearer(KEY_A)).json()["data"][0]["step_id"]
    return session_id, step_id


def endpoints(session_id: str, step_id: int) -> list[tuple[str, str, dict[str, Any] | None]]:
    return [
        ("POST", "/v1/chat/completions", chat_body(MARKER_A)),
        ("POST", "/v1/chat/completions", chat_body(MARKER_A, stream=True)),
        ("GET", "/v1/models", None),
        ("GET", "/sessions", None),
        ("GET", f"/sessions/{session_id}", None),
        ("GET", "/sessions/no-such-session", None),
        ("POST", f"/sessions/{session_id}/summarize", None),
        ("POST", "/sessions/no-such-session/summarize", None),
        ("GET", "/journal", None),
        ("GET", f"/journal?session_id={session_id}", None),
        ("GET", f"/journal/{step_id}", None),
        ("GET", "/journal/424242", None),
    ]


def test_every_endpoint_refuses_a_missing_or_wrong_key(
    secured: ProxyServer, fake: FakeUpstream, tenant_a: tuple[str, int]
) -> None:
    session_id, step_id = tenant_a
    upstream_calls = len(fake.requests)
    with httpx.Client(base_url=secured.url, timeout=TIMEOUT_S) as http:
        for method, path, body in endpoints(session_id, step_id):
            for headers in BAD_AUTH:
                response = http.request(method, path, json=body, headers=headers)
                assert response.status_code == 401, (method, path, headers, response.text)
                error = assert_openai_error(response.json())
                assert error["code"] == "invalid_api_key", (method, path, headers)
                assert error["type"] == "invalid_request_error"
        # /healthz stays open (a load balancer has no key) and says nothing about tenants.
        health = http.get("/healthz")
        assert health.status_code == 200
        assert MARKER_A not in health.text
        assert session_id not in health.text
        # The right key still works on every endpoint.
        for method, path, body in endpoints(session_id, step_id):
            if "no-such-session" in path or path.endswith("/424242"):
                continue
            response = http.request(method, path, json=body, headers=bearer(KEY_A))
            assert response.status_code in (200, 400), (method, path, response.text)  # 400: nothing to summarize
    assert len(fake.requests) > upstream_calls


def test_refusals_write_nothing(secured: ProxyServer, fake: FakeUpstream, tenant_a: tuple[str, int]) -> None:
    session_id, step_id = tenant_a
    before = row_counts(secured.config.store.path)
    with httpx.Client(base_url=secured.url, timeout=TIMEOUT_S) as http:
        for method, path, body in endpoints(session_id, step_id):
            for headers in BAD_AUTH:
                assert http.request(method, path, json=body, headers=headers).status_code == 401
    assert row_counts(secured.config.store.path) == before
    assert fake.requests[-1].body["messages"][-1]["content"] == f"{MARKER_A} three"


# --- 3. tenants ----------------------------------------------------------------------------------------------------


def test_one_key_cannot_read_another_keys_sessions_or_journal(secured: ProxyServer, fake: FakeUpstream) -> None:
    with httpx.Client(base_url=secured.url, timeout=TIMEOUT_S) as http:

        def chat(key: str, marker: str, session: str | None = None, stream: bool = False) -> str:
            headers = {**bearer(key), **({"X-Session-Id": session} if session else {})}
            response = http.post("/v1/chat/completions", json=chat_body(marker, stream=stream), headers=headers)
            assert response.status_code == 200, response.text
            return response.headers["x-session-id"]

        a_only = chat(KEY_A, MARKER_A)
        chat(KEY_A, MARKER_A + "-streamed", session="same-name", stream=True)
        b_only = chat(KEY_B, MARKER_B)
        chat(KEY_B, MARKER_B + "-streamed", session="same-name", stream=True)
        # Same content from both tenants derives the same-looking conversation: still two sessions.
        a_shared_root = chat(KEY_A, "common text")
        b_shared_root = chat(KEY_B, "common text")

        def get(path: str, key: str) -> httpx.Response:
            return http.get(path, headers=bearer(key))

        sessions_a = {s["id"] for s in get("/sessions", KEY_A).json()["data"]}
        sessions_b = {s["id"] for s in get("/sessions", KEY_B).json()["data"]}
        assert {a_only, "same-name", a_shared_root} <= sessions_a
        assert {b_only, "same-name", b_shared_root} <= sessions_b
        assert a_only not in sessions_b
        assert b_only not in sessions_a

        for owner, other, own_id, foreign_id, own_marker, foreign_marker in (
            (KEY_A, KEY_B, a_only, b_only, MARKER_A, MARKER_B),
            (KEY_B, KEY_A, b_only, a_only, MARKER_B, MARKER_A),
        ):
            assert get(f"/sessions/{own_id}", owner).status_code == 200
            for response in (
                get(f"/sessions/{foreign_id}", owner),
                http.post(f"/sessions/{foreign_id}/summarize", headers=bearer(owner)),
            ):
                assert response.status_code == 404, response.text
                assert_openai_error(response.json())
                assert foreign_marker not in response.text
            # The shared session name holds each tenant's own conversation only.
            same = get("/sessions/same-name", owner).json()
            texts = " ".join(str(m["content"]) for m in same["messages"])
            assert own_marker in texts
            assert foreign_marker not in texts
            # Journal: own steps only, the other's ids are 404, filters cannot reach across.
            own_steps = get("/journal", owner).json()["data"]
            assert own_steps
            assert all(step["session_id"] in sessions_a | sessions_b for step in own_steps)
            assert foreign_marker not in json.dumps(own_steps)
            foreign_steps = get("/journal", other).json()["data"]
            for step in foreign_steps:
                response = get(f"/journal/{step['step_id']}", owner)
                assert response.status_code == 404, response.text
                assert_openai_error(response.json())
            assert get(f"/journal?session_id={foreign_id}", owner).json()["data"] == []
            own_ids = {step["step_id"] for step in own_steps}
            assert own_ids.isdisjoint(step["step_id"] for step in foreign_steps)
            for step_id in own_ids:
                assert get(f"/journal/{step_id}", owner).status_code == 200
