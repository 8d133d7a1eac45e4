"""Slow bodies do not deny service: while trickling bodies fill every slot (`server.max_connections`), health
checks and fast clients are still served.

Each test drives the real server (uvicorn on 127.0.0.1, the protocol of `proxy.serving.server`) with raw sockets, the
attack scaled down by a small `max_connections` (the attack run outside used 1,100 connections):
1. Bodies trickling a byte at a time, as many as the cap: after the rate grace each /healthz and a fast chat
   request is served at once, each evicting one of the slowest bodies (before: closed at accept, no /healthz
   success for the whole body deadline).
2. Bodies that arrive quickly but are not finished (busy, not slow): none is evicted; a /healthz is still served
   on a spare socket, and any other request there is answered a 503 `server_busy` with `Connection: close`.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, suppress

import httpx
import pytest

from proxy.serving.server import BODY_RATE_GRACE_S
from tests.conftest import ServeProxy
from tests.reliability.support import assert_openai_error
from tests.reliability.test_slow_clients import connection, is_closed, read_until_closed, split_response
from tests.support.proxy_server import ProxyServer

CAP = 12
BODY_TIMEOUT_S = 60.0
"""Far beyond the test: only eviction can free a slot."""
CHAT_HEAD = "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
CHAT = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}]}
SERVED_WITHIN_S = 2.0


@pytest.fixture
def capped(serve_proxy: ServeProxy) -> ProxyServer:
    return serve_proxy(server={"max_connections": CAP, "body_timeout_s": BODY_TIMEOUT_S, "header_timeout_s": 60})


def trickle(sockets: list[socket.socket], stop: threading.Event) -> None:
    """A byte per socket every 0.2 s: 5 bytes a second, far below `server.min_body_rate`."""
    while not stop.wait(0.2):
        for sock in sockets:
            with suppress(OSError):
                sock.sendall(b" ")


@pytest.fixture
def stack() -> Iterator[ExitStack]:
    with ExitStack() as stack:
        yield stack


@pytest.mark.time_budget(60)
def test_trickling_bodies_filling_every_slot_are_evicted_for_health_checks_and_fast_clients(
    capped: ProxyServer, stack: ExitStack
) -> None:
    slow = []
    for _ in range(CAP):
        sock = stack.enter_context(connection(capped))
        sock.sendall(f"{CHAT_HEAD}Content-Length: 100000\r\n\r\n".encode() + b'{"model": "fake", ')
        slow.append(sock)
    stop = threading.Event()
    dripper = threading.Thread(target=trickle, args=(slow, stop))
    dripper.start()
    try:
        time.sleep(BODY_RATE_GRACE_S + 0.5)
        with httpx.Client(timeout=SERVED_WITHIN_S) as client:
            for _ in range(3):
                started = time.monotonic()
                # A new connection each time: each must find a slot among the trickling ones.
                response = client.get(f"{capped.url}/healthz", headers={"Connection": "close"})
                assert response.status_code == 200
                assert time.monotonic() - started < SERVED_WITHIN_S
            answer = client.post(f"{capped.url}/v1/chat/completions", json=CHAT, headers={"Connection": "close"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"]
    finally:
        stop.set()
        dripper.join()
    evicted = [is_closed(sock) for sock in slow]
    assert 1 <= sum(evicted) <= 4, evicted  # one slot per new client, no more


@pytest.mark.time_budget(60)
def test_busy_connections_are_kept_and_a_health_check_still_served_on_a_spare_socket(
    capped: ProxyServer, stack: ExitStack
) -> None:
    busy = []
    for _ in range(CAP):
        sock = stack.enter_context(connection(capped))
        # 20 kB of a 10 MB body at once: fast so far (not evictable) and far from done.
        sock.sendall(f"{CHAT_HEAD}Content-Length: 10000000\r\n\r\n".encode() + b'{"model": "fake", ' + b" " * 20000)
        busy.append(sock)
    time.sleep(BODY_RATE_GRACE_S + 0.2)

    with httpx.Client(timeout=SERVED_WITHIN_S) as client:
        assert client.get(f"{capped.url}/healthz").status_code == 200
        refused = client.post(f"{capped.url}/v1/chat/completions", json=CHAT)
    assert refused.status_code == 503
    assert refused.headers["connection"] == "close"
    assert refused.headers["retry-after"] == "1"
    assert assert_openai_error(refused.json())["code"] == "server_busy"
    assert not any(is_closed(sock) for sock in busy)

    with connection(capped) as sock:  # a busy server refuses in the door's own shape
        body = json.dumps({"model": "fake", "max_tokens": 10, "messages": []}).encode()
        head = f"POST /v1/messages HTTP/1.1\r\nHost: proxy\r\nContent-Length: {len(body)}\r\n\r\n"
        sock.sendall(head.encode() + body)
        status, _headers, raw = split_response(read_until_closed(sock, within_s=5.0))
    assert status == 503
    assert json.loads(raw)["error"]["type"] == "api_error"
