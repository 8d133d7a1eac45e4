"""Issue 41, items 2-4: a WebSocket on `/v1/responses` is bounded like an HTTP connection.

Each test drives the served proxy with a real WebSocket client (`websockets`' own, as the OpenAI SDK's
`responses.connect()` uses):
2. A socket waiting for its next `response.create` is idle: past `server.max_connections` a new connection closes
   the one that has waited longest, a socket as an idle keep-alive connection; an idle socket is closed after
   `server.socket_idle_timeout_s` (a socket answering is not idle); one key holds at most
   `server.max_sockets_per_key` sockets, the next handshake refused 429.
3. Sockets whose client never reads are reset after `server.write_timeout_s`, as HTTP streams are, and every
   answer is journaled and sealed to its end.
4. A socket keeps only its latest warm-up (`generate: false`): continuing an older one is
   `previous_response_not_found`, and a hundred large warm-ups cost the memory of one.
On code without these bounds, idle sockets are never evictable (a real client gets 503 `server_busy`), sockets
that never read stay open for ever, and every warm-up stays in memory until its socket closes.
"""

from __future__ import annotations

import json
import socket
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from tests.conftest import ServeProxy
from tests.reliability.support import assert_openai_error, read_only
from tests.reliability.test_stalled_streams import HealthProbe, is_established
from tests.support.fake_upstream import FakeUpstream, Reply
from tests.support.proxy_server import HOST, ProxyProcess, ProxyServer, make_config

ENDINGS = ("response.completed", "response.failed", "response.incomplete", "error")
CAP = 8
IDLE_S = 1.0
SLACK_S = 3.0
"""How late after its deadline a socket may still be closed (scheduling on a busy test machine)."""
GOING_AWAY = 1001


def open_socket(port: int, key: str | None = None, **options: Any) -> ClientConnection:
    headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
    return connect(f"ws://{HOST}:{port}/v1/responses", additional_headers=headers, open_timeout=10, **options)


def create(sock: ClientConnection, **fields: Any) -> list[dict[str, Any]]:
    """Send one `response.create`; the events that answer it, up to its last."""
    sock.send(json.dumps({"type": "response.create", "model": "fake", **fields}))
    events: list[dict[str, Any]] = []
    while True:
        event = json.loads(sock.recv(timeout=30))
        events.append(event)
        if event["type"] in ENDINGS:
            return events


def close_code(sock: ClientConnection, within_s: float) -> int | None:
    """The close code the server sent, waiting at most `within_s`; fails if the socket is still open then."""
    try:
        message = sock.recv(timeout=within_s)
    except ConnectionClosed as closed:
        return closed.rcvd.code if closed.rcvd is not None else None
    except TimeoutError:
        pytest.fail(f"the socket was still open after {within_s} s")
    pytest.fail(f"the socket got a message instead of closing: {str(message)[:200]}")


def is_open(sock: ClientConnection) -> bool:
    try:
        sock.recv(timeout=0.05)
    except TimeoutError:
        return True
    except ConnectionClosed:
        return False
    return True


# --- 2: idle sockets --------------------------------------------------------------------------------------------


def test_idle_sockets_past_the_cap_make_room_for_a_real_client(serve_proxy: ServeProxy) -> None:
    """As many idle sockets as `server.max_connections`: a real client's request closes the one that has waited
    longest and is answered (it got 503 `server_busy`: a socket was never evictable)."""
    proxy = serve_proxy(server={"max_connections": CAP})
    with ExitStack() as stack:
        sockets = [stack.enter_context(open_socket(proxy.port)) for _ in range(CAP)]
        assert create(sockets[0], input="warm")[-1]["type"] == "response.completed"
        time.sleep(0.2)  # every socket now waits for its next `response.create`
        body = {"model": "fake", "messages": [{"role": "user", "content": "a real client"}]}
        response = httpx.post(f"{proxy.base_url}/chat/completions", json=body, timeout=20)
        assert response.status_code == 200, response.text
        assert close_code(sockets[1], within_s=5) == GOING_AWAY  # the first to wait after its handshake
        assert [is_open(sock) for sock in sockets[2:]] == [True] * (CAP - 2)
        assert create(sockets[0], input="still here")[-1]["type"] == "response.completed"


def test_an_idle_socket_is_closed_but_one_answering_is_not(serve_proxy: ServeProxy, fake: FakeUpstream) -> None:
    """`server.socket_idle_timeout_s` counts only the wait for the next `response.create`: an answer slower than it
    is not cut, and the socket is closed (1001) once it has waited that long after it."""
    proxy = serve_proxy(server={"socket_idle_timeout_s": IDLE_S})
    fake.responder = lambda body: Reply(content=" ".join(f"w{n}" for n in range(6)))
    fake.chunk_delay_s = 0.4  # the answer takes ~2.4 s, twice the idle timeout
    with open_socket(proxy.port) as sock:
        events = create(sock, input="take your time")
        assert events[-1]["type"] == "response.completed", events[-1]
        assert close_code(sock, within_s=IDLE_S + SLACK_S) == GOING_AWAY


def test_one_key_holds_at_most_max_sockets_per_key(serve_proxy: ServeProxy) -> None:
    """Past `server.max_sockets_per_key` a key's handshake is refused 429 in OpenAI's shape; another key is not
    affected, and a socket closed gives its key the room back."""
    proxy = serve_proxy(auth={"keys": ["k1", "k2"]}, server={"max_sockets_per_key": 3})
    with ExitStack() as stack:
        mine = [stack.enter_context(open_socket(proxy.port, "k1")) for _ in range(3)]
        with pytest.raises(InvalidStatus) as refused:
            open_socket(proxy.port, "k1")
        assert refused.value.response.status_code == 429
        error = assert_openai_error(json.loads(refused.value.response.body))
        assert error["code"] == "too_many_sockets"
        assert "k1" not in refused.value.response.body.decode()
        with open_socket(proxy.port, "k2") as theirs:
            assert create(theirs, input="hi")[-1]["type"] == "response.completed"
        mine.pop().close()
        deadline = time.monotonic() + 5
        while True:  # the server hears the close a moment later
            try:
                again = stack.enter_context(open_socket(proxy.port, "k1"))
                break
            except InvalidStatus:
                assert time.monotonic() < deadline, "a closed socket never gave its key the room back"
                time.sleep(0.05)
        assert create(again, input="hi")[-1]["type"] == "response.completed"


# --- 3: sockets that never read ---------------------------------------------------------------------------------

UNREAD = 4
PIECE = "x" * 3999 + " "
PIECES = 4000
"""16 MB an answer in 4,000-character deltas: beyond what the kernel's socket buffers take (`tcp_wmem`'s 4 MB)."""
WRITE_TIMEOUT_S = 1.0
DROPPED_WITHIN_S = 45.0


def unread_socket(port: int) -> tuple[ClientConnection, socket.socket]:
    """A socket that asks for a long answer and never reads: a small receive window, the client's own queue of
    one message (past which it stops reading the network), no pings of its own (unanswered, they would make the
    client close the socket itself), and no compression (the answer's repeated text would fit in the kernel's
    buffers compressed)."""
    raw = socket.socket()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    raw.connect((HOST, port))
    options: dict[str, Any] = {"max_queue": 1, "ping_interval": None, "compression": None}
    sock = connect(f"ws://{HOST}:{port}/v1/responses", sock=raw, open_timeout=10, **options)
    sock.send(json.dumps({"type": "response.create", "model": "fake", "input": "Tell me everything."}))
    return sock, raw


@pytest.mark.time_budget(120)
def test_sockets_that_never_read_are_dropped_and_every_answer_sealed(tmp_path: Path, fake: FakeUpstream) -> None:
    fake.responder = lambda body: Reply(content=PIECE * PIECES, finish_reason="stop")
    config = make_config(
        tmp_path,
        fake.url,
        server={"write_timeout_s": WRITE_TIMEOUT_S},
        limits={"max_answer_chars": 2 * len(PIECE) * PIECES},
    )
    config["upstream"] = {"timeout_s": 30}
    with ProxyProcess(config, tmp_path) as proxy, ExitStack() as stack, HealthProbe(proxy.url) as probe:
        clients = []
        for _ in range(UNREAD):
            _sock, raw = unread_socket(proxy.port)
            stack.callback(raw.close)
            clients.append(raw)
        deadline = time.monotonic() + DROPPED_WITHIN_S
        while time.monotonic() < deadline and (sealed(tmp_path) < UNREAD or any(map(is_established, clients))):
            time.sleep(0.1)
        held = sum(map(is_established, clients))

    assert held == 0, f"{held} of {UNREAD} sockets that never read still hold their connection"
    with read_only(tmp_path / "store.db") as db:
        steps = db.execute("SELECT status, length(content) FROM journal_steps ORDER BY id").fetchall()
    assert [tuple(row) for row in steps] == [("sealed", len(PIECE) * PIECES)] * UNREAD
    assert probe.failures == []


def sealed(tmp_path: Path) -> int:
    with read_only(tmp_path / "store.db") as db:
        return int(db.execute("SELECT COUNT(*) FROM journal_steps WHERE status = 'sealed'").fetchone()[0])


# --- 4: warm-ups ------------------------------------------------------------------------------------------------


def warm_up(sock: ClientConnection, text: str) -> str:
    """A warm-up (`generate: false`) of one user message; its response id."""
    events = create(sock, input=[{"role": "user", "content": text}], store=False, generate=False)
    assert events[-1]["type"] == "response.completed", events[-1]
    return str(events[-1]["response"]["id"])


def test_a_socket_continues_only_its_latest_warm_up(proxy: ProxyServer, fake: FakeUpstream) -> None:
    with open_socket(proxy.port) as sock:
        older = warm_up(sock, "an older warm-up")
        latest = warm_up(sock, "the latest warm-up")
        refused = create(sock, input=[], store=False, previous_response_id=older)[-1]
        assert refused["type"] == "error", refused
        assert refused["error"]["code"] == "previous_response_not_found"
        events = create(sock, input=[], store=False, previous_response_id=latest)
    assert events[-1]["type"] == "response.completed", events[-1]
    assert fake.requests[-1].body["messages"] == [{"role": "user", "content": "the latest warm-up"}]


WARM_UPS = 40
WARM_UP_CHARS = 4_000_000
"""Under `limits.max_message_chars` (4 MiB)."""
GROWTH_WITHIN = 64 * 1024 * 1024
"""What the proxy may grow by over the warm-ups: a few of them (each costs its input a few times over), far
less than all of them (160 MiB of input)."""


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


@pytest.mark.time_budget(180)
def test_many_large_warm_ups_on_one_socket_cost_the_memory_of_one(tmp_path: Path, fake: FakeUpstream) -> None:
    config = make_config(tmp_path, fake.url)
    config["models"][0]["context_window"] = 10_000_000  # the warm-ups are never compacted: only kept
    with ProxyProcess(config, tmp_path) as proxy, open_socket(proxy.port) as sock:
        warm_up(sock, "first")
        warm_up(sock, "x" * WARM_UP_CHARS)
        before = rss_of(proxy.pid)
        for turn in range(WARM_UPS):
            warm_up(sock, f"{turn} " + "x" * WARM_UP_CHARS)
        grown = rss_of(proxy.pid) - before
    assert grown < GROWTH_WITHIN, f"the proxy grew {grown / 2**20:.0f} MiB over {WARM_UPS} warm-ups of 4 MiB"
