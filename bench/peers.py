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

Targets (issue 6): our added latency at most 1/3 of LiteLLM proxy's, our throughput at least its. `--json PATH`
writes the three tables (bench/harness/report.py's format).
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
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.harness import servers  # noqa: E402
from bench.harness.clients import Load, load, messages, percentile, round_order, timed  # noqa: E402
from bench.harness.processes import Memory, MemoryWatch, checkout_env, process  # noqa: E402
from bench.harness.report import Report, add_json_option, columns  # noqa: E402

LITELLM_VERSION = "1.106.2"
DEFAULT_VENV = Path("/tmp/litellm-proxy-venv")
TARGETS = ("direct", "floor", "litellm", "ours")
SERVERS = ("floor", "litellm", "ours")
WARMUP = 20
START_TIMEOUT_S = 180.0
PROFILE_STOP_TIMEOUT_S = 300.0
COOL_DOWN_S = 3.0
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
                for target in round_order(TARGETS, round_index):
                    samples[target].append(timed(client, urls[target], payload, stream) * 1000)
            rows.append(_latency_row(size, stream, samples))
            print(f"  latency {size} msgs {'stream' if stream else 'non-stream'} done", file=sys.stderr)
    return rows


def _latency_row(size: int, stream: bool, samples: dict[str, list[float]]) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": size, "kind": "TTFC stream" if stream else "non-stream"}
    for target in TARGETS:
        row[f"{target}_p50"] = statistics.median(samples[target])
        row[f"{target}_p95"] = percentile(samples[target], 95)
    for target in SERVERS:
        row[f"{target}_added_p50"] = row[f"{target}_p50"] - row["direct_p50"]
        row[f"{target}_added_p95"] = row[f"{target}_p95"] - row["direct_p95"]
    for q in ("p50", "p95"):
        row[f"ratio_{q}"] = row[f"ours_added_{q}"] / max(row[f"litellm_added_{q}"], 0.01)
    ok = row["ratio_p50"] <= LATENCY_TARGET and row["ratio_p95"] <= LATENCY_TARGET
    row["verdict"] = "ok" if ok else "MISSED"
    return row


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


def run(args: argparse.Namespace) -> Results:
    started = time.monotonic()
    venv = Path(args.litellm_venv)
    litellm = ensure_litellm_venv(venv)
    fake_port, floor_port, litellm_port, ours_port = (servers.free_port() for _ in range(4))
    upstream = f"{servers.base_url(fake_port)}/v1"
    workdir = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    ours_config = servers.proxy_config(workdir, upstream, "ours")
    (workdir / "litellm.yaml").write_text(json.dumps(litellm_config(upstream), indent=2))  # JSON is YAML
    urls = {
        "direct": f"{upstream}/chat/completions",
        "floor": servers.base_url(floor_port) + servers.CHAT_PATH,
        "litellm": servers.base_url(litellm_port) + servers.CHAT_PATH,
        "ours": servers.base_url(ours_port) + servers.CHAT_PATH,
    }
    ours_argv = servers.proxy_argv(ours_config, ours_port)
    ours_options: dict[str, Any] = {}
    if args.profile_ours:
        # uvicorn re-raises SIGTERM after its shutdown, which would kill pyinstrument before it writes its report;
        # SIGINT ends in a KeyboardInterrupt that pyinstrument catches. Rendering takes a while.
        ours_options = {"stop_timeout": PROFILE_STOP_TIMEOUT_S, "stop_signal": signal.SIGINT}
        report = Path(args.profile_ours).resolve()
        renderer = ["-r", "session"] if report.suffix == ".pyisession" else ["-r", "text", "-p", "flat=true"]
        prefix = ["-m", "pyinstrument", *renderer, "-o", str(report)]
        ours_argv[1:1] = prefix
    litellm_argv = [str(litellm), "--config", str(workdir / "litellm.yaml"), "--host", servers.HOST]
    litellm_argv += ["--port", str(litellm_port), "--telemetry", "False"]
    print(f"logs in {workdir}", file=sys.stderr)
    with ExitStack() as stack:
        stack.enter_context(servers.fake_upstream(fake_port, log=workdir / "fake.log"))
        watch = stack.enter_context(MemoryWatch())
        floor = stack.enter_context(servers.floor(floor_port, upstream, log=workdir / "floor.log"))
        watch.watch("floor", floor.pid)
        peer = stack.enter_context(
            process(
                litellm_argv,
                f"{servers.base_url(litellm_port)}/health/liveliness",
                env=litellm_env(venv),
                log=workdir / "litellm.log",
                start_timeout=START_TIMEOUT_S,
            )
        )
        watch.watch("litellm", peer.pid)
        ours = stack.enter_context(
            process(
                ours_argv,
                f"{servers.base_url(ours_port)}/healthz",
                env=checkout_env(),
                log=workdir / "ours.log",
                start_timeout=START_TIMEOUT_S,
                **ours_options,
            )
        )
        watch.watch("ours", ours.pid)
        print(f"servers up after {time.monotonic() - started:.0f} s", file=sys.stderr)
        with httpx.Client(timeout=60) as client:
            rows = latency_rows(client, urls, args.requests, tuple(int(s) for s in args.sizes.split(",")))
        loads = throughput(urls, args.concurrency, args.seconds)
        watch.sample()  # VmHWM is a high-water mark: one last read before the servers stop
        memory = dict(watch.memory)
    return Results(rows, loads, memory)


def report(results: Results, args: argparse.Namespace, result: Report) -> None:
    latency = result.table(
        "latency",
        "latency added over calling the fake upstream directly (ms)",
        columns(
            ("messages", "msgs"), ("kind",), ("direct_p50", "direct p50", ".2f"), ("direct_p95", "p95", ".2f"),
            ("floor_added_p50", "floor +p50", ".2f"), ("floor_added_p95", "+p95", ".2f"),
            ("litellm_added_p50", "litellm +p50", ".2f"), ("litellm_added_p95", "+p95", ".2f"),
            ("ours_added_p50", "ours +p50", ".2f"), ("ours_added_p95", "+p95", ".2f"),
            ("ratio_p50", "ours/litellm p50", ".2f"), ("ratio_p95", "p95", ".2f"), ("verdict", "target<=0.33"),
        ),
    )  # fmt: skip
    latency.rows = results.latency
    latency.notes.append(
        f"ms; '+' = latency added over calling the fake upstream directly; {args.requests} alternating rounds/row"
    )
    for row in results.latency:
        result.ratios[f"ours/litellm added p50, {row['messages']} msgs {row['kind']}"] = row["ratio_p50"]

    load_table = result.table(
        "throughput",
        f"throughput: concurrency {args.concurrency}, {args.seconds:.0f} s each, non-stream, 10-message history",
        columns(
            ("target",), ("rps", "req/s", ".0f"), ("ok",), ("errors",), ("p50_ms", "p50 ms", ".1f"),
            ("vs_litellm", "vs litellm", ".2f"),
        ),
    )  # fmt: skip
    peer = results.load["litellm"].rps
    for target in TARGETS:
        measured = results.load[target]
        load_table.add(
            target=target,
            rps=measured.rps,
            ok=measured.ok,
            errors=measured.errors,
            p50_ms=measured.p50,
            vs_litellm=measured.rps / peer if peer else None,
        )
    ours_ratio = results.load["ours"].rps / peer if peer else 0.0
    result.ratios["ours/litellm throughput"] = ours_ratio
    load_table.notes.append(
        f"ours/litellm throughput {ours_ratio:.2f} (target >= {THROUGHPUT_TARGET:.0f}: "
        f"{'ok' if ours_ratio >= THROUGHPUT_TARGET else 'MISSED'})"
    )

    memory_table = result.table(
        "memory",
        "peak RSS over the run (MiB; VmHWM per process, summed over the server's process tree)",
        columns(
            ("target",), ("procs",), ("hwm_sum_mib", "sum HWM", ".0f"), ("hwm_max_mib", "largest", ".0f"),
            ("peak_sum_rss_mib", "peak sum RSS", ".0f"), ("vs_litellm", "vs litellm", ".2f"),
        ),
    )  # fmt: skip
    peer_mib = results.memory["litellm"].hwm_sum_mib
    for target in SERVERS:
        memory = results.memory[target]
        memory_table.add(
            target=target,
            procs=len(memory.hwm_kb),
            hwm_sum_mib=memory.hwm_sum_mib,
            hwm_max_mib=memory.hwm_max_mib,
            peak_sum_rss_mib=memory.peak_sum_rss_kb / 1024,
            vs_litellm=memory.hwm_sum_mib / peer_mib if peer_mib else None,
        )
    result.ratios["ours/litellm peak memory"] = results.memory["ours"].hwm_sum_mib / peer_mib if peer_mib else 0.0


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
    add_json_option(parser)
    args = parser.parse_args(argv)
    result = Report.start("peers", args)
    report(run(args), args, result)
    result.publish(args.json)


if __name__ == "__main__":
    main()
