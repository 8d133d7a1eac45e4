"""The chat-completions wire adapter's parsing, the bounded body read and the X-Context-* request headers: every
kind of bad input is a 400 (or 413) naming the field, before anything is stored."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from proxy.canonical.conversation import ContextMode, ContextOptions
from proxy.doors.body import read_body
from proxy.doors.chat import parse_chat_request
from proxy.doors.context_headers import (
    MAX_IDEMPOTENCY_KEY_LENGTH,
    MAX_PRESERVE_RECENT,
    MAX_SESSION_ID_LENGTH,
    context_options,
)
from proxy.errors import InvalidRequest, PayloadTooLarge, openai_error

USER = {"role": "user", "content": "hi"}


def body(**fields: Any) -> bytes:
    payload: dict[str, Any] = {"model": "m", "messages": [USER]}
    payload.update(fields)
    return json.dumps({k: v for k, v in payload.items() if v is not OMIT}).encode()


OMIT: Any = object()


def invalid(raw: bytes) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as caught:
        parse_chat_request(raw)
    error = caught.value
    status, payload, _headers = openai_error(error)
    assert status == 400
    assert payload["error"]["type"] == "invalid_request_error"
    assert payload["error"]["message"]
    return error


async def chunks_of(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


# --- parse_chat_request -------------------------------------------------------------------------------------


def test_valid_request_keeps_the_body_unchanged() -> None:
    payload = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "hi"}], "name": "ann"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "42"},
            {"role": "developer", "content": "dev"},
        ],
        "stream": True,
        "max_tokens": 10,
        "temperature": 0.5,
        "stop": ["x"],
        "foo_custom": {"anything": [1, 2]},
    }
    chat = parse_chat_request(json.dumps(payload).encode())

    assert chat.model == "m"
    assert chat.messages == payload["messages"]
    assert chat.stream is True
    assert chat.max_output == 10
    assert chat.max_output_param == "max_tokens"
    assert chat.params == {k: v for k, v in payload.items() if k not in ("model", "messages")}
    assert chat.identity == {k: v for k, v in payload.items() if k != "stream"}


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    assert parse_chat_request(body(max_tokens=10, max_completion_tokens=20)).max_output == 20
    assert parse_chat_request(body(max_tokens=10, max_completion_tokens=20)).max_output_param == "max_completion_tokens"
    assert parse_chat_request(body()).max_output is None
    assert parse_chat_request(body()).stream is False


def test_zero_max_tokens_is_accepted() -> None:
    assert parse_chat_request(body(max_tokens=0)).max_output == 0


@pytest.mark.parametrize(
    "raw",
    [b"", b"{", b"{'model': 'm'}", b'{"model": "m",}', b"not json", b'{"model": "m"} trailing'],
)
def test_malformed_json(raw: bytes) -> None:
    error = invalid(raw)
    assert error.param is None
    assert "JSON" in error.message


@pytest.mark.parametrize(
    ("raw", "kind"),
    [(b"[]", "an array"), (b'"text"', "a string"), (b"42", "a number"), (b"null", "null"), (b"true", "a boolean")],
)
def test_body_must_be_an_object(raw: bytes, kind: str) -> None:
    error = invalid(raw)
    assert error.param is None
    assert f"must be a JSON object, not {kind}" in error.message


def test_invalid_utf8() -> None:
    error = invalid(b'{"model": "m\xff\xfe", "messages": []}')
    assert "UTF-8" in error.message
    assert "byte 12" in error.message


def test_deeply_nested_json_is_a_400_not_a_crash() -> None:
    error = invalid(b"[" * 100_000)
    assert "nested too deeply" in error.message
    assert error.param is None


def test_deeply_nested_value_inside_an_object() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "x": ' + b"[" * 100_000 + b"]" * 100_000
    raw += b"}"
    assert "nested too deeply" in invalid(raw).message


@pytest.mark.parametrize(
    ("raw", "param", "fragment"),
    [
        (body(model=OMIT), "model", "must provide a model"),
        (body(model=None), "model", "must provide a model"),
        (body(model=""), "model", "non-empty string"),
        (body(model=7), "model", "not a number"),
        (body(model=["m"]), "model", "not an array"),
        (body(messages=OMIT), "messages", "Missing required parameter: 'messages'"),
        (body(messages=None), "messages", "Missing required parameter"),
        (body(messages="hi"), "messages", "must be an array, not a string"),
        (body(messages={"role": "user"}), "messages", "not an object"),
        (body(messages=[]), "messages", "at least one message"),
        (body(messages=["hi"]), "messages[0]", "must be an object"),
        (body(messages=[USER, {"content": "x"}]), "messages[1].role", "role"),
        (body(messages=[{"role": 1, "content": "x"}]), "messages[0].role", "role"),
        (body(messages=[{"role": "wizard", "content": "x"}]), "messages[0].role", "'wizard'"),
        (body(messages=[{"role": "user"}]), "messages[0].content", "Missing required parameter"),
        (body(messages=[{"role": "user", "content": None}]), "messages[0].content", "Missing"),
        (body(messages=[{"role": "user", "content": 42}]), "messages[0].content", "but got a number"),
        (body(messages=[{"role": "user", "content": {"text": "x"}}]), "messages[0].content", "an object"),
        (body(messages=[{"role": "user", "content": True}]), "messages[0].content", "a boolean"),
        (body(messages=[{"role": "user", "content": ["x"]}]), "messages[0].content[0]", "string 'type'"),
        (body(messages=[{"role": "user", "content": [{"text": "x"}]}]), "messages[0].content[0]", "'type'"),
        (body(messages=[{"role": "user", "content": "x", "name": 5}]), "messages[0].name", "string"),
        (body(messages=[{"role": "tool", "content": "x"}]), "messages[0].tool_call_id", "tool_call_id"),
        (body(messages=[{"role": "user", "content": "x", "tool_calls": []}]), "messages[0].tool_calls", "assistant"),
        (
            body(messages=[{"role": "assistant", "content": None, "tool_calls": {"id": "c"}}]),
            "messages[0].tool_calls",
            "array",
        ),
        (
            body(messages=[{"role": "assistant", "tool_calls": [{"id": "c"}]}]),
            "messages[0].tool_calls[0]",
            "'function'",
        ),
        (body(messages=[{"role": "assistant", "tool_calls": ["c"]}]), "messages[0].tool_calls[0]", "'id'"),
        # The proxy's own keys: a client's message passed off as a summary the proxy wrote, or as another API's parts
        (body(messages=[{"role": "user", "content": "x", "origin": "summary"}]), "messages[0].origin", "proxy keeps"),
        (body(messages=[{"role": "user", "content": "x", "items": []}]), "messages[0].items", "proxy keeps"),
        (body(messages=[{"role": "assistant", "content": "x", "answer": {}}]), "messages[0].answer", "proxy keeps"),
        (body(max_tokens=-1), "max_tokens", "below minimum"),
        (body(max_tokens=1.5), "max_tokens", "expected an integer"),
        (body(max_tokens="10"), "max_tokens", "expected an integer, but got a string"),
        (body(max_tokens=True), "max_tokens", "expected an integer, but got a boolean"),
        (body(max_completion_tokens=-5), "max_completion_tokens", "below minimum"),
        (body(n=0), "n", "below minimum"),
        (body(top_logprobs=-1), "top_logprobs", "below minimum"),
        (body(stream="yes"), "stream", "expected a boolean, but got a string"),
        (body(stream=1), "stream", "expected a boolean, but got a number"),
        (body(logprobs="true"), "logprobs", "boolean"),
        (body(temperature="hot"), "temperature", "expected a number"),
        (body(temperature=True), "temperature", "expected a number"),
        (body(top_p=[0.1]), "top_p", "expected a number"),
        (body(stream_options=True), "stream_options", "expected an object"),
        (body(response_format="json"), "response_format", "expected an object"),
        (body(metadata=["a"]), "metadata", "expected an object"),
        (body(tools={"type": "function"}), "tools", "array of objects"),
        (body(tools=["f"]), "tools", "array of objects"),
        (body(stop=5), "stop", "string or an array of strings"),
        (body(stop=["a", 1]), "stop", "string or an array of strings"),
        (body(user=42), "user", "expected a string"),
    ],
)
def test_invalid_fields_name_the_param(raw: bytes, param: str, fragment: str) -> None:
    error = invalid(raw)
    assert error.param == param
    assert fragment in error.message


def test_non_finite_numbers_are_refused() -> None:
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": NaN}'
    assert invalid(raw).param == "temperature"
    raw = b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": Infinity}'
    assert invalid(raw).param == "top_p"


def test_the_first_bad_message_is_named() -> None:
    messages = [USER, USER, {"role": "robot", "content": "x"}, {"role": "user", "content": 1}]
    assert invalid(body(messages=messages)).param == "messages[2].role"


CALL_C = {"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}]}


@pytest.mark.parametrize(
    "messages",
    [
        [{"role": "assistant"}],
        [{"role": "assistant", "content": None}],
        [CALL_C, {"role": "tool", "tool_call_id": "c", "content": None}],
        [{"role": "function", "name": "f", "content": "x"}],
        [{"role": "user", "content": []}],
    ],
)
def test_accepted_edge_messages(messages: list[dict[str, Any]]) -> None:
    chat = parse_chat_request(body(messages=messages))
    assert chat.messages == messages


def test_valid_params_of_every_kind_pass() -> None:
    params: dict[str, Any] = {
        "n": 1,
        "top_logprobs": 0,
        "temperature": 0,
        "top_p": 1.0,
        "presence_penalty": -1.5,
        "frequency_penalty": 2,
        "logprobs": False,
        "parallel_tool_calls": True,
        "store": False,
        "stream_options": {},
        "response_format": {"type": "text"},
        "logit_bias": {"1": 2},
        "metadata": {},
        "tools": [],
        "functions": [{"name": "f"}],
        "stop": "x",
        "user": "u",
    }
    assert parse_chat_request(body(**params)).params == params


def test_request_is_frozen() -> None:
    chat = parse_chat_request(body())
    with pytest.raises(AttributeError):
        chat.messages = []  # type: ignore[misc]


# --- read_body ---------------------------------------------------------------------------------------------


async def read(chunks: AsyncIterator[bytes], content_length: str | None, max_bytes: int) -> bytes:
    return (await read_body(chunks, content_length, max_bytes)).body.tobytes()


async def test_read_body_joins_the_chunks() -> None:
    assert await read(chunks_of(b"ab", b"", b"cd"), "4", max_bytes=4) == b"abcd"
    assert await read(chunks_of(b"ab", b"cd"), None, max_bytes=4) == b"abcd"
    assert await read(chunks_of(), None, max_bytes=4) == b""


async def test_read_body_shares_what_it_repeats_of_an_earlier_body() -> None:
    first = await read_body(chunks_of(b"[1,2,", b"3]"), None, max_bytes=100)
    second = await read_body(chunks_of(b"[1,", b"2,3", b",4]"), None, max_bytes=100, earlier=[first.body])
    assert (second.body.tobytes(), second.base, second.shared, second.fresh) == (b"[1,2,3,4]", first.body, 6, 3)


async def test_declared_length_over_the_limit_is_refused_before_reading() -> None:
    read: list[bytes] = []

    async def tracked() -> AsyncIterator[bytes]:
        read.append(b"x")
        yield b"x"

    with pytest.raises(PayloadTooLarge) as caught:
        await read_body(tracked(), "2049", max_bytes=2048)
    assert read == []
    status, payload, _headers = openai_error(caught.value)
    assert status == 413
    assert payload["error"]["code"] == "request_too_large"
    assert "2049" in payload["error"]["message"]


async def test_streamed_body_over_the_limit_is_refused_as_soon_as_it_is_known() -> None:
    produced: list[int] = []

    async def endless() -> AsyncIterator[bytes]:
        for index in range(1000):
            produced.append(index)
            yield b"x" * 1000

    with pytest.raises(PayloadTooLarge) as caught:
        await read_body(endless(), None, max_bytes=2048)
    assert len(produced) == 3
    assert "2048" in caught.value.message


async def test_understated_content_length_does_not_bypass_the_limit() -> None:
    with pytest.raises(PayloadTooLarge):
        await read_body(chunks_of(b"x" * 3000), "10", max_bytes=2048)


async def test_non_numeric_content_length_falls_back_to_counting() -> None:
    assert await read(chunks_of(b"abc"), "lots", max_bytes=2048) == b"abc"
    with pytest.raises(PayloadTooLarge):
        await read_body(chunks_of(b"x" * 2049), "-1", max_bytes=2048)


async def test_body_exactly_at_the_limit_is_accepted() -> None:
    assert len(await read(chunks_of(b"x" * 2048), "2048", max_bytes=2048)) == 2048


# --- context_options ---------------------------------------------------------------------------------------


def test_no_headers_are_the_defaults() -> None:
    assert context_options({}) == ContextOptions()
    assert ContextOptions() == ContextOptions(None, None, False, None, ContextMode.AUTO, None)


def test_every_header_is_read() -> None:
    options = context_options(
        {
            "x-session-id": "  my-session ",
            "x-context-budget": "5000",
            "x-context-preserve-recent": "0",
            "x-context-mode": "OFF",
            "idempotency-key": "key-1",
        }
    )
    assert options == ContextOptions(
        session_id="my-session",
        budget=5000,
        reset_budget=False,
        preserve_recent=0,
        mode="off",
        idempotency_key="key-1",
    )


@pytest.mark.parametrize("value", ["none", "None", " NONE "])
def test_budget_none_resets(value: str) -> None:
    options = context_options({"x-context-budget": value})
    assert options.reset_budget is True
    assert options.budget is None


@pytest.mark.parametrize("value", ["0", "-5", "abc", "1.5", "", " ", "1e3", "٣", "²", "10k"])
def test_invalid_budget(value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        context_options({"x-context-budget": value})
    assert caught.value.param == "X-Context-Budget"
    assert openai_error(caught.value)[0] == 400


@pytest.mark.parametrize("value", ["-1", "x", str(MAX_PRESERVE_RECENT + 1), "2.0", ""])
def test_invalid_preserve_recent(value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        context_options({"x-context-preserve-recent": value})
    assert caught.value.param == "X-Context-Preserve-Recent"


def test_preserve_recent_upper_bound_is_accepted() -> None:
    assert context_options({"x-context-preserve-recent": str(MAX_PRESERVE_RECENT)}).preserve_recent == 1000


@pytest.mark.parametrize("value", ["on", "manual", "", "auto,off"])
def test_invalid_mode(value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        context_options({"x-context-mode": value})
    assert caught.value.param == "X-Context-Mode"


@pytest.mark.parametrize("value", ["", "   ", "s" * (MAX_SESSION_ID_LENGTH + 1), "a\tb", "line\x00"])
def test_invalid_session_id(value: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        context_options({"x-session-id": value})
    assert caught.value.param == "X-Session-Id"


def test_longest_session_id_is_accepted() -> None:
    value = "s" * MAX_SESSION_ID_LENGTH
    assert context_options({"x-session-id": value}).session_id == value


def test_invalid_idempotency_key() -> None:
    with pytest.raises(InvalidRequest) as caught:
        context_options({"idempotency-key": "k" * (MAX_IDEMPOTENCY_KEY_LENGTH + 1)})
    assert caught.value.param == "Idempotency-Key"


CALL = {
    "role": "assistant",
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}],
}


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ({"role": "user", "content": [{"type": "banana", "text": "x"}]}, "messages[0].content[0].type"),
        ({"role": "user", "content": [{"type": "refusal", "refusal": "no"}]}, "messages[0].content[0].type"),
        (
            {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "u"}}]},
            "messages[0].content[0].type",
        ),
        ({"role": "assistant", "content": [{"type": "file", "file": {}}]}, "messages[0].content[0].type"),
        ({"role": "user", "content": [{"type": "text", "text": 5}]}, "messages[0].content[0].text"),
        ({"role": "user", "content": [{"type": "text"}]}, "messages[0].content[0].text"),
        ({"role": "assistant", "content": [{"type": "refusal", "refusal": None}]}, "messages[0].content[0].refusal"),
        ({"role": "user", "content": [{"type": "image_url", "image_url": "u"}]}, "messages[0].content[0].image_url"),
    ],
)
def test_a_content_part_its_role_does_not_take_is_refused_naming_it(message: dict[str, Any], param: str) -> None:
    error = invalid(body(messages=[message]))
    assert error.param == param


def test_the_part_types_openai_takes_pass() -> None:
    user = {
        "role": "user",
        "content": [
            {"type": "text", "text": "look"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            {"type": "file", "file": {"file_id": "file-1"}},
        ],
    }
    assistant = {"role": "assistant", "content": [{"type": "text", "text": "a"}, {"type": "refusal", "refusal": "b"}]}
    tool = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "r"}]}
    messages = [user, assistant, CALL, tool, {"role": "developer", "content": [{"type": "text", "text": "d"}]}]
    assert parse_chat_request(body(messages=messages)).messages == messages


@pytest.mark.parametrize(
    "messages",
    [
        [USER, {"role": "tool", "tool_call_id": "c1", "content": "r"}],
        [USER, {"role": "tool", "tool_call_id": "c1", "content": "r"}, CALL],
        [
            USER,
            {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "id": "c2"}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
        ],
    ],
)
def test_a_tool_output_answering_no_call_before_it_is_refused(messages: list[dict[str, Any]]) -> None:
    error = invalid(body(messages=messages))
    assert error.param == "messages"
    assert "must be a response to a preceeding message with 'tool_calls'" in error.message


@pytest.mark.parametrize("following", [USER, {"role": "assistant", "content": "x"}, {"role": "system", "content": "s"}])
def test_a_call_another_message_follows_unanswered_is_refused_with_openai_s_words(following: dict[str, Any]) -> None:
    two = {**CALL, "tool_calls": [CALL["tool_calls"][0], {**CALL["tool_calls"][0], "id": "c2"}]}
    error = invalid(body(messages=[USER, two, {"role": "tool", "tool_call_id": "c2", "content": "r"}, following]))
    assert error.param == "messages[1].tool_calls"
    assert error.message == (
        "An assistant message with 'tool_calls' must be followed by tool messages responding to each "
        "'tool_call_id'. The following tool_call_ids did not have response messages: c1"
    )


def test_a_call_at_the_end_is_the_client_s_to_answer() -> None:
    messages = [USER, CALL]
    assert parse_chat_request(body(messages=messages)).messages == messages


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_number_that_is_not_finite_is_refused_naming_where_it_is(number: str) -> None:
    raw = body(metadata={"a": [1, "__x__"]}).replace(b'"__x__"', number.encode())
    error = invalid(raw)
    assert error.param == "metadata.a[1]"
    assert "not a finite number" in error.message
