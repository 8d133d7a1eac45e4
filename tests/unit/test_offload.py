"""Work moved off the event loop (`proxy.offload`): a JSON document of any size, made in pieces; the doors' lane,
one piece of work at a time."""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

import pytest
from starlette.responses import JSONResponse

from proxy.offload import JSON_PIECE_CHARS, OFF_LOOP_CHARS, Lane, json_pieces


def session_like(messages: int) -> dict[str, Any]:
    return {
        "id": "s-1",
        "ratio": 0.25,
        "empty": [],
        "messages": [
            {"id": f"m{n}", "content": f"ligne {n} — “quoted” \\ \n\t\u0001 " * 40, "pinned": n % 7 == 0, "x": None}
            for n in range(messages)
        ],
    }


async def joined(content: Any) -> tuple[bytes, int]:
    pieces = [piece async for piece in json_pieces(content)]
    return b"".join(pieces), len(pieces)


@pytest.mark.parametrize("content", [session_like(3), session_like(0), [], {}, "é", 7, None])
async def test_the_pieces_are_the_bytes_json_response_renders(content: Any) -> None:
    body, _ = await joined(content)
    assert body == JSONResponse(content).body


async def test_a_large_document_comes_in_pieces_and_the_event_loop_runs_between_them() -> None:
    content = session_like(2_000)
    expected = JSONResponse(content).body
    assert len(expected) > 4 * JSON_PIECE_CHARS
    observed: set[int] = set()
    pieces: list[bytes] = []
    done = False

    async def other_request() -> None:  # what else the event loop serves meanwhile
        while not done:
            observed.add(len(pieces))
            await asyncio.sleep(0)

    other = asyncio.create_task(other_request())
    await asyncio.sleep(0)
    async for piece in json_pieces(content):
        pieces.append(piece)
    done = True
    await other
    assert b"".join(pieces) == expected
    assert len(pieces) >= 4
    assert observed >= set(range(len(pieces)))  # it ran before each piece was made, in a worker thread
    assert json.loads(b"".join(pieces)) == content


async def test_a_value_json_cannot_hold_fails_as_json_response_does() -> None:
    with pytest.raises(ValueError, match="not JSON compliant"):
        JSONResponse({"x": float("nan")})
    with pytest.raises(ValueError, match="not JSON compliant"):
        await joined({"x": float("nan")})


@pytest.mark.parametrize("width", [1, 2])
async def test_a_lane_runs_large_work_in_worker_threads_width_at_a_time(width: int) -> None:
    lane = Lane(width)
    running: list[int] = []
    overlapped: list[int] = []
    threads: set[int] = set()
    lock, started, release = threading.Lock(), threading.Event(), threading.Event()

    def work(number: int) -> int:
        with lock:
            running.append(number)
            overlapped.append(len(running))
            threads.add(threading.get_ident())
            if len(running) == width:
                started.set()
        release.wait(10)
        with lock:
            running.remove(number)
        return number

    tasks = [asyncio.create_task(lane.compute(OFF_LOOP_CHARS + 1, work, n)) for n in range(5)]
    await asyncio.to_thread(started.wait, 10)
    await asyncio.sleep(0.05)  # time for the others to start, were they not waiting for their turn
    release.set()
    assert await asyncio.gather(*tasks) == [0, 1, 2, 3, 4]
    assert max(overlapped) == width
    assert threading.get_ident() not in threads


async def test_a_lane_does_small_work_at_once_on_the_event_loop() -> None:
    lane = Lane()
    assert await lane.compute(OFF_LOOP_CHARS, threading.get_ident) == threading.get_ident()
