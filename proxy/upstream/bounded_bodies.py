"""Every upstream body is read bounded: the httpx transport both upstream routes are given.

An error body (and, for a non-stream call, an event stream) reaches LiteLLM cut to `LITELLM_READ_BYTES`: what
LiteLLM does with such a body (its secret redaction, its error classification: several regular-expression passes)
costs time in proportion to its size, on the event loop — a 10 MB body stalled every request for ~24 s. The rest
of it is never read, and the connection is closed.

An answer is bounded by `limits.max_answer_chars`, in bytes, before anything parses it: a non-stream body past
`answer_byte_cap` of them, or one line of an event stream past it (a single huge SSE event, which the line
decoders would gather whole), raises `AnswerTooLarge` from the body's reader. The bytes allowed per character are
JSON's worst (`\\uXXXX`), so no answer within the limit is refused here; one between the limit and the cap is
refused by the pipeline or the relay, which count characters, and keeps only the limit's worth.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx

from proxy.errors import AnswerTooLarge
from proxy.upstream.redaction import CUT_MARK

EVENT_STREAM = "text/event-stream"
CUT_HEADERS = ("content-length", "content-encoding", "transfer-encoding")
LITELLM_READ_BYTES = 8 * 1024
"""The most of an error body LiteLLM is given: its passes over it cost ~8 µs a byte on the event loop (measured:
68 KB stalled the loop ~0.6 s), so it gets less than the cap on what the proxy keeps of an upstream's text."""
BYTES_PER_CHAR = 6
"""A character's most bytes in JSON text: a `\\uXXXX` escape."""
ENVELOPE_BYTES = 64 * 1024
"""Room for what surrounds the text in an answer or an event (ids, usage, a tool call's name)."""


def answer_byte_cap(max_answer_chars: int) -> int:
    """The most bytes a non-stream answer, or one line of a stream, may take for `max_answer_chars` of text."""
    return max_answer_chars * BYTES_PER_CHAR + ENVELOPE_BYTES


class BoundedBodies(httpx.AsyncBaseTransport):
    """Cuts error bodies for LiteLLM (`cut_errors`), refuses an event stream to a non-stream call (`json_only`),
    and bounds every answer's body (a whole JSON body, or each line of an event stream) by `max_answer_chars`."""

    def __init__(
        self, inner: httpx.AsyncBaseTransport, *, json_only: bool, max_answer_chars: int, cut_errors: bool = True
    ) -> None:
        self._inner = inner
        self._json_only = json_only
        self._cut_errors = cut_errors
        self._max_answer_chars = max_answer_chars

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self._inner.handle_async_request(request)
        streamed = response.headers.get("content-type", "").startswith(EVENT_STREAM)
        if response.status_code >= 400:
            return await _cut(response, request) if self._cut_errors else response
        if self._json_only and streamed:
            return await _cut(response, request)
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        response.stream = CappedStream(stream, self._max_answer_chars, per_line=streamed)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class CappedStream(httpx.AsyncByteStream):
    """A response body that raises `AnswerTooLarge` once it (or, `per_line`, one of its lines) passes the cap."""

    def __init__(self, inner: httpx.AsyncByteStream, max_answer_chars: int, *, per_line: bool) -> None:
        self._inner = inner
        self._limit = max_answer_chars
        self._cap = answer_byte_cap(max_answer_chars)
        self._per_line = per_line

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for part in self._inner:
            if self._per_line:
                newline = part.rfind(b"\n")
                size = len(part) - newline - 1 if newline >= 0 else size + len(part)
            else:
                size += len(part)
            if size > self._cap:
                raise AnswerTooLarge(self._limit)
            yield part

    async def aclose(self) -> None:
        await self._inner.aclose()


async def _cut(response: httpx.Response, request: httpx.Request) -> httpx.Response:
    """The response with its body cut to `LITELLM_READ_BYTES` (marked as cut); the rest is never read."""
    head = bytearray()
    cut = b""
    try:
        async for part in response.aiter_raw():
            head += part
            if len(head) > LITELLM_READ_BYTES:
                cut = CUT_MARK.encode()
                break
    finally:
        await response.aclose()
    headers = [(name, value) for name, value in response.headers.items() if name.lower() not in CUT_HEADERS]
    content = bytes(head[:LITELLM_READ_BYTES]) + cut
    return httpx.Response(response.status_code, headers=headers, content=content, request=request)


def answer_too_large(exc: BaseException) -> AnswerTooLarge | None:
    """The `AnswerTooLarge` a body's reader raised, however LiteLLM wrapped it on its way out."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, AnswerTooLarge):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None
