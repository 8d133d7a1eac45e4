"""What one hostile client costs everyone else: the attack tables of issues 12 (item 1), 29 and 41.

Run by hand: `python bench/hostile.py [--baseline DIR] [--issue 12|29|41] [--only NAME,...]`. For every attack, and for
every target (this checkout, then the baseline's), a fresh `context-proxy serve` process with its own store (SQLite,
or a PostgreSQL server of its own), one model with a context window no attack reaches (`BIG_WINDOW`) on a fake
upstream of its own (answering as the attack needs: `bench.harness.servers.ANSWERS`). While the attack runs (and
for a second after it ends), a prober process GETs `/healthz` every 10 ms, on a new connection each time as a load
balancer does; the table gives

    outcome       what the attacker got: the HTTP status and error code, for a stream `[DONE]` or the error
                  event's code, or the attack's own summary (`bench/hostile_attacks.py`)
    lost/leaked   what the attack cost the data: answers not journaled, bytes stored of a refused answer, a key
                  found in the response, store, WAL or log, a foreign file changed ("-": nothing to check)
    attack s      how long the attack took
    worst gap     the longest time without a successful `/healthz` (failures count as waiting), in ms
    p99 ms        the 99th-percentile `/healthz` answer
    start / peak  the proxy process's VmHWM (peak resident memory) after one ordinary request (LiteLLM's first
                  call imports for ~0.5 s: `warm_up`), and after the attack

The attacks of issue 12 (`REQUEST_ATTACKS`) are single hostile requests; issue 29's (`hostile_attacks.ATTACKS`,
items 1-11) and issue 41's (`ROUND_THREE`: a module per concern) are scaled down to run in seconds, their sizes in
their names and in their modules' docstrings.
Bodies are built once, before any target runs, so that the client is not what is measured.

Both targets run with default limits except where an attack sets one the baseline also knows. `--baseline DIR` is
another checkout (e.g. `git worktree add /tmp/base d80e928`); then a second table gives the ratios this/baseline
of the worst `/healthz` gap and the peak memory, measured side by side in one run. A request gets 300 s; `--only`
picks attacks. Each row is told on stderr as it is measured; `--json PATH` writes the tables
(bench/harness/report.py's format).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import servers
from bench.harness.clients import WORDS, percentile
from bench.harness.processes import ROOT, checkout_env, peak_rss_mib
from bench.harness.report import Report, Table, add_json_option, checkout_state, columns

REQUEST_TIMEOUT_S = 300.0
PROBE_TIMEOUT_S = 120.0
PROBE_INTERVAL_S = 0.010
PROBE_START_TIMEOUT_S = 60.0
PROBE_AFTER_S = 1.0
"""Probing goes on this long after the attack ended: work the proxy does once it has answered."""
SHORT_REPLY_WORDS = 5
"""The fake's answer to the request attacks: short, so that only the request is hostile."""
NOTHING = "-"


@dataclass(frozen=True)
class Target:
    """One proxy under attack: where it listens, where it keeps its store and log."""

    name: str
    root: Path
    base: str
    port: int
    workdir: Path
    config: Path
    log: Path
    store_path: Path | None
    """The SQLite file (None on PostgreSQL)."""
    postgres: Any = None
    """The `PostgresServer` of the store, when the attack runs on PostgreSQL."""
    pid: int = 0


@dataclass(frozen=True)
class Outcome:
    outcome: str
    lost: str = NOTHING


@dataclass(frozen=True)
class Attack:
    name: str
    drive: Callable[[Target], Outcome]
    issue: int = 12
    item: str = "1"
    answer: tuple[str, str] | None = None
    """The fake upstream's hostile answer (`servers.ANSWERS`); None: short answers (`reply_chars` if set)."""
    reply_chars: int | None = None
    sections: Mapping[str, Any] = field(default_factory=dict)
    """Config sections beside `store` and `models`."""
    model: Mapping[str, Any] = field(default_factory=dict)
    """Changes to the one model entry (a key of None removes it)."""
    env: Mapping[str, str] = field(default_factory=dict)
    postgres: bool = False
    upstream: Callable[[], AbstractContextManager[str]] | None = None
    """An upstream of the attack's own in place of the fake (one the fake cannot play): a context manager yielding
    its API's URL, entered for each target."""
    serve: bool = True
    """False: the attack starts the proxy itself (its store is the attack), and no prober runs."""


# --- the request attacks of issue 12 ------------------------------------------------------------------------------


def _body(messages_json: bytes, stream: bool = False) -> bytes:
    head = b'{"model":"fake","stream":' + (b"true" if stream else b"false") + b',"messages":'
    return head + messages_json + b"}"


def _one_message(chars: int) -> bytes:
    return _body(json.dumps([{"role": "user", "content": "x" * chars}]).encode())


def _tiny_messages(count: int) -> bytes:
    return _body(b"[" + b",".join([b'{"role":"user","content":"a"}'] * count) + b"]")


def _prose_messages(count: int) -> bytes:
    prose = WORDS * 2
    history = [
        {"role": "user" if (count - 1 - index) % 2 == 0 else "assistant", "content": f"{index} {prose}"[:100]}
        for index in range(count)
    ]
    return _body(json.dumps(history).encode())


def short_question(stream: bool = True) -> bytes:
    """The question the fake answers with the attack's hostile answer (`servers.HOSTILE_QUESTION`)."""
    return _body(json.dumps([{"role": "user", "content": servers.HOSTILE_QUESTION}]).encode(), stream=stream)


def warm_up(base: str) -> None:
    """One ordinary request: LiteLLM's first call in a process imports for ~0.5 s, which is not the attack's."""
    body = {"model": "fake", "messages": [{"role": "user", "content": "warm up"}]}
    with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
        client.post(f"{base}/v1/chat/completions", json=body)


def request(build: Callable[[], bytes], stream: bool = False) -> Callable[[Target], Outcome]:
    """An attack that is one request, its body built once (`prepare`) before any target runs."""
    body = functools.cache(build)

    def drive(target: Target) -> Outcome:
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            return Outcome(send(client, f"{target.base}/v1/chat/completions", body(), stream))

    drive.prepare = body  # type: ignore[attr-defined]
    return drive


REQUEST_ATTACKS = (
    Attack("one-30MB-message-no-spaces", request(lambda: _one_message(30_000_000))),
    Attack("one-3MB-message-no-spaces", request(lambda: _one_message(3_000_000))),
    Attack("800k-tiny-messages", request(lambda: _tiny_messages(800_000))),
    Attack("20k-messages", request(lambda: _prose_messages(20_000))),
    Attack("20MB-streamed-answer", request(short_question, stream=True), reply_chars=20_000_000),
    Attack("4MB-streamed-answer", request(short_question, stream=True), reply_chars=3_900_000),
)


# --- measuring ----------------------------------------------------------------------------------------------------


class Prober:
    """GETs `url` every `PROBE_INTERVAL_S` until stopped, from a process of its own (a thread beside the attacker
    would measure its own process's GIL as the proxy's latency), each time on a new connection. Keeps every
    latency (s), the failures, and the longest time between two successes (or from the start / to the end).

    The process is a fresh interpreter (spawned, not forked): a fork inherits the bench's heap (a store filled in
    this process), and its first full garbage collection then walks all of it, ~80 ms on a quiet machine, which
    the probe waiting on it counted as the proxy's (`bench/lifecycle.py`: one probe of each row, the ~89th).
    `start` returns once the first answer came, so what follows is probed from its beginning."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures = 0
        self.worst_gap = 0.0
        context = multiprocessing.get_context("spawn")
        self._stop_event = context.Event()
        self._ready = context.Event()
        receiver, self._sender = context.Pipe(duplex=False)
        self._receiver = receiver
        self._process = context.Process(
            target=_probe, args=(url, self._stop_event, self._ready, self._sender), daemon=True
        )

    def start(self) -> None:
        self._process.start()
        if not self._ready.wait(PROBE_START_TIMEOUT_S):
            self._process.kill()
            raise RuntimeError(f"the prober of {self.url} did not start within {PROBE_START_TIMEOUT_S:.0f} s")

    def stop(self) -> None:
        self._stop_event.set()
        self.latencies, self.failures, self.worst_gap = self._receiver.recv()
        self._process.join()


def _probe(url: str, stop: Any, ready: Any, results: Any) -> None:
    latencies: list[float] = []
    failures = 0
    worst_gap = 0.0
    limits = httpx.Limits(max_keepalive_connections=0)
    with httpx.Client(timeout=PROBE_TIMEOUT_S, limits=limits) as client:
        last_ok = time.perf_counter()  # the client made (its TLS context: a fresh interpreter's first takes a while)
        while not stop.is_set():
            started = time.perf_counter()
            try:
                client.get(url).raise_for_status()
                ok = True
            except httpx.HTTPError:
                failures += 1
                ok = False
            now = time.perf_counter()
            latencies.append(now - started)
            if ok:
                worst_gap = max(worst_gap, now - last_ok)
                last_ok = now
            ready.set()
            stop.wait(PROBE_INTERVAL_S)
        worst_gap = max(worst_gap, time.perf_counter() - last_ok)
    results.send((latencies, failures, worst_gap))


def error_code(text: bytes) -> str:
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(error, dict):
        return ""
    return str(error.get("code") or error.get("type") or "")


def send(client: httpx.Client, url: str, body: bytes, stream: bool) -> str:
    """Send a request; return its outcome: status and error code, or how a stream ended."""
    headers = {"content-type": "application/json"}
    with client.stream("POST", url, content=body, headers=headers) as response:
        if response.status_code >= 400 or not stream:
            text = response.read()
            code = error_code(text) if response.status_code >= 400 else ""
            return f"{response.status_code} {code}".strip()
        tail, error, received = b"", b"", 0
        for chunk in response.iter_raw():
            received += len(chunk)
            window = tail + chunk
            if not error and (at := window.find(b'data: {"error"')) >= 0:
                error = window[at:]
            elif error and b"\n\n" not in error:
                error += chunk
            tail = window[-64:]
        if error:
            event = error[len(b"data: ") :].split(b"\n\n", 1)[0]
            return f"{response.status_code} event {error_code(event) or '?'} ({received / 1e6:.1f} MB)"
        done = "[DONE]" if tail.rstrip().endswith(b"data: [DONE]") else "no [DONE]"
        return f"{response.status_code} {done} ({received / 1e6:.1f} MB)"


def write_config(attack: Attack, storedir: Path, upstream: str, name: str, postgres: Any) -> Path:
    store = {"url": postgres.url} if postgres is not None else {"path": str(storedir / f"{name}.db")}
    path = servers.proxy_config(storedir, upstream, name, **dict(attack.sections), store=store)
    config = json.loads(path.read_text())
    model = config["models"][0]
    for key, value in attack.model.items():
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value
    path.write_text(json.dumps(config))
    return path


@contextmanager
def postgres_server(wanted: bool) -> Iterator[Any]:
    if not wanted:
        yield None
        return
    from tests.support.postgres_server import PostgresServer

    with PostgresServer() as server:
        yield server


def measure(attack: Attack, upstream: str, root: Path, workdir: Path, name: str) -> dict[str, Any]:
    """One attack against a fresh proxy from the checkout `root`."""
    port = servers.free_port()
    base = servers.base_url(port)
    storedir = workdir / name
    storedir.mkdir()
    row: dict[str, Any] = {"attack": attack.name, "item": f"{attack.issue}.{attack.item}", "target": name}
    with ExitStack() as stack:
        postgres = stack.enter_context(postgres_server(attack.postgres))
        if attack.upstream is not None:
            upstream = stack.enter_context(attack.upstream())
        config = write_config(attack, storedir, upstream, name, postgres)
        log = workdir / f"{name}.log"
        store_path = None if postgres is not None else storedir / f"{name}.db"
        target = Target(name, root, base, port, storedir, config, log, store_path, postgres)
        if not attack.serve:
            started = time.perf_counter()
            outcome = attack.drive(target)
            row["attack_s"] = time.perf_counter() - started
            row |= {"outcome": outcome.outcome, "lost": outcome.lost}
            return row
        env = {**checkout_env(root), **attack.env}
        child = stack.enter_context(servers.proxy_process(config, port, root=root, log=log, env=env))
        target = Target(name, root, base, port, storedir, config, log, store_path, postgres, child.pid)
        warm_up(base)
        row["start_mib"] = peak_rss_mib(child.pid)
        prober = Prober(f"{base}/healthz")
        prober.start()
        started = time.perf_counter()
        try:
            outcome = attack.drive(target)
        except httpx.TimeoutException:
            outcome = Outcome(f"client timeout ({REQUEST_TIMEOUT_S:.0f} s)")
        except httpx.HTTPError as exc:
            outcome = Outcome(type(exc).__name__)
        row["attack_s"] = time.perf_counter() - started
        row |= {"outcome": outcome.outcome, "lost": outcome.lost}
        time.sleep(PROBE_AFTER_S)
        prober.stop()
        row["peak_mib"] = peak_rss_mib(child.pid)
        child.kill()  # a proxy still busy with the attack would hold up a graceful shutdown
    shutil.rmtree(storedir, ignore_errors=True)
    latencies = sorted(prober.latencies) or [float("nan")]
    row["gap_ms"] = prober.worst_gap * 1000
    row["p99_ms"] = percentile(latencies, 99, method="inclusive") * 1000
    row["probes"] = len(prober.latencies)
    row["probe_failures"] = prober.failures
    return row


def run(attacks: list[Attack], baseline: Path | None, table: Table) -> None:
    """Every attack against every target; each row is told on stderr as soon as it is measured."""
    targets = [("this", ROOT), *([("baseline", baseline)] if baseline is not None else [])]
    workdir = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    for attack in attacks:
        prepare = getattr(attack.drive, "prepare", None)
        if prepare is not None:
            prepare()
    for attack in attacks:
        fake_port = servers.free_port()
        upstream = f"{servers.base_url(fake_port)}/v1"
        words = SHORT_REPLY_WORDS if attack.reply_chars is None and attack.answer is None else None
        with servers.fake_upstream(fake_port, reply_words=words, reply_chars=attack.reply_chars, answer=attack.answer):
            for name, root in targets:
                attack_dir = workdir / attack.name
                attack_dir.mkdir(exist_ok=True)
                row = table.add(**measure(attack, upstream, root, attack_dir, name))
                gap = row.get("gap_ms")
                print(
                    f"  {row['attack']} / {name}: {row['outcome']}; lost/leaked {row['lost']}; "
                    f"{row['attack_s']:.2f} s" + (f", worst /healthz gap {gap:.0f} ms" if gap is not None else ""),
                    file=sys.stderr,
                    flush=True,
                )
    table.notes.append(f"proxy logs in {workdir}")


ATTACK_COLUMNS = columns(
    ("item",), ("attack",), ("target",), ("outcome",), ("lost", "lost/leaked"), ("attack_s", "attack s", ".2f"),
    ("gap_ms", "worst gap ms", ",.0f"), ("p99_ms", "p99 ms", ".1f"), ("start_mib", "start MiB", ".0f"),
    ("peak_mib", "peak MiB", ".0f"), ("probes",), ("probe_failures", "failed"),
)  # fmt: skip


def ratios(table: Table, result: Report) -> None:
    """this/baseline per attack, when a baseline ran: a table of its own, and the report's ratios."""
    pairs = [
        (this, base)
        for this in table.rows
        for base in table.rows
        if this["target"] == "this" and base["target"] == "baseline" and this["attack"] == base["attack"]
    ]
    if not pairs:
        return
    against = result.table(
        "baseline",
        "this checkout over the baseline's",
        columns(
            ("attack",), ("gap_ratio", "worst /healthz gap this/base", ".3f"),
            ("peak_ratio", "peak RSS this/base", ".2f"),
        ),
    )  # fmt: skip
    for this, base in pairs:
        if "gap_ms" not in this or "gap_ms" not in base:
            continue
        row = against.add(
            attack=this["attack"],
            gap_ratio=this["gap_ms"] / base["gap_ms"],
            peak_ratio=this["peak_mib"] / base["peak_mib"],
        )
        result.ratios[f"worst /healthz gap this/base, {this['attack']}"] = row["gap_ratio"]


ROUND_THREE = (
    "bench.hostile_tenants",  # item 1
    "bench.hostile_sockets",  # items 2-4
    "bench.hostile_bodies",  # items 5 and 8
    "bench.hostile_compaction",  # item 6
    "bench.hostile_outage",  # items 7 and 9
)
"""The modules of issue 41's attacks, in the order of its items."""


def all_attacks() -> list[Attack]:
    from bench.hostile_attacks import ATTACKS

    round_three = [attack for name in ROUND_THREE for attack in importlib.import_module(name).ATTACKS]
    return [*REQUEST_ATTACKS, *ATTACKS, *round_three]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout whose proxy is attacked beside this one")
    parser.add_argument("--issue", type=int, choices=(12, 29, 41), help="only the attacks of this issue")
    parser.add_argument("--only", help="comma-separated attack names (see --list)")
    parser.add_argument("--list", action="store_true", help="print the attacks' names and stop")
    add_json_option(parser)
    args = parser.parse_args(argv)
    attacks = [attack for attack in all_attacks() if args.issue in (None, attack.issue)]
    if args.list:
        print("\n".join(f"{attack.issue}.{attack.item}  {attack.name}" for attack in attacks))
        return
    if args.only:
        names = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(names) - {a.name for a in attacks})
        if unknown:
            parser.error(f"unknown attacks: {', '.join(unknown)}")
        attacks = [a for a in attacks if a.name in names]
    result = Report.start("hostile", args)
    machine = result.machine
    print(f"CPUs: {machine.cpus} usable ({machine.cpus_total} in the machine); Python {machine.python}")
    baseline = args.baseline.resolve() if args.baseline else None
    if baseline is not None:
        result.parameters["baseline_commit"] = checkout_state(baseline)[0]
    table = result.table("attacks", "hostile clients", ATTACK_COLUMNS)
    run(attacks, baseline, table)
    ratios(table, result)
    result.notes.append(f"{len(table.rows)} attacks measured")
    print()
    result.publish(args.json)


if __name__ == "__main__":
    main()
