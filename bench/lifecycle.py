"""What deleting costs everyone else: a long session's deletion and a retention sweep over many sessions, each
while a prober asks the serving proxy's `/healthz` every 10 ms (issue 45).

Run by hand: `python bench/lifecycle.py [--sessions 10000] [--messages 4000] [--steps 1000] [--postgres]`. The
store is filled first, in this process, through the proxy's own `History` and `Journal` (no upstream, no HTTP:
the filling is not what is measured): one session of `--messages` messages (a 1,000-turn agent session is about
4,000) whose `--steps` answers are journaled with 20 events each, `--sessions` sessions of four messages idle for
100 days, all opening with the same system prompt (one shared root), and 100 sessions used today. Then a
`context-proxy serve` process (this checkout, `store.retention_days: 30`, an admin key) serves that store, and
one after the other:

    idle          nothing: the prober's reference
    delete        `DELETE /sessions/long`: the long session, its steps and events, in one transaction
    sweep         `POST /admin/retention`: every idle session, 100 a transaction, then the space given back

For each: how long it took, what it deleted, and the prober's answers (from a process of its own, a new
connection each time, as a load balancer asks): their number, the slowest, the 99th percentile, and the worst gap
between two successful answers. The issue's bar: `/healthz` answers within 50 ms throughout. `--json PATH`
writes the table (bench/harness/report.py's format).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import servers
from bench.harness.clients import percentile
from bench.harness.processes import ROOT, checkout_env
from bench.harness.report import Report, add_json_option, columns
from bench.hostile import Prober, postgres_server

ADMIN = "bench-admin-key"
DAY_S = 86_400.0
PROBE_AFTER_S = 1.0
FRESH_SESSIONS = 100
EVENTS_PER_STEP = 20
REQUEST_TIMEOUT_S = 600.0
TABLE_COLUMNS = columns(
    ("operation",),
    ("store",),
    ("seconds", "s", ".2f"),
    ("deleted",),
    ("probes", "probes", ",d"),
    ("max_ms", "slowest ms", ".1f"),
    ("p99_ms", "p99 ms", ".1f"),
    ("gap_ms", "worst gap ms", ".1f"),
    ("failures", "failed", "d"),
)


def words(count: int, seed: int) -> str:
    return " ".join(f"w{(seed * 7919 + i) % 5000}" for i in range(count))


async def fill(target: Path | str, messages: int, steps: int, sessions: int) -> None:
    """The store the proxy will serve, written through the proxy's own parts."""
    from proxy import environment
    from proxy.config.schema import JournalConfig
    from proxy.history.answers import Answers
    from proxy.history.store import History
    from proxy.journal.writer import Journal
    from proxy.store.database import Database

    environment.prepare()
    now = time.time()
    clock = [now - 100 * DAY_S]
    db = await Database.open(target)
    try:
        history = History(db, clock=lambda: clock[0], count=lambda message, encoding: 50)
        journal = Journal(db, Answers(history), JournalConfig(keep_events_s=None), clock=lambda: clock[0])
        system = {"role": "system", "content": "You are a coding agent. " + words(300, 0)}
        for index in range(sessions):
            conversation = [
                system,
                {"role": "user", "content": f"task {index}: " + words(60, index)},
                {"role": "assistant", "content": words(80, index + 1)},
                {"role": "user", "content": words(40, index + 2)},
            ]
            await history.reconcile("open", f"idle-{index}", conversation, "fake", "cl100k_base")
            if index % 1000 == 999:
                print(f"  {index + 1:,} idle sessions", file=sys.stderr)
        clock[0] = now
        for index in range(FRESH_SESSIONS):
            conversation = [system, {"role": "user", "content": f"fresh {index}: " + words(60, -index)}]
            await history.reconcile("open", f"fresh-{index}", conversation, "fake", "cl100k_base")
        long = [system]
        for turn in range((messages - 1) // 2):
            long.append({"role": "user", "content": f"step {turn}: " + words(120, turn)})
            long.append({"role": "assistant", "content": words(150, turn + 3)})
        path = (await history.reconcile("open", "long", long, "fake", "cl100k_base")).path
        every = max(1, len(path) // max(1, steps))
        for position in range(every - 1, len(path), every)[:steps]:
            step = await journal.begin(
                tenant="open",
                session_id="long",
                model="fake",
                fingerprint="",
                idempotency_key=None,
                stream=True,
                parent_message_id=path[position].id,
                encoding="cl100k_base",
            )
            chunk = {"choices": [{"index": 0, "delta": {"content": words(12, position)}, "finish_reason": None}]}
            await journal.append(step, [chunk] * EVENTS_PER_STEP)
            await journal.interrupt(step)  # its events kept, no answer node: the path stays the one stored
    finally:
        await db.close()


def probed(base: str, operation: Any) -> dict[str, Any]:
    prober = Prober(f"{base}/healthz")
    prober.start()
    time.sleep(0.3)
    started = time.perf_counter()
    outcome = operation()
    seconds = time.perf_counter() - started
    time.sleep(PROBE_AFTER_S)
    prober.stop()
    latencies = sorted(prober.latencies) or [float("nan")]
    return {
        "seconds": seconds,
        "deleted": outcome,
        "probes": len(prober.latencies),
        "max_ms": latencies[-1] * 1000,
        "p99_ms": percentile(latencies, 99, method="inclusive") * 1000,
        "gap_ms": prober.worst_gap * 1000,
        "failures": prober.failures,
    }


def admin(client: httpx.Client, method: str, path: str) -> dict[str, Any]:
    response = client.request(method, path, headers={"Authorization": f"Bearer {ADMIN}"})
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def run(args: argparse.Namespace, workdir: Path, table: Any, engine: str) -> None:
    with ExitStack() as stack:
        postgres = stack.enter_context(postgres_server(engine == "postgresql"))
        store: dict[str, Any] = {"url": postgres.url} if postgres is not None else {"path": str(workdir / "store.db")}
        target: Path | str = postgres.url if postgres is not None else workdir / "store.db"
        print(f"{engine}: filling the store", file=sys.stderr)
        started = time.perf_counter()
        asyncio.run(fill(target, args.messages, args.steps, args.sessions))
        print(f"{engine}: filled in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        store["retention_days"] = 30
        config = servers.proxy_config(
            workdir, "http://127.0.0.1:9/v1", "lifecycle", store=store, auth={"admin_keys": [ADMIN]}
        )
        port = servers.free_port()
        base = servers.base_url(port)
        stack.enter_context(
            servers.proxy_process(config, port, root=ROOT, log=workdir / "proxy.log", env=checkout_env(ROOT))
        )
        client = stack.enter_context(httpx.Client(base_url=base, timeout=REQUEST_TIMEOUT_S))

        def idle() -> str:
            time.sleep(2.0)
            return "-"

        def delete() -> str:
            response = client.delete("/sessions/long")
            response.raise_for_status()
            rows = response.json()["rows"]
            return f"{rows.get('messages', 0):,} messages, {rows.get('journal_events', 0):,} events"

        def sweep() -> str:
            swept = admin(client, "POST", "/admin/retention")
            return f"{len(swept['sessions']):,} sessions, {swept['rows'].get('messages', 0):,} messages"

        for name, operation in (("idle", idle), ("delete", delete), ("sweep", sweep)):
            row = table.add(operation=name, store=engine, **probed(base, operation))
            print(json.dumps(row), file=sys.stderr)
        listed = client.get("/sessions", params={"limit": FRESH_SESSIONS}).json()
        left = f"{len(listed['data'])}{'+' if listed['has_more'] else ''}"
        table.notes.append(f"{engine}: {left} sessions left (the {FRESH_SESSIONS} fresh ones expected)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000, help="idle sessions the sweep deletes")
    parser.add_argument("--messages", type=int, default=4_000, help="messages of the long session")
    parser.add_argument("--steps", type=int, default=1_000, help="journaled answers of the long session")
    parser.add_argument("--postgres", action="store_true", help="also on a PostgreSQL store of its own")
    add_json_option(parser)
    args = parser.parse_args(argv)
    result = Report.start("lifecycle", args)
    table = result.table("lifecycle", "deleting beside /healthz", TABLE_COLUMNS)
    for engine in ("sqlite", "postgresql") if args.postgres else ("sqlite",):
        workdir = Path(tempfile.mkdtemp(prefix=f"bench-lifecycle-{engine}-"))
        try:
            run(args, workdir, table, engine)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    result.publish(args.json)


if __name__ == "__main__":
    main()
