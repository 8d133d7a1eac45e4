"""Side by side with LiteLLM's own proxy: added latency, throughput and memory against the same fake upstream.

Run by hand: `.venv/bin/python bench/peers.py [--requests 200] [--seconds 20]`. LiteLLM's proxy is not a
dependency of this project: the script installs `litellm[proxy]` (the version we pin) into a venv of its own
(`--litellm-venv`, default /tmp/litellm-proxy-venv), once, and reuses it afterwards. Five processes, all on
127.0.0.1:

    direct        the fake upstream (tests/support/fake_upstream.py), behind every other target
    floor         a bare httpx pass-through: the least a Python proxy adds
    litellm       `litellm --config ...` (no database, no master key, no retries)
    ours          `python -m proxy serve` (history, budget, compaction check, journal, LiteLLM)

1. Latency: for 10- and 500-message histories (~200 tokens each), non-stream total time and stream time to
   the first chunk, requests alternating between targets in every round; p50/p95 added over `direct`.
2. Throughput: each target alone, 32 concurrent clients for `--seconds`, non-stream, 10-message history; each
   client is its own conversation (`X-Session-Id`) re-sending the same history.
3. Memory: peak RSS (VmHWM from /proc) of each server's process tree over the whole run.

Targets (issue 6): our added latency at most 1/3 of LiteLLM proxy's, our throughput at least its.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import HARNESS, HOST, free_port, messages, process, proxy_config, timed  # noqa: E402

LITELLM_VERSION = "1.106.2"
DEFAULT_VENV = Path("/tmp/litellm-proxy-venv")
TARGETS = ("direct", "floor", "litellm", "ours")
SERVERS = ("floor", "litellm", "ours")
WARMUP = 20
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 15.0
PROFILE_STOP_TIMEOUT_S = 300.0
COOL_DOWN_S = 3.0
RSS_POLL_S = 0.25
LATENCY_TARGET = 1 / 3
THROUGHPUT_TARGET = 1.0


# --- LiteLLM's proxy, in a venv of its own -------------------------------------------------------------------


def ensure_litellm_venv(venv: Path) -> Path:
    """The `litellm` executable of a venv holding `litellm[proxy]==LITELLM_VERSION`; installs it when missing."""
    python, litellm = venv / "bin" / "python", venv / "bin" / "litellm"
    probe = "import importlib.metadata as m; print(m.version('litellm'))"
    if litellm.exists():
        found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=False)
        if found.returncode == 0 and found.stdout.strip() == LITELLM_VERSION:
            return litellm
    print(f"installing litellm[proxy]=={LITELLM_VERSION} into {venv} (once; a few minutes)", file=sys.stderr)
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            f"litellm[proxy]=={LITELLM_VERSION}",
        ],
        check=True,
    )
    return litellm


def litellm_tokenizers(venv: Path) -> Path:
    """LiteLLM's bundled tiktoken files in that venv (found without importing litellm: ~3 s)."""
    probe = "import importlib.util; print(importlib.util.find_spec('litellm').origin)"
    origin = subprocess.run([str(venv / "bin" / "python"), "-c", probe], capture_output=True, text=True, check=True)
    return Path(origin.stdout.strip()).parent / "litellm_core_utils" / "tokenizers"


def litellm_config(upstream: str) -> dict[str, Any]:
    return {
        "model_list": [
            {
                "model_name": "fake",
                "litellm_params": {"model": "openai/fake-model", "api_base": upstream, "api_key": "sk-bench"},
            }
        ],
        "litellm_settings": {"num_retries": 0, "request_timeout": 60, "telemetry": False},
        "general_settings": {},
    }


def litellm_env(venv: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "LITELLM_MASTER_KEY", "PYTHONPATH")}
    env.update(
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        TIKTOKEN_CACHE_DIR=str(litellm_tokenizers(venv)),
        CUSTOM_TIKTOKEN_CACHE_DIR=str(litellm_tokenizers(venv)),
        LITELLM_LOG="ERROR",
        HF_HUB_OFFLINE="1",
        LITELLM_TELEMETRY="False",
        # 1.106 refuses to start without a master key; ours runs without auth.keys here too.
        LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY="true",
        VIRTUAL_ENV=str(venv),
    )
    return env


# --- processes and their memory ------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found.extend(int(c) for c in (task / "children").read_text().split())
        except OSError:
            continue
    return found


def process_tree(pid: int) -> list[int]:
    tree, pending = [], [pid]
    while pending:
        current = pending.pop()
        tree.append(current)
        pending.extend(_children(current))
    return tree


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


@dataclass
class Memory:
    """Per server: the peak VmHWM of every process seen in its tree, and the peak of the tree's summed VmRSS."""

    hwm_kb: dict[int, int] = field(default_factory=dict)
    peak_sum_rss_kb: int = 0

    def sample(self, root: int) -> None:
        tree = process_tree(root)
        total = 0
        for pid in tree:
            total += _status_kb(pid, "VmRSS")
            self.hwm_kb[pid] = max(self.hwm_kb.get(pid, 0), _status_kb(pid, "VmHWM"))
        self.peak_sum_rss_kb = max(self.peak_sum_rss_kb, total)

    @property
    def hwm_sum_mib(self) -> float:
        return sum(self.hwm_kb.values()) / 1024

    @property
    def hwm_max_mib(self) -> float:
        return max(self.hwm_kb.values(), default=0) / 1024


class MemoryWatch:
    """A thread that samples each server's process tree until stopped (and once more at the end)."""

    def __init__(self) -> None:
        self.roots: dict[str, int] = {}
        self.memory: dict[str, Memory] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def watch(self, name: str, pid: int) -> None:
        self.memory[name] = Memory()
        self.roots[name] = pid

    def sample(self) -> None:
        for name, pid in list(self.roots.items()):
            self.memory[name].sample(pid)

    def _run(self) -> None:
        while not self._stop.wait(RSS_POLL_S):
            self.sample()

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def server(
    argv: list[str],
    health: str,
    env: dict[str, str],
    log: Path,
    stop_timeout: float = STOP_TIMEOUT_S,
    stop_signal: signal.Signals = signal.SIGTERM,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start argv, wait for `health` to answer, yield the child; on exit stop it and any process it spawned."""
    with log.open("wb") as sink:
        child = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT)
        spawned: set[int] = set()
        try:
            _wait_healthy(child, health, log, sink)
            spawned.update(process_tree(child.pid)[1:])
            yield child
        finally:
            spawned.update(process_tree(child.pid)[1:])
            child.send_signal(stop_signal)
            try:
                child.wait(stop_timeout)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait(STOP_TIMEOUT_S)
            for pid in spawned:  # a worker its parent did not take down
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def _wait_healthy(child: subprocess.Popen[bytes], health: str, log: Path, sink: IO[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            httpx.get(health, timeout=2)
            return
        except httpx.TransportError:
            if time.monotonic() > deadline or child.poll() is not None:
                sink.flush()
                tail = log.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"{child.args!r} did not start:\n{tail}") from None
            time.sleep(0.2)


# --- measurements --------------------------------------------------------------------------------------------


def latency_rows(
    client: httpx.Client, urls: dict[str, str], requests: int, sizes: tuple[int, ...]
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for size in sizes:
        history = messages(size)
        for stream in (False, True):
            payload = {"model": "fake", "messages": history, "stream": stream}
            for target in TARGETS:  # warm-up: lazy imports, the stored history, connection pools
                for _ in range(WARMUP):
                    timed(client, urls[target], payload, stream)
            samples: dict[str, list[float]] = {target: [] for target in TARGETS}
            for round_index in range(requests):
                shift = round_index % len(TARGETS)
                order = TARGETS[shift:] + TARGETS[:shift]
                for target in order if round_index % 2 == 0 else order[::-1]:
                    samples[target].append(timed(client, urls[target], payload, stream) * 1000)
            rows.append(_latency_row(size, stream, samples))
            print(f"  latency {size} msgs {'stream' if stream else 'non-stream'} done", file=sys.stderr)
    return rows


def _latency_row(size: int, stream: bool, samples: dict[str, list[float]]) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": size, "kind": "TTFC stream" if stream else "non-stream"}
    for target in TARGETS:
        row[f"{target}_p50"] = statistics.median(samples[target])
        row[f"{target}_p95"] = statistics.quantiles(samples[target], n=100)[94]
    for target in SERVERS:
        row[f"{target}_added_p50"] = row[f"{target}_p50"] - row["direct_p50"]
        row[f"{target}_added_p95"] = row[f"{target}_p95"] - row["direct_p95"]
    for q in ("p50", "p95"):
        row[f"ratio_{q}"] = row[f"ours_added_{q}"] / max(row[f"litellm_added_{q}"], 0.01)
    return row


@dataclass
class Load:
    ok: int
    errors: int
    seconds: float
    latencies_ms: list[float]

    @property
    def rps(self) -> float:
        return self.ok / self.seconds


async def load(url: str, body: bytes, concurrency: int, seconds: float) -> Load:
    """`concurrency` workers posting `body` back to back until a shared deadline; worker i is session bench-i."""
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    latencies: list[float] = []
    counts = {"ok": 0, "errors": 0}
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        deadline = time.perf_counter() + seconds

        async def worker(index: int) -> None:
            headers = {"content-type": "application/json", "x-session-id": f"bench-load-{index}"}
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    response = await client.post(url, content=body, headers=headers)
                except httpx.HTTPError:
                    counts["errors"] += 1
                    continue
                if response.status_code == 200:
                    counts["ok"] += 1
                    latencies.append((time.perf_counter() - started) * 1000)
                else:
                    counts["errors"] += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - started
    return Load(counts["ok"], counts["errors"], elapsed, latencies)


def throughput(urls: dict[str, str], concurrency: int, seconds: float) -> dict[str, Load]:
    body = json.dumps({"model": "fake", "messages": messages(10), "stream": False}).encode()
    results: dict[str, Load] = {}
    for target in TARGETS:
        asyncio.run(load(urls[target], body, concurrency, min(2.0, seconds)))  # warm the sessions and pools
        time.sleep(COOL_DOWN_S)
        results[target] = asyncio.run(load(urls[target], body, concurrency, seconds))
        print(f"  throughput {target}: {results[target].rps:.0f} req/s", file=sys.stderr)
        time.sleep(COOL_DOWN_S)
    return results


# --- the run -------------------------------------------------------------------------------------------------


@dataclass
class Results:
    latency: list[dict[str, Any]]
    load: dict[str, Load]
    memory: dict[str, Memory]
    seconds: float


def run(args: argparse.Namespace) -> Results:
    started = time.monotonic()
    venv = Path(args.litellm_venv)
    litellm = ensure_litellm_venv(venv)
    fake_port, floor_port, litellm_port, ours_port = (free_port() for _ in range(4))
    upstream = f"http://{HOST}:{fake_port}/v1"
    workdir = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    ours_config = proxy_config(workdir, upstream, "ours")
    (workdir / "litellm.yaml").write_text(json.dumps(litellm_config(upstream), indent=2))  # JSON is YAML
    urls = {
        "direct": f"{upstream}/chat/completions",
        "floor": f"http://{HOST}:{floor_port}/v1/chat/completions",
        "litellm": f"http://{HOST}:{litellm_port}/v1/chat/completions",
        "ours": f"http://{HOST}:{ours_port}/v1/chat/completions",
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ours_argv = [sys.executable, "-m", "proxy", "serve", "--config", str(ours_config)]
    ours_argv += ["--port", str(ours_port), "--log-level", "warning"]
    stop_timeout, stop_signal = STOP_TIMEOUT_S, signal.SIGTERM
    if args.profile_ours:
        # uvicorn re-raises SIGTERM after its shutdown, which would kill pyinstrument before it writes its report;
        # SIGINT ends in a KeyboardInterrupt that pyinstrument catches. Rendering takes a while.
        stop_timeout, stop_signal = PROFILE_STOP_TIMEOUT_S, signal.SIGINT
        report = Path(args.profile_ours).resolve()
        renderer = ["-r", "session"] if report.suffix == ".pyisession" else ["-r", "text", "-p", "flat=true"]
        prefix = ["-m", "pyinstrument", *renderer, "-o", str(report)]
        ours_argv[1:1] = prefix
    litellm_argv = [str(litellm), "--config", str(workdir / "litellm.yaml"), "--host", HOST]
    litellm_argv += ["--port", str(litellm_port), "--telemetry", "False"]
    print(f"logs in {workdir}", file=sys.stderr)
    with ExitStack() as stack:
        stack.enter_context(process([str(HARNESS), "--serve-fake", str(fake_port)], f"{upstream}/models"))
        watch = stack.enter_context(MemoryWatch())
        floor = stack.enter_context(
            server(
                [sys.executable, str(HARNESS), "--serve-floor", str(floor_port), upstream],
                f"http://{HOST}:{floor_port}/",
                env,
                workdir / "floor.log",
            )
        )
        watch.watch("floor", floor.pid)
        peer = stack.enter_context(
            server(
                litellm_argv,
                f"http://{HOST}:{litellm_port}/health/liveliness",
                litellm_env(venv),
                workdir / "litellm.log",
            )
        )
        watch.watch("litellm", peer.pid)
        ours = stack.enter_context(
            server(
                ours_argv, f"http://{HOST}:{ours_port}/healthz", env, workdir / "ours.log", stop_timeout, stop_signal
            )
        )
        watch.watch("ours", ours.pid)
        print(f"servers up after {time.monotonic() - started:.0f} s", file=sys.stderr)
        with httpx.Client(timeout=60) as client:
            rows = latency_rows(client, urls, args.requests, tuple(int(s) for s in args.sizes.split(",")))
        loads = throughput(urls, args.concurrency, args.seconds)
        watch.sample()  # VmHWM is a high-water mark: one last read before the servers stop
        memory = dict(watch.memory)
    return Results(rows, loads, memory, time.monotonic() - started)


def print_report(results: Results, args: argparse.Namespace) -> None:
    header = (
        f"{'msgs':>5} {'kind':<12} {'direct p50/p95':>16} {'floor +p50/+p95':>17} {'litellm +p50/+p95':>19} "
        f"{'ours +p50/+p95':>17} {'ours/litellm p50/p95':>21}  target<=0.33"
    )
    print(header)
    print("-" * len(header))
    for r in results.latency:
        verdict = "ok" if r["ratio_p50"] <= LATENCY_TARGET and r["ratio_p95"] <= LATENCY_TARGET else "MISSED"
        print(
            f"{r['messages']:>5} {r['kind']:<12} {r['direct_p50']:>7.2f}/{r['direct_p95']:<8.2f} "
            f"{r['floor_added_p50']:>8.2f}/{r['floor_added_p95']:<8.2f} "
            f"{r['litellm_added_p50']:>9.2f}/{r['litellm_added_p95']:<9.2f} "
            f"{r['ours_added_p50']:>8.2f}/{r['ours_added_p95']:<8.2f} "
            f"{r['ratio_p50']:>10.2f}/{r['ratio_p95']:<10.2f}  {verdict}"
        )
    print(f"\nms; '+' = latency added over calling the fake upstream directly; {args.requests} alternating rounds/row")

    print(f"\nthroughput: concurrency {args.concurrency}, {args.seconds:.0f} s each, non-stream, 10-message history")
    header = f"{'target':<8} {'req/s':>8} {'ok':>7} {'errors':>6} {'p50 ms':>8} {'vs litellm':>10}"
    print(header)
    print("-" * len(header))
    peer = results.load["litellm"].rps
    for target in TARGETS:
        result = results.load[target]
        p50 = statistics.median(result.latencies_ms) if result.latencies_ms else float("nan")
        ratio = result.rps / peer if peer else float("nan")
        print(f"{target:<8} {result.rps:>8.0f} {result.ok:>7} {result.errors:>6} {p50:>8.1f} {ratio:>10.2f}")
    ours_ratio = results.load["ours"].rps / peer if peer else 0.0
    print(
        f"ours/litellm throughput {ours_ratio:.2f} (target >= {THROUGHPUT_TARGET:.0f}: "
        f"{'ok' if ours_ratio >= THROUGHPUT_TARGET else 'MISSED'})"
    )

    print("\npeak RSS over the run (MiB; VmHWM per process, summed over the server's process tree)")
    header = f"{'target':<8} {'procs':>5} {'sum HWM':>8} {'largest':>8} {'peak sum RSS':>12} {'vs litellm':>10}"
    print(header)
    print("-" * len(header))
    peer_mib = results.memory["litellm"].hwm_sum_mib
    for target in SERVERS:
        memory = results.memory[target]
        ratio = memory.hwm_sum_mib / peer_mib if peer_mib else float("nan")
        print(
            f"{target:<8} {len(memory.hwm_kb):>5} {memory.hwm_sum_mib:>8.0f} {memory.hwm_max_mib:>8.0f} "
            f"{memory.peak_sum_rss_kb / 1024:>12.0f} {ratio:>10.2f}"
        )
    print(f"\n(total {results.seconds:.0f} s)")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, default=200, help="alternating rounds per latency row")
    parser.add_argument("--sizes", default="10,500", help="history lengths, comma-separated")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=20.0, help="duration of each throughput run")
    parser.add_argument("--litellm-venv", default=str(DEFAULT_VENV), help="venv for litellm[proxy] (made if missing)")
    parser.add_argument(
        "--profile-ours",
        help="run our proxy under pyinstrument, writing a flat text report here (or a session if *.pyisession)",
    )
    args = parser.parse_args(argv)
    print_report(run(args), args)


if __name__ == "__main__":
    main()
