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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.proxy_server import HOST, free_port  # noqa: E402

WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "
BIG_WINDOW = 1_000_000
TARGETS = ("direct", "floor", "proxy")


def messages(count: int) -> list[dict[str, Any]]:
    body = WORDS * 12  # ~200 tokens
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful. " + body}]
    for index in range(count - 1):
        history.append({"role": "user" if index % 2 == 0 else "assistant", "content": f"message {index} {body}"})
    history[-1]["role"] = "user"
    return history


def serve_fake(port: int) -> None:
    import uvicorn

    from tests.fake_upstream import FakeUpstream

    fake = FakeUpstream(context_window=BIG_WINDOW)
    uvicorn.run(fake._app, host=HOST, port=port, log_level="warning", lifespan="off")


def serve_floor(port: int, upstream: str) -> None:
    """The floor: forward bytes to the upstream and stream its answer back, nothing else."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=upstream, timeout=60)

    async def chat(request: Request) -> Response:
        body = await request.body()
        upstream_request = client.build_request(
            "POST", "/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        response = await client.send(upstream_request, stream=True)
        return StreamingResponse(
            response.aiter_raw(),
            status_code=response.status_code,
            media_type=response.headers.get("content-type"),
            background=None,
        )

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host=HOST, port=port, log_level="warning", lifespan="off")


@contextmanager
def process(args: list[str], health: str, env: dict[str, str] | None = None) -> Iterator[None]:
    child = subprocess.Popen([sys.executable, *args], cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(health, timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError(f"{args} did not start") from None
                time.sleep(0.1)
        yield
    finally:
        child.terminate()
        child.wait(10)


def timed(client: httpx.Client, url: str, payload: dict[str, Any], stream: bool) -> float:
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


def run(requests: int, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    fake_port, floor_port, proxy_port = free_port(), free_port(), free_port()
    upstream = f"http://{HOST}:{fake_port}/v1"
    workdir = Path(tempfile.mkdtemp(prefix="bench-overhead-"))
    config = {
        "store": {"path": str(workdir / "store.db")},
        "models": [
            {
                "name": "fake",
                "model": "openai/fake-model",
                "api_base": upstream,
                "api_key": "sk-bench",
                "context_window": BIG_WINDOW,
                "max_output": 4096,
            }
        ],
    }
    (workdir / "config.json").write_text(json.dumps(config))
    urls = {
        "direct": f"{upstream}/chat/completions",
        "floor": f"http://{HOST}:{floor_port}/v1/chat/completions",
        "proxy": f"http://{HOST}:{proxy_port}/v1/chat/completions",
    }
    rows: list[dict[str, Any]] = []
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with (
        process([__file__, "--serve-fake", str(fake_port)], f"{upstream}/models", env),
        process([__file__, "--serve-floor", str(floor_port), upstream], f"http://{HOST}:{floor_port}/", env),
        process(
            [
                "-m",
                "proxy",
                "serve",
                "--config",
                str(workdir / "config.json"),
                "--port",
                str(proxy_port),
                "--log-level",
                "warning",
            ],
            f"http://{HOST}:{proxy_port}/healthz",
            env,
        ),
        httpx.Client(timeout=60) as client,
    ):
        for size in sizes:
            history = messages(size)
            for stream in (False, True):
                payload = {"model": "fake", "messages": history, "stream": stream}
                for target in TARGETS:  # warm-up: first calls pay lazy imports and store the history
                    for _ in range(20):
                        timed(client, urls[target], payload, stream)
                samples: dict[str, list[float]] = {target: [] for target in TARGETS}
                for round_index in range(requests):
                    order = TARGETS if round_index % 2 == 0 else TARGETS[::-1]
                    for target in order:
                        samples[target].append(timed(client, urls[target], payload, stream) * 1000)
                rows.append(_row(size, stream, samples))
    return rows


def _row(size: int, stream: bool, samples: dict[str, list[float]]) -> dict[str, Any]:
    def pct(values: list[float], q: float) -> float:
        return statistics.quantiles(values, n=100)[int(q) - 1]

    row: dict[str, Any] = {"messages": size, "kind": "TTFC stream" if stream else "non-stream"}
    for target in TARGETS:
        row[f"{target}_p50"] = statistics.median(samples[target])
        row[f"{target}_p95"] = pct(samples[target], 95)
    for target in ("floor", "proxy"):
        row[f"{target}_added_p50"] = row[f"{target}_p50"] - row["direct_p50"]
        row[f"{target}_added_p95"] = row[f"{target}_p95"] - row["direct_p95"]
    floor = max(row["floor_added_p50"], 0.01)
    row["ratio_p50"] = row["proxy_added_p50"] / floor
    row["ratio_p95"] = row["proxy_added_p95"] / max(row["floor_added_p95"], 0.01)
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--sizes", default="10,500")
    parser.add_argument("--serve-fake", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--serve-floor", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_fake:
        serve_fake(args.serve_fake)
        return
    if args.serve_floor:
        serve_floor(int(args.serve_floor[0]), args.serve_floor[1])
        return
    started = time.monotonic()
    rows = run(args.requests, tuple(int(s) for s in args.sizes.split(",")))
    print_table(rows)
    print(f"({args.requests} alternating rounds per row, {time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
