"""The attacks of issue 41, items 7 and 9, for `bench/hostile.py`: what the store's and the upstream's failures
leave behind. Sizes, against the issue's run:

    7   pg-outage-mid-stream         three streams and a non-stream call under way when PostgreSQL stops for 5 s
                                     (issue: three streams): what each client is told, and whether the steps are
                                     still `open` 30 s after the store is back (issue: for as long as the process
                                     runs, over 100 s)
    9   upstream-resets-reused-20    20 calls, one after the other, to an upstream that resets each kept-alive
                                     connection as the next request arrives on it (issue: 1 in 24,000 under load,
                                     where an idle connection was closed just as it was reused)

Each needs an upstream the bench's fake cannot play (a stream slow enough to be cut by the outage; a raw server
that resets a connection at the moment of reuse: `tests.support.resetting_upstream`): `Attack.upstream`. While
PostgreSQL is down, `/healthz` answers 503 by design: the worst gap of item 7 is the outage's length and more.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx

from bench.harness import servers
from bench.hostile import NOTHING, Attack, Outcome, Target

CHAT = "/v1/chat/completions"
STREAMS = 3
OUTAGE_S = 5.0
SETTLE_S = 30.0
"""How long after the store is back the attack waits for the steps to leave `open`."""
NOTHING_SAVED = "nothing of this request was saved"
NO_STREAM = "no stream"
RESET_CALLS = 20
UPSTREAM_STOP_S = 10.0


@contextmanager
def slow_streams() -> Iterator[str]:
    """An upstream whose streams take ~20 s (the warm-up's answer is short), and whose non-stream answer comes
    after 2 s: both are under way when the store goes."""
    from tests.support.fake_upstream import FakeUpstream, Reply

    long, short = Reply(content="word " * 400, finish_reason="stop"), Reply(content="ok", finish_reason="stop")
    with FakeUpstream(context_window=servers.BIG_WINDOW, chunk_delay_s=0.05, keep_requests=False) as fake:
        fake.responder = lambda body: long if body.get("stream") else short
        fake.delay = lambda body: 2.0 if body["messages"][-1]["content"] == NO_STREAM else 0.0
        yield fake.url


@contextmanager
def resetting() -> Iterator[str]:
    """The resetting upstream in a process of its own: the prober's process, forked from this one, would hold a
    copy of each of its sockets, and a reset socket whose copy lives on is never reset."""
    stop = multiprocessing.Event()
    receiver, sender = multiprocessing.Pipe(duplex=False)
    server = multiprocessing.Process(target=_serve_resetting, args=(sender, stop), daemon=True)
    server.start()
    try:
        yield receiver.recv()
    finally:
        stop.set()
        server.join(UPSTREAM_STOP_S)


def _serve_resetting(sender: Any, stop: Any) -> None:
    from tests.support.resetting_upstream import ResettingUpstream

    with ResettingUpstream("reset-on-reuse") as upstream:
        sender.send(upstream.url)
        stop.wait()


# --- 7: steps cut off by a store outage ---------------------------------------------------------------------------


def told(answer: Any) -> str:
    """What a client was told: an error's code, and whether it says nothing was saved or names its step."""
    error = answer.get("error") if isinstance(answer, dict) else None
    if not isinstance(error, dict):
        return str(answer)
    message = str(error.get("message"))
    said = "'nothing saved'" if NOTHING_SAVED in message else "names its step" if "journal step" in message else ""
    return f"{error.get('code')} {said}".strip()


def stream(base: str, number: int, started: threading.Event) -> str:
    body = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": f"stream {number}"}]}
    last: Any = None
    with httpx.stream("POST", base + CHAT, json=body, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: "):
                last = line[6:] if line == "data: [DONE]" else json.loads(line[6:])
                started.set()
    return f"event {told(last)}"


def single(base: str) -> str:
    body = {"model": "fake", "messages": [{"role": "user", "content": NO_STREAM}]}
    response = httpx.post(base + CHAT, json=body, timeout=120)
    return f"{response.status_code} {told(response.json())}"


def step_count(target: Target, where: str = "") -> int:
    return int(target.postgres.psql(f"SELECT COUNT(*) FROM journal_steps {where}"))


def pg_outage_mid_stream(target: Target) -> Outcome:
    with ThreadPoolExecutor(STREAMS + 1) as pool:
        started = [threading.Event() for _ in range(STREAMS)]
        streams = [pool.submit(stream, target.base, n, started[n]) for n in range(STREAMS)]
        call = pool.submit(single, target.base)
        deadline = time.monotonic() + 30
        while not all(event.is_set() for event in started) or step_count(target) < STREAMS + 2:  # and the warm-up
            if time.monotonic() > deadline:
                return Outcome("the requests did not start")
            time.sleep(0.05)
        target.postgres.pause()
        time.sleep(OUTAGE_S)
        target.postgres.resume()
        back = time.monotonic()
        answers = Counter([*(s.result(timeout=120) for s in streams), call.result(timeout=120)])
    settled: float | None = None
    while time.monotonic() - back < SETTLE_S:
        if step_count(target, "WHERE status = 'open'") == 0:
            settled = time.monotonic() - back
            break
        time.sleep(0.1)
    still_open = step_count(target, "WHERE status = 'open'")
    clients = ", ".join(f"{answer} ×{count}" for answer, count in answers.most_common())
    ended = f"all steps ended {settled:.1f} s after restart" if settled is not None else f"{still_open} steps open"
    lies = sum(count for answer, count in answers.items() if "'nothing saved'" in answer)
    lost = [f"{still_open} steps open {SETTLE_S:.0f} s after restart"] if still_open else []
    lost += [f"{lies} clients told nothing was saved"] if lies else []
    return Outcome(f"{clients}; {ended}", "; ".join(lost) or NOTHING)


# --- 9: a pooled connection the upstream reset as it was reused -------------------------------------------------


def upstream_resets_reused(target: Target) -> Outcome:
    body = {"model": "fake", "messages": [{"role": "user", "content": "ping"}]}
    statuses: Counter[str] = Counter()
    with httpx.Client(base_url=target.base, timeout=60) as client:
        for _ in range(RESET_CALLS):
            response = client.post(CHAT, json=body)
            code = response.json().get("error", {}).get("code") if response.status_code != 200 else None
            statuses[f"{response.status_code}" + (f" {code}" if code else "")] += 1
    failed = RESET_CALLS - statuses["200"]
    outcome = ", ".join(f"{status} ×{count}" for status, count in statuses.most_common())
    return Outcome(outcome, f"{failed} requests failed that the upstream never answered" if failed else NOTHING)


ATTACKS = (
    Attack("pg-outage-mid-stream", pg_outage_mid_stream, 41, "7", postgres=True, upstream=slow_streams),
    Attack(f"upstream-resets-reused-{RESET_CALLS}", upstream_resets_reused, 41, "9", upstream=resetting),
)
