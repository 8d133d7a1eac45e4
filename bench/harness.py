"""What every benchmark shares: child processes on 127.0.0.1, the fake upstream, the floor, proxy configs.

Benchmarks run each server in its own process (one GIL each, like production) and alternate requests between
targets so that they share the machine's noise. This module is also the entry point of the fake upstream
and the bare pass-through: `python bench/harness.py --serve-fake PORT [WORDS] [--reply-chars N]` /
`--serve-floor PORT URL`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.support.proxy_server import HOST, free_port  # noqa: E402

HARNESS = Path(__file__).resolve()
BIG_WINDOW = 1_000_000
"""A context window no benchmark history reaches: benchmarks of forwarding must not compact."""
START_TIMEOUT_S = 60.0
WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod tempor "

__all__ = ["BIG_WINDOW", "HARNESS", "HOST", "ROOT", "free_port", "messages", "process", "proxy_config", "timed"]


def messages(count: int) -> list[dict[str, Any]]:
    """A history of `count` messages of ~200 tokens each, ending with a user turn."""
    body = WORDS * 12
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are helpful. " + body}]
    for index in range(count - 1):
        history.append({"role": "user" if index % 2 == 0 else "assistant", "content": f"message {index} {body}"})
    history[-1]["role"] = "user"
    return history


def proxy_config(workdir: Path, upstream: str, name: str, **sections: Any) -> Path:
    """Write a config with one model "fake" on `upstream` (no compaction) and its own store; return its path."""
    config: dict[str, Any] = {
        "store": {"path": str(workdir / f"{name}.db")},
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
        **sections,
    }
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


@contextmanager
def process(
    args: list[str],
    health: str,
    log: Path | None = None,
    start_timeout: float = START_TIMEOUT_S,
    root: Path = ROOT,
) -> Iterator[subprocess.Popen[bytes]]:
    """A child Python process running `args` from the checkout `root`, yielded once `health` answers;
    terminated on exit."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    sink = log.open("ab") if log is not None else subprocess.DEVNULL
    try:
        child = subprocess.Popen([sys.executable, *args], cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT)
    finally:
        if log is not None and not isinstance(sink, int):
            sink.close()
    try:
        deadline = time.monotonic() + start_timeout
        while True:
            try:
                httpx.get(health, timeout=1)
                break
            except httpx.TransportError:
                if time.monotonic() > deadline or child.poll() is not None:
                    raise RuntimeError(f"{args} did not start" + (f"; see {log}" if log else "")) from None
                time.sleep(0.1)
        yield child
    finally:
        child.terminate()
        child.wait(30)


def timed(client: httpx.Client, url: str, payload: dict[str, Any], stream: bool) -> float:
    """Seconds for a non-stream call, or to the first streamed byte."""
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


def serve_fake(port: int, reply_words: int | None = None, reply_chars: int | None = None) -> None:
    """The fake upstream; with `reply_words`, every answer is that many words, streamed as fast as it can; with
    `reply_chars`, every answer is that many characters of 100-character hyphenated words (one chunk each)."""
    import uvicorn

    from tests.support.fake_upstream import FakeUpstream, Reply

    fake = FakeUpstream(context_window=BIG_WINDOW)
    if reply_words is not None:
        reply = Reply(content=" ".join(f"w{n}" for n in range(reply_words)))
        fake.responder = lambda body: reply
    if reply_chars is not None:
        word = "-".join(WORDS.split())
        piece = (word * (99 // len(word) + 1))[:99] + " "
        reply = Reply(content=(piece * (reply_chars // len(piece) + 1))[:reply_chars])
        fake.responder = lambda body: reply
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
            response.aiter_raw(), status_code=response.status_code, media_type=response.headers.get("content-type")
        )

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    uvicorn.run(app, host=HOST, port=port, log_level="warning", lifespan="off")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="entry points of the benchmarks' helper servers")
    parser.add_argument("--serve-fake", nargs="+", metavar=("PORT", "WORDS"))
    parser.add_argument("--reply-chars", type=int, help="with --serve-fake: every answer is this many characters")
    parser.add_argument("--serve-floor", nargs=2, metavar=("PORT", "UPSTREAM"))
    args = parser.parse_args(argv)
    if args.serve_fake:
        words = int(args.serve_fake[1]) if len(args.serve_fake) > 1 else None
        serve_fake(int(args.serve_fake[0]), words, args.reply_chars)
    elif args.serve_floor:
        serve_floor(int(args.serve_floor[0]), args.serve_floor[1])
    else:
        parser.error("nothing to serve")


if __name__ == "__main__":
    main()
