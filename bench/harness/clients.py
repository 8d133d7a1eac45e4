"""What benchmark clients send and how they time it: histories, one timed call, a streamed read, a load.

Targets are measured side by side: each round sends one request to every target, in an order that shifts and
reverses from round to round (`round_order`), so that all of them share the machine's noise.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import httpx

WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
MESSAGE_BODY = WORDS * 12
"""About 200 tokens: the size of every message in a benchmark history."""
SYSTEM_PROMPT = "You are helpful. " + MESSAGE_BODY
FAILURES_KEPT = 5
LOAD_TIMEOUT_S = 60.0
T = TypeVar("T")


def messages(count: int) -> list[dict[str, Any]]:
    """A history of `count` messages of ~200 tokens each, ending with a user turn."""
    history: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM_PROMPT}]
    for index in range(count - 1):
        history.append(
            {"role": "user" if index % 2 == 0 else "assistant", "content": f"message {index} {MESSAGE_BODY}"}
        )
    history[-1]["role"] = "user"
    return history


def round_order(targets: Sequence[T], round_index: int) -> list[T]:
    """The targets in the order of round `round_index`: shifted by one per round, reversed every other round."""
    shift = round_index % len(targets)
    order = [*targets[shift:], *targets[:shift]]
    return order if round_index % 2 == 0 else order[::-1]


def percentile(values: Sequence[float], q: int, method: Literal["exclusive", "inclusive"] = "exclusive") -> float:
    """The `q`th percentile (1..99) of at least two values; the value itself for one; NaN for none."""
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method=method)[q - 1]


def timed(client: httpx.Client, url: str, payload: dict[str, Any], stream: bool) -> float:
    """Seconds for a non-stream call, or to the first streamed byte."""
    started = time.perf_counter()
    if not stream:
        response = client.post(url, json=payload)
        response.raise_for_status()
        return time.perf_counter() - started
    with client.stream("POST", url, json=payload) as response:
        response.raise_for_status()
        first = None
        for _chunk in response.iter_raw():
            if first is None:
                first = time.perf_counter() - started
        return first if first is not None else time.perf_counter() - started


@dataclass(frozen=True)
class StreamRead:
    first_s: float
    """Time to the first chunk."""
    total_s: float
    chunks: int
    """SSE events, `[DONE]` not counted."""
    bytes: int


def stream_once(client: httpx.Client, url: str, body: dict[str, Any]) -> StreamRead:
    """One streamed answer read to its end."""
    started = time.perf_counter()
    first: float | None = None
    received = events = 0
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        for data in response.iter_bytes():
            if first is None:
                first = time.perf_counter() - started
            received += len(data)
            events += data.count(b"data: ")
    total = time.perf_counter() - started
    return StreamRead(first if first is not None else total, total, events - 1, received)


@dataclass
class Load:
    """What a load run saw: completed and failed requests, the run's duration, every completed latency."""

    ok: int = 0
    errors: int = 0
    seconds: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    """The first `FAILURES_KEPT` failures, as text."""

    @property
    def rps(self) -> float:
        return self.ok / self.seconds if self.seconds else 0.0

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")

    def fail(self, reason: str) -> None:
        self.errors += 1
        if len(self.failures) < FAILURES_KEPT:
            self.failures.append(reason)


def load_client(concurrency: int) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    return httpx.AsyncClient(timeout=LOAD_TIMEOUT_S, limits=limits)


async def load(url: str, body: bytes, concurrency: int, seconds: float) -> Load:
    """`concurrency` workers posting `body` back to back until a shared deadline; worker i is session
    `bench-load-i` (`X-Session-Id`), re-sending the same history."""
    result = Load()
    async with load_client(concurrency) as client:
        deadline = time.perf_counter() + seconds

        async def worker(index: int) -> None:
            headers = {"content-type": "application/json", "x-session-id": f"bench-load-{index}"}
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    response = await client.post(url, content=body, headers=headers)
                except httpx.HTTPError as exc:
                    result.fail(f"{type(exc).__name__}: {exc}")
                    continue
                if response.status_code == 200:
                    result.ok += 1
                    result.latencies_ms.append((time.perf_counter() - started) * 1000)
                else:
                    result.fail(f"{response.status_code}: {response.text[:300]}")

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        result.seconds = time.perf_counter() - started
    return result
