"""Event streams from journaled chunks (`proxy.doors.event_streams`), what the Responses and Messages doors share:
a live answer relayed group by group and a replay all at once, rendered by the door's `ChunkRenderer` from chat
chunks, or — when the first chunk carries a native upstream's event — those events relayed whole; and a failure
after the start ending the stream in the door's own terms. Groups come from the relay's real `JournaledGroups`,
fed through its queue as `StreamRelay` feeds it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from proxy.canonical.answers import Journaled
from proxy.canonical.types import Chunk
from proxy.canonical.vocabulary import EVENT
from proxy.doors.event_streams import ChunkRenderer, Event, frames, relayed, replayed
from proxy.doors.messages.output import MessageEvents, MessageShape
from proxy.doors.responses.fields import ToolNames
from proxy.doors.responses.output import EventStream, ResponseShape
from proxy.errors import UpstreamError
from proxy.journal.relay import DONE, Backlog, JournaledGroups

STEP = 0x10


def groups(*items: Sequence[Chunk] | BaseException) -> JournaledGroups:
    """The relay's consumer side with these groups already durable, then the end (or a failure)."""
    ready = Backlog()
    ended = False
    for item in items:
        if isinstance(item, BaseException):
            ready.put(item)
            ended = True
        else:
            ready.put([Journaled(chunk, json.dumps(chunk)) for chunk in item])
    if not ended:
        ready.put(DONE)
    return JournaledGroups(ready, lambda: None)


async def collect(stream: AsyncIterator[bytes]) -> list[bytes]:
    return [frame async for frame in stream]


def parse(frame_bytes: bytes) -> list[tuple[str, Event]]:
    """SSE frames as (event name, data); the name must be the data's own type."""
    events = []
    for block in frame_bytes.decode().split("\n\n"):
        if not block:
            continue
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ")
        assert data_line.startswith("data: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == name_line.removeprefix("event: ")
        events.append((name_line.removeprefix("event: "), data))
    return events


def names(frame_list: list[bytes]) -> list[list[str]]:
    return [[name for name, _ in parse(frame)] for frame in frame_list]


def responses() -> EventStream:
    return EventStream(ResponseShape(STEP, 1_700_000_000.0, "coder", {}, ToolNames()))


def messages() -> MessageEvents:
    return MessageEvents(MessageShape(STEP, "claude", 10))


def text(content: str, finish: str | None = None) -> Chunk:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": finish}],
    }


def native(event: dict[str, Any]) -> Chunk:
    """A chunk from a native upstream: its event whole, beside the chat delta it amounts to."""
    return {"object": "chat.completion.chunk", EVENT: event, "choices": [{"index": 0, "delta": {}}]}


def test_frames_name_each_event() -> None:
    assert frames([{"type": "ping"}, {"type": "message_stop", "x": "é"}]) == (
        b'event: ping\ndata: {"type":"ping"}\n\n'
        + 'event: message_stop\ndata: {"type":"message_stop","x":"é"}\n\n'.encode()
    )


async def test_a_live_chat_answer_is_rendered_group_by_group() -> None:
    relay = groups([text("Hel")], [text("lo")], [text("", "stop")])
    frame_list = await collect(relayed(responses(), relay))
    assert names(frame_list) == [
        ["response.created", "response.in_progress"],
        ["response.output_item.added", "response.content_part.added", "response.output_text.delta"],
        ["response.output_text.delta"],
        # the finishing chunk renders nothing by itself: no empty frame is yielded for it
        ["response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"],
    ]
    events = [event for frame in frame_list for _, event in parse(frame)]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Hello"


async def test_the_same_answer_relayed_and_replayed_says_the_same() -> None:
    chunks = [text("Hel"), text("lo"), text("", "stop")]
    for renderer in (responses, messages):
        live = b"".join(await collect(relayed(renderer(), groups(*[[chunk] for chunk in chunks]))))
        again = await collect(replayed(renderer(), chunks))
        assert len(again) == 1  # a replay is sent at once
        assert again[0] == live


async def test_a_native_stream_s_events_are_relayed_whole_under_the_proxy_s_id() -> None:
    created = {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_up", "status": "in_progress"}}
    delta = {
        "type": "response.output_text.delta",
        "sequence_number": 1,
        "item_id": "msg_up",
        "delta": "Hi",
        "extra": [1],
    }
    completed = {
        "type": "response.completed",
        "sequence_number": 2,
        "response": {"id": "resp_up", "status": "completed"},
    }
    frame_list = await collect(relayed(responses(), groups([native(created), native(delta)], [native(completed)])))
    events = [event for frame in frame_list for _, event in parse(frame)]
    assert events == [
        {**created, "response": {"id": "resp_0000000000000010", "status": "in_progress"}},
        delta,  # not one of the renderer's own: no created/in_progress/completed added, sequence as sent
        {**completed, "response": {"id": "resp_0000000000000010", "status": "completed"}},
    ]
    assert len(frame_list) == 2


async def test_a_native_anthropic_stream_is_relayed_and_replayed_whole() -> None:
    start: dict[str, Any] = {"type": "message_start", "message": {"id": "msg_up", "type": "message", "content": []}}
    thinking = {"type": "content_block_start", "index": 0, "content_block": {"type": "thinking", "thinking": ""}}
    stop = {"type": "message_stop"}
    chunks = [native(start), native(thinking), native(stop)]
    live = await collect(relayed(messages(), groups(chunks)))
    expected = [
        ("message_start", {**start, "message": {**start["message"], "id": "msg_0000000000000010"}}),
        ("content_block_start", thinking),
        ("message_stop", stop),
    ]
    assert [event for frame in live for event in parse(frame)] == expected
    assert [event for frame in await collect(replayed(messages(), chunks)) for event in parse(frame)] == expected


async def test_a_failure_after_the_start_ends_the_stream_in_the_door_s_terms() -> None:
    failure = UpstreamError("The upstream timed out.", status=504, code="upstream_timeout")
    frame_list = await collect(relayed(responses(), groups([text("Part")], failure)))
    assert names(frame_list)[-1] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.failed",
    ]
    failed = parse(frame_list[-1])[-1][1]["response"]
    assert failed["error"] == {"code": "upstream_timeout", "message": "The upstream timed out."}
    assert "response.completed" not in {name for frame in names(frame_list) for name in frame}

    anthropic = await collect(relayed(messages(), groups([text("Part")], UpstreamError("busy", status=529))))
    assert names(anthropic)[-1] == ["content_block_stop", "error"]
    assert parse(anthropic[-1])[-1][1] == {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    assert "message_stop" not in {name for frame in names(anthropic) for name in frame}


async def test_a_failure_before_the_first_group_still_opens_the_stream() -> None:
    """The SDKs expect `response.created` first: a stream that fails at once opens, then fails."""
    frame_list = await collect(relayed(responses(), groups(UpstreamError("refused", status=502))))
    assert names(frame_list) == [["response.created", "response.in_progress", "response.failed"]]
    anthropic = await collect(relayed(messages(), groups(UpstreamError("refused", status=502))))
    assert names(anthropic) == [["message_start", "error"]]


async def test_a_native_stream_that_fails_is_not_opened_again() -> None:
    created = {"type": "response.created", "sequence_number": 0, "response": {"id": "resp_up"}}
    frame_list = await collect(relayed(responses(), groups([native(created)], UpstreamError("cut", status=502))))
    assert names(frame_list) == [["response.created"], ["response.failed"]]


async def test_an_empty_chat_answer_still_opens_and_finishes() -> None:
    assert names(await collect(relayed(messages(), groups()))) == [["message_start", "message_delta", "message_stop"]]
    assert names(await collect(replayed(messages(), []))) == [["message_start", "message_delta", "message_stop"]]


class Recorder(ChunkRenderer):
    """The hooks `feed` calls, recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, ...]] = []

    def text(self, content: str) -> list[Event]:
        self.calls.append(("text", content))
        return [{"type": "text"}]

    def call(self, position: int, delta: Mapping[str, Any]) -> list[Event]:
        self.calls.append(("call", position, dict(delta)))
        return [{"type": "call"}]


def test_feed_reads_choice_zero_s_text_calls_finish_and_usage() -> None:
    recorder = Recorder()
    usage = {"prompt_tokens": 3, "completion_tokens": 2}
    events = recorder.feed(
        [
            {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},  # nothing said yet
            {"choices": [{"index": 1, "delta": {"content": "another choice"}}]},
            {"choices": [{"index": 0, "delta": {"content": "hi", "tool_calls": [{"index": 0}, {"index": 1}]}}]},
            {"choices": [{"delta": {"content": "!"}, "finish_reason": "tool_calls"}]},  # index defaults to 0
            {"choices": [], "usage": usage},
            {"choices": [{"index": 0, "message": {"content": "whole"}}]},  # a completion reads like a delta
        ]
    )
    assert recorder.calls == [
        ("text", "hi"),
        ("call", 0, {"index": 0}),
        ("call", 1, {"index": 1}),
        ("text", "!"),
        ("text", "whole"),
    ]
    assert events == [{"type": "text"}, {"type": "call"}, {"type": "call"}, {"type": "text"}, {"type": "text"}]
    assert recorder.finish_reason == "tool_calls"
    assert recorder.usage == usage
