"""A raw HTTP/1.1 upstream on 127.0.0.1 that breaks its connections at chosen moments, deterministically.

uvicorn cannot be told to drop a kept-alive connection exactly as a client reuses it, so this one is a plain
asyncio server in a thread of the test process. Its `mode` says what each connection does:

    reset-on-reuse  answers the first request of a connection (keep-alive), and resets the connection (TCP RST)
                    as soon as the next request's head arrives on it: what an upstream closing an idle connection
                    does to a client that reuses it at that moment
    cut-answer      sends the answer's head and the first part of its body, then resets the connection
    silent          reads the request and never answers

It answers OpenAI's chat completions (`stream` true or false), Responses and Anthropic Messages with a short
answer ("pong"), and counts the request heads it received and the answers it sent.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from types import TracebackType
from typing import Any, Literal, Self

HOST = "127.0.0.1"
START_TIMEOUT_S = 10.0
ANSWER_TEXT = "pong"
Mode = Literal["reset-on-reuse", "cut-answer", "silent"]

CHAT: dict[str, Any] = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "fake-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": ANSWER_TEXT}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
}
RESPONSE: dict[str, Any] = {
    "id": "resp_1",
    "object": "response",
    "created_at": 1,
    "status": "completed",
    "model": "fake-model",
    "output": [
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": ANSWER_TEXT, "annotations": []}],
        }
    ],
    "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6},
}
MESSAGE: dict[str, Any] = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-fake",
    "content": [{"type": "text", "text": ANSWER_TEXT}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 5, "output_tokens": 1},
}


def chat_chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


def answer_body(path: str, stream: bool) -> tuple[bytes, str]:
    """The body for a request to `path` and its content type."""
    if stream:
        events = chat_chunk(ANSWER_TEXT) + chat_chunk(None, "stop") + b"data: [DONE]\n\n"
        return events, "text/event-stream"
    if path.endswith("/responses"):
        return json.dumps(RESPONSE).encode(), "application/json"
    if path.endswith("/messages"):
        return json.dumps(MESSAGE).encode(), "application/json"
    return json.dumps(CHAT).encode(), "application/json"


class ResettingUpstream:
    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        self.requests = 0
        """Request heads received, on every connection."""
        self.answers = 0
        """Answers sent whole."""
        self.connections = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._port = 0

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self._port}/v1"

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._serve, name="resetting-upstream", daemon=True)
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise RuntimeError("the resetting upstream did not start")
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(START_TIMEOUT_S)

    def _serve(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        server = await asyncio.start_server(self._connection, HOST, 0)
        self._port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stop.wait()
        server.close()
        # Each connection ends by itself once its socket is gone (a cancelled one would be logged as an error).
        for writer in self._writers:
            writer.transport.abort()
        connections = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        await asyncio.gather(*connections, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._stop is not None
        self.connections += 1
        self._writers.add(writer)
        served = 0
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self.requests += 1
                if self.mode == "reset-on-reuse" and served > 0:
                    reset(writer)
                    return
                body = await reader.readexactly(content_length(head))
                if self.mode == "silent":
                    await self._stop.wait()
                    return
                path = head.split(b" ", 2)[1].decode()
                stream = bool(json.loads(body or b"{}").get("stream"))
                content, kind = answer_body(path, stream)
                if self.mode == "cut-answer":
                    writer.write(
                        response_head(kind, len(content), stream) + chunked(content[: len(content) // 2], stream)
                    )
                    await writer.drain()
                    reset(writer)
                    return
                writer.write(response_head(kind, len(content), stream) + chunked(content, stream, last=True))
                await writer.drain()
                self.answers += 1
                served += 1
        finally:
            self._writers.discard(writer)
            writer.close()


def response_head(kind: str, length: int, stream: bool) -> bytes:
    framing = "Transfer-Encoding: chunked" if stream else f"Content-Length: {length}"
    return f"HTTP/1.1 200 OK\r\nContent-Type: {kind}\r\n{framing}\r\nConnection: keep-alive\r\n\r\n".encode()


def chunked(content: bytes, stream: bool, *, last: bool = False) -> bytes:
    if not stream:
        return content
    return f"{len(content):x}\r\n".encode() + content + b"\r\n" + (b"0\r\n\r\n" if last else b"")


def content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return 0


def reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a server does that drops a connection with data unread."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
