"""An in-process upstream for unit tests: scripted answers at the `Upstream` seam, with no server and no sockets.

The request path reaches a model only through `proxy.upstream.protocol.Upstream`. Like httpx's `MockTransport`,
this is where unit tests plug in: a test queues what the next calls answer (a stream of chunks, a
`chat.completion`, or an `UpstreamError` before the first byte or after some chunks), holds a call or any one
chunk on an `asyncio.Event` so that it decides exactly when each byte arrives, and reads back every call made.
Concurrency in the relay and the pipeline can then be tested step by step, deterministically; the HTTP
behaviour of the real client is tested end to end against `tests.support.fake_upstream` instead.
"""

from __future__ import annotations

import asyncio
import copy
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from proxy.canonical.types import Chunk, Message, NativeRequest
from proxy.config.models import ModelEntry
from proxy.errors import CONTEXT_LENGTH_EXCEEDED, ContextOverflow, UpstreamError
from proxy.upstream.protocol import UpstreamCall

CallKind = Literal["complete", "stream"]


@dataclass(frozen=True)
class Call:
    """One call the upstream received, with copies of what it was given."""

    kind: CallKind
    entry: ModelEntry
    messages: list[Message]
    params: dict[str, Any]
    native: NativeRequest | None = None


@dataclass
class Script:
    """What one call answers: `completion` (complete), `chunks` then `error` if set (stream), or `refusal`,
    raised by the call itself, before the first byte (either kind)."""

    kind: CallKind | None
    completion: Chunk | None = None
    chunks: list[Chunk] = field(default_factory=list)
    error: UpstreamError | None = None
    refusal: UpstreamError | None = None
    release: asyncio.Event | None = None
    gates: dict[int, asyncio.Event] = field(default_factory=dict)
    taken: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when a call took this script (before `release` is waited for)."""
    sent: int = 0
    """Chunks handed to the reader so far."""
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the stream has passed its last chunk (before it raises its error, if any)."""
    closed: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the stream's iterator is finished or closed, however it ended (the upstream connection)."""

    def hold(self) -> asyncio.Event:
        """Make the call wait, before it answers or refuses, until the returned event is set."""
        self.release = asyncio.Event()
        return self.release

    def gate(self, index: int) -> asyncio.Event:
        """Make chunk `index` wait until the returned event is set; `len(chunks)` gates the end (or error)."""
        return self.gates.setdefault(index, asyncio.Event())


class ScriptedUpstream:
    """Answers each call with the next queued `Script`; an unscripted or mismatched call fails the test."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.on_call: Callable[[Call], None] | None = None
        """Called as each call arrives, before anything is awaited: what the caller had done by then."""
        self._scripts: deque[Script] = deque()

    def reply(self, completion: Chunk) -> Script:
        return self._queue(Script("complete", completion=completion))

    def stream(self, chunks: Sequence[Chunk], *, error: UpstreamError | None = None) -> Script:
        return self._queue(Script("stream", chunks=list(chunks), error=error))

    def refuse(self, refusal: UpstreamError) -> Script:
        return self._queue(Script(None, refusal=refusal))

    @property
    def pending(self) -> int:
        """Scripts not yet taken by a call."""
        return len(self._scripts)

    async def complete(self, call: UpstreamCall) -> Chunk:
        script = await self._take("complete", call)
        assert script.completion is not None
        return copy.deepcopy(script.completion)

    async def open_stream(self, call: UpstreamCall) -> AsyncIterator[Chunk]:
        script = await self._take("stream", call)
        return self._chunks(script)

    def _queue(self, script: Script) -> Script:
        self._scripts.append(script)
        return script

    async def _take(self, kind: CallKind, upstream_call: UpstreamCall) -> Script:
        call = Call(
            kind,
            upstream_call.entry,
            copy.deepcopy(upstream_call.messages),
            copy.deepcopy(dict(upstream_call.params)),
            upstream_call.native,
        )
        self.calls.append(call)
        if self.on_call is not None:
            self.on_call(call)
        if not self._scripts:
            raise AssertionError(f"unexpected {kind} call to {call.entry.name}: nothing is scripted")
        script = self._scripts.popleft()
        if script.kind is not None and script.kind != kind:
            raise AssertionError(f"a {kind} call took a script for a {script.kind} call")
        script.taken.set()
        if script.release is not None:
            await script.release.wait()
        if script.refusal is not None:
            raise script.refusal
        return script

    @staticmethod
    async def _chunks(script: Script) -> AsyncIterator[Chunk]:
        try:
            for index, chunk in enumerate(script.chunks):
                gate = script.gates.get(index)
                if gate is not None:
                    await gate.wait()
                script.sent += 1
                yield copy.deepcopy(chunk)
            end = script.gates.get(len(script.chunks))
            if end is not None:
                await end.wait()
            script.ended.set()
            if script.error is not None:
                raise script.error
        finally:
            script.closed.set()


def chunk(content: str | None = None, finish_reason: str | None = None) -> Chunk:
    """A `chat.completion.chunk` with a text delta (none if `content` is None)."""
    delta = {} if content is None else {"content": content}
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion.chunk",
        "created": 1_700_000_000,
        "model": "scripted",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def completion(content: str, finish_reason: str = "stop") -> Chunk:
    """A `chat.completion` answering `content`."""
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "scripted",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }


def context_length_exceeded(window: int, counted: int) -> UpstreamError:
    """OpenAI's refusal of a prompt its tokenizer counted as `counted` tokens, as the boundary marks it."""
    return UpstreamError(
        f"This model's maximum context length is {window} tokens. However, your messages resulted in {counted} "
        "tokens. Please reduce the length of the messages.",
        status=400,
        error_type="invalid_request_error",
        param="messages",
        code=CONTEXT_LENGTH_EXCEEDED,
        context_overflow=ContextOverflow(prompt_tokens=counted, context_window=window),
    )


def rate_limited(retry_after: int = 1) -> UpstreamError:
    return UpstreamError(
        "Rate limit reached for requests.",
        status=429,
        error_type="rate_limit_error",
        code="rate_limit_exceeded",
        headers={"Retry-After": str(retry_after)},
    )


def server_error(message: str = "The upstream connection broke.") -> UpstreamError:
    return UpstreamError(message, status=502, error_type="upstream_error", code="upstream_unreachable")
