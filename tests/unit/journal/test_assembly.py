"""Assembling an answer from its chunks (`proxy.journal.assembly`): text, tool calls by index, finish_reason,
usage, and the assistant message stored in history — alike for a stream and a chat.completion."""

from __future__ import annotations

from typing import Any

from proxy.canonical.types import Chunk
from proxy.journal.assembly import PIECES_PER_BLOCK, Assembly, assemble

USAGE = {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}


def delta(finish: str | None = None, index: int = 0, **fields: Any) -> Chunk:
    return {
        "object": "chat.completion.chunk",
        "choices": [{"index": index, "delta": fields, "finish_reason": finish}],
    }


def fragment(
    arguments: str = "",
    *,
    index: int | None = None,
    call_id: str | None = None,
    name: str | None = None,
    call_type: str | None = None,
) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if name is not None:
        function["name"] = name
    piece: dict[str, Any] = {"function": function}
    if index is not None:
        piece["index"] = index
    if call_id is not None:
        piece["id"] = call_id
    if call_type is not None:
        piece["type"] = call_type
    return piece


# --- text ----------------------------------------------------------------------------------------------------


def test_text_deltas_are_joined_in_order() -> None:
    assembly = assemble(
        [delta(role="assistant", content=""), delta(content="Hel"), delta(content="lo, "), delta(content="world")]
    )
    assert assembly.content == "Hello, world"
    assert assembly.text.value() == "Hello, world"


def test_content_is_none_without_text() -> None:
    assembly = assemble([delta(role="assistant"), delta(content=""), delta(content=None), delta("stop")])
    assert assembly.content is None
    assert assembly.text.value() == ""


def test_nothing_assembled_from_no_chunks() -> None:
    assembly = assemble([])
    assert assembly.content is None
    assert assembly.tool_calls is None
    assert assembly.finish_reason is None
    assert assembly.usage is None
    assert assembly.message() == {"role": "assistant", "content": None}


def test_non_string_content_is_ignored() -> None:
    assembly = assemble([delta(content="a"), delta(content=[{"type": "text", "text": "x"}]), delta(content="b")])
    assert assembly.content == "ab"


def test_add_grows_the_assembly_chunk_by_chunk() -> None:
    assembly = Assembly()
    assembly.add(delta(content="one "))
    assert assembly.content == "one "
    assembly.add(delta(content="two"))
    assert assembly.content == "one two"


# --- finish_reason and usage -----------------------------------------------------------------------------------


def test_finish_reason_is_taken_from_the_chunk_that_carries_it() -> None:
    assembly = assemble([delta(content="hi"), delta("length"), delta(None)])
    assert assembly.finish_reason == "length"


def test_finish_reason_none_until_one_arrives() -> None:
    assert assemble([delta(content="hi")]).finish_reason is None


def test_usage_only_chunk() -> None:
    assembly = assemble(
        [delta(content="hi"), delta("stop"), {"object": "chat.completion.chunk", "choices": [], "usage": USAGE}]
    )
    assert assembly.usage == USAGE
    assert assembly.content == "hi"
    assert assembly.finish_reason == "stop"


def test_usage_alone_assembles_no_message_content() -> None:
    assembly = assemble([{"choices": [], "usage": USAGE}])
    assert assembly.usage == USAGE
    assert assembly.content is None
    assert assembly.tool_calls is None


def test_latest_usage_wins_and_null_usage_is_ignored() -> None:
    later = {**USAGE, "completion_tokens": 4, "total_tokens": 16}
    assembly = assemble(
        [{"choices": [], "usage": USAGE}, {**delta(content="x"), "usage": None}, {"choices": [], "usage": later}]
    )
    assert assembly.usage == later


# --- only choice 0 -------------------------------------------------------------------------------------------


def test_only_choice_zero_is_assembled() -> None:
    chunk: Chunk = {
        "choices": [
            {
                "index": 1,
                "delta": {"content": "other", "tool_calls": [fragment("{}", index=0, call_id="c9", name="f")]},
                "finish_reason": "tool_calls",
            },
            {"index": 0, "delta": {"content": "mine"}, "finish_reason": None},
        ]
    }
    assembly = assemble([chunk, delta(content="!", index=2), delta("length", index=1)])
    assert assembly.content == "mine"
    assert assembly.tool_calls is None
    assert assembly.finish_reason is None


def test_choice_without_index_counts_as_choice_zero() -> None:
    assembly = assemble([{"choices": [{"delta": {"content": "no index"}, "finish_reason": "stop"}]}])
    assert assembly.content == "no index"
    assert assembly.finish_reason == "stop"


def test_chunks_without_choices_are_harmless() -> None:
    assembly = assemble(
        [
            {"object": "chat.completion.chunk"},
            {"choices": None},
            delta(content="ok"),
            {"choices": [{"index": 0, "delta": None, "finish_reason": None}]},
        ]
    )
    assert assembly.content == "ok"


# --- tool calls ----------------------------------------------------------------------------------------------


def test_tool_call_fragments_assembled_by_index() -> None:
    chunks = [
        delta(tool_calls=[fragment("", index=0, call_id="call_a", name="weather", call_type="function")]),
        delta(tool_calls=[fragment('{"city": ', index=0)]),
        delta(tool_calls=[fragment('"Paris"}', index=0)]),
        delta(tool_calls=[fragment("{", index=1, call_id="call_b", name="time", call_type="function")]),
        delta(tool_calls=[fragment("}", index=1)]),
        delta("tool_calls"),
    ]
    assembly = assemble(chunks)
    assert assembly.tool_calls == [
        {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "time", "arguments": "{}"}},
    ]
    assert assembly.finish_reason == "tool_calls"
    assert assembly.content is None


def test_interleaved_fragments_go_to_their_own_call() -> None:
    chunks = [
        delta(
            tool_calls=[fragment("[1", index=0, call_id="a", name="f"), fragment("[2", index=1, call_id="b", name="g")]
        ),
        delta(tool_calls=[fragment(",", index=1)]),
        delta(tool_calls=[fragment(",", index=0)]),
        delta(tool_calls=[fragment("3]", index=1), fragment("4]", index=0)]),
    ]
    calls = assemble(chunks).tool_calls
    assert calls is not None
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in calls] == [
        ("a", "f", "[1,4]"),
        ("b", "g", "[2,3]"),
    ]


def test_tool_calls_are_ordered_by_index_not_arrival() -> None:
    chunks = [
        delta(tool_calls=[fragment("{}", index=2, call_id="third", name="c")]),
        delta(tool_calls=[fragment("{}", index=0, call_id="first", name="a")]),
    ]
    calls = assemble(chunks).tool_calls
    assert calls is not None
    assert [c["id"] for c in calls] == ["first", "third"]


def test_id_and_name_come_from_the_first_fragment() -> None:
    chunks = [
        delta(tool_calls=[fragment("{", index=0, call_id="call_first", name="first_name", call_type="function")]),
        delta(tool_calls=[fragment("}", index=0, call_id="call_later", name="later_name")]),
    ]
    calls = assemble(chunks).tool_calls
    assert calls == [{"id": "call_first", "type": "function", "function": {"name": "first_name", "arguments": "{}"}}]


def test_tool_call_without_id_gets_one_from_its_index() -> None:
    calls = assemble([delta(tool_calls=[fragment("{}", index=3, name="f")])]).tool_calls
    assert calls == [{"id": "call_3", "type": "function", "function": {"name": "f", "arguments": "{}"}}]


def test_type_defaults_to_function() -> None:
    calls = assemble([delta(tool_calls=[fragment("{}", index=0, call_id="x", name="f")])]).tool_calls
    assert calls is not None
    assert calls[0]["type"] == "function"


def test_calls_without_index_use_their_position() -> None:
    chunk = delta(tool_calls=[fragment('{"a":1}', call_id="p0", name="f"), fragment('{"b":2}', call_id="p1", name="g")])
    calls = assemble([chunk]).tool_calls
    assert calls == [
        {"id": "p0", "type": "function", "function": {"name": "f", "arguments": '{"a":1}'}},
        {"id": "p1", "type": "function", "function": {"name": "g", "arguments": '{"b":2}'}},
    ]


def test_non_integer_index_falls_back_to_position() -> None:
    chunk = delta(tool_calls=[{**fragment("{}", call_id="p0", name="f"), "index": "0"}])
    calls = assemble([chunk]).tool_calls
    assert calls is not None
    assert [c["id"] for c in calls] == ["p0"]


def test_text_and_tool_calls_together() -> None:
    chunks = [
        delta(content="Let me check. "),
        delta(tool_calls=[fragment('{"q": "x"}', index=0, call_id="c1", name="search")]),
        delta("tool_calls"),
    ]
    assembly = assemble(chunks)
    assert assembly.content == "Let me check. "
    assert assembly.tool_calls is not None
    assert assembly.tool_calls[0]["function"]["arguments"] == '{"q": "x"}'


# --- chat.completion ---------------------------------------------------------------------------------------


def test_chat_completion_assembles_like_a_one_chunk_stream() -> None:
    calls = [{"id": "call_z", "type": "function", "function": {"name": "lookup", "arguments": '{"k": 1}'}}]
    completion: Chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "Looking it up.", "tool_calls": calls},
                "finish_reason": "tool_calls",
            }
        ],
        "usage": USAGE,
    }
    streamed = [
        delta(content="Looking it up."),
        delta(tool_calls=[{"index": 0, **calls[0]}]),
        delta("tool_calls"),
        {"choices": [], "usage": USAGE},
    ]
    assembly = assemble([completion])
    assert assembly.content == "Looking it up."
    assert assembly.tool_calls == calls
    assert assembly.finish_reason == "tool_calls"
    assert assembly.usage == USAGE
    assert assembly.message() == assemble(streamed).message()


def test_chat_completion_other_choices_are_ignored() -> None:
    completion: Chunk = {
        "object": "chat.completion",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "zero"}, "finish_reason": "stop"},
            {"index": 1, "message": {"role": "assistant", "content": "one"}, "finish_reason": "length"},
        ],
    }
    assembly = assemble([completion])
    assert assembly.content == "zero"
    assert assembly.finish_reason == "stop"


# --- message() -----------------------------------------------------------------------------------------------


def test_message_without_tool_calls_has_no_tool_calls_key() -> None:
    message = assemble([delta(content="Hi there"), delta("stop")]).message()
    assert message == {"role": "assistant", "content": "Hi there"}
    assert "tool_calls" not in message


def test_message_with_tool_calls() -> None:
    chunks = [delta(tool_calls=[fragment('{"x": 1}', index=0, call_id="c", name="f")]), delta("tool_calls")]
    assert assemble(chunks).message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
    }


def test_message_is_a_fresh_dict_each_time() -> None:
    assembly = assemble([delta(content="a")])
    first = assembly.message()
    first["content"] = "changed"
    assert assembly.message()["content"] == "a"


def test_a_long_answer_of_tiny_deltas_is_kept_in_blocks_in_order() -> None:
    pieces = [f"{i}," for i in range(PIECES_PER_BLOCK * 3 + 7)]
    assembly = assemble([delta(content=piece) for piece in pieces])
    assert assembly.content == "".join(pieces)
    assert len(assembly.text.blocks) == 3
    assert len(assembly.text.pieces) == 7
    assert assembly.size == len("".join(pieces))
