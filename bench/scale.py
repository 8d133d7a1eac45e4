"""Throughput and added latency of the store backends: SQLite in one process, PostgreSQL with one and two replicas.

Run by hand: `python bench/scale.py [--seconds 8] [--concurrency 32] [--only sqlite|pg1|pg2]`. Every server is a
process of its own on 127.0.0.1, all started before any measurement and all behind one fake upstream
(`bench/harness/servers.py`, echo answers):

    direct        the fake upstream itself: the reference for added latency, and the machine's ceiling
    sqlite        `python -m proxy serve` with `store.path` (the default backend)
    pg1           the same with `store.url` on a throwaway PostgreSQL (`tests/support/postgres_server.py`)
    pg2           two such processes on one database (not pg1's); the client sends requests round-robin to
                  both, so consecutive turns of a conversation usually land on different replicas

The load is the one clients make: each client keeps a conversation and re-sends its whole history, without
`X-Session-Id` (the proxy derives the session). A conversation opens with `--history - 2 * (--turns - 1)`
messages of ~200 tokens (system, then user and assistant alternating, ending with a user message); each turn
appends the answer and a new user message, and after `--turns` turns (the last one `--history` messages long)
the client opens a new conversation. So every request makes the proxy reconcile a history and store new
messages and an answer.

1. Added latency, at concurrency 1: rounds of one request to each target, in alternating order so that all
   share the machine's noise (as in bench/overhead.py); added p50 = p50 through a cell minus p50 of `direct`.
   This counts everything the proxy adds to the client's wait, the writes after the answer included, which
   the proxy's own `context_proxy_added_seconds` histogram does not (it stops at the upstream call, and its
   5/10/25 ms buckets are too coarse for a p50).
2. Requests/s, at `--concurrency`: each target alone (the others idle) for a warm-up and then `--seconds`,
   one shared `httpx.AsyncClient`; completed requests over the elapsed time. Errors must be 0. The p50 under
   load is printed too: at a fixed concurrency it mostly mirrors requests/s (queueing), hence no "added" there.

The machine's CPUs are shared by the client, the fake upstream, the proxies and PostgreSQL: on a small
machine requests/s says how much CPU each request costs, not how far replicas scale on separate hosts.
`--json PATH` writes the table (bench/harness/report.py's format).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import math
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import servers  # noqa: E402
from bench.harness.clients import FAILURES_KEPT, MESSAGE_BODY, SYSTEM_PROMPT, Load, load_client, round_order  # noqa: E402
from bench.harness.report import Report, add_json_option, columns  # noqa: E402
from tests.support.postgres_server import PostgresServer  # noqa: E402

CONCURRENCY = 32
SECONDS = 8.0
HISTORY = 10
TURNS = 3
LATENCY_ROUNDS = 100
LATENCY_WARMUP_ROUNDS = 10
WARMUP_S = 2.0
COOL_DOWN_S = 2.0
POOL_SIZE = 10
JSON_HEADERS = {"content-type": "application/json"}
T = TypeVar("T")
INTERRUPTED = threading.Event()
"""Set by Ctrl-C (or SIGTERM) while requests run: the clients stop after their request in flight."""


@dataclass(frozen=True)
class Cell:
    name: str
    replicas: int
    database: str | None
    """PostgreSQL's database of the cell; None: SQLite."""


CELLS = (
    Cell("sqlite", 1, None),
    Cell("pg1", 1, "scale_pg1"),
    Cell("pg2", 2, "scale_pg2"),
)
DIRECT = "direct"


# --- the clients ---------------------------------------------------------------------------------------------


class Chat:
    """One client's conversation: the history it re-sends, growing by an answer and a user turn per request."""

    _ids = itertools.count()

    def __init__(self, owner: str, history: int, turns: int) -> None:
        self.owner = owner
        self.history = history
        self.turns = turns
        self.messages: list[dict[str, Any]] = []
        self.turn = 0
        self.restart()

    def restart(self) -> None:
        """Open a new conversation, distinct from every other one from its first user message on."""
        tag = f"{self.owner} chat {next(self._ids)}"
        opening = self.history - 2 * (self.turns - 1)
        self.messages = [{"role": "system", "content": SYSTEM_PROMPT}]
        for index in range(opening - 1):
            role = "user" if index % 2 == 0 else "assistant"
            self.messages.append({"role": role, "content": f"{tag} message {index} {MESSAGE_BODY}"})
        self.tag = tag
        self.turn = 0

    def body(self) -> bytes:
        return json.dumps({"model": "fake", "messages": self.messages, "stream": False}).encode()

    def answered(self, content: str) -> None:
        self.turn += 1
        if self.turn >= self.turns:
            self.restart()
            return
        self.messages.append({"role": "assistant", "content": content})
        self.messages.append({"role": "user", "content": f"{self.tag} turn {self.turn} {MESSAGE_BODY}"})


@dataclass
class Target:
    """Where requests go: one URL, or a cell's replicas taken round-robin."""

    name: str
    urls: list[str]
    _turn: Iterator[int] = field(default_factory=itertools.count, init=False, repr=False)

    def url(self) -> str:
        return self.urls[next(self._turn) % len(self.urls)]


async def turn(client: httpx.AsyncClient, target: Target, chat: Chat, load: Load) -> None:
    """One request of `chat` to `target`; a failed one ends the conversation (its history is now unknown)."""
    started = time.perf_counter()
    try:
        response = await client.post(target.url(), content=chat.body(), headers=JSON_HEADERS)
        elapsed_ms = (time.perf_counter() - started) * 1000
        if response.status_code != 200:
            load.fail(f"{response.status_code}: {response.text[:300]}")
            chat.restart()
            return
        content = response.json()["choices"][0]["message"].get("content") or ""
    except (httpx.HTTPError, ValueError, LookupError, TypeError) as exc:
        load.fail(f"{type(exc).__name__}: {exc}")
        chat.restart()
        return
    chat.answered(content)
    load.ok += 1
    load.latencies_ms.append(elapsed_ms)


async def latencies(targets: list[Target], rounds: int, history: int, turns: int) -> dict[str, Load]:
    """Concurrency 1: each round sends one request to every target, the order shifting and reversing per round."""
    chats = {target.name: Chat(f"{target.name} sequential", history, turns) for target in targets}
    loads = {target.name: Load() for target in targets}
    async with load_client(1) as client:
        for round_index in range(LATENCY_WARMUP_ROUNDS + rounds):
            if INTERRUPTED.is_set():
                break
            for target in round_order(targets, round_index):
                load = loads[target.name] if round_index >= LATENCY_WARMUP_ROUNDS else Load()
                await turn(client, target, chats[target.name], load)
    return loads


async def throughput(target: Target, concurrency: int, seconds: float, history: int, turns: int) -> Load:
    """`concurrency` clients, each with its own conversations, back to back: a warm-up, then `seconds` measured."""
    chats = [Chat(f"{target.name} load {index}", history, turns) for index in range(concurrency)]
    async with load_client(concurrency) as client:

        async def run(duration: float, load: Load) -> None:
            deadline = time.perf_counter() + duration

            async def worker(chat: Chat) -> None:
                while time.perf_counter() < deadline and not INTERRUPTED.is_set():
                    await turn(client, target, chat, load)

            started = time.perf_counter()
            await asyncio.gather(*(worker(chat) for chat in chats))
            load.seconds = time.perf_counter() - started

        await run(WARMUP_S, Load())
        await asyncio.sleep(COOL_DOWN_S / 2)
        measured = Load()
        await run(seconds, measured)
    return measured


# --- the servers ---------------------------------------------------------------------------------------------


def start_cell(
    stack: ExitStack, cell: Cell, workdir: Path, upstream: str, postgres: PostgresServer | None
) -> Target | str:
    """Start the cell's proxies (one after another: the first runs the migrations); a reason if it cannot run."""
    if cell.database is not None:
        if postgres is None:
            return "no PostgreSQL"
        database_url = postgres.url.rsplit("/", 1)[0] + f"/{cell.database}"
        store = {"url": database_url, "pool_size": POOL_SIZE}
    else:
        store = {"path": str(workdir / f"{cell.name}.db")}
    urls: list[str] = []
    try:
        with ExitStack() as replicas:
            for replica in range(cell.replicas):
                name = f"{cell.name}-{replica}"
                config = servers.proxy_config(workdir, upstream, name, store=store)
                port = servers.free_port()
                replicas.enter_context(servers.proxy_process(config, port, log=workdir / f"{name}.log"))
                urls.append(servers.base_url(port) + servers.CHAT_PATH)
            stack.enter_context(replicas.pop_all())
    except RuntimeError as exc:
        return _last_lines(str(exc).split("did not start:", 1)[-1])
    return Target(cell.name, urls)


def start_postgres(stack: ExitStack, cells: list[Cell]) -> PostgresServer | str:
    try:
        postgres = stack.enter_context(PostgresServer())
        for cell in cells:
            if cell.database is not None:
                postgres.psql(f"CREATE DATABASE {cell.database}")
    except RuntimeError as exc:
        return _last_lines(str(exc))
    return postgres


def _last_lines(text: str, count: int = 3) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return " | ".join(lines[-count:])


# --- the run -------------------------------------------------------------------------------------------------


@dataclass
class Results:
    processes: dict[str, int]
    sequential: dict[str, Load]
    loads: dict[str, Load]
    not_started: dict[str, str]


def run(args: argparse.Namespace) -> Results:
    started = time.monotonic()
    cells = [cell for cell in CELLS if args.only in (None, cell.name)]
    workdir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    not_started: dict[str, str] = {}
    with ExitStack() as stack:
        if args.keep_logs:
            print(f"logs in {workdir}", file=sys.stderr)
        else:
            stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        fake_port = servers.free_port()
        upstream = f"{servers.base_url(fake_port)}/v1"
        stack.enter_context(servers.fake_upstream(fake_port, log=workdir / "fake.log"))
        targets = [Target(DIRECT, [f"{upstream}/chat/completions"])]
        postgres: PostgresServer | None = None
        if any(cell.database is not None for cell in cells):
            found = start_postgres(stack, cells)
            if isinstance(found, str):
                not_started.update({cell.name: found for cell in cells if cell.database is not None})
            else:
                postgres = found
        for cell in cells:
            if cell.name in not_started:
                continue
            target = start_cell(stack, cell, workdir, upstream, postgres)
            if isinstance(target, str):
                not_started[cell.name] = target
                print(f"  {cell.name} did not start: {target}", file=sys.stderr)
            else:
                targets.append(target)
        print(f"servers up after {time.monotonic() - started:.0f} s", file=sys.stderr)

        sequential = _until_done(latencies(targets, args.rounds, args.history, args.turns))
        print("  latency at concurrency 1 done", file=sys.stderr)
        loads: dict[str, Load] = {}
        for target in targets:
            time.sleep(COOL_DOWN_S)
            loads[target.name] = _until_done(
                throughput(target, args.concurrency, args.seconds, args.history, args.turns)
            )
            print(f"  {target.name}: {loads[target.name].rps:.0f} req/s", file=sys.stderr)
    processes = {cell.name: cell.replicas for cell in cells}
    return Results(processes, sequential, loads, not_started)


def _ratio(value: float, reference: float | None) -> float | None:
    if reference is None or reference <= 0 or math.isnan(value):
        return None
    return value / reference


def report(results: Results, args: argparse.Namespace, result: Report) -> None:
    opening = args.history - 2 * (args.turns - 1)
    table = result.table(
        "cells",
        f"concurrency {args.concurrency}, {args.seconds:g} s per cell, non-stream, conversations of "
        f"{opening}..{args.history} messages ({args.turns} turns each, ~200 tokens a message)",
        columns(
            ("cell",), ("procs",), ("rps", "req/s", ".0f"), ("rps_vs_sqlite", "vs sqlite", ".2f"), ("errors",),
            ("p50_at_load_ms", "p50@load", ".1f"), ("added_p50_ms", "added p50@1", ".2f"),
            ("added_vs_sqlite", "vs sqlite", ".2f"), ("p50_ms", "p50@1", ".2f"),
        ),
    )  # fmt: skip
    direct_p50 = results.sequential[DIRECT].p50 if DIRECT in results.sequential else float("nan")
    added = {name: load.p50 - direct_p50 for name, load in results.sequential.items() if name != DIRECT}
    reference_rps = results.loads["sqlite"].rps if "sqlite" in results.loads else None
    reference_added = added.get("sqlite")
    for name, measured in results.loads.items():
        sequential = results.sequential[name]
        table.add(
            cell=name,
            procs=results.processes.get(name),
            rps=measured.rps,
            rps_vs_sqlite=_ratio(measured.rps, reference_rps),
            errors=measured.errors + sequential.errors,
            p50_at_load_ms=measured.p50,
            added_p50_ms=added.get(name),
            added_vs_sqlite=_ratio(added[name], reference_added) if name in added else None,
            p50_ms=sequential.p50,
        )
        if name in added and name != "sqlite":
            result.ratios[f"{name}/sqlite req/s"] = _ratio(measured.rps, reference_rps) or float("nan")
    for name, reason in results.not_started.items():
        table.add(cell=name, procs=results.processes.get(name))
        table.notes.append(f"{name} did not start: {reason}")
    table.notes.append(
        "ms; p50@load: client-observed p50 at the load's concurrency; added p50@1: p50 at concurrency 1 minus "
        "direct's, requests alternating between targets"
    )
    for name in results.loads:
        failures = results.sequential[name].failures + results.loads[name].failures
        table.notes.extend(f"  {name} error: {failure}" for failure in failures[:FAILURES_KEPT])


def _until_done(clients: Coroutine[Any, Any, T]) -> T:
    result = asyncio.run(clients)
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt
    return result


def _interrupt(signum: int, frame: FrameType | None) -> None:
    """Outside the clients' event loop, interrupt; inside it, tell the clients to stop (see `main`)."""
    INTERRUPTED.set()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise KeyboardInterrupt from None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--seconds", type=float, default=SECONDS, help="measured duration of each throughput run")
    parser.add_argument("--concurrency", type=int, default=CONCURRENCY)
    parser.add_argument("--only", choices=[cell.name for cell in CELLS], help="one cell (beside direct)")
    parser.add_argument("--rounds", type=int, default=LATENCY_ROUNDS, help="alternating rounds at concurrency 1")
    parser.add_argument("--history", type=int, default=HISTORY, help="messages of a conversation's last request")
    parser.add_argument("--turns", type=int, default=TURNS, help="requests per conversation")
    parser.add_argument("--keep-logs", action="store_true", help="keep the temp dir with configs and server logs")
    add_json_option(parser)
    args = parser.parse_args(argv)
    if args.history % 2 or args.turns < 1 or args.history - 2 * (args.turns - 1) < 2:
        parser.error("--history must be even and leave at least 2 messages to open a conversation of --turns turns")
    # Our own handler, not Python's default: asyncio.run would turn that one into a cancellation, which httpx
    # can swallow mid-request, and the run would go on against stopped servers.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    result = Report.start("scale", args)
    try:
        results = run(args)
    except KeyboardInterrupt:
        print("interrupted; servers stopped", file=sys.stderr)
        raise SystemExit(130) from None
    report(results, args, result)
    result.publish(args.json)


if __name__ == "__main__":
    main()
