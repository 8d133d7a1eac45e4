"""What one hostile request costs everyone else: the attack table of issue 12 item 1.

Run by hand: `python bench/hostile.py [--baseline DIR] [--only NAME,...]`. For every attack, and for every
target (this checkout, then the baseline's), a fresh `context-proxy serve` process with its own store, one model
with a context window no attack reaches (`BIG_WINDOW`) on a fake upstream of its own. While the hostile request
runs (and for a second after it ends), a prober thread GETs `/healthz` every 10 ms; the table gives

    outcome       the hostile request's HTTP status and error code, or for a stream `[DONE]` / the error event's code
    request s     how long the hostile request took, from the first byte sent to the last byte read
    worst / p99   the slowest and the 99th-percentile `/healthz` answer meanwhile, in ms: how long the event loop
                  was held, i.e. how long every other client of the proxy waited
    start / peak  the proxy process's VmHWM (peak resident memory) once it answered `/healthz`, and after the attack

Attacks (bodies built once, before any target runs, so that the client is not what is measured):

    one-30MB-message-no-spaces   one user message of 30,000,000 "x" (under `max_body_bytes`, over a message's limit)
    one-3MB-message-no-spaces    3,000,000 "x": under every limit, so really counted and forwarded
    800k-tiny-messages           800,000 messages {"role":"user","content":"a"} (~24 MB of JSON)
    20k-messages                 20,000 alternating user/assistant messages of ~100 characters of prose
    20MB-streamed-answer         a short streamed request the upstream answers with 20,000,000 characters
    4MB-streamed-answer          the same with 3,900,000 characters (under `max_answer_chars`)

Both targets run with default limits (an older checkout refuses a `limits:` key it does not know). `--baseline DIR`
is another checkout (e.g. `git worktree add /tmp/base 670ace0`); then one line per attack gives the ratios
this/baseline of the worst `/healthz` latency, the peak memory and the request's duration, measured side by side
in one run. A request gets 300 s; `--only` picks attacks, since an unprotected baseline can take minutes on one.
Each row is told on stderr as it is measured; `--json PATH` writes the table (bench/harness/report.py's format).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import servers
from bench.harness.clients import WORDS, percentile
from bench.harness.processes import ROOT, peak_rss_mib
from bench.harness.report import Report, Table, add_json_option, checkout_state, columns

REQUEST_TIMEOUT_S = 300.0
PROBE_TIMEOUT_S = 120.0
PROBE_INTERVAL_S = 0.010
PROBE_AFTER_S = 1.0
"""Probing goes on this long after the hostile request ended: work the proxy does once it has answered."""
SHORT_REPLY_WORDS = 5
"""The fake's answer to the request attacks: short, so that only the request is hostile."""


@dataclass(frozen=True)
class Attack:
    name: str
    build: Callable[[], bytes]
    stream: bool = False
    reply_chars: int | None = None
    """The fake upstream's answer, in characters (None: a short answer)."""


def _body(messages_json: bytes, stream: bool = False) -> bytes:
    head = b'{"model":"fake","stream":' + (b"true" if stream else b"false") + b',"messages":'
    return head + messages_json + b"}"


def _one_message(chars: int) -> Callable[[], bytes]:
    return lambda: _body(json.dumps([{"role": "user", "content": "x" * chars}]).encode())


def _tiny_messages(count: int) -> bytes:
    return _body(b"[" + b",".join([b'{"role":"user","content":"a"}'] * count) + b"]")


def _prose_messages(count: int) -> bytes:
    prose = WORDS * 2
    history = [
        {"role": "user" if (count - 1 - index) % 2 == 0 else "assistant", "content": f"{index} {prose}"[:100]}
        for index in range(count)
    ]
    return _body(json.dumps(history).encode())


def _short_question() -> bytes:
    return _body(json.dumps([{"role": "user", "content": "Tell me everything."}]).encode(), stream=True)


ATTACKS = (
    Attack("one-30MB-message-no-spaces", _one_message(30_000_000)),
    Attack("one-3MB-message-no-spaces", _one_message(3_000_000)),
    Attack("800k-tiny-messages", lambda: _tiny_messages(800_000)),
    Attack("20k-messages", lambda: _prose_messages(20_000)),
    Attack("20MB-streamed-answer", _short_question, stream=True, reply_chars=20_000_000),
    Attack("4MB-streamed-answer", _short_question, stream=True, reply_chars=3_900_000),
)


class Prober:
    """GETs `url` every `PROBE_INTERVAL_S` until stopped, from a process of its own: a thread beside the hostile
    client would measure its own process's GIL as the proxy's latency. Keeps every latency (s), counts failures."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self.failures = 0
        self._stop_event = multiprocessing.Event()
        receiver, self._sender = multiprocessing.Pipe(duplex=False)
        self._receiver = receiver
        self._process = multiprocessing.Process(target=_probe, args=(url, self._stop_event, self._sender), daemon=True)

    def start(self) -> None:
        self._process.start()

    def stop(self) -> None:
        self._stop_event.set()
        self.latencies, self.failures = self._receiver.recv()
        self._process.join()


def _probe(url: str, stop: Any, results: Any) -> None:
    latencies: list[float] = []
    failures = 0
    with httpx.Client(timeout=PROBE_TIMEOUT_S) as client:
        while not stop.is_set():
            started = time.perf_counter()
            try:
                client.get(url).raise_for_status()
            except httpx.HTTPError:
                failures += 1
            latencies.append(time.perf_counter() - started)
            stop.wait(PROBE_INTERVAL_S)
    results.send((latencies, failures))


def _error_code(text: bytes) -> str:
    try:
        error = json.loads(text).get("error")
    except (ValueError, AttributeError):
        return ""
    if not isinstance(error, dict):
        return ""
    return str(error.get("code") or error.get("type") or "")


def _send(client: httpx.Client, url: str, body: bytes, stream: bool) -> str:
    """Send the hostile request; return its outcome: status and error code, or how a stream ended."""
    headers = {"content-type": "application/json"}
    with client.stream("POST", url, content=body, headers=headers) as response:
        if response.status_code >= 400 or not stream:
            text = response.read()
            code = _error_code(text) if response.status_code >= 400 else ""
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
            return f"{response.status_code} event {_error_code(event) or '?'} ({received / 1e6:.1f} MB)"
        done = "[DONE]" if tail.rstrip().endswith(b"data: [DONE]") else "no [DONE]"
        return f"{response.status_code} {done} ({received / 1e6:.1f} MB)"


def measure(attack: Attack, body: bytes, upstream: str, root: Path, workdir: Path, name: str) -> dict[str, Any]:
    """One hostile request against a fresh proxy from the checkout `root`."""
    port = servers.free_port()
    base = servers.base_url(port)
    storedir = workdir / name
    storedir.mkdir()
    config = servers.proxy_config(storedir, upstream, name)
    row: dict[str, Any] = {"attack": attack.name, "target": name}
    with servers.proxy_process(config, port, root=root, log=workdir / f"{name}.log") as child:
        row["start_mib"] = peak_rss_mib(child.pid)
        prober = Prober(f"{base}/healthz")
        with httpx.Client(timeout=REQUEST_TIMEOUT_S) as client:
            prober.start()
            started = time.perf_counter()
            try:
                row["outcome"] = _send(client, f"{base}/v1/chat/completions", body, attack.stream)
            except httpx.TimeoutException:
                row["outcome"] = f"client timeout ({REQUEST_TIMEOUT_S:.0f} s)"
            except httpx.HTTPError as exc:
                row["outcome"] = f"{type(exc).__name__}"
            row["request_s"] = time.perf_counter() - started
            time.sleep(PROBE_AFTER_S)
            prober.stop()
        row["peak_mib"] = peak_rss_mib(child.pid)
        child.kill()  # a proxy still busy with the attack would hold up a graceful shutdown
    shutil.rmtree(storedir, ignore_errors=True)
    latencies = sorted(prober.latencies) or [float("nan")]
    row["worst_ms"] = latencies[-1] * 1000
    row["p99_ms"] = percentile(latencies, 99, method="inclusive") * 1000
    row["probes"] = len(prober.latencies)
    row["probe_failures"] = prober.failures
    return row


def run(attacks: list[Attack], baseline: Path | None, table: Table) -> None:
    """Every attack against every target; each row is told on stderr as soon as it is measured."""
    targets = [("this", ROOT), *([("baseline", baseline)] if baseline is not None else [])]
    workdir = Path(tempfile.mkdtemp(prefix="bench-hostile-"))
    bodies = {attack.name: attack.build() for attack in attacks}
    for attack in attacks:
        fake_port = servers.free_port()
        upstream = f"{servers.base_url(fake_port)}/v1"
        words = SHORT_REPLY_WORDS if attack.reply_chars is None else None
        with servers.fake_upstream(fake_port, reply_words=words, reply_chars=attack.reply_chars):
            for name, root in targets:
                attack_dir = workdir / attack.name
                attack_dir.mkdir(exist_ok=True)
                row = table.add(**measure(attack, bodies[attack.name], upstream, root, attack_dir, name))
                print(
                    f"  {row['attack']} / {name}: {row['outcome']}, {row['request_s']:.2f} s, "
                    f"worst /healthz {row['worst_ms']:.1f} ms",
                    file=sys.stderr,
                    flush=True,
                )
    table.notes.append(f"proxy logs in {workdir}")


ATTACK_COLUMNS = columns(
    ("attack",), ("target",), ("outcome",), ("request_s", "request s", ".2f"), ("worst_ms", "worst ms", ".1f"),
    ("p99_ms", "p99 ms", ".1f"), ("start_mib", "start MiB", ".0f"), ("peak_mib", "peak MiB", ".0f"),
    ("probes",), ("probe_failures", "failed"),
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
            ("attack",), ("worst_ratio", "worst /healthz this/base", ".3f"),
            ("peak_ratio", "peak RSS this/base", ".2f"), ("request_ratio", "request s this/base", ".3f"),
        ),
    )  # fmt: skip
    for this, base in pairs:
        row = against.add(
            attack=this["attack"],
            worst_ratio=this["worst_ms"] / base["worst_ms"],
            peak_ratio=this["peak_mib"] / base["peak_mib"],
            request_ratio=this["request_s"] / base["request_s"],
        )
        result.ratios[f"worst /healthz this/base, {this['attack']}"] = row["worst_ratio"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline", type=Path, help="another checkout whose proxy is attacked beside this one")
    parser.add_argument("--only", help="comma-separated attack names: " + ", ".join(a.name for a in ATTACKS))
    add_json_option(parser)
    args = parser.parse_args(argv)
    attacks = list(ATTACKS)
    if args.only:
        names = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(names) - {a.name for a in ATTACKS})
        if unknown:
            parser.error(f"unknown attacks: {', '.join(unknown)}")
        attacks = [a for a in ATTACKS if a.name in names]
    result = Report.start("hostile", args)
    machine = result.machine
    print(f"CPUs: {machine.cpus} usable ({machine.cpus_total} in the machine); Python {machine.python}")
    baseline = args.baseline.resolve() if args.baseline else None
    if baseline is not None:
        result.parameters["baseline_commit"] = checkout_state(baseline)[0]
    table = result.table("attacks", "hostile requests", ATTACK_COLUMNS)
    run(attacks, baseline, table)
    ratios(table, result)
    result.notes.append(f"{len(table.rows)} hostile requests")
    print()
    result.publish(args.json)


if __name__ == "__main__":
    main()
