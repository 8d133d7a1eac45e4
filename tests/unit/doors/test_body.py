"""Parsing a request body: the C parser for a body of few values, the pure-Python scanner for one of many; the
bounds OpenAI puts on `metadata`."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from proxy.config.schema import RequestLimits
from proxy.doors.body import C_PARSE_MAX_BYTES, C_PARSE_MAX_COMMAS, c_parse_ok, parse_json_object
from proxy.doors.chat import parse_chat_request
from proxy.doors.json_values import COUNT_PIECE_CHARS
from proxy.doors.responses.input import ResponsesRequest, parse_responses_request
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


def chat_with_metadata(metadata: object) -> bytes:
    return json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": metadata}).encode()


def responses_with_metadata(metadata: object) -> bytes:
    return json.dumps({"model": "m", "input": "hi", "metadata": metadata}).encode()


METADATA_REFUSALS = [
    (
        {f"k{index}": "v" for index in range(17)},
        "metadata",
        "object_above_max_properties",
        "Invalid 'metadata': too many properties. Expected an object with at most 16 properties, but got an object "
        "with 17 properties instead.",
    ),
    (
        {"k" * 65: "v"},
        "metadata." + "k" * 64 + "...",
        "property_name_above_max_length",
        "Invalid property name in 'metadata': '" + "k" * 64 + "...' is too long. Expected a string with maximum "
        "length 64, but got a string with length 65 instead.",
    ),
    (
        {"k": "x" * 513},
        "metadata.k",
        "string_above_max_length",
        "Invalid 'metadata.k': string too long. Expected a string with maximum length 512, but got a string with "
        "length 513 instead.",
    ),
    (
        {"v": [0, 0, 0]},
        "metadata.v",
        "invalid_type",
        "Invalid type for 'metadata.v': expected a string, but got an array instead.",
    ),
]


@pytest.mark.parametrize("build", [chat_with_metadata, responses_with_metadata])
@pytest.mark.parametrize(("metadata", "param", "code", "message"), METADATA_REFUSALS)
def test_metadata_past_openais_bounds_is_refused_as_openai_refuses_it(
    build: Callable[[object], bytes], metadata: object, param: str, code: str, message: str
) -> None:
    parse: Callable[[bytes], object] = parse_chat_request if build is chat_with_metadata else parse_responses
    with pytest.raises(InvalidRequest) as caught:
        parse(build(metadata))
    assert (caught.value.status, caught.value.param, caught.value.code) == (400, param, code)
    assert caught.value.message == message


@pytest.mark.parametrize("build", [chat_with_metadata, responses_with_metadata])
def test_metadata_within_openais_bounds_is_passed_on(build: Callable[[object], bytes]) -> None:
    metadata = {f"{index:0>64}": "x" * 512 for index in range(16)}
    if build is chat_with_metadata:
        assert parse_chat_request(build(metadata)).params["metadata"] == metadata
    else:
        assert parse_responses(build(metadata)).body["metadata"] == metadata


def parse_responses(raw: bytes) -> ResponsesRequest:
    return parse_responses_request(raw, RequestLimits())


@pytest.mark.parametrize("shift", range(-6, 2))
def test_a_surrogate_escape_across_a_search_piece_is_found(shift: int) -> None:
    head = '{"model": "m", "x": "'
    pad = "a" * (COUNT_PIECE_CHARS - len(head) + shift)
    raw = (head + pad + '\\ud800"}').encode()
    with pytest.raises(InvalidRequest, match="surrogate"):
        parse_json_object(raw)
