"""A body's values counted while it is scanned: refused past `limits.max_body_values`, on every door, before the
rest is read; counted exactly where only the bound is over, resumed requests included."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.config.schema import RequestLimits
from proxy.doors.body import c_parse_ok, parse_json_object
from proxy.doors.chat import parse_chat_request
from proxy.doors.json_values import COUNT_PIECE_CHARS, ValueCount, count_chars, values_bound
from proxy.doors.messages.input import parse_messages_request
from proxy.doors.resent import ResentLists
from proxy.doors.responses.input import parse_responses_request, parse_socket_event
from proxy.errors import InvalidRequest, TooManyValues

LIMIT = 2048
LIMITS = RequestLimits(max_body_values=LIMIT)
TENANT = "t"


def chat_body(messages: list[dict[str, Any]], **fields: Any) -> bytes:
    return json.dumps({"model": "m", "messages": messages, **fields}).encode()


def zeros(count: int) -> list[int]:
    return [0] * count


def test_the_default_limit_refuses_the_issues_body_of_millions_of_integers() -> None:
    raw = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"metadata":{"v":[' + b"0," * 1_200_000 + b"0]}}"
    with pytest.raises(TooManyValues) as caught:
        parse_chat_request(raw)
    assert caught.value.status == 400
    assert caught.value.code == "too_many_values"
    assert "limits.max_body_values" in caught.value.message


@pytest.mark.parametrize("where", ["metadata", "x", "messages"])
def test_a_body_over_the_limit_is_refused_wherever_its_values_are(where: str) -> None:
    values = zeros(LIMIT)
    if where == "messages":
        raw = chat_body([{"role": "user", "content": "hi", "x": values}])
    else:
        raw = chat_body(
            [{"role": "user", "content": "hi"}], **{where: {"v": values} if where == "metadata" else values}
        )
    with pytest.raises(TooManyValues):
        parse_chat_request(raw, LIMITS)
    with pytest.raises(TooManyValues):
        parse_chat_request(raw, LIMITS, ResentLists().of(TENANT))


def test_a_body_under_the_limit_parses_as_json_does() -> None:
    raw = chat_body([{"role": "user", "content": "hi"}], x=zeros(LIMIT - 100))
    assert parse_json_object(raw, LIMIT) == json.loads(raw)
    conversation = parse_chat_request(raw, LIMITS, ResentLists().of(TENANT))
    assert conversation.params["x"] == zeros(LIMIT - 100)


def test_the_scan_stops_at_the_first_value_past_the_limit() -> None:
    """What follows is never read: were it, this body would be refused as malformed JSON."""
    raw = b'{"model":"m","x":[' + b"0," * (LIMIT + 10) + b"not json"
    with pytest.raises(TooManyValues):
        parse_json_object(raw, LIMIT)
    with pytest.raises(InvalidRequest, match="could not parse"):
        parse_json_object(raw, LIMIT * 10)


def test_strings_full_of_commas_are_counted_one_value_each() -> None:
    """The bound (commas, colons, brackets) is only a hint: a text whose bound is over is counted exactly."""
    messages = [{"role": "user", "content": ",:[" * 200} for _ in range(100)]
    raw = chat_body(messages)
    text = raw.decode()
    assert values_bound(text, 0, len(text)) > LIMIT
    count = ValueCount(text, 0, LIMIT)
    assert count.exact
    assert not c_parse_ok(text, 0, count)
    assert parse_chat_request(raw, LIMITS).messages == messages
    assert parse_chat_request(raw, LIMITS, ResentLists().of(TENANT)).messages == messages


def test_a_text_that_cannot_hold_too_many_values_is_not_counted_one_by_one() -> None:
    text = chat_body([{"role": "user", "content": "word " * 1000}] * 20).decode()
    count = ValueCount(text, 0, LIMIT)
    assert not count.exact
    assert c_parse_ok(text, 0, count)


@pytest.mark.parametrize("door", ["messages", "responses", "socket"])
def test_every_door_refuses_a_body_over_the_limit(door: str) -> None:
    with pytest.raises(TooManyValues):
        if door == "messages":
            raw = json.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
            parse_messages_request(raw[:-1].encode() + b',"x":' + json.dumps(zeros(LIMIT)).encode() + b"}", LIMITS)
        elif door == "responses":
            parse_responses_request(json.dumps({"model": "m", "input": "hi", "x": zeros(LIMIT)}).encode(), LIMITS)
        else:
            event = {"type": "response.create", "model": "m", "input": "hi", "x": zeros(LIMIT)}
            parse_socket_event(json.dumps(event).encode(), LIMITS)


def test_a_resent_conversation_counts_the_values_of_the_part_it_repeats() -> None:
    """The kept request's elements are not scanned again, but their values still count: a conversation grown
    past the limit a few values at a time is refused, though what is new in it holds few."""
    resent = ResentLists().of(TENANT)
    history = [{"role": "user", "content": f"m{index}", "x": zeros(100)} for index in range(25)]
    for count in (15, 17):
        assert parse_chat_request(chat_body(history[:count]), LIMITS, resent).messages == history[:count]
    listed = resent.parse(chat_body(history[:18]), "messages", LIMITS)
    assert listed._scan is not None
    assert listed._scan.scanned.reused == 17
    with pytest.raises(TooManyValues):
        parse_chat_request(chat_body(history), LIMITS, resent)


def test_a_resent_conversation_whose_bound_is_over_but_values_are_not_is_taken() -> None:
    """The repeated part's count may be its bound (the C parser read it): past the limit, the whole body is
    counted one by one before it is refused."""
    resent = ResentLists().of(TENANT)
    history = [{"role": "user", "content": ",:[" * 150} for _ in range(4)]
    text = chat_body(history).decode()
    assert not ValueCount(text, 0, LIMIT).exact  # the C parser reads it; its elements count their bound
    parse_chat_request(chat_body(history), LIMITS, resent)
    grown = [*history, {"role": "user", "content": "more", "x": zeros(300)}]
    assert parse_chat_request(chat_body(grown), LIMITS, resent).messages == grown


def test_characters_are_counted_across_pieces_and_the_count_stops_once_over() -> None:
    text = ("a," * (COUNT_PIECE_CHARS // 2 + 7)) + "[:"
    assert count_chars(text, ",", 0, len(text)) == text.count(",")
    assert values_bound(text, 0, len(text)) == text.count(",") + 2
    stopped = count_chars(text, ",", 0, len(text), stop=10)
    assert 10 < stopped < text.count(",")
