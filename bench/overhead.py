"""What the proxy adds to a request's latency, against the floor of a bare Python pass-through.

Run by hand: `python bench/overhead.py [--requests 300]`. Three targets in separate processes, one fake
upstream behind them all, requests alternating between targets in every round so that they share the
machine's noise:

    direct        the fake upstream itself
    floor         a bare httpx pass-through (uvicorn + one httpx.AsyncClient): the least a Python proxy adds
    proxy         context-proxy serve (history, budget, compaction check, journal, LiteLLM)

For 10- and 500-message histories (~200 tokens each) it reports p50/p95 total latency of non-stream calls and
time to the first streamed byte, the latency added over `direct`, and the ratio of the proxy's added latency
to the floor's (printed, and with `--json PATH` written in bench/harness/report.py's format).

`--window N` sets the model's context window (default: one no history reaches, so nothing compacts); with
`--window 1000000` a 5,000-message history (~1M tokens) is compacted on every request, which measures what the
compaction stage costs a long session's requests.

`--baseline DIR` adds a fourth target, `context-proxy serve` run from another checkout (e.g. a `git worktree`
of the previous commit), and the ratio of this checkout's added latency to the baseline's: a regression check
measured side by side in one run.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import servers
from bench.harness.clients import messages, percentile, round_order, timed
from bench.harness.report import Report, add_json_option, checkout_state, columns

WARMUP = 20
"""Calls per target before a row is measured: the first ones pay lazy imports and store the history."""
RATIO_FLOOR_MS = 0.01
"""A divisor no smaller than this: a floor that adds nothing measurable does not make the ratio infinite."""


def run(
    requests: int, sizes: tuple[int, ...], baseline: Path | None = None, window: int = servers.BIG_WINDOW
) -> list[dict[str, Any]]:
    targets = ("direct", "floor", "proxy", *(("baseline",) if baseline else ()))
    fake_port, floor_port, proxy_port, baseline_port = (servers.free_port() for _ in range(4))
    upstream = f"{servers.base_url(fake_port)}/v1"
    workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    urls = {
        "direct": f"{upstream}/chat/completions",
        "floor": servers.base_url(floor_port) + servers.CHAT_PATH,
        "proxy": servers.base_url(proxy_port) + servers.CHAT_PATH,
        "baseline": servers.base_url(baseline_port) + servers.CHAT_PATH,
    }
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        stack.enter_context(servers.fake_upstream(fake_port))
        stack.enter_context(servers.floor(floor_port, upstream))
        config = servers.proxy_config(workdir, upstream, "proxy", window=window)
        stack.enter_context(servers.proxy_process(config, proxy_port))
        if baseline is not None:
            config = servers.proxy_config(workdir, upstream, "baseline", window=window)
            stack.enter_context(servers.proxy_process(config, baseline_port, root=baseline))
        client = stack.enter_context(httpx.Client(timeout=60))
        for size in sizes:
            history = messages(size)
            for stream in (False, True):
                payload = {"model": "fake", "messages": history, "stream": stream}
                for target in targets:
                    for _ in range(WARMUP):
                        timed(client, urls[target], payload, stream)
                samples: dict[str, list[float]] = {target: [] for target in targets}
                for round_index in range(requests):
                    for target in round_order(targets, round_index):
                        samples[target].append(timed(client, urls[target], payload, stream) * 1000)
                rows.append(_row(size, stream, samples))
    return rows


def _row(size: int, stream: bool, samples: dict[str, list[float]]) -> dict[str, Any]:
    row: dict[str, Any] = {"messages": size, "kind": "TTFC stream" if stream else "non-stream"}
    for target, values in samples.items():
        row[f"{target}_p50"] = statistics.median(values)
        row[f"{target}_p95"] = percentile(values, 95)
        row[f"{target}_added_p50"] = row[f"{target}_p50"] - row["direct_p50"]
        row[f"{target}_added_p95"] = row[f"{target}_p95"] - row["direct_p95"]
    for q in ("p50", "p95"):
        row[f"ratio_{q}"] = row[f"proxy_added_{q}"] / max(row[f"floor_added_{q}"], RATIO_FLOOR_MS)
        if "baseline" in samples:
            row[f"vs_baseline_{q}"] = row[f"proxy_added_{q}"] / max(row[f"baseline_added_{q}"], RATIO_FLOOR_MS)
    return row


def report(rows: list[dict[str, Any]], result: Report) -> None:
    latency = result.table(
        "latency",
        "latency added over calling the upstream directly (ms)",
        columns(
            ("messages", "msgs"), ("kind",), ("direct_p50", "direct p50", ".2f"), ("direct_p95", "p95", ".2f"),
            ("floor_added_p50", "floor +p50", ".2f"), ("floor_added_p95", "+p95", ".2f"),
            ("proxy_added_p50", "proxy +p50", ".2f"), ("proxy_added_p95", "+p95", ".2f"),
            ("ratio_p50", "proxy/floor p50", ".1f"), ("ratio_p95", "p95", ".1f"),
        ),
    )  # fmt: skip
    latency.rows = rows
    latency.notes.append(
        "ms; '+' = latency added over calling the upstream directly; ratios = proxy added / floor added"
    )
    for row in rows:
        result.ratios[f"proxy/floor added p50, {row['messages']} msgs {row['kind']}"] = row["ratio_p50"]
    if rows and "vs_baseline_p50" in rows[0]:
        against = result.table(
            "baseline",
            "this checkout against the baseline's",
            columns(
                ("messages", "msgs"), ("kind",), ("baseline_added_p50", "baseline +p50", ".2f"),
                ("baseline_added_p95", "+p95", ".2f"), ("vs_baseline_p50", "proxy/baseline p50", ".2f"),
                ("vs_baseline_p95", "p95", ".2f"),
            ),
        )  # fmt: skip
        against.rows = rows
        for row in rows:
            result.ratios[f"proxy/baseline added p50, {row['messages']} msgs {row['kind']}"] = row["vs_baseline_p50"]
    result.notes.append(f"{result.parameters['requests']} alternating rounds per row")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--sizes", default="10,500")
    parser.add_argument("--baseline", type=Path, help="another checkout whose proxy runs beside this one")
    parser.add_argument("--window", type=int, default=servers.BIG_WINDOW, help="the model's context window")
    add_json_option(parser)
    args = parser.parse_args(argv)
    result = Report.start("overhead", args)
    if args.baseline is not None:
        result.parameters["baseline_commit"] = checkout_state(args.baseline)[0]
    rows = run(args.requests, tuple(int(s) for s in args.sizes.split(",")), args.baseline, args.window)
    report(rows, result)
    result.publish(args.json)


if __name__ == "__main__":
    main()
