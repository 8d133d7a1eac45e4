"""Issue 29, item 5: clients that never read their stream are dropped, and every answer is still journaled.

`python -m proxy serve` runs as a child process (`ProxyProcess`). Several raw-socket clients ask for a stream
longer than the kernel's socket buffers hold and never read a byte. After `server.write_timeout_s` without taking
anything each is dropped — its connection reset, not left to the kernel to retry for minutes — while every answer
is journaled to its end: the client is dropped, never the data. /healthz keeps answering meanwhile. On code
without the write timeout the sockets stay open for ever. (The relay's bounded backlog for such a client is
asserted in `tests/unit/journal/test_relay.py`, through the upstream seam.)
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest

from tests.reliability.support import read_only
from tests.support.fake_upstream import FakeUpstream, Reply
from tests.support.proxy_server import HOST, ProxyProcess, make_config

CLIENTS = 4
PIECE = "x" * 3999 + " "
PIECES = 4000
"""16 MB an answer, in 4,000-character chunks: well beyond what the kernel's socket buffers take for a client
(up to `tcp_wmem`'s 4 MB), so the proxy itself must hold or drop the rest."""
WRITE_TIMEOUT_S = 1.0
HEALTHZ_WITHIN_S = 1.0
WITHIN_S = 45.0
REQUEST = b'{"model": "fake", "stream": true, "messages": [{"role": "user", "content": "Tell me everything."}]}'


def is_established(sock: socket.socket) -> bool:
    """Whether the server still holds the connection (TCP_INFO's first byte is the state; 1 is ESTABLISHED)."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == 1


def stalled_client(port: int) -> socket.socket:
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
    sock.connect((HOST, port))
    head = "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
    sock.sendall(f"{head}Content-Length: {len(REQUEST)}\r\n\r\n".encode() + REQUEST)
    return sock


class HealthProbe:
    """GETs /healthz every 15 ms from a thread; keeps the slowest answer."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.worst = 0.0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    client.get(f"{self.url}/healthz").raise_for_status()
                except httpx.HTTPError as exc:
                    self.failures.append(repr(exc))
                self.worst = max(self.worst, time.monotonic() - started)
                self._stop.wait(0.015)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(15)


@pytest.fixture
def stalling_proxy(tmp_path: Path, fake: FakeUpstream) -> Iterator[ProxyProcess]:
    fake.responder = lambda body: Reply(content=PIECE * PIECES, finish_reason="stop")
    config = make_config(
        tmp_path,
        fake.url,
        server={"write_timeout_s": WRITE_TIMEOUT_S},
        limits={"max_answer_chars": 2 * len(PIECE) * PIECES},
    )
    config["upstream"] = {"timeout_s": 30}
    with ProxyProcess(config, tmp_path) as proxy:
        yield proxy


@pytest.mark.time_budget(90)
def test_clients_that_never_read_are_dropped_and_every_answer_journaled(
    stalling_proxy: ProxyProcess, tmp_path: Path
) -> None:
    proxy = stalling_proxy
    with ExitStack() as stack, HealthProbe(proxy.url) as probe:
        clients = [stack.enter_context(stalled_client(proxy.port)) for _ in range(CLIENTS)]
        deadline = time.monotonic() + WITHIN_S
        while time.monotonic() < deadline and (sealed_steps(tmp_path) < CLIENTS or any(map(is_established, clients))):
            time.sleep(0.1)
        held = sum(map(is_established, clients))

    assert held == 0, f"{held} of {CLIENTS} clients that never read still hold their connection"
    with read_only(tmp_path / "store.db") as db:
        steps = db.execute("SELECT id, status, length(content) FROM journal_steps ORDER BY id").fetchall()
        pieces = db.execute(
            "SELECT step_id, COUNT(*) FROM journal_events WHERE instr(content, ?) > 0 GROUP BY step_id",
            (PIECE.strip(),),
        ).fetchall()
    assert [(row[1], row[2]) for row in steps] == [("sealed", len(PIECE) * PIECES)] * CLIENTS
    assert [tuple(row) for row in pieces] == [(row[0], PIECES) for row in steps]  # every chunk journaled
    assert probe.failures == []
    assert probe.worst < HEALTHZ_WITHIN_S, f"/healthz took {probe.worst:.2f} s beside {CLIENTS} stalled streams"


def sealed_steps(tmp_path: Path) -> int:
    with read_only(tmp_path / "store.db") as db:
        return int(db.execute("SELECT COUNT(*) FROM journal_steps WHERE status = 'sealed'").fetchone()[0])
