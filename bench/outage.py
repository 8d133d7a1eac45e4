"""A PostgreSQL outage under steady traffic: issue 29, item 1.

Run by hand: `python bench/outage.py [--baseline DIR] [--outage 5] [--clients 4]`. For every target (this checkout,
then the baseline's), a fresh PostgreSQL server (the distribution's, on 127.0.0.1, as the tests start it), a fresh
`context-proxy serve` process on it and a fake upstream. Client threads send chat requests back to back (each a
new short conversation) and a prober GETs `/healthz` every 20 ms, through three phases: before (3 s), the outage
(`--outage` seconds: `pg_ctl stop -m fast`, then `start`), after (10 s). The table gives, per target and phase,
the requests and how they ended (status counts), the slowest request, the `/healthz` statuses, and after the
outage how long until the first request succeeded again.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import servers
from bench.harness.processes import ROOT
from bench.harness.report import Report, Table, add_json_option, checkout_state, columns
from tests.support.postgres_server import PostgresServer

BEFORE_S = 3.0
AFTER_S = 10.0
REQUEST_TIMEOUT_S = 30.0
PROBE_INTERVAL_S = 0.02


@dataclass
class Phase:
    name: str
    statuses: Counter[str] = field(default_factory=Counter)
    slowest_s: float = 0.0
    health: Counter[str] = field(default_factory=Counter)
    first_success_s: float | None = None
    """After the outage: from the server's restart to the first request that succeeded."""


class Traffic:
    """Requests and probes, each counted in the phase that was current when it started."""

    def __init__(self, url: str, clients: int) -> None:
        self.url = url
        self.clients = clients
        self.phase = Phase("before")
        self.phases = [self.phase]
        self.restarted_at: float | None = None
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def enter(self, name: str) -> None:
        with self.lock:
            self.phase = Phase(name)
            self.phases.append(self.phase)

    def _client(self, number: int) -> None:
        with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S) as http:
            turn = 0
            while not self.stop.is_set():
                turn += 1
                phase = self.phase
                body = {"model": "fake", "messages": [{"role": "user", "content": f"client {number} turn {turn}"}]}
                started = time.monotonic()
                try:
                    status = str(http.post("/v1/chat/completions", json=body).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                took = time.monotonic() - started
                with self.lock:
                    phase.statuses[status] += 1
                    phase.slowest_s = max(phase.slowest_s, took)
                    if status == "200" and phase.name == "after" and phase.first_success_s is None:
                        assert self.restarted_at is not None
                        phase.first_success_s = time.monotonic() - self.restarted_at

    def _probe(self) -> None:
        with httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S) as http:
            while not self.stop.is_set():
                phase = self.phase
                try:
                    status = str(http.get("/healthz").status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                with self.lock:
                    phase.health[status] += 1
                time.sleep(PROBE_INTERVAL_S)

    def start(self) -> list[threading.Thread]:
        threads = [threading.Thread(target=self._client, args=(n,), daemon=True) for n in range(self.clients)]
        threads.append(threading.Thread(target=self._probe, daemon=True))
        for thread in threads:
            thread.start()
        return threads


def measure(name: str, root: Path, outage_s: float, clients: int, workdir: Path, table: Table) -> None:
    upstream_port, proxy_port = servers.free_port(), servers.free_port()
    with PostgresServer() as postgres, servers.fake_upstream(upstream_port, reply_words=5):
        upstream = f"{servers.base_url(upstream_port)}/v1"
        config = servers.proxy_config(workdir, upstream, name, store={"url": postgres.url})
        with servers.proxy_process(config, proxy_port, root=root, log=workdir / f"{name}.log"):
            traffic = Traffic(servers.base_url(proxy_port), clients)
            threads = traffic.start()
            time.sleep(BEFORE_S)
            traffic.enter("outage")
            postgres.pause()
            time.sleep(outage_s)
            postgres.resume()
            traffic.restarted_at = time.monotonic()
            traffic.enter("after")
            time.sleep(AFTER_S)
            traffic.stop.set()
            for thread in threads:
                thread.join(REQUEST_TIMEOUT_S)
    for phase in traffic.phases:
        table.add(
            target=name,
            phase=phase.name,
            requests=sum(phase.statuses.values()),
            outcomes=", ".join(f"{status}×{count}" for status, count in sorted(phase.statuses.items())),
            slowest=phase.slowest_s,
            health=", ".join(f"{status}×{count}" for status, count in sorted(phase.health.items())),
            recovered=phase.first_success_s,
        )
    print(f"{name}: measured", file=sys.stderr)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--baseline", type=Path, help="another checkout whose proxy is measured the same way")
    parser.add_argument("--outage", type=float, default=5.0, help="seconds PostgreSQL is down")
    parser.add_argument("--clients", type=int, default=4, help="client threads sending requests back to back")
    add_json_option(parser)
    args = parser.parse_args(argv)
    result = Report.start("outage", args)
    if args.baseline is not None:
        result.parameters["baseline_commit"] = checkout_state(args.baseline)[0]
    table = result.table(
        "outage",
        f"A {args.outage:g} s PostgreSQL outage under {args.clients} clients' steady traffic",
        columns(
            ("target",), ("phase",), ("requests",), ("outcomes", "request outcomes"), ("slowest", "slowest s", ".2f"),
            ("health", "/healthz"), ("recovered", "first success after restart s", ".2f"),
        ),
    )  # fmt: skip
    targets = [("this", ROOT), *([("baseline", args.baseline)] if args.baseline is not None else [])]
    with tempfile.TemporaryDirectory(prefix="bench-outage-") as tmp:
        for name, root in targets:
            measure(name, root, args.outage, args.clients, Path(tmp), table)
    result.publish(args.json)


if __name__ == "__main__":
    main()
