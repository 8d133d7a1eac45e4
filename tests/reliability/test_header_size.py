"""Huge request headers: refused with a 431 as soon as they outgrow `server.max_header_bytes`, before auth.

Each test drives the real server (uvicorn on 127.0.0.1, the protocol of `proxy.serving.server`) with raw sockets:
1. A 64 MB header without a key is answered 431 (OpenAI's error shape, `Connection: close`) within a fraction of
   a second, and the process's memory does not grow by anything near the header's size.
2. While eight clients keep sending such headers, `/healthz` keeps answering.
3. On /v1/messages the 431 is in Anthropic's error shape.
4. Ordinary requests, headers just under the cap on one keep-alive connection, and a large body all still work.
"""

from __future__ import annotations

import json
import os
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from proxy.config.schema import DEFAULT_MAX_HEADER_BYTES
from tests.conftest import ServeProxy
from tests.reliability.support import assert_openai_error
from tests.support.proxy_server import HOST, ProxyServer

CLIENT_KEY = "client-key-7c2d1b"
HUGE_HEADER = 64 * 1024 * 1024
PIECE = b"a" * 65536
REFUSED_WITHIN_S = 2.0
"""Measured: ~2 ms (median of 20). Without the cap the proxy parsed the whole header first: no answer in 15 s."""
GIVE_UP_S = 15.0
"""How long a huge header is sent and its answer awaited before the test stops trying."""
ATTACKERS = 8
ATTACK_S = 3.0
HEALTH_GAP_S = 1.0
"""The longest `/healthz` may go unanswered while the attackers send."""
PAGE = os.sysconf("SC_PAGE_SIZE")


@pytest.fixture
def guarded(serve_proxy: ServeProxy) -> ProxyServer:
    return serve_proxy(auth={"keys": [CLIENT_KEY]})


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE


@contextmanager
def peak_rss() -> Iterator[list[int]]:
    """The test process's (and so the in-thread proxy's) highest resident size while the block runs: `[peak]`."""
    peak = [rss_bytes()]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.005):
            peak[0] = max(peak[0], rss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield peak
    finally:
        done.set()
        sampler.join()


def send_huge_header(proxy: ProxyServer, path: str = "/v1/chat/completions") -> tuple[bytes, float]:
    """Send a request whose one header is 64 MB, stopping as soon as the server answers; what it answered (up to its
    close) and the seconds from the first byte to the answer."""
    with socket.create_connection((HOST, proxy.port), timeout=GIVE_UP_S) as sock:
        started = time.monotonic()
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nX-Junk: ".encode())
        sent = 0
        while sent < HUGE_HEADER and time.monotonic() - started < GIVE_UP_S:
            if select.select([sock], [], [], 0)[0]:
                break
            try:
                sock.sendall(PIECE)
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += len(PIECE)
        select.select([sock], [], [], max(0.0, GIVE_UP_S - (time.monotonic() - started)))
        answered_s = time.monotonic() - started
        received = bytearray()
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    return bytes(received), answered_s


def split_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


@pytest.mark.time_budget(60)
def test_a_64_mb_header_without_a_key_is_refused_with_431_at_once(guarded: ProxyServer) -> None:
    with httpx.Client(timeout=10) as http:  # the proxy's first request costs lazy imports: not the attack's
        assert http.get(f"{guarded.url}/healthz").status_code == 200
    before = rss_bytes()
    with peak_rss() as peak:
        raw, answered_s = send_huge_header(guarded)
    assert raw, "no answer"
    status, headers, body = split_response(raw)
    assert status == 431, raw[:500]
    assert headers["connection"] == "close"
    assert headers["content-type"] == "application/json"
    error = assert_openai_error(json.loads(body), status=431)
    assert error["code"] == "request_headers_too_large"
    assert "server.max_header_bytes" in error["message"]
    assert answered_s < REFUSED_WITHIN_S
    assert peak[0] - before < HUGE_HEADER // 8, f"RSS grew {(peak[0] - before) / 2**20:.1f} MiB"


@pytest.mark.time_budget(60)
def test_a_huge_header_to_the_messages_door_is_refused_in_anthropics_shape(guarded: ProxyServer) -> None:
    raw, _answered_s = send_huge_header(guarded, path="/v1/messages")
    status, headers, body = split_response(raw)
    assert status == 431, raw[:500]
    assert headers["connection"] == "close"
    refusal = json.loads(body)
    assert set(refusal) == {"type", "error"}, refusal
    assert refusal["type"] == "error"
    assert refusal["error"]["type"] == "invalid_request_error"
    assert "server.max_header_bytes" in refusal["error"]["message"]


@pytest.mark.time_budget(60)
def test_health_answers_while_eight_clients_send_huge_headers(guarded: ProxyServer) -> None:
    stop = threading.Event()
    answers: list[tuple[bytes, float]] = []

    def attack() -> None:
        while not stop.is_set():
            answers.append(send_huge_header(guarded))

    with httpx.Client(timeout=10) as http:
        assert http.get(f"{guarded.url}/healthz").status_code == 200
        attackers = [threading.Thread(target=attack, daemon=True) for _ in range(ATTACKERS)]
        for attacker in attackers:
            attacker.start()
        started = last_ok = time.monotonic()
        worst_gap = 0.0
        while time.monotonic() - started < ATTACK_S:
            try:
                ok = http.get(f"{guarded.url}/healthz", timeout=HEALTH_GAP_S * 2).status_code == 200
            except httpx.TimeoutException:
                ok = False
            now = time.monotonic()
            if ok:
                worst_gap = max(worst_gap, now - last_ok)
                last_ok = now
            time.sleep(0.015)
        worst_gap = max(worst_gap, time.monotonic() - last_ok)
        stop.set()
        for attacker in attackers:
            attacker.join(GIVE_UP_S + 5)
    assert worst_gap < HEALTH_GAP_S, f"/healthz went {worst_gap:.2f} s without an answer"
    assert answers
    assert {split_response(raw)[0] if raw else 0 for raw, _ in answers} == {431}
    assert max(seconds for _, seconds in answers) < REFUSED_WITHIN_S


@pytest.mark.time_budget(60)
def test_ordinary_and_large_but_allowed_requests_still_work(guarded: ProxyServer) -> None:
    near_cap = "b" * (DEFAULT_MAX_HEADER_BYTES - 4096)
    chat = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}]}
    with httpx.Client(timeout=20) as http:
        ordinary = {"Authorization": f"Bearer {CLIENT_KEY}", "anthropic-beta": "a-feature-2025," * 40}
        response = http.post(f"{guarded.base_url}/chat/completions", json=chat, headers=ordinary)
        assert response.status_code == 200, response.text
        # Requests just under the cap, one after the other on one keep-alive connection: the count is per request.
        for _ in range(3):
            health = http.get(f"{guarded.url}/healthz", headers={"X-Near-Cap": near_cap})
            assert health.status_code == 200, health.text
        # A 2 MB body sent in the same writes as the headers is read as a body (and found too long for the model).
        big = {"model": "fake", "messages": [{"role": "user", "content": "c " * 1_000_000}]}
        response = http.post(f"{guarded.base_url}/chat/completions", json=big, headers=ordinary)
        assert response.status_code == 400, response.text
        assert assert_openai_error(response.json())["code"] == "context_length_exceeded"
        refused = http.get(f"{guarded.url}/healthz", headers={"X-Over-Cap": near_cap + "b" * 8192})
        assert refused.status_code == 431
