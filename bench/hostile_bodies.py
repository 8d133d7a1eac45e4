"""The body attacks of issue 41 (items 5 and 8), scaled down to seconds, for `bench/hostile.py`.

Each is an `Attack` whose `drive` plays the hostile client against one served proxy (`Target`) and returns what it
got and what the store kept of it. Sizes, against the issue's run:

    5   4x-2M-ints-in-metadata       four concurrent 4 MB chat bodies whose `metadata` holds 2 M integers (issue:
                                     7.8 MB and 3.9 M integers each)
        4x-2M-nulls-passed-on        the same values as nulls, in a field the proxy passes on untouched
        4x-500k-values-passed-on     four concurrent bodies of 500,000 values each in such a field: under the
                                     limit, answered (the event loop must stay responsive while they are parsed)
    8   10x31MB-invalid-bodies       ten concurrent 31 MB conversations whose last message has an invalid role
        40-unread-4MB-streams        40 clients that never read a 4 MB stream, default `write_timeout_s` (30 s):
                                     how long the sockets are held, and whether every answer is journaled whole
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections import Counter
from collections.abc import Callable

import httpx

from bench.hostile import Attack, Outcome, Target, send
from bench.hostile_attacks import CHAT, MB, number, unread_streams

REQUEST_TIMEOUT_S = 300.0
STORED_TABLES = ("messages", "journal_steps")


def stored_rows(target: Target) -> int:
    """Rows of messages and journal steps in the SQLite store: what a refused request must not add to."""
    return sum(number(target, f"SELECT COUNT(*) FROM {table}") for table in STORED_TABLES)


def concurrent(count: int, build: Callable[[], bytes]) -> Callable[[Target], Outcome]:
    """`count` clients posting the same body (built once, before any target runs) at once: their statuses, the
    slowest answer, and the rows the store gained."""
    body = functools.cache(build)

    def drive(target: Target) -> Outcome:
        before = stored_rows(target)
        results: list[tuple[str, float]] = []

        def client() -> None:
            started = time.monotonic()
            with httpx.Client(timeout=REQUEST_TIMEOUT_S) as http:
                try:
                    outcome = send(http, target.base + CHAT, body(), False)
                except httpx.HTTPError as exc:
                    outcome = type(exc).__name__
            results.append((outcome, time.monotonic() - started))

        threads = [threading.Thread(target=client) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(REQUEST_TIMEOUT_S)
        statuses = Counter(outcome for outcome, _ in results)
        slowest = max((seconds for _, seconds in results), default=float("nan"))
        shown = ", ".join(f"{outcome} ×{n}" for outcome, n in statuses.most_common())
        return Outcome(f"{shown}; slowest {slowest:.1f} s", f"{stored_rows(target) - before} rows stored")

    drive.prepare = body  # type: ignore[attr-defined]
    return drive


def chat_body(extra: bytes, messages: bytes = b'[{"role":"user","content":"hi"}]') -> bytes:
    return b'{"model":"fake","messages":' + messages + b"," + extra + b"}"


def values(value: bytes, count: int) -> bytes:
    """A JSON array of `count` copies of `value`."""
    return b"[" + b",".join([value] * count) + b"]"


def invalid_conversation(size: int) -> bytes:
    """A conversation of ~4 KB messages, `size` bytes in all, whose last message has a role no API knows."""
    text = ("lorem ipsum dolor sit amet, " * 150)[:4000]
    message = json.dumps({"role": "user", "content": text}).encode()
    count = size // (len(message) + 1)
    return chat_body(b'"stream":false', b"[" + b",".join([message] * count) + b',{"role":"bad","content":"x"}]')


ATTACKS = (
    Attack(
        "4x-2M-ints-in-metadata",
        concurrent(4, lambda: chat_body(b'"metadata":{"v":' + values(b"0", 2_000_000) + b"}")),
        41,
        "5",
    ),
    Attack("4x-2M-nulls-passed-on", concurrent(4, lambda: chat_body(b'"x":' + values(b"null", 2_000_000))), 41, "5"),
    Attack("4x-500k-values-passed-on", concurrent(4, lambda: chat_body(b'"x":' + values(b"1", 500_000))), 41, "5"),
    Attack("10x31MB-invalid-bodies", concurrent(10, lambda: invalid_conversation(31 * MB)), 41, "8"),
    Attack("40-unread-4MB-streams", unread_streams(40, 90.0), 41, "8", answer=("chunks", f"{4 * MB}:4000")),
)
