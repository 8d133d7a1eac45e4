"""Parsing a request body: the C parser for a body of few values, the pure-Python scanner for one of many."""

from __future__ import annotations

import json

import pytest

from proxy.doors.body import C_PARSE_MAX_BYTES, C_PARSE_MAX_COMMAS, c_parse_ok, parse_json_object
from proxy.errors import InvalidRequest
from proxy.offload import OFF_LOOP_CHARS


def body_of(messages: list[dict[str, str]]) -> bytes:
    return json.dumps({"model": "m", "messages": messages, "seed": 123456789012345678901234567890}).encode()


def test_a_long_conversation_of_few_values_takes_the_c_parser() -> None:
    raw = body_of([{"role": "user", "content": "word " * 400}] * 1000)
    assert OFF_LOOP_CHARS < len(raw) <= C_PARSE_MAX_BYTES
    assert c_parse_ok(raw.decode())


def test_a_body_of_many_values_takes_the_pure_python_scanner() -> None:
    raw = body_of([{"role": "user", "content": "a"}] * (C_PARSE_MAX_COMMAS // 2 + 1))
    assert not c_parse_ok(raw.decode())


def test_a_body_past_the_byte_bound_takes_the_pure_python_scanner() -> None:
    raw = body_of([{"role": "user", "content": "x" * (C_PARSE_MAX_BYTES // 4)}] * 5)
    assert not c_parse_ok(raw.decode())


@pytest.mark.parametrize("count", [10, 1000, C_PARSE_MAX_COMMAS])
def test_both_parsers_read_the_same_object_big_integers_kept_exact(count: int) -> None:
    messages = [{"role": "user", "content": f"message {index} ☀️"} for index in range(count)]
    body = parse_json_object(body_of(messages))
    assert body["messages"] == messages
    assert body["seed"] == 123456789012345678901234567890


@pytest.mark.parametrize("count", [10, 1000, C_PARSE_MAX_COMMAS])
def test_both_parsers_refuse_a_number_that_is_not_finite(count: int) -> None:
    raw = body_of([{"role": "user", "content": "hi " * 100}] * count).replace(b'"seed": ', b'"seed": NaN, "x": ')
    with pytest.raises(InvalidRequest, match="'seed' is NaN"):
        parse_json_object(raw)
