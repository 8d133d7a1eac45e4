"""Slow and vanishing clients: no connection is held for ever, and none costs another client its answer.

Each test drives the real server (uvicorn on 127.0.0.1, the protocol of `proxy.serving.server`) with raw sockets:
1. Request headers sent a byte at a time are cut off at `server.header_timeout_s`, as is a connection that
   never sends anything.
2. A request body that does not arrive within `server.body_timeout_s` is answered with an OpenAI-shaped 408
   and the connection closed; a slow body to a route that never reads one is closed too.
3. Fifty slow-header and fifty slow-body connections do not slow /healthz down, and are all closed after
   their deadlines.
4. A client that leaves in the middle of its body costs one INFO line, not ERROR tracebacks.
5. An idle keep-alive connection outlives httpx's own keep-alive expiry (5 s), so a client never sends a
   request on a connection the server is closing at that very moment.
6. Past `server.max_connections` a new connection closes the one waiting longest for a request, so slow
   clients never hold every socket and a real client is served at once.
"""

from __future__ import annotations

import json
import logging
import resource
import socket
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import httpx
import pytest

from proxy.config.schema import ServerConfig
from proxy.serving.server import RESERVED_FILES, default_max_connections, server_options
from tests.conftest import ServeProxy
from tests.reliability.support import assert_openai_error
from tests.support.proxy_server import HOST, ProxyServer

HEADER_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
SLACK_S = 2.0
"""How late after its deadline a connection may still be closed (scheduling on a busy test machine)."""
HTTPX_KEEPALIVE_EXPIRY_S = 5.0
SLOW_CLIENTS = 50
CHAT = "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"


@pytest.fixture
def strict(serve_proxy: ServeProxy) -> ProxyServer:
    return serve_proxy(server={"header_timeout_s": HEADER_TIMEOUT_S, "body_timeout_s": BODY_TIMEOUT_S})


@contextmanager
def connection(proxy: ProxyServer) -> Iterator[socket.socket]:
    with socket.create_connection((HOST, proxy.port), timeout=10) as sock:
        yield sock


def read_until_closed(sock: socket.socket, within_s: float) -> bytes:
    """Everything the server sends until it closes the connection; fails if it is still open after `within_s`."""
    sock.settimeout(within_s)
    received = bytearray()
    try:
        while chunk := sock.recv(65536):
            received += chunk
    except TimeoutError:
        pytest.fail(f"the connection was still open after {within_s} s (received {bytes(received)!r})")
    except ConnectionResetError:
        pass
    return bytes(received)


def is_closed(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


def split_response(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, body


def test_headers_sent_a_byte_at_a_time_are_cut_off_at_the_header_timeout(strict: ProxyServer) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: proxy\r\nX-Slow: " + b"a" * 200 + b"\r\n\r\n"
    with connection(strict) as sock:
        started = time.monotonic()
        closed = False
        for byte in request:
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if is_closed(sock):
                closed = True
                break
            time.sleep(0.05)
            assert time.monotonic() - started < HEADER_TIMEOUT_S + SLACK_S, "still open past the header timeout"
        elapsed = time.monotonic() - started
    assert closed
    assert HEADER_TIMEOUT_S * 0.8 <= elapsed < HEADER_TIMEOUT_S + SLACK_S


def test_a_connection_that_sends_nothing_is_closed_at_the_header_timeout(strict: ProxyServer) -> None:
    with connection(strict) as sock:
        started = time.monotonic()
        assert read_until_closed(sock, HEADER_TIMEOUT_S + SLACK_S) == b""
    assert time.monotonic() - started >= HEADER_TIMEOUT_S * 0.8


def test_a_slow_body_is_answered_408_and_the_connection_closed(strict: ProxyServer) -> None:
    with connection(strict) as sock:
        sock.sendall(f"{CHAT}Content-Length: 400\r\n\r\n".encode() + b'{"model": "fake", ')
        started = time.monotonic()
        raw = read_until_closed(sock, BODY_TIMEOUT_S + SLACK_S)
        elapsed = time.monotonic() - started

    status, headers, body = split_response(raw)
    assert status == 408
    assert headers["connection"] == "close"
    error = assert_openai_error(json.loads(body))
    assert error["code"] == "request_timeout"
    assert error["type"] == "invalid_request_error"
    assert BODY_TIMEOUT_S * 0.8 <= elapsed < BODY_TIMEOUT_S + SLACK_S


@pytest.mark.time_budget(30)
def test_a_slow_body_nobody_reads_is_closed_too(serve_proxy: ServeProxy) -> None:
    """/healthz answers at once without reading the body; the rest of it must not keep the connection."""
    proxy = serve_proxy(server={"body_timeout_s": 0.2})
    deadline_s = 0.2 + 5.0 + SLACK_S  # body_timeout_s + the protocol's grace (proxy.serving.server.BODY_GRACE_S)
    with connection(proxy) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\nContent-Length: 1000\r\n\r\n")
        started = time.monotonic()
        closed = False
        while time.monotonic() - started < deadline_s:
            try:
                sock.sendall(b"x")
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            time.sleep(0.1)
            if is_closed(sock):
                closed = True
                break
    assert closed, f"a dripping body kept the connection open for {deadline_s} s"


@pytest.mark.time_budget(60)
def test_many_slow_clients_neither_slow_healthz_nor_stay_open(strict: ProxyServer) -> None:
    with ExitStack() as stack:
        slow = [stack.enter_context(connection(strict)) for _ in range(2 * SLOW_CLIENTS)]
        for sock in slow[:SLOW_CLIENTS]:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n")
        for sock in slow[SLOW_CLIENTS:]:
            sock.sendall(f"{CHAT}Content-Length: 400\r\n\r\n".encode() + b'{"model"')

        worst = 0.0
        with httpx.Client(timeout=5) as client:
            for _ in range(10):
                started = time.monotonic()
                assert client.get(f"{strict.url}/healthz").status_code == 200
                worst = max(worst, time.monotonic() - started)
        assert worst < 0.5, f"/healthz took {worst:.3f} s beside {len(slow)} slow clients"

        time.sleep(max(HEADER_TIMEOUT_S, BODY_TIMEOUT_S))
        still_open: list[socket.socket] = []
        for sock in slow:
            sock.settimeout(SLACK_S)
            try:
                while sock.recv(65536):
                    pass
            except TimeoutError:
                still_open.append(sock)
            except ConnectionResetError:
                pass
        assert still_open == [], f"{len(still_open)} of {len(slow)} slow connections are still open"


def test_a_client_leaving_mid_body_logs_no_error(strict: ProxyServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    with connection(strict) as sock:
        sock.sendall(f"{CHAT}Content-Length: 4000\r\n\r\n".encode() + b'{"model": "fake", "messages": [')
        time.sleep(0.2)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not any("left" in record.getMessage() for record in caplog.records):
        time.sleep(0.05)
    # The server is still fine, and has had time to log whatever the departure costs.
    assert httpx.get(f"{strict.url}/healthz", timeout=5).status_code == 200

    errors = [record for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info]
    assert errors == [], [record.getMessage() for record in errors]
    departures = [record for record in caplog.records if "left" in record.getMessage()]
    assert len(departures) == 1


def test_the_keep_alive_timeout_is_well_above_httpx_keepalive_expiry() -> None:
    assert server_options(ServerConfig())["timeout_keep_alive"] >= 10 * HTTPX_KEEPALIVE_EXPIRY_S


@pytest.mark.time_budget(30)
def test_an_idle_connection_outlives_httpx_keepalive_expiry(proxy: ProxyServer) -> None:
    request = b"GET /healthz HTTP/1.1\r\nHost: proxy\r\n\r\n"
    with connection(proxy) as sock:
        sock.sendall(request)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(HTTPX_KEEPALIVE_EXPIRY_S + 1)
        assert not is_closed(sock), "the server closed an idle connection a client could still be using"
        sock.sendall(request)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


# --- 6. sockets are capped where they are accepted ----------------------------------------------------------------

CAP = 20


@pytest.mark.time_budget(60)
def test_slow_clients_past_the_cap_make_room_for_real_ones(serve_proxy: ServeProxy) -> None:
    """More slow-header connections than `server.max_connections`: the oldest are closed as new ones arrive,
    the server never holds more than the cap, and a real client is served at once (uvicorn alone would hold all
    of them until the header deadline and answer the real client 503)."""
    proxy = serve_proxy(server={"header_timeout_s": 30, "max_connections": CAP})
    with ExitStack() as stack:
        slow = []
        for _ in range(CAP * 2):
            sock = stack.enter_context(connection(proxy))
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: pro")
            slow.append(sock)
        time.sleep(0.3)
        closed = [is_closed(sock) for sock in slow]
        assert sum(closed) >= CAP  # the first ones, evicted by the later ones
        assert all(closed[:CAP]), closed
        started = time.monotonic()
        response = httpx.get(f"{proxy.url}/healthz", timeout=10)
        assert response.status_code == 200
        assert time.monotonic() - started < 5  # not held until the 30 s header deadline
        # The newest slow connections were still open: a real client only evicted what waited longest.
        assert not all(is_closed(sock) for sock in slow[-CAP // 2 :])


def test_the_default_cap_leaves_half_the_file_limit_to_upstreams() -> None:
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert default_max_connections() == max(16, (soft - RESERVED_FILES) // 2)
    assert server_options(ServerConfig()).keys() == {"http", "ws", "timeout_keep_alive"}


def test_an_unauthenticated_slow_body_is_answered_401_and_closed_at_once(serve_proxy: ServeProxy) -> None:
    """A request without a valid key is refused before its body is read, and with `Connection: close`: the rest of
    a dripping body must not keep the socket for the body timeout (it kept it 125 s)."""
    proxy = serve_proxy(auth={"keys": ["k1"]})
    with connection(proxy) as sock:
        sock.sendall(CHAT.encode() + b"Content-Length: 1000000\r\n\r\n{")
        started = time.monotonic()
        received = read_until_closed(sock, within_s=3.0)
    status, headers, _body = split_response(received)
    assert status == 401
    assert headers.get("connection") == "close"
    assert time.monotonic() - started < 3.0
