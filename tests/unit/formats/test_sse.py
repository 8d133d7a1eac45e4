"""`proxy.formats.sse`: the one SSE decoder the upstream clients read with, and its agreement with the encoder the
doors write with."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from proxy.formats.sse import SSE_DONE, SSEEvent, sse_data, sse_event, sse_events, sse_named


async def lines(items: Iterable[str]) -> AsyncIterator[str]:
    for item in items:
        yield item


async def decoded(text: str) -> list[SSEEvent]:
    # httpx's `aiter_lines` splits on any line ending and drops it, as `str.splitlines` does.
    return [event async for event in sse_events(lines(text.splitlines()))]


async def test_each_event_is_its_data_and_its_name() -> None:
    text = 'event: response.created\ndata: {"type":"response.created"}\n\ndata: {"a":1}\n\n'
    assert await decoded(text) == [
        SSEEvent('{"type":"response.created"}', "response.created"),
        SSEEvent('{"a":1}'),
    ]


async def test_data_lines_join_and_other_fields_and_comments_are_not_events() -> None:
    text = ': keep-alive\n\nid: 7\nretry: 10\ndata: {"a":\ndata:  1}\n\nevent: ping\n\n'
    events = await decoded(text)
    assert events == [SSEEvent('{"a":\n1}')]
    assert events[0].json() == {"a": 1}


async def test_an_event_cut_off_by_the_end_of_the_stream_is_still_read() -> None:
    assert await decoded('data: {"a":1}\n\nevent: done\ndata: [DONE]') == [
        SSEEvent('{"a":1}'),
        SSEEvent("[DONE]", "done"),
    ]


async def test_what_the_doors_write_is_what_the_clients_read() -> None:
    payload = {"type": "response.output_text.delta", "delta": "héllo\nworld"}
    written = sse_event(payload) + sse_named("response.output_text.delta", payload) + sse_data("{}") + SSE_DONE
    events = await decoded(written.decode())
    assert [(event.event, event.json() if event.data != "[DONE]" else event.data) for event in events] == [
        (None, payload),
        ("response.output_text.delta", payload),
        (None, {}),
        (None, "[DONE]"),
    ]
