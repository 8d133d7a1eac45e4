"""The servers benchmarks measure against, each a child process on 127.0.0.1: the fake upstream, the floor, the proxy.

    fake upstream   tests/support/fake_upstream.py's strict fake, with a long window (`BIG_WINDOW`) and
                    optionally a fixed answer of N words or N characters
    floor           a bare pass-through (uvicorn + one httpx.AsyncClient): the least a Python proxy adds
    proxy           `python -m proxy serve` from a checkout (this one, or a baseline's) with its own store

This module is also the entry point of the first two: `python -m bench.harness.servers --serve-fake PORT [WORDS]
[--reply-chars N] [--answer MODE ARG]` / `--serve-floor PORT URL`. `--answer` makes every answer a hostile one
(`ANSWERS`): a huge error body, an event stream to a non-stream call, one huge event, a huge JSON answer, lines
that are not JSON, chunks of the wrong shape, a 401 echoing a key, or an answer in many small chunks.
"""

from __future__ import annotations

import argparse
import json
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

from bench.harness.clients import WORDS
from bench.harness.processes import ROOT, python
from bench.harness.processes import process as child_process
from tests.support.proxy_server import HOST, free_port

BIG_WINDOW = 4_000_000
"""A context window no benchmark history reaches (5,000 messages of ~200 tokens are ~1M): benchmarks of forwarding
must not compact, or the proxy would send the fake less than the other targets do."""
CHAT_PATH = "/v1/chat/completions"
UPSTREAM_TIMEOUT_S = 60.0
ENTRY = "bench.harness.servers"

__all__ = ["BIG_WINDOW", "HOST", "base_url", "fake_upstream", "floor", "free_port", "proxy_config", "proxy_process"]


def base_url(port: int) -> str:
    return f"http://{HOST}:{port}"


def proxy_config(workdir: Path, upstream: str, name: str, *, window: int = BIG_WINDOW, **sections: Any) -> Path:
    """Write a config with one model "fake" on `upstream` (a `window` no history reaches: no compaction) and its
    own store; return its path. `sections` are top-level config sections (`journal`, `store`, …)."""
    config: dict[str, Any] = {
        "store": {"path": str(workdir / f"{name}.db")},
        "models": [
            {
                "name": "fake",
                "model": "openai/fake-model",
                "api_base": upstream,
                "api_key": "sk-bench",
                "context_window": window,
                "max_output": 4096,
            }
        ],
        **sections,
    }
    path = workdir / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


ANSWERS = (
    "error",
    "sse-to-json",
    "one-event",
    "json-answer",
    "non-json-lines",
    "wrong-shape",
    "key-echo",
    "chunks",
    "quote",
)
"""`--answer MODE ARG` of the fake: ARG is a size in characters, except for `key-echo` (the key) and `chunks`
(`SIZE:PIECE`, an answer of SIZE characters in PIECE-character chunks)."""
RAW_PIECE = 65536
ANSWER_FAULTS = 10_000
"""The fake answers this many requests with the hostile answer: all a benchmark sends."""
HOSTILE_QUESTION = "Tell me everything."
"""Only a request whose last message is this gets the hostile answer: a warm-up request gets a short one."""


@contextmanager
def fake_upstream(
    port: int,
    *,
    reply_words: int | None = None,
    reply_chars: int | None = None,
    answer: tuple[str, str] | None = None,
    log: Path | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """The fake upstream on `port` (its API at `base_url(port)/v1`); see `serve_fake`."""
    argv = python("-m", ENTRY, "--serve-fake", str(port))
    argv += [str(reply_words)] if reply_words is not None else []
    argv += ["--reply-chars", str(reply_chars)] if reply_chars is not None else []
    argv += ["--answer", *answer] if answer is not None else []
    with child_process(argv, f"{base_url(port)}/v1/models", log=log) as child:
        yield child


@contextmanager
def floor(port: int, upstream: str, log: Path | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """The bare pass-through on `port`, forwarding to the API at `upstream`."""
    with child_process(
        python("-m", ENTRY, "--serve-floor", str(port), upstream), f"{base_url(port)}/", log=log
    ) as child:
        yield child


def proxy_argv(config: Path, port: int) -> list[str]:
    return python("-m", "proxy", "serve", "--config", str(config), "--port", str(port), "--log-level", "warning")


@contextmanager
def proxy_process(
    config: Path, port: int, *, root: Path = ROOT, log: Path | None = None, **options: Any
) -> Iterator[subprocess.Popen[bytes]]:
    """`context-proxy serve` from the checkout `root` on `port`; `options` go to `processes.process`."""
    with child_process(proxy_argv(config, port), f"{base_url(port)}/healthz", log=log, root=root, **options) as child:
        yield child


def asks_hostile(body: dict[str, Any]) -> bool:
    messages = body.get("messages") or [{}]
    return bool(messages[-1].get("content") == HOSTILE_QUESTION)


def hostile_answer(mode: str, arg: str) -> Any:
    """The fake's `Fault` (or, for `chunks`, its `Reply`) for `--answer MODE ARG`; huge bodies are made piece by
    piece as they are sent."""
    from tests.support.fake_upstream import Fault, Reply

    def text(size: int) -> Iterator[bytes]:
        for start in range(0, size, RAW_PIECE):
            yield b"x" * min(RAW_PIECE, size - start)

    def event(delta: str, finish: str | None = None) -> bytes:
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake-model"}
        chunk["choices"] = [{"index": 0, "delta": json.loads(delta), "finish_reason": finish}]
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    def one_event(size: int) -> Iterator[bytes]:
        yield event('{"role": "assistant", "content": ""}') + event('{"content": "before "}')
        yield b'data: {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake-model", '
        yield b'"choices": [{"index": 0, "delta": {"content": "'
        yield from text(size)
        yield b'"}, "finish_reason": null}]}\n\n' + event("{}", "stop") + b"data: [DONE]\n\n"

    def json_answer(size: int) -> Iterator[bytes]:
        yield b'{"id": "c", "object": "chat.completion", "created": 1, "model": "fake-model", "choices": [{"index":'
        yield b' 0, "message": {"role": "assistant", "content": "'
        yield from text(size)
        yield b'"}, "finish_reason": "stop"}], '
        yield b'"usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}'

    def sse_to_json(size: int) -> Iterator[bytes]:
        line = event('{"content": "hi"}')
        for _ in range(size // len(line)):
            yield line

    if mode == "error":
        return Fault(status=500, raw_parts=lambda: text(int(arg)), media_type="text/plain")
    if mode == "sse-to-json":
        return Fault(status=200, raw_parts=lambda: sse_to_json(int(arg)), media_type="text/event-stream")
    if mode == "one-event":
        return Fault(status=200, raw_parts=lambda: one_event(int(arg)), media_type="text/event-stream")
    if mode == "json-answer":
        return Fault(status=200, raw_parts=lambda: json_answer(int(arg)))
    if mode == "non-json-lines":
        lines = b"data: not json at all\n\n" * max(1, int(arg) // 23) + b"data: [DONE]\n\n"
        return Fault(status=200, raw_body=lines, media_type="text/event-stream")
    if mode == "wrong-shape":
        body = b'data: {"choices": "nope"}\n\n' * max(1, int(arg) // 28) + b"data: [DONE]\n\n"
        return Fault(status=200, raw_body=body, media_type="text/event-stream")
    if mode == "key-echo":
        error = {"message": f"Incorrect API key provided: {arg}.", "type": "invalid_request_error"}
        return Fault(status=401, body={"error": {**error, "param": None, "code": "invalid_api_key"}})
    if mode == "quote":  # OpenAI's answer to a value it refuses, quoting it, to every request that carries it
        error = {"message": f"Invalid value: '{arg}'.", "type": "invalid_request_error", "param": "messages"}
        quoted = {"error": {**error, "code": "invalid_value"}}
        return Fault(status=400, body=quoted, when=lambda body: arg in json.dumps(body))
    if mode == "chunks":
        size, piece = (int(part) for part in arg.split(":"))
        word = "x" * (piece - 1) + " "
        return Reply(content=(word * (size // piece + 1))[:size], finish_reason="stop")
    raise ValueError(f"unknown answer {mode!r}: one of {', '.join(ANSWERS)}")


def serve_fake(
    port: int, reply_words: int | None = None, reply_chars: int | None = None, answer: list[str] | None = None
) -> None:
    """The fake upstream; with `reply_words`, every answer is that many words, streamed as fast as it can; with
    `reply_chars`, every answer is that many characters of 100-character hyphenated words (one chunk each); with
    `answer`, every answer is that hostile one (`hostile_answer`)."""
    import uvicorn

    from tests.support.fake_upstream import FakeUpstream, Reply

    fake = FakeUpstream(context_window=BIG_WINDOW, keep_requests=False)
    if answer is not None:
        hostile = hostile_answer(*answer)
        short = Reply(content="a short answer")
        if isinstance(hostile, Reply):
            fake.responder = lambda body: hostile if asks_hostile(body) else short
        else:
            fake.fail_next(hostile if hostile.when else replace(hostile, when=asks_hostile), count=ANSWER_FAULTS)
    if reply_words is not None:
        words_reply = Reply(content=" ".join(f"w{n}" for n in range(reply_words)))
        fake.responder = lambda body: words_reply
    if reply_chars is not None:
        word = "-".join(WORDS.split())
        piece = (word * (99 // len(word) + 1))[:99] + " "
        chars_reply = Reply(content=(piece * (reply_chars // len(piece) + 1))[:reply_chars])
        fake.responder = lambda body: chars_reply
    uvicorn.run(fake._app, host=HOST, port=port, log_level="warning", lifespan="off")


def serve_floor(port: int, upstream: str) -> None:
    """The floor: forward bytes to the upstream and stream its answer back, nothing else."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    client = httpx.AsyncClient(base_url=upstream, timeout=UPSTREAM_TIMEOUT_S)

    async def chat(request: Request) -> Response:
        body = await request.body()
        upstream_request = client.build_request(
            "POST", "/chat/completions", content=body, headers={"content-type": "application/json"}
        )
        response = await client.send(upstream_request, stream=True)
        return StreamingResponse(
            response.aiter_raw(), status_code=response.status_code, media_type=response.headers.get("content-type")
        )

    app = Starlette(routes=[Route(CHAT_PATH, chat, methods=["POST"])])
    uvicorn.run(app, host=HOST, port=port, log_level="warning", lifespan="off")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="entry points of the benchmarks' helper servers")
    parser.add_argument("--serve-fake", nargs="+", metavar=("PORT", "WORDS"))
    parser.add_argument("--reply-chars", type=int, help="with --serve-fake: every answer is this many characters")
    parser.add_argument("--answer", nargs=2, metavar=("MODE", "ARG"), help="with --serve-fake: " + ", ".join(ANSWERS))
    parser.add_argument("--serve-floor", nargs=2, metavar=("PORT", "UPSTREAM"))
    args = parser.parse_args(argv)
    if args.serve_fake:
        words = int(args.serve_fake[1]) if len(args.serve_fake) > 1 else None
        serve_fake(int(args.serve_fake[0]), words, args.reply_chars, args.answer)
    elif args.serve_floor:
        serve_floor(int(args.serve_floor[0]), args.serve_floor[1])
    else:
        parser.error("nothing to serve")


if __name__ == "__main__":
    main()
