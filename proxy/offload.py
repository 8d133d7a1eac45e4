"""CPU work proportional to what a client sent runs off the event loop once it is big enough to be felt.

Parsing a body, hashing and counting its messages, sealing an answer: each costs little for an ordinary turn
and seconds for a hostile one (tiktoken takes ~0.65 s per million characters without spaces), and while the
event loop computes, every other client waits — even for `/healthz`. Past `OFF_LOOP_CHARS` the work goes to
a worker thread; below it the hop would cost more than the work. Code that runs there is pure Python or
releases the GIL (tiktoken, hashlib, sqlite3), so the event loop gets the interpreter back every few
milliseconds (`sys.getswitchinterval`) however long the work takes. Only C calls that hold the GIL for their
whole run escape this, so they are kept bounded: `json.loads` is used inline for small bodies only
(`proxy.doors.body`), and one message's size is limited (`limits.max_message_chars`).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

OFF_LOOP_CHARS = 64 * 1024
"""About 40 ms of tiktoken on text without spaces; ~1 ms on prose."""

JSON_PIECE_CHARS = 256 * 1024
"""What `json_pieces` makes per hop to a worker thread: ~400 hops for a 100 MB document."""


async def compute(size: int, work: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`work(*args, **kwargs)`, on the event loop if `size` (characters it will look at) is small, else in a
    worker thread."""
    if size <= OFF_LOOP_CHARS:
        return work(*args, **kwargs)
    return await asyncio.to_thread(work, *args, **kwargs)


class Lane:
    """Work that keeps a processor busy from end to end runs in worker threads `width` at a time. Threads running
    Python take the GIL in turns of `sys.getswitchinterval` (5 ms), and the event loop has to win it back after
    each wait for I/O against every one of them: with four bodies of many values parsed at once, a health check
    waited ~0.35 s. Work that releases the GIL (tiktoken) still takes a processor: six threads counting 40
    answers at once left the event loop's thread a third of one, and `/healthz` unanswered for seconds. In a
    lane such work finishes as soon in all (the GIL, or the processors, ran no more of it anyway) and the loop
    competes with `width` threads at most. Built once, by what owns the work (the doors' parsing, the answers'
    counting)."""

    def __init__(self, width: int = 1) -> None:
        self._turns = asyncio.Semaphore(width)

    async def compute(self, size: int, work: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """As `compute`, a worker thread's turn taken after the work before it in the lane."""
        if size <= OFF_LOOP_CHARS:
            return work(*args, **kwargs)
        async with self._turns:
            return await asyncio.to_thread(work, *args, **kwargs)


def usable_cpus() -> int:
    """The processors this process may run on (a container's share, where the system says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


async def json_pieces(content: Any) -> AsyncIterator[bytes]:
    """`content` as compact UTF-8 JSON (as Starlette's `JSONResponse` renders it), made a piece at a time in a
    worker thread: for a document of any size, such as a whole session (~100 MB after 1,000 agent turns). The C
    encoder, and joining its output, each hold the GIL for the whole document (~0.5 s there, every other request
    waiting); the standard library's pure-Python encoder goes value by value, and each piece is joined alone."""
    pieces = _json_pieces(content)
    while (piece := await asyncio.to_thread(next, pieces, None)) is not None:
        yield piece


def _json_pieces(content: Any) -> Iterator[bytes]:
    encoder = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    batch: list[str] = []
    size = 0
    for chunk in encoder.iterencode(content):  # not `_one_shot`: the pure-Python encoder, strings escaped in C
        batch.append(chunk)
        size += len(chunk)
        if size >= JSON_PIECE_CHARS:
            yield "".join(batch).encode()
            batch, size = [], 0
    if batch:
        yield "".join(batch).encode()
