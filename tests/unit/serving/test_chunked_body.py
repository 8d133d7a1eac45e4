"""`ChunkedBody`: what uvicorn's request cycle does with a body's bytes (`+=`, `len`, `bytes`), without copying."""

from __future__ import annotations

from proxy.serving.server import ChunkedBody


def test_one_chunk_is_handed_on_as_the_parsers_own_object() -> None:
    held = ChunkedBody()
    chunk = b"x" * 300_000
    held += chunk
    assert len(held) == 300_000
    assert bytes(held) is chunk


def test_chunks_that_wait_together_are_joined_in_order() -> None:
    held = ChunkedBody()
    for chunk in (b"ab", memoryview(b"cde"), b"", b"f"):
        held += chunk
    assert len(held) == 6
    assert bytes(held) == b"abcdef"


def test_an_empty_body_is_empty() -> None:
    assert len(ChunkedBody()) == 0
    assert bytes(ChunkedBody()) == b""
