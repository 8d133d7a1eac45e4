"""The WebSocket attacks of issue 41 (items 2-4), scaled down to seconds, for `bench/hostile.py`.

Each plays the hostile client against one served proxy (`Target`) over Responses WebSocket mode
(`/v1/responses`), with `websockets`' own client (the one the OpenAI SDK's `responses.connect()` uses). Sizes,
against the issue's run:

    2   120-idle-sockets-cap-100     one key opens 120 sockets and sends nothing, `max_connections` 100 (issue: ~450
                                     at an open-file limit of 1,024, which leaves 448); then another key's chat
                                     requests, one every 0.5 s for 8 s
        120-idle-sockets-cap-50      the same with `max_connections` 50: below `max_sockets_per_key` (64), so the
                                     sockets that wait longest make room
    3   10-unread-socket-8MB-answers 10 sockets ask for an 8 MB answer (4,000-character deltas) and never read,
                                     `write_timeout_s` 2 (issue: 20 of 4 MB, past 90 s)
    4   100-warm-ups-of-4MB          one socket sends 100 `generate: false` warm-ups of 4 MB each (as the issue)
"""

from __future__ import annotations

import functools
import json
import socket
import time
from collections import Counter
from contextlib import ExitStack, suppress
from typing import Any

import httpx
from websockets.exceptions import InvalidStatus, WebSocketException
from websockets.sync.client import ClientConnection, connect

from bench.harness.servers import HOSTILE_QUESTION
from bench.hostile import NOTHING, Attack, Outcome, Target
from bench.hostile_attacks import CHAT, HOST, MB, established, number

ATTACKER, VICTIM = "k-attacker", "k-victim"
ENDINGS = ("response.completed", "response.failed", "response.incomplete", "error")
IDLE_SOCKETS = 120
UNREAD_SOCKETS = 10
UNREAD_WAIT_S = 45.0
WARM_UPS = 100
WARM_UP_CHARS = 4_000_000
"""Under `limits.max_message_chars` (4 MiB)."""


def open_socket(target: Target, key: str | None = None, **options: Any) -> ClientConnection:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"ws://{HOST}:{target.port}/v1/responses"
    return connect(url, additional_headers=headers, open_timeout=30, ping_interval=None, **options)


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


# --- 2: idle sockets take every connection slot ------------------------------------------------------------------


def idle_sockets(target: Target) -> Outcome:
    """One key's idle sockets up to the cap; what another key's chat requests get meanwhile."""
    refused: Counter[str] = Counter()
    with ExitStack() as stack:
        held = []
        for _ in range(IDLE_SOCKETS):
            try:
                held.append(stack.enter_context(open_socket(target, ATTACKER)))
            except InvalidStatus as exc:
                refused[str(exc.response.status_code)] += 1
            except (OSError, WebSocketException) as exc:
                refused[type(exc).__name__] += 1
        answers: Counter[str] = Counter()
        deadline = time.monotonic() + 8
        headers = {"Authorization": f"Bearer {VICTIM}"}
        while time.monotonic() < deadline:
            body = {"model": "fake", "messages": [{"role": "user", "content": f"fast {sum(answers.values())}"}]}
            try:
                answers[str(httpx.post(target.base + CHAT, json=body, headers=headers, timeout=10).status_code)] += 1
            except httpx.HTTPError as exc:
                answers[type(exc).__name__] += 1
            time.sleep(0.5)
        still_open = sum(is_open(sock) for sock in held)
    opened = f"sockets held {still_open} of {len(held)} opened" + (
        f" ({', '.join(f'{kind}×{n}' for kind, n in refused.items())} refused)" if refused else ""
    )
    return Outcome(f"{opened}; other key's chats: " + ", ".join(f"{kind}×{n}" for kind, n in answers.most_common()))


def is_open(sock: ClientConnection) -> bool:
    try:
        sock.recv(timeout=0)
    except TimeoutError:
        return True
    except WebSocketException:
        return False
    return True


# --- 3: sockets that never read ----------------------------------------------------------------------------------


def unread_sockets(target: Target) -> Outcome:
    """How long the proxy holds sockets nobody reads (counted from /proc), and whether every answer is journaled
    whole and sealed."""
    event = json.dumps({"type": "response.create", "model": "fake", "input": HOSTILE_QUESTION})
    query = "SELECT COUNT(*) FROM journal_steps WHERE stream = 1 AND status = 'sealed'"
    with ExitStack() as stack:
        for _ in range(UNREAD_SOCKETS):
            raw = stack.enter_context(socket.socket())
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
            raw.connect((HOST, target.port))
            # Its own queue of one message, past which it stops reading; no compression (the answer's repeated
            # text would fit in the kernel's buffers compressed).
            sock = open_socket(target, sock=raw, max_queue=1, compression=None)
            stack.callback(sock.close_socket)
            sock.send(event)
        started = time.monotonic()
        dropped_s = journaled_s = None
        while time.monotonic() - started < UNREAD_WAIT_S and (dropped_s is None or journaled_s is None):
            if dropped_s is None and established(target.port) == 0:
                dropped_s = time.monotonic() - started
            if journaled_s is None and number(target, query) == UNREAD_SOCKETS:
                journaled_s = time.monotonic() - started
            time.sleep(0.25)
        held = established(target.port)
    journaled = number(target, query)
    dropped = f"all dropped after {dropped_s:.1f} s" if dropped_s is not None else f"{held} still held"
    kept = f"all sealed after {journaled_s:.1f} s" if journaled_s is not None else "not all sealed"
    return Outcome(dropped, f"{UNREAD_SOCKETS - journaled} not sealed ({kept}, {UNREAD_WAIT_S:.0f} s max)")


# --- 4: warm-ups kept without bound ------------------------------------------------------------------------------


@functools.cache
def warm_up_events() -> tuple[str, ...]:
    """The warm-ups, built once before any target runs (each its own text, as a client's turns are)."""
    return tuple(
        json.dumps(
            {
                "type": "response.create",
                "model": "fake",
                "store": False,
                "generate": False,
                "input": [{"role": "user", "content": f"{turn} " + "x" * WARM_UP_CHARS}],
            }
        )
        for turn in range(WARM_UPS)
    )


def warm_ups(target: Target) -> Outcome:
    """One socket's warm-ups; what they were answered, and how much the proxy grew while the socket was open."""
    before = rss_mib(target.pid)
    endings: Counter[str] = Counter()
    with open_socket(target) as sock:
        for event in warm_up_events():
            sock.send(event)
            while (kind := json.loads(sock.recv(timeout=60))["type"]) not in ENDINGS:
                pass
            endings[kind] += 1
        grown = rss_mib(target.pid) - before
        with suppress(OSError):
            sock.close()
    answered = ", ".join(f"{kind}×{n}" for kind, n in endings.most_common())
    return Outcome(f"{answered}; RSS +{grown:.0f} MiB with the socket open", NOTHING)


warm_ups.prepare = warm_up_events  # type: ignore[attr-defined]


def idle_sockets_attack(cap: int) -> Attack:
    sections = {"server": {"max_connections": cap}, "auth": {"keys": [ATTACKER, VICTIM]}}
    return Attack(f"{IDLE_SOCKETS}-idle-sockets-cap-{cap}", idle_sockets, 41, "2", sections=sections)


ATTACKS = (
    idle_sockets_attack(100),
    idle_sockets_attack(50),
    Attack(
        "10-unread-socket-8MB-answers",
        unread_sockets,
        41,
        "3",
        answer=("chunks", f"{8 * MB}:4000"),
        sections={"server": {"write_timeout_s": 2}, "limits": {"max_answer_chars": 10 * MB}},
    ),
    Attack("100-warm-ups-of-4MB", warm_ups, 41, "4"),
)
