"""A body read against earlier ones: its bytes exactly, sharing the longest run any of them began with."""

from __future__ import annotations

import random

import pytest

from proxy.canonical.pieces import MAX_PIECES, Pieces, Reading, Received


def read(data: bytes, earlier: list[Pieces], rng: random.Random) -> Received:
    """`data` in chunks of random sizes, as a socket gives them."""
    reading = Reading(earlier)
    start = 0
    while start < len(data):
        size = rng.randrange(1, 12)
        reading.add(data[start : start + size])
        start += size
    return reading.received()


def common(a: bytes, b: bytes) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


@pytest.mark.parametrize("seed", range(4))
def test_a_body_read_against_earlier_ones_is_its_bytes_sharing_the_longest_run(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(400):
        earlier: list[Pieces] = []
        data = b""
        for _ in range(rng.randrange(1, 6)):  # each body cut from the last and grown: pieces of pieces
            data = data[: rng.randrange(len(data) + 1)] + bytes(rng.choice(b"ab") for _ in range(rng.randrange(30)))
            received = read(data, earlier, rng)
            assert received.body.tobytes() == data
            best = max((common(body.tobytes(), data) for body in earlier if len(body)), default=0)
            assert received.shared == best
            assert received.fresh == len(data) - best
            if received.base is not None:
                assert received.base.tobytes()[:best] == data[:best]
            for start in range(0, len(data) + 1, 3):
                assert received.body.tobytes(start) == data[start:]
                for stop in range(start, len(data) + 1, 5):
                    assert b"".join(received.body.views(start, stop)) == data[start:stop]
            earlier.insert(0, received.body)


def test_a_body_read_against_none_is_one_piece_and_the_very_bytes() -> None:
    data = b'{"messages":[]}'
    received = read(data, [], random.Random(0))
    assert (received.base, received.shared, received.fresh) == (None, 0, len(data))
    assert received.body.tobytes() == data


def test_a_session_of_many_requests_keeps_its_pieces_bounded() -> None:
    rng = random.Random(5)
    body = Pieces.of(b"[")
    for turn in range(3 * MAX_PIECES):
        data = body.tobytes() + b"%d," % turn
        received = read(data, [body], rng)
        assert received.shared == len(data) - len(b"%d," % turn)
        body = received.body
        assert len(body.views(0, len(body))) <= MAX_PIECES
    assert body.tobytes() == b"[" + b"".join(b"%d," % turn for turn in range(3 * MAX_PIECES))


def test_bodies_hold_the_same_memory_up_to_where_their_runs_part() -> None:
    one, two = b"a" * 100, b"b" * 10
    other = bytes(bytearray(one))
    body = Pieces([(one, 0, 100), (two, 0, 10)])
    assert body.same_memory(Pieces([(one, 0, 100), (two, 0, 4)])) == 104
    assert body.same_memory(Pieces([(one, 0, 50), (two, 0, 10)])) == 50  # equal bytes after, other memory
    assert body.same_memory(Pieces([(other, 0, 100), (two, 0, 10)])) == 0  # equal bytes, other memory
    assert body.same_memory(Pieces([(one, 1, 100)])) == 0
    assert body.same_memory(body) == len(body)
