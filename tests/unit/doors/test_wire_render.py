"""Rendering an answer on the chat-completions wire: SSE framing (`proxy.doors.sse`), the X-Context-* report
headers (`proxy.doors.context_headers`), and `proxy.doors.chat.render` for completed, replayed and streamed
answers — exact bytes, headers, errors after the first byte, and an early stop by the client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator, Sequence

import pytest
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Message

from proxy.canonical.answers import (
    Completed,
    ContextReport,
    Journaled,
    Replayed,
    StepRef,
    Streaming,
    compact_count,
    usage_text,
)
from proxy.canonical.types import Chunk
from proxy.doors.chat import render
from proxy.doors.context_headers import REPLAY_HEADER, report_headers
from proxy.doors.sse import SSE_DONE, SSE_HEADERS, SSE_MEDIA_TYPE, sse_data, sse_event
from proxy.errors import UpstreamError
from proxy.journal.steps import StepRecord, StepStatus

REPORT = ContextReport(session_id="sess-1", prompt_tokens=50_000, budget=129_000, history_tokens=48_000, summaries=2)
REPORT_HEADERS = {
    "x-session-id": "sess-1",
    "x-context-tokens": "50000",
    "x-context-budget": "129000",
    "x-context-history-tokens": "48000",
    "x-context-summaries": "2",
    "x-context-usage": "50k / 129k (39%) [2S]",
}
TIMEOUT_S = 5


def chunk(content: str, finish: str | None = None) -> Chunk:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
    }


def journaled(item: Chunk) -> Journaled:
    # The journal's stored text is compact JSON; a distinctive spacing proves render relays it verbatim.
    return Journaled(item, json.dumps(item, separators=(", ", ": ")))


STEP = StepRef(7, 1.0)


def replay_of(record: StepRecord, chunks: list[Chunk]) -> Replayed:
    """What the pipeline answers a keyed retry with, for a step of `record`'s report."""
    report = ContextReport.from_json(record.session_id or "", record.context)
    return Replayed(chunks, report, StepRef(record.id, record.created_at))


def record(session_id: str | None = "sess-r") -> StepRecord:
    return StepRecord(
        id=7,
        tenant="open",
        session_id=session_id,
        model="m",
        stream=True,
        status=StepStatus.SEALED,
        created_at=1.0,
        sealed_at=2.0,
        content="Hi",
        tool_calls=None,
        finish_reason="stop",
        usage=None,
        error=None,
        message_id="msg",
        events=2,
    )


async def groups_of(*groups: Sequence[Journaled]) -> AsyncGenerator[Sequence[Journaled], None]:
    for group in groups:
        yield group


async def read_body(response: Response) -> bytes:
    assert isinstance(response, StreamingResponse)
    parts: list[bytes] = []
    async with asyncio.timeout(TIMEOUT_S):
        async for part in response.body_iterator:
            assert isinstance(part, bytes)
            parts.append(part)
    return b"".join(parts)


def events_of(body: bytes) -> list[bytes]:
    assert body.endswith(b"\n\n")
    return [event + b"\n\n" for event in body[:-2].split(b"\n\n")]


def assert_sse(response: Response) -> None:
    assert isinstance(response, StreamingResponse)
    assert response.media_type == SSE_MEDIA_TYPE
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"


# --- sse -----------------------------------------------------------------------------------------------------


def test_sse_data_frames_text_verbatim() -> None:
    assert sse_data('{"a": 1}') == b'data: {"a": 1}\n\n'


def test_sse_data_encodes_utf8() -> None:
    assert sse_data('{"t":"héllo ✓"}') == 'data: {"t":"héllo ✓"}\n\n'.encode()


def test_sse_event_is_compact_json_without_ascii_escapes() -> None:
    event = sse_event({"content": "é", "n": [1, 2]})
    assert event == 'data: {"content":"é","n":[1,2]}\n\n'.encode()
    assert json.loads(event.removeprefix(b"data: ")) == {"content": "é", "n": [1, 2]}


def test_sse_done_and_headers() -> None:
    assert SSE_DONE == b"data: [DONE]\n\n"
    assert SSE_MEDIA_TYPE == "text/event-stream"
    assert SSE_HEADERS["Cache-Control"] == "no-cache"


# --- report headers ------------------------------------------------------------------------------------------


def test_report_headers() -> None:
    assert report_headers(REPORT) == {
        "X-Session-Id": "sess-1",
        "X-Context-Tokens": "50000",
        "X-Context-Budget": "129000",
        "X-Context-History-Tokens": "48000",
        "X-Context-Summaries": "2",
        "X-Context-Recalled": "0",
        "X-Context-Usage": "50k / 129k (39%) [2S]",
    }


def test_report_headers_without_summaries() -> None:
    report = ContextReport(session_id="s", prompt_tokens=2_100, budget=129_000, history_tokens=0, summaries=0)
    headers = report_headers(report)
    assert headers["X-Context-Summaries"] == "0"
    assert headers["X-Context-Usage"] == "2.1k / 129k (2%)"


@pytest.mark.parametrize(
    ("tokens", "budget", "summaries", "expected"),
    [
        (50_000, 129_000, 2, "50k / 129k (39%) [2S]"),
        (1_500, 129_000, 0, "1.5k / 129k (1%)"),
        (0, 8_000, 0, "0 / 8k (0%)"),
        (129_000, 129_000, 1, "129k / 129k (100%) [1S]"),
        (140_000, 100_000, 0, "140k / 100k (140%)"),
        (5, 0, 0, "5 / 0 (100%)"),
    ],
)
def test_usage_text(tokens: int, budget: int, summaries: int, expected: str) -> None:
    assert usage_text(tokens, budget, summaries) == expected


@pytest.mark.parametrize(
    ("tokens", "expected"),
    [
        (0, "0"),
        (999, "999"),
        (1_000, "1k"),
        (1_049, "1k"),
        (1_060, "1.1k"),
        (2_100, "2.1k"),
        (9_940, "9.9k"),
        (10_000, "10k"),
        (129_000, "129k"),
        (128_400, "128k"),
        (1_000_000, "1M"),
        (1_500_000, "1.5M"),
        (2_000_000, "2M"),
    ],
)
def test_compact_count(tokens: int, expected: str) -> None:
    assert compact_count(tokens) == expected


# --- render: Completed ---------------------------------------------------------------------------------------


def test_render_completed_is_json_with_report_headers() -> None:
    completion: Chunk = {
        "id": "chatcmpl-9",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "é ok"}, "finish_reason": "stop"}],
    }
    for stream in (False, True):
        response = render(Completed(completion, REPORT, STEP), stream)
        assert isinstance(response, JSONResponse)
        assert response.status_code == 200
        assert response.media_type == "application/json"
        assert json.loads(response.body) == completion
        for name, value in REPORT_HEADERS.items():
            assert response.headers[name] == value
        assert REPLAY_HEADER.lower() not in response.headers


# --- render: Replayed ----------------------------------------------------------------------------------------


def test_render_replayed_json() -> None:
    completion: Chunk = {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
    }
    response = render(replay_of(record(), [completion]), False)
    assert isinstance(response, JSONResponse)
    assert json.loads(response.body) == completion
    assert response.headers["x-context-replay"] == "true"
    assert response.headers["x-session-id"] == "sess-r"
    assert "x-context-tokens" not in response.headers


def test_render_replayed_without_session_has_no_session_header() -> None:
    response = render(replay_of(record(session_id=None), [{"object": "chat.completion", "choices": []}]), False)
    assert response.headers["x-context-replay"] == "true"
    assert "x-session-id" not in response.headers


async def test_render_replayed_stream() -> None:
    chunks = [chunk("Hé"), chunk("llo", "stop"), {"object": "chat.completion.chunk", "choices": [], "usage": None}]
    response = render(replay_of(record(), chunks), True)
    assert_sse(response)
    assert response.headers["x-context-replay"] == "true"
    assert response.headers["x-session-id"] == "sess-r"
    body = await read_body(response)
    assert body == b"".join(sse_event(item) for item in chunks) + b"data: [DONE]\n\n"
    events = events_of(body)
    assert len(events) == 4
    assert [json.loads(e.removeprefix(b"data: ")) for e in events[:3]] == chunks
    assert events[-1] == SSE_DONE


# --- render: Streaming ---------------------------------------------------------------------------------------


async def test_render_streaming_relays_stored_text_then_done() -> None:
    first = [journaled(chunk("Hel")), journaled(chunk("lo"))]
    second = [journaled(chunk("", "stop"))]
    response = render(Streaming(groups_of(first, second), REPORT, STEP), True)
    assert_sse(response)
    for name, value in REPORT_HEADERS.items():
        assert response.headers[name] == value
    body = await read_body(response)
    expected = b"".join(b"data: " + item.text.encode() + b"\n\n" for item in [*first, *second]) + b"data: [DONE]\n\n"
    assert body == expected
    assert events_of(body)[-1] == b"data: [DONE]\n\n"


async def test_render_streaming_one_write_per_group() -> None:
    first = [journaled(chunk("a")), journaled(chunk("b"))]
    second = [journaled(chunk("c"))]
    response = render(Streaming(groups_of(first, second), REPORT, STEP), True)
    assert isinstance(response, StreamingResponse)
    parts = [part async for part in response.body_iterator]
    assert parts == [
        sse_data(first[0].text) + sse_data(first[1].text),
        sse_data(second[0].text),
        SSE_DONE,
    ]


async def test_render_streaming_empty_stream_is_just_done() -> None:
    response = render(Streaming(groups_of(), REPORT, STEP), True)
    assert await read_body(response) == b"data: [DONE]\n\n"


async def test_render_streaming_error_after_first_group() -> None:
    group = [journaled(chunk("partial"))]

    async def failing() -> AsyncGenerator[Sequence[Journaled], None]:
        yield group
        raise UpstreamError("The upstream went away.", status=502, code="upstream_gone", error_type="api_error")

    response = render(Streaming(failing(), REPORT, STEP), True)
    body = await read_body(response)
    events = events_of(body)
    assert events[0] == sse_data(group[0].text)
    assert len(events) == 2
    assert b"[DONE]" not in body
    error = json.loads(events[1].removeprefix(b"data: "))
    assert error == {
        "error": {"message": "The upstream went away.", "type": "api_error", "param": None, "code": "upstream_gone"}
    }


async def test_render_streaming_unexpected_error_leaks_nothing() -> None:
    async def failing() -> AsyncGenerator[Sequence[Journaled], None]:
        yield [journaled(chunk("x"))]
        raise RuntimeError("secret-key-sk-123 in a traceback")

    body = await read_body(render(Streaming(failing(), REPORT, STEP), True))
    events = events_of(body)
    assert len(events) == 2
    error = json.loads(events[1].removeprefix(b"data: "))["error"]
    assert error["code"] == "internal_error"
    assert b"secret-key" not in body
    assert b"[DONE]" not in body


async def test_render_streaming_client_leaving_mid_body_closes_the_groups() -> None:
    produced: list[int] = []
    closed = asyncio.Event()

    async def endless() -> AsyncGenerator[Sequence[Journaled], None]:
        try:
            for index in range(1_000):
                produced.append(index)
                yield [journaled(chunk(str(index)))]
        finally:
            closed.set()

    response = render(Streaming(endless(), REPORT, STEP), True)  # type: ignore[arg-type]
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)
        if message["type"] == "http.response.body":
            raise OSError("the client is gone")

    async def receive() -> Message:
        await asyncio.sleep(60)
        return {"type": "http.disconnect"}

    with pytest.raises(ClientDisconnect):
        async with asyncio.timeout(5):
            await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
    assert closed.is_set()
    assert produced == [0]
    assert [message["type"] for message in sent] == ["http.response.start", "http.response.body"]


async def test_render_streaming_closes_groups_at_the_end() -> None:
    closed: list[str] = []

    async def tracked() -> AsyncGenerator[Sequence[Journaled], None]:
        try:
            yield [journaled(chunk("only"))]
        finally:
            closed.append("closed")

    body = await read_body(render(Streaming(tracked(), REPORT, STEP), True))
    assert body.endswith(SSE_DONE)
    assert closed == ["closed"]
