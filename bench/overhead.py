"""What the proxy adds to a request's latency, against the floor of a bare Python pass-through.

Run by hand: `python bench/overhead.py [--requests 300]`. Three targets in separate processes, one fake
upstream behind them all, requests alternating between targets in every round so that they share the
machine's noise:

    direct        the fake upstream itself
    floor         a bare httpx pass-through (uvicorn + one httpx.AsyncClient): the least a Python proxy adds
    proxy         context-proxy serve (history, budget, compaction check, journal, LiteLLM)

For 10- and 500-message histories (~200 tokens each) it prints p50/p95 total latency of non-stream calls and
time to the first streamed byte, the latency added over `direct`, and the ratio of the proxy's added latency
to the floor's.

`--baseline DIR` adds a fourth target, `context-proxy serve` run from another checkout (e.g. a `git worktree`
of the previous commit), and the ratio of this checkout's added latency to the baseline's: a regression check
measured side by side in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from contextlib import AbstractContextManager, ExitStack
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import HARNESS, HOST, ROOT, free_port, messages, process, proxy_config, timed


def run(requests: int, sizes: tuple[int, ...], baseline: Path | None = None) -> list[dict[str, Any]]:
    targets = ("direct", "floor", "proxy", *(("baseline",) if baseline else ()))
    fake_port, floor_port, proxy_port, baseline_port = free_port(), free_port(), free_port(), free_port()
    upstream = f"http://{HOST}:{fake_port}/v1"
    workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    urls = {
        "direct": f"{upstream}/chat/completions",
        "floor": f"http://{HOST}:{floor_port}/v1/chat/completions",
        "proxy": f"http://{HOST}:{proxy_port}/v1/chat/completions",
        "baseline": f"http://{HOST}:{baseline_port}/v1/chat/completions",
    }
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        stack.enter_context(process([str(HARNESS), "--serve-fake", str(fake_port)], f"{upstream}/models"))
        stack.enter_context(
            process([str(HARNESS), "--serve-floor", str(floor_port), upstream], f"http://{HOST}:{floor_port}/")
        )
        stack.enter_context(_proxy(workdir, upstream, "proxy", proxy_port, ROOT))
        if baseline is not None:
            stack.enter_context(_proxy(workdir, upstream, "baseline", baseline_port, baseline))
        client = stack.enter_context(httpx.Client(timeout=60))
        for size in sizes:
            history = messages(size)
            for stream in (False, True):
                payload = {"model": "fake", "messages": history, "stream": stream}
                for target in targets:  # warm-up: first calls pay lazy imports and store the history
                    for _ in range(20):
                        timed(client, urls[target], payload, stream)
                samples: dict[str, list[float]] = {target: [] for target in targets}
                for round_index in range(requests):
                    order = targets if round_index % 2 == 0 else targets[::-1]
                    for target in order:
                        samples[target].append(timed(client, urls[target], payload, stream) * 1000)
                rows.append(_row(size, stream, samples))
    return rows


def _proxy(workdir: Path, upstream: str, name: str, port: int, root: Path) -> AbstractContextManager[Any]:
    """`context-proxy serve` from the checkout `root`, with its own store."""
    config = proxy_config(workdir, upstream, name)
    return process(
        ["-m", "proxy", "serve", "--config", str(config), "--port", str(port), "--log-level", "warning"],
        f"http://{HOST}:{port}/healthz",
        root=root,
    )


def _row(size: int, stream: bool, samples: dict[str, list[float]]) -> dict[str, Any]:
    def pct(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[int(q) - 1]

    row: dict[str, Any] = {"messages": size, "kind": "TTFC stream" if stream else "non-stream"}
    for target, values in samples.items():
        row[f"{target}_p50"] = statistics.median(values)
        row[f"{target}_p95"] = pct(values, 95)
        row[f"{target}_added_p50"] = row[f"{target}_p50"] - row["direct_p50"]
        row[f"{target}_added_p95"] = row[f"{target}_p95"] - row["direct_p95"]
    floor = max(row["floor_added_p50"], 0.01)
    row["ratio_p50"] = row["proxy_added_p50"] / floor
    row["ratio_p95"] = row["proxy_added_p95"] / max(row["floor_added_p95"], 0.01)
    if "baseline" in samples:
        row["vs_baseline_p50"] = row["proxy_added_p50"] / max(row["baseline_added_p50"], 0.01)
        row["vs_baseline_p95"] = row["proxy_added_p95"] / max(row["baseline_added_p95"], 0.01)
    return row


def print_table(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'msgs':>5} {'kind':<12} {'direct p50/p95':>16} {'floor +p50/+p95':>17} "
        f"{'proxy +p50/+p95':>17} {'proxy/floor p50':>15} {'p95':>6}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['messages']:>5} {r['kind']:<12} {r['direct_p50']:>7.2f}/{r['direct_p95']:<8.2f} "
            f"{r['floor_added_p50']:>8.2f}/{r['floor_added_p95']:<8.2f} "
            f"{r['proxy_added_p50']:>8.2f}/{r['proxy_added_p95']:<8.2f} {r['ratio_p50']:>15.1f} {r['ratio_p95']:>6.1f}"
        )
    print("\nms; '+' = latency added over calling the upstream directly; ratios = proxy added / floor added")
    if rows and "vs_baseline_p50" in rows[0]:
        print(f"\n{'msgs':>5} {'kind':<12} {'baseline +p50/+p95':>19} {'proxy/baseline p50':>19} {'p95':>6}")
        for r in rows:
            print(
                f"{r['messages']:>5} {r['kind']:<12} {r['baseline_added_p50']:>9.2f}/{r['baseline_added_p95']:<9.2f} "
                f"{r['vs_baseline_p50']:>19.2f} {r['vs_baseline_p95']:>6.2f}"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--sizes", default="10,500")
    parser.add_argument("--baseline", type=Path, help="another checkout whose proxy runs beside this one")
    args = parser.parse_args(argv)
    started = time.monotonic()
    rows = run(args.requests, tuple(int(s) for s in args.sizes.split(",")), args.baseline)
    print_table(rows)
    print(f"({args.requests} alternating rounds per row, {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
