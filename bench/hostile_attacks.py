"""The attacks of issue 29 (items 1-11), scaled down to seconds, for `bench/hostile.py`.

Each is an `Attack` whose `drive` plays the hostile client against one served proxy (`Target`) and returns what it
got (`Outcome.outcome`) and what the data lost or leaked (`Outcome.lost`). Sizes, against the issue's run:

    1   pg-outage-4s                 PostgreSQL stopped 4 s under 2 clients' steady traffic (issue: 5 s)
    2   10MB-error-body              an upstream 500 whose body is 10 MB
        20MB-sse-to-non-stream       a 20 MB event stream answering a non-stream call
    3   110-slow-bodies-cap-100      110 bodies trickling a byte per 0.5 s with `max_connections` 100 (issue: 1,100
                                     over the default cap), a fast chat request each second meanwhile
    4   8x64MB-headers               eight 64 MB headers at once
    5   10-unread-8MB-streams        10 clients that never read an 8 MB stream (4,000-character chunks: more than the
                                     kernel's socket buffers take), `write_timeout_s` 2 (issue: 100 on 4 MB)
    6   1MB-in-4-char-chunks         a 1 MB streamed answer in 4-character chunks (issue: 4 MB)
    7   40MB-non-stream-answer       a 40 MB non-stream answer (`max_answer_chars` 4M by default: its byte cap is
                                     ~25 MB)
        one-40MB-sse-event           one 40 MB SSE event in a stream (over the byte cap too)
    8   fuzzed-bad-bodies            13 bodies of the shapes the fuzzer found (bad parts, roles, sources, NaN,
                                     orphan and unanswered tool calls, 5M-character strings) on the four routes
    9   env-key-echoed               a model whose key comes from OPENAI_API_KEY; the upstream's 401 echoes it
    10  foreign-sqlite               `store.path` at another application's database with a `messages` table
    11  corrupt-store                `store.path` at 64 KB of random bytes
        non-json-stream              a stream of lines that are not JSON, then [DONE]
        wrong-shape-chunks           chunks whose `choices` is a string
        1KB-chunks-journal-size      a 3.9 MB answer in 1 KB chunks: bytes its events take per byte of text
        unauth-slow-body             a dripping body without a key: how long the socket is kept after the 401
        huge-header-on-messages      a 1 MB header on /v1/messages: the 431's shape
    (Disk full mid-stream needs a full disk under the proxy: tests/reliability/test_hardening.py has it.)
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import sqlite3
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable
from contextlib import ExitStack, closing, suppress

import httpx

from bench.harness.processes import checkout_env, python
from bench.hostile import NOTHING, Attack, Outcome, Target, send, short_question

HOST = "127.0.0.1"
MB = 1_000_000
SECRET = "sk-proj-envKEY0123456789abcdefghijklmnopqrstuv"
CHAT = "/v1/chat/completions"


def chat(stream: bool) -> Callable[[Target], Outcome]:
    """A short question; what came back, and the longest text the store kept of it."""

    def drive(target: Target) -> Outcome:
        with httpx.Client(timeout=300) as client:
            outcome = send(client, target.base + CHAT, short_question(stream), stream)
        return Outcome(outcome, f"largest text stored {largest_stored(target) / 1e3:,.0f} kB")

    return drive


def number(target: Target, sql: str) -> int:
    """One number from the SQLite store, read-only (0 for NULL)."""
    assert target.store_path is not None
    with closing(sqlite3.connect(f"file:{target.store_path}?mode=ro", uri=True)) as db:
        value: int | None = db.execute(sql).fetchone()[0]
    return int(value or 0)


def largest_stored(target: Target) -> int:
    steps = "SELECT MAX(MAX(LENGTH(content)), MAX(LENGTH(error))) FROM journal_steps"
    events = "SELECT MAX(LENGTH(content)) FROM journal_events"
    return max(number(target, steps), number(target, events))


# --- 1: a PostgreSQL outage -----------------------------------------------------------------------------------


def pg_outage(target: Target) -> Outcome:
    sealed = "SELECT COUNT(*) FROM journal_steps WHERE status IN ('sealed', 'complete')"
    kept_before = int(target.postgres.psql(sealed))
    phases: dict[str, Counter[str]] = {"before": Counter(), "outage": Counter(), "after": Counter()}
    phase = ["before"]
    answered = [0]
    first_ok: list[float] = []
    restarted = [0.0]
    stop = threading.Event()

    def client(number: int) -> None:
        with httpx.Client(base_url=target.base, timeout=30) as http:
            turn = 0
            while not stop.is_set():
                turn += 1
                current = phase[0]
                body = {"model": "fake", "messages": [{"role": "user", "content": f"client {number} turn {turn}"}]}
                try:
                    status = str(http.post(CHAT, json=body).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                phases[current][status] += 1
                answered[0] += status == "200"
                if status == "200" and current == "after" and not first_ok:
                    first_ok.append(time.monotonic() - restarted[0])

    threads = [threading.Thread(target=client, args=(n,), daemon=True) for n in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(2)
    phase[0] = "outage"
    target.postgres.pause()
    time.sleep(4)
    target.postgres.resume()
    restarted[0] = time.monotonic()
    phase[0] = "after"
    time.sleep(6)
    stop.set()
    for thread in threads:
        thread.join(35)
    kept = int(target.postgres.psql(sealed)) - kept_before
    during = ", ".join(f"{status}×{count}" for status, count in phases["outage"].most_common())
    after = phases["after"]
    back = f"first 200 {first_ok[0]:.1f} s after restart" if first_ok else "no 200 after restart"
    outcome = f"outage: {during}; after: {after['200']}/{sum(after.values())} 200, {back}"
    return Outcome(outcome, f"{answered[0] - kept} answered turns not in the store")


# --- 3, 4, 5, 11: connections -----------------------------------------------------------------------------------


def slow_bodies(target: Target) -> Outcome:
    with ExitStack() as stack:
        slow = []
        for _ in range(110):
            sock = stack.enter_context(socket.create_connection((HOST, target.port), timeout=10))
            sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: p\r\nContent-Length: 100000\r\n\r\n{{".encode())
            slow.append(sock)
        answers: Counter[str] = Counter()
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            for sock in slow:
                with suppress(OSError):
                    sock.sendall(b" ")
            body = {"model": "fake", "messages": [{"role": "user", "content": f"fast {sum(answers.values())}"}]}
            try:
                answers[str(httpx.post(target.base + CHAT, json=body, timeout=5).status_code)] += 1
            except httpx.HTTPError as exc:
                answers[type(exc).__name__] += 1
            time.sleep(0.5)
    return Outcome("fast chats: " + ", ".join(f"{kind}×{n}" for kind, n in answers.most_common()))


def huge_headers(target: Target) -> Outcome:
    results: list[tuple[int, float]] = []

    def attacker() -> None:
        results.append(send_huge_header(target, CHAT, 64 * MB))

    threads = [threading.Thread(target=attacker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    statuses = Counter(status for status, _ in results)
    slowest = max((seconds for _, seconds in results), default=float("nan"))
    return Outcome(", ".join(f"{status}×{n}" for status, n in statuses.items()) + f", slowest {slowest:.2f} s")


def send_huge_header(target: Target, path: str, size: int) -> tuple[int, float]:
    """The status of a request whose one header is `size` bytes (0: none came), and the seconds to the answer."""
    piece = b"a" * 65536
    with socket.create_connection((HOST, target.port), timeout=60) as sock:
        started = time.monotonic()
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: p\r\nX-Junk: ".encode())
        sock.setblocking(False)
        sent, answer = 0, b""
        while sent < size and not answer:
            try:
                answer = sock.recv(65536)
                break
            except BlockingIOError:
                pass
            try:
                sent += sock.send(piece)
            except BlockingIOError:
                time.sleep(0.001)
            except OSError:
                break
        sock.setblocking(True)
        sock.settimeout(60)
        try:
            while b"\r\n\r\n" not in answer and (more := sock.recv(65536)):
                answer += more
        except OSError:
            pass
        seconds = time.monotonic() - started
        try:
            while more := sock.recv(65536):
                answer += more
        except OSError:
            pass
    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
    huge_header_bodies[target.name] = answer.partition(b"\r\n\r\n")[2]
    return status, seconds


huge_header_bodies: dict[str, bytes] = {}


def unread_streams(clients: int, wait_s: float) -> Callable[[Target], Outcome]:
    """`clients` asking for a stream they never read: when the proxy dropped each socket (counted from /proc:
    reading one would unstall it), and whether every answer is still journaled whole, within `wait_s`."""

    def drive(target: Target) -> Outcome:
        body = short_question(stream=True)
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        query = "SELECT COUNT(*) FROM journal_steps WHERE stream = 1 AND status IN ('sealed', 'complete')"
        with ExitStack() as stack:
            for _ in range(clients):
                sock = stack.enter_context(socket.create_connection((HOST, target.port), timeout=10))
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sock.sendall(head.encode() + body)
            started = time.monotonic()
            dropped: list[float] = []
            journaled_s = None
            while time.monotonic() - started < wait_s and (len(dropped) < clients or journaled_s is None):
                held = established(target.port)
                dropped += [time.monotonic() - started] * (clients - held - len(dropped))
                if journaled_s is None and number(target, query) == clients:
                    journaled_s = time.monotonic() - started
                time.sleep(0.25)
        journaled = number(target, query)
        if len(dropped) == clients:
            shown = f"dropped after {dropped[0]:.0f}-{dropped[-1]:.0f} s"
        else:
            shown = f"{clients - len(dropped)} still held after {wait_s:.0f} s"
        kept = f"all journaled after {journaled_s:.1f} s" if journaled_s is not None else "not all journaled"
        return Outcome(shown, f"{clients - journaled} not journaled whole ({kept})")

    return drive


def established(port: int) -> int:
    """The proxy's established TCP connections on `port` (read from /proc: reading a socket would unstall it)."""
    local = f":{port:04X}"
    count = 0
    with open("/proc/net/tcp") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            count += fields[1].endswith(local) and fields[3] == "01"
    return count


def unauth_slow_body(target: Target) -> Outcome:
    with socket.create_connection((HOST, target.port), timeout=30) as sock:
        sock.sendall(f"POST {CHAT} HTTP/1.1\r\nHost: p\r\nContent-Length: 1000000\r\n\r\n{{".encode())
        started = time.monotonic()
        answer = b""
        sock.settimeout(0.2)
        while time.monotonic() - started < 20:
            try:
                sock.sendall(b" ")
                more = sock.recv(65536)
                if not more:
                    break
                answer += more
            except TimeoutError:
                continue
            except OSError:
                break
        held = time.monotonic() - started
    status = answer.split(b" ", 2)[1].decode() if answer.startswith(b"HTTP/") else "no answer"
    return Outcome(f"{status}, socket closed after {held:.1f} s" + (" (gave up)" if held >= 20 else ""))


def huge_header_on_messages(target: Target) -> Outcome:
    status, _seconds = send_huge_header(target, "/v1/messages", MB)
    try:
        refusal = json.loads(huge_header_bodies.get(target.name, b""))
    except ValueError:
        refusal = None
    shape = "Anthropic's shape" if isinstance(refusal, dict) and refusal.get("type") == "error" else "OpenAI's shape"
    return Outcome(f"{status} in {shape}")


# --- 8, 9, 10, 11: bodies, keys, store files ---------------------------------------------------------------------

HUGE = "z" * 5_000_000
BAD_BODIES: tuple[tuple[str, str], ...] = (
    (CHAT, json.dumps({"model": "fake", "messages": [{"role": "user", "content": [{"type": "weird", "x": 1}]}]})),
    (CHAT, json.dumps({"model": "fake", "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})),
    (
        CHAT,
        json.dumps(
            {
                "model": "fake",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "tool", "tool_call_id": "nope", "content": "orphan"},
                ],
            }
        ),
    ),
    (
        CHAT,
        json.dumps(
            {
                "model": "fake",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {
                        "role": "assistant",
                        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                    },
                    {"role": "user", "content": "never answered"},
                ],
            }
        ),
    ),
    (CHAT, '{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "temperature": NaN}'),
    (CHAT, '{"model": "fake", "messages": [{"role": "user", "content": "hi"}], "top_p": Infinity}'),
    ("/v1/responses", json.dumps({"model": "fake", "input": [{"role": {"x": 1}, "content": "hi"}]})),
    ("/v1/responses", json.dumps({"model": "fake", "input": HUGE})),
    ("/v1/responses", json.dumps({"model": "fake", "input": "hi", "instructions": HUGE})),
    (
        "/v1/messages",
        json.dumps(
            {
                "model": "fake",
                "max_tokens": 10,
                "messages": [{"role": "user", "content": [{"type": "image", "source": "abc"}]}],
            }
        ),
    ),
    (
        "/v1/messages",
        json.dumps(
            {"model": "fake", "max_tokens": 10, "system": HUGE, "messages": [{"role": "user", "content": "hi"}]}
        ),
    ),
    (
        "/v1/messages/count_tokens",
        json.dumps({"model": "fake", "messages": [{"role": "user", "content": [{"type": "image", "source": "abc"}]}]}),
    ),
    (
        "/v1/messages/count_tokens",
        json.dumps({"model": "fake", "messages": [{"role": "user", "content": [{"type": "text", "text": ["x"]}]}]}),
    ),
)


def bad_bodies(target: Target) -> Outcome:
    tables = ("messages", "journal_steps")
    before = sum(number(target, f"SELECT COUNT(*) FROM {table}") for table in tables)
    statuses: Counter[str] = Counter()
    with httpx.Client(base_url=target.base, timeout=60) as http:
        for path, body in BAD_BODIES:
            status = http.post(path, content=body, headers={"content-type": "application/json"}).status_code
            statuses[f"{status // 100}xx"] += 1
    written = sum(number(target, f"SELECT COUNT(*) FROM {table}") for table in tables) - before
    return Outcome(", ".join(f"{n} {kind}" for kind, n in sorted(statuses.items())), f"{written} rows written")


def env_key_echoed(target: Target) -> Outcome:
    with httpx.Client(timeout=60) as client:
        response = client.post(target.base + CHAT, content=short_question(False))
    assert target.store_path is not None
    places = {
        "response": response.content,
        "store": target.store_path.read_bytes(),
        "WAL": target.store_path.with_name(target.store_path.name + "-wal").read_bytes(),
        "log": target.log.read_bytes(),
    }
    found = [place for place, data in places.items() if SECRET.encode() in data]
    return Outcome(
        f"{response.status_code} {response.json().get('error', {}).get('code')}",
        "key in " + ", ".join(found) if found else "key nowhere",
    )


def refused_store(make: Callable[[str], None]) -> Callable[[Target], Outcome]:
    """Serve on a store file made by `make(path)`: how the process ends, and whether the file changed."""

    def drive(target: Target) -> Outcome:
        assert target.store_path is not None
        make(str(target.store_path))
        before = hashlib.sha256(target.store_path.read_bytes()).hexdigest()
        argv = python("-m", "proxy", "serve", "--config", str(target.config), "--port", str(target.port))
        started = time.monotonic()
        try:
            done = subprocess.run(
                argv, cwd=target.root, env=checkout_env(target.root), capture_output=True, text=True, timeout=30
            )
            ended = f"exit {done.returncode} in {time.monotonic() - started:.1f} s"
            lines = done.stderr.strip().splitlines()
            ended += f", {len(lines)} stderr lines" + (", a traceback" if "Traceback" in done.stderr else "")
        except subprocess.TimeoutExpired:
            ended = "still serving after 30 s"
        after = hashlib.sha256(target.store_path.read_bytes()).hexdigest()
        return Outcome(ended, "file changed" if after != before else "file untouched")

    return drive


def foreign_database(path: str) -> None:
    with closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE messages (id INTEGER PRIMARY KEY, note TEXT)")
        db.execute("INSERT INTO messages (note) VALUES ('their data')")
        db.commit()


def corrupt_file(path: str) -> None:
    with open(path, "wb") as file:
        file.write(os.urandom(64 * 1024))


EXCEPTION_TEXT = re.compile(r"Traceback|[A-Z][a-z]+Error|object has no attribute|not subscriptable")


def stream_leaks(target: Target) -> Outcome:
    with httpx.Client(timeout=60) as client:
        response = client.post(target.base + CHAT, content=short_question(True))
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    error = next((json.loads(event)["error"] for event in events if event.startswith('{"error"')), None)
    ended = "[DONE]" if events and events[-1] == "[DONE]" else "no [DONE]"
    code = f"event {error.get('code')}" if error else ended
    leak = "Python exception text" if error and EXCEPTION_TEXT.search(str(error.get("message"))) else NOTHING
    return Outcome(f"{response.status_code} {code}", leak)


JOURNALED_CHARS = 3_900_000
"""Under `max_answer_chars` (4M by default): the whole answer is journaled."""


def journal_size(target: Target) -> Outcome:
    with httpx.Client(timeout=300) as client:
        outcome = send(client, target.base + CHAT, short_question(True), True)
    query = "SELECT SUM(pgsize) FROM dbstat WHERE name IN ('journal_events', 'sqlite_autoindex_journal_events_1')"
    return Outcome(outcome, f"events: {number(target, query) / JOURNALED_CHARS:.2f} bytes a text byte")


ATTACKS = (
    Attack("pg-outage-4s", pg_outage, 29, "1", postgres=True),
    Attack("10MB-error-body", chat(False), 29, "2", answer=("error", str(10 * MB))),
    Attack("20MB-sse-to-non-stream", chat(False), 29, "2", answer=("sse-to-json", str(20 * MB))),
    Attack("110-slow-bodies-cap-100", slow_bodies, 29, "3", sections={"server": {"max_connections": 100}}),
    Attack("8x64MB-headers", huge_headers, 29, "4"),
    Attack(
        "10-unread-8MB-streams",
        unread_streams(10, 60.0),
        29,
        "5",
        answer=("chunks", f"{8 * MB}:4000"),
        sections={"server": {"write_timeout_s": 2}, "limits": {"max_answer_chars": 10 * MB}},
    ),
    Attack("1MB-in-4-char-chunks", chat(True), 29, "6", answer=("chunks", f"{MB}:4")),
    Attack("40MB-non-stream-answer", chat(False), 29, "7", answer=("json-answer", str(40 * MB))),
    Attack("one-40MB-sse-event", chat(True), 29, "7", answer=("one-event", str(40 * MB))),
    Attack("fuzzed-bad-bodies", bad_bodies, 29, "8"),
    Attack(
        "env-key-echoed",
        env_key_echoed,
        29,
        "9",
        answer=("key-echo", SECRET),
        model={"api_key": None},
        env={"OPENAI_API_KEY": SECRET},
    ),
    Attack("foreign-sqlite", refused_store(foreign_database), 29, "10", serve=False),
    Attack("corrupt-store", refused_store(corrupt_file), 29, "11", serve=False),
    Attack("non-json-stream", stream_leaks, 29, "11", answer=("non-json-lines", "2000")),
    Attack("wrong-shape-chunks", stream_leaks, 29, "11", answer=("wrong-shape", "200")),
    Attack("1KB-chunks-journal-size", journal_size, 29, "11", answer=("chunks", f"{JOURNALED_CHARS}:1024")),
    Attack("unauth-slow-body", unauth_slow_body, 29, "11", sections={"auth": {"keys": ["k-bench"]}}),
    Attack("huge-header-on-messages", huge_header_on_messages, 29, "11"),
)
