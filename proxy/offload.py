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
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

OFF_LOOP_CHARS = 64 * 1024
"""About 40 ms of tiktoken on text without spaces; ~1 ms on prose."""


async def compute(size: int, work: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """`work(*args, **kwargs)`, on the event loop if `size` (characters it will look at) is small, else in a
    worker thread."""
    if size <= OFF_LOOP_CHARS:
        return work(*args, **kwargs)
    return await asyncio.to_thread(work, *args, **kwargs)
