"""Fuzzing the front door: hypothesis-generated bodies and headers POSTed raw to `/v1/chat/completions`.

Property 1 — every *invalid* request (a body that is not JSON, not an object, has a field of the wrong type,
an empty, huge or unknown value, an unpaired surrogate escape, deeply nested junk, a NaN or Infinity, a content
part of a type its role does not take or with text that is not a string, a tool output answering no call, a
call another message follows unanswered; or a valid body with a bad X-Context-Budget /
X-Context-Preserve-Recent / X-Context-Mode / X-Session-Id / Idempotency-Key) is answered with a 4xx carrying
an OpenAI-shaped error body, never a 5xx, and changes nothing: no row is added to the store and nothing is
sent upstream. Property 2 — valid-looking random conversations never get a 5xx (nor an SSE error event).
Property 3 — the same for the Responses and Messages doors (and `count_tokens`): the bad input of each, refused
at parse time in the door's own error shape, with nothing written or sent. One served proxy for the module;
each example reads the store before and after.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.reliability.support import assert_openai_error, row_counts, sse_events
from tests.support.fake_upstream import FakeUpstream
from tests.support.proxy_server import ProxyServer, make_config

MAX_BODY_BYTES = 64 * 1024
MAX_MESSAGE_CHARS = 8 * 1024
ROLES = ("system", "developer", "user", "assistant", "tool", "function")
CHAT = "/v1/chat/completions"
TIMEOUT_S = 20.0

FUZZ_SETTINGS = settings(
    max_examples=500,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.fixture(scope="module")
def fuzz_proxy(upstream_server: FakeUpstream, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProxyServer]:
    upstream_server.reset()
    tmp_path = tmp_path_factory.mktemp("fuzz")
    raw = make_config(
        tmp_path, upstream_server.url, limits={"max_body_bytes": MAX_BODY_BYTES, "max_message_chars": MAX_MESSAGE_CHARS}
    )
    with ProxyServer(raw, tmp_path) as proxy:
        yield proxy
    upstream_server.reset()


@pytest.fixture(scope="module")
def http(fuzz_proxy: ProxyServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=fuzz_proxy.url, timeout=TIMEOUT_S) as client:
        yield client


# --- building blocks ------------------------------------------------------------------------------------------

lone_surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)
any_text = st.text(st.characters(codec=None), max_size=40)
"""Any code points, lone surrogates included (json.dumps escapes them as \\udxxx)."""
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    any_text,
)
junk = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(any_text, children, max_size=4),
    max_leaves=12,
)
deep = st.integers(min_value=50, max_value=5000).flatmap(
    lambda depth: st.sampled_from(["[" * depth + "]" * depth, '{"a":' * depth + "1" + "}" * depth])
)
"""Nesting as JSON text, beyond what Python's parser (or the proxy) will recurse into at the high end."""


def not_of(*types: type) -> st.SearchStrategy[Any]:
    """Junk that is none of `types` (booleans are never numbers here, as in OpenAI's API)."""

    def wrong(value: Any) -> bool:
        if isinstance(value, bool):
            return bool not in types
        return not isinstance(value, types)

    return junk.filter(wrong)


def valid_body() -> dict[str, Any]:
    return {"model": "fake", "messages": [{"role": "user", "content": "hello there"}]}


NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e999", "-1e400")
"""What Python's parser reads as a float that is not finite; none is a JSON number OpenAI's parser accepts."""
_NON_FINITE_MARK = "\x00non-finite\x00"


@st.composite
def with_non_finite(draw: st.DrawFn, body: dict[str, Any]) -> bytes:
    """`body` with a non-finite number anywhere: a new key of any object in it, or in place of any value."""
    places: list[dict[str, Any] | list[Any]] = []
    stack: list[Any] = [body]
    while stack:
        value = stack.pop()
        if isinstance(value, dict | list):
            places.append(value)
            stack.extend(value.values() if isinstance(value, dict) else value)
    place = draw(st.sampled_from(places))
    if isinstance(place, dict):
        place[draw(st.sampled_from([*place, "extra"]))] = _NON_FINITE_MARK
    elif place:
        place[draw(st.integers(0, len(place) - 1))] = _NON_FINITE_MARK
    else:
        place.append(_NON_FINITE_MARK)
    return json.dumps(body).replace(json.dumps(_NON_FINITE_MARK), draw(st.sampled_from(NON_FINITE)), 1).encode()


def with_surrogate(text: str, surrogate: str, at: int) -> str:
    at = at % (len(text) + 1)
    return text[:at] + surrogate + text[at:]


# --- invalid bodies ---------------------------------------------------------------------------------------------


@st.composite
def bad_messages(draw: st.DrawFn) -> Any:
    """A `messages` value OpenAI (and the proxy) must refuse."""
    good = {"role": "user", "content": "hi"}
    kind = draw(
        st.sampled_from(
            [
                "type",
                "empty",
                "item",
                "role",
                "no-role",
                "content",
                "parts",
                "part-type",
                "part-text",
                "tool",
                "orphan",
                "unanswered",
                "name",
                "calls",
            ]
        )
    )
    if kind == "type":
        return draw(not_of(list))
    if kind == "empty":
        return []
    message: Any
    if kind == "item":
        message = draw(not_of(dict))
    elif kind == "role":
        message = {"role": draw(any_text.filter(lambda r: r not in ROLES) | not_of(str)), "content": "hi"}
    elif kind == "no-role":
        message = {"content": draw(any_text)}
    elif kind == "content":
        role = draw(st.sampled_from(["system", "developer", "user"]))
        message = {"role": role} if draw(st.booleans()) else {"role": role, "content": draw(not_of(str, list))}
    elif kind == "parts":
        parts = draw(st.lists(junk, min_size=1, max_size=4))
        assume(any(not (isinstance(p, dict) and isinstance(p.get("type"), str)) for p in parts))
        message = {"role": "user", "content": parts}
    elif kind == "part-type":
        # Each role takes its own part types (user: text, image_url, input_audio, file; assistant: text, refusal;
        # the others text): anything else is refused by OpenAI, or by LiteLLM before it is sent.
        role = draw(st.sampled_from(ROLES[:5]))
        allowed = {"user": CHAT_USER_PARTS, "assistant": ("text", "refusal")}.get(role, ("text",))
        kind_of = draw(st.sampled_from([*CHAT_USER_PARTS, "refusal", "input_text", "image", "tool_use"]) | any_text)
        assume(kind_of not in allowed)
        part = {"type": kind_of, "text": "x", kind_of: {"url": "https://example.com/a.png"}}
        message = {"role": role, "content": [{"type": "text", "text": "ok"}, part]}
        if role == "tool":
            return [good, CALL, {**message, "tool_call_id": "call_1"}]
    elif kind == "part-text":
        field = draw(st.sampled_from(["text", "refusal"]))
        value = draw(not_of(str))
        message = {"role": "assistant" if field == "refusal" else "user", "content": [{"type": field, field: value}]}
    elif kind == "orphan":
        answered = draw(st.sampled_from(["nothing", "another call", "a later call"]))
        tool = {"role": "tool", "tool_call_id": "call_1", "content": "result"}
        if answered == "nothing":
            return [good, tool]
        if answered == "another call":
            return [good, {**CALL, "tool_calls": [{**CALL["tool_calls"][0], "id": "call_2"}]}, tool]
        return [good, tool, CALL]
    elif kind == "unanswered":
        following = draw(
            st.sampled_from([good, {"role": "assistant", "content": "x"}, {"role": "system", "content": "s"}])
        )
        partly = draw(st.booleans())
        calls = [CALL["tool_calls"][0], {**CALL["tool_calls"][0], "id": "call_2"}]
        answers = [{"role": "tool", "tool_call_id": "call_2", "content": "r"}] if partly else []
        return [good, {"role": "assistant", "tool_calls": calls}, *answers, following]
    elif kind == "tool":
        message = {"role": "tool", "content": "result"}
        if draw(st.booleans()):
            message["tool_call_id"] = draw(not_of(str))
    elif kind == "name":
        message = {**good, "name": draw(not_of(str).filter(lambda v: v is not None))}
    else:
        calls = draw(not_of(list).filter(lambda v: v is not None) | st.lists(not_of(dict), min_size=1, max_size=3))
        message = {"role": draw(st.sampled_from(["assistant", "user"])), "content": "x", "tool_calls": calls}
        if message["role"] == "user" and calls == []:
            message["tool_calls"] = [{}]
    messages = draw(st.lists(st.just(good), max_size=3))
    messages.insert(draw(st.integers(0, len(messages))), message)
    return messages


CHAT_USER_PARTS = ("text", "image_url", "input_audio", "file")
CALL: dict[str, Any] = {
    "role": "assistant",
    "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}


BAD_PARAMS: dict[str, st.SearchStrategy[Any]] = {
    "max_tokens": not_of(int).filter(lambda v: v is not None) | st.integers(max_value=-1),
    "max_completion_tokens": not_of(int).filter(lambda v: v is not None) | st.integers(max_value=-1),
    "n": not_of(int).filter(lambda v: v is not None) | st.integers(max_value=0),
    "temperature": not_of(int, float).filter(lambda v: v is not None)
    | st.sampled_from([math.inf, -math.inf, math.nan]),
    "top_p": not_of(int, float).filter(lambda v: v is not None),
    "stream": not_of(bool).filter(lambda v: v is not None),
    "logprobs": not_of(bool).filter(lambda v: v is not None),
    "stream_options": not_of(dict).filter(lambda v: v is not None),
    "response_format": not_of(dict).filter(lambda v: v is not None),
    "metadata": not_of(dict).filter(lambda v: v is not None),
    "tools": not_of(list).filter(lambda v: v is not None) | st.lists(not_of(dict), min_size=1, max_size=3),
    "stop": not_of(str, list).filter(lambda v: v is not None) | st.lists(not_of(str), min_size=1, max_size=3),
    "user": not_of(str).filter(lambda v: v is not None),
}


@st.composite
def invalid_body(draw: st.DrawFn) -> bytes:
    kind = draw(
        st.sampled_from(
            [
                "bytes",
                "truncated",
                "not-object",
                "deep",
                "model",
                "messages",
                "param",
                "surrogate",
                "huge",
                "deep-inside",
                "long-number",
                "non-finite",
            ]
        )
    )
    body: Any = valid_body()
    if kind == "non-finite":
        return draw(with_non_finite({**valid_body(), **draw(valid_params)}))
    if kind == "bytes":
        raw = draw(st.binary(max_size=300))
        try:
            parsed = json.loads(raw)
        except ValueError:
            return raw
        assume(not isinstance(parsed, dict) or "messages" not in parsed)
        return raw
    if kind == "truncated":
        text = json.dumps(draw(st.just(valid_body())))
        return text[: draw(st.integers(0, len(text) - 1))].encode()
    if kind == "not-object":
        return json.dumps(draw(not_of(dict))).encode()
    if kind == "deep":
        return draw(deep).encode()
    if kind == "long-number":
        # Python refuses to parse integers of more than 4,300 digits (a ValueError, not a JSONDecodeError).
        field = draw(st.sampled_from(["max_tokens", "temperature", "n", "model"]))
        digits = "9" * draw(st.integers(4301, 20_000))
        return json.dumps(body).replace("{", "{" + f'"{field}": {digits}, ', 1).encode()
    if kind == "deep-inside":
        # Nested junk where a field wants something else: it must be refused, not recursed into until it breaks.
        field = draw(st.sampled_from(["messages", "model", "stop", "user"]))
        text = json.dumps(body)
        return text.replace(
            f'"{field}": ' + json.dumps(body[field]) if field in body else "{",
            (f'"{field}": {draw(deep)}' if field in body else "{" + f'"{field}": {draw(deep)}, '),
            1,
        ).encode()
    if kind == "model":
        choice = draw(st.sampled_from(["missing", "type", "empty", "unknown"]))
        if choice == "missing":
            del body["model"]
        elif choice == "type":
            body["model"] = draw(not_of(str).filter(lambda v: v is not None))
        elif choice == "empty":
            body["model"] = ""
        else:
            body["model"] = draw(any_text.filter(lambda m: m not in ("", "fake")))
    elif kind == "messages":
        if draw(st.booleans()) and draw(st.booleans()):
            del body["messages"]
        else:
            body["messages"] = draw(bad_messages())
    elif kind == "param":
        name = draw(st.sampled_from(sorted(BAD_PARAMS)))
        body[name] = draw(BAD_PARAMS[name])
    elif kind == "surrogate":
        surrogate = draw(lone_surrogates)
        where = draw(st.sampled_from(["content", "model", "user", "metadata-key", "name"]))
        at = draw(st.integers(0, 100))
        if where == "content":
            body["messages"][0]["content"] = with_surrogate(draw(any_text), surrogate, at)
        elif where == "model":
            body["model"] = with_surrogate("fake", surrogate, at)
        elif where == "user":
            body["user"] = with_surrogate(draw(any_text), surrogate, at)
        elif where == "name":
            body["messages"][0]["name"] = with_surrogate(draw(any_text), surrogate, at)
        else:
            body["metadata"] = {with_surrogate(draw(any_text), surrogate, at): "v"}
    else:  # huge: over the body limit, whatever else is wrong or right with it
        size = draw(st.integers(MAX_BODY_BYTES + 1, 4 * MAX_BODY_BYTES))
        body["messages"][0]["content"] = draw(st.sampled_from("ab é€😀")) * size
    return json.dumps(body).encode()


# --- invalid headers on a valid body ------------------------------------------------------------------------------

HEADER_CHARS = st.characters(codec="latin-1").filter(lambda c: c == "\t" or " " <= c <= "~" or c >= "\x80")
"""What an HTTP header value may carry on the wire (h11): tab, visible ASCII, space, obs-text; read as latin-1."""
header_text = st.text(HEADER_CHARS, max_size=40).map(lambda v: v.strip(" \t"))
"""h11 refuses to send a value with leading or trailing whitespace (and servers strip it anyway)."""


def _valid_int(text: str, minimum: int, maximum: int | None = None) -> bool:
    text = text.strip()
    return text.isascii() and text.isdigit() and int(text) >= minimum and (maximum is None or int(text) <= maximum)


def _valid_token(text: str, max_length: int) -> bool:
    text = text.strip()
    return bool(text) and len(text) <= max_length and text.isprintable()


def bad_token(max_length: int) -> st.SearchStrategy[str]:
    non_printable = st.sampled_from(["\t", "\x85", "\xa0", "\xad", "\x9f", "\x80"])
    return st.one_of(
        st.just(""),
        st.text(st.sampled_from("abcXYZ019-_.:"), min_size=max_length + 1, max_size=max_length + 50),
        st.tuples(header_text, non_printable, header_text).map(lambda parts: f"{parts[0]}x{parts[1]}x{parts[2]}"),
    ).filter(lambda v: not _valid_token(v, max_length))


BAD_HEADERS: dict[str, st.SearchStrategy[str]] = {
    "X-Context-Budget": (header_text | st.sampled_from(["0", "00", "-1", "1.5", "1e3", "none please", "\xb2"])).filter(
        lambda v: not _valid_int(v, 1) and v.strip().lower() != "none"
    ),
    "X-Context-Preserve-Recent": (header_text | st.integers(1001, 10**30).map(str) | st.just("-1")).filter(
        lambda v: not _valid_int(v, 0, 1000)
    ),
    "X-Context-Mode": (header_text | st.sampled_from(["AUTO!", "on", "none", "passthrough"])).filter(
        lambda v: v.strip().lower() not in ("auto", "off")
    ),
    "X-Session-Id": bad_token(200),
    "Idempotency-Key": bad_token(255),
}


@st.composite
def invalid_headers(draw: st.DrawFn) -> dict[str, bytes]:
    names = draw(st.lists(st.sampled_from(sorted(BAD_HEADERS)), min_size=1, max_size=3, unique=True))
    return {name: draw(BAD_HEADERS[name]).encode("latin-1") for name in names}


# --- the properties ---------------------------------------------------------------------------------------------


def assert_refused_without_a_trace(
    http: httpx.Client, proxy: ProxyServer, upstream: FakeUpstream, body: bytes, headers: dict[str, bytes]
) -> None:
    before = row_counts(proxy.config.store.path)
    sent_upstream = len(upstream.requests)
    sent: dict[bytes, bytes] = {b"Content-Type": b"application/json"}
    sent.update((name.encode("ascii"), value) for name, value in headers.items())
    response = http.post(CHAT, content=body, headers=sent)
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("application/json")
    assert_openai_error(response.json())
    assert row_counts(proxy.config.store.path) == before
    assert len(upstream.requests) == sent_upstream


@pytest.mark.time_budget(60)
@FUZZ_SETTINGS
@given(body=invalid_body())
def test_invalid_bodies_are_4xx_openai_errors_and_change_nothing(
    http: httpx.Client, fuzz_proxy: ProxyServer, upstream_server: FakeUpstream, body: bytes
) -> None:
    assert_refused_without_a_trace(http, fuzz_proxy, upstream_server, body, {})


@pytest.mark.time_budget(60)
@FUZZ_SETTINGS
@given(headers=invalid_headers(), stream=st.booleans())
def test_invalid_context_headers_are_4xx_openai_errors_and_change_nothing(
    http: httpx.Client, fuzz_proxy: ProxyServer, upstream_server: FakeUpstream, headers: dict[str, bytes], stream: bool
) -> None:
    body = json.dumps({**valid_body(), "stream": stream}).encode()
    assert_refused_without_a_trace(http, fuzz_proxy, upstream_server, body, headers)


# --- valid-looking conversations -----------------------------------------------------------------------------------

message_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=200)
valid_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant"]), "content": message_text},
    optional={"name": st.from_regex(r"[A-Za-z0-9_-]{1,20}", fullmatch=True)},
)
valid_params = st.fixed_dictionaries(
    {},
    optional={
        "temperature": st.floats(0, 2),
        "top_p": st.floats(0, 1),
        "max_tokens": st.integers(1, 512),
        "user": st.text(max_size=30),
        "metadata": st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3),
        "stop": st.lists(st.text(min_size=1, max_size=5), max_size=3),
    },
)
valid_headers = st.fixed_dictionaries(
    {},
    optional={
        "X-Session-Id": st.from_regex(r"[A-Za-z0-9._:-]{1,40}", fullmatch=True),
        "X-Context-Budget": st.integers(200, 10_000).map(str) | st.just("none"),
        "X-Context-Preserve-Recent": st.integers(0, 8).map(str),
        "X-Context-Mode": st.sampled_from(["auto", "off", "AUTO", "Off"]),
    },
)


@pytest.mark.time_budget(60)
@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=st.lists(valid_message, min_size=1, max_size=6).filter(
        lambda ms: any(m["role"] in ("user", "developer", "system") for m in ms)
    ),
    params=valid_params,
    headers=valid_headers,
    stream=st.booleans(),
)
def test_valid_looking_conversations_never_get_a_5xx(
    http: httpx.Client,
    messages: list[dict[str, Any]],
    params: dict[str, Any],
    headers: dict[str, str],
    stream: bool,
) -> None:
    body = {"model": "fake", "messages": messages, **params, "stream": stream}
    with http.stream("POST", CHAT, json=body, headers=headers) as response:
        assert response.status_code < 500, response.read()[:500]
        if response.status_code >= 400:
            assert_openai_error(json.loads(response.read()))
            return
        if not stream:
            response.read()
            assert response.json()["choices"][0]["message"]["role"] == "assistant"
            return
        events = list(sse_events(response))
    assert events[-1] == "[DONE]", events[-1:]
    assert not any(isinstance(event, dict) and "error" in event for event in events), events


# --- the other doors ------------------------------------------------------------------------------------------------

RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
COUNT_TOKENS = "/v1/messages/count_tokens"
LONG_TEXT = st.integers(MAX_MESSAGE_CHARS + 1, 2 * MAX_MESSAGE_CHARS).map(lambda n: "y" * n)
"""Text for one message over `limits.max_message_chars`, well within the body limit."""
ASSISTANT_TEXT = {"role": "assistant", "content": "x"}
RESPONSES_CALL = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
MESSAGES_CALL = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]}


def valid_responses_body() -> dict[str, Any]:
    return {"model": "fake", "input": [{"role": "user", "content": "hello there"}]}


def valid_messages_body() -> dict[str, Any]:
    return {"model": "fake", "max_tokens": 64, "messages": [{"role": "user", "content": "hello there"}]}


@st.composite
def invalid_responses_body(draw: st.DrawFn) -> bytes:
    """A Responses body OpenAI refuses, or that the proxy must refuse before it writes."""
    kind = draw(st.sampled_from(["role", "part-type", "part-text", "orphan", "unanswered", "non-finite", "long"]))
    body = valid_responses_body()
    user = {"role": "user", "content": "hi"}
    if kind == "role":
        item_type = draw(st.sampled_from(["message", "something_else", None]))
        item = {"role": draw(not_of(str).filter(lambda v: v is not None)), "content": "x"}
        body["input"] = [user, item if item_type is None else {**item, "type": item_type}]
    elif kind == "part-type":
        part_type = draw(st.sampled_from(["image_url", "file", "banana", "tool_use"]) | any_text)
        assume(part_type not in ("input_text", "input_image", "output_text", "refusal", "input_file", "input_audio"))
        assume(part_type != "text")
        role = draw(st.sampled_from(["user", "system", "developer", "assistant"]))
        body["input"] = [user, {"role": role, "content": [{"type": part_type, "text": "x"}]}]
        if role == "assistant":
            body["input"].append(user)
    elif kind == "part-text":
        part_type = draw(st.sampled_from(["input_text", "output_text", "refusal"]))
        field = "refusal" if part_type == "refusal" else "text"
        part = {"type": part_type, field: draw(not_of(str))}
        where = draw(st.sampled_from(["message", "output"]))
        if where == "message":
            body["input"] = [{"role": "user", "content": [part]}]
        else:
            output = {"type": "function_call_output", "call_id": "call_1", "output": [part]}
            body["input"] = [user, RESPONSES_CALL, output]
    elif kind == "orphan":
        output = {"type": "function_call_output", "call_id": "call_1", "output": "r"}
        body["input"] = draw(st.sampled_from([[user, output], [user, output, RESPONSES_CALL]]))
    elif kind == "unanswered":
        # An assistant message after the call is the same turn (one chat message): a user turn must follow it.
        after = draw(st.sampled_from([[user], [{"role": "developer", "content": "d"}], [ASSISTANT_TEXT, user]]))
        body["input"] = [user, RESPONSES_CALL, *after]
    elif kind == "non-finite":
        return draw(with_non_finite({**body, "temperature": 1.0, "metadata": {"k": "v"}}))
    else:
        where = draw(st.sampled_from(["input", "instructions", "item"]))
        text = draw(LONG_TEXT)
        if where == "input":
            body["input"] = text
        elif where == "instructions":
            body["instructions"] = text
        else:
            body["input"] = [{"role": "user", "content": text}]
    return json.dumps(body).encode()


@st.composite
def invalid_messages_body(draw: st.DrawFn) -> bytes:
    """A Messages body Anthropic refuses, or that the proxy must refuse before it writes."""
    kind = draw(st.sampled_from(["text", "image", "orphan", "unanswered", "non-finite", "long-system"]))
    body = valid_messages_body()
    user = {"role": "user", "content": "hi"}
    if kind == "text":
        block = {"type": "text", "text": draw(not_of(str))}
        where = draw(st.sampled_from(["user", "assistant", "system"]))
        if where == "system":
            body["system"] = [block]
        else:
            body["messages"] = [user, {"role": where, "content": [block]}]
    elif kind == "image":
        source = draw(not_of(dict))
        body["messages"] = [
            {"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": "x"}]}
        ]
    elif kind == "orphan":
        result = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}]}
        body["messages"] = draw(
            st.sampled_from([[user, result], [user, {"role": "assistant", "content": "x"}, result]])
        )
    elif kind == "unanswered":
        after = draw(st.sampled_from([user, {"role": "user", "content": [{"type": "text", "text": "no result"}]}]))
        body["messages"] = [user, MESSAGES_CALL, after]
    elif kind == "non-finite":
        return draw(with_non_finite({**body, "temperature": 0.5, "metadata": {"user_id": "u"}}))
    else:
        text = draw(LONG_TEXT)
        body["system"] = draw(st.sampled_from([text, [{"type": "text", "text": text}]]))
    return json.dumps(body).encode()


def assert_anthropic_error(body: Any) -> None:
    """`{"type": "error", "error": {"type": str, "message": str}}` and nothing else."""
    assert isinstance(body, dict), body
    assert set(body) == {"type", "error"}, body
    assert body["type"] == "error", body
    error = body["error"]
    assert isinstance(error, dict), body
    assert set(error) == {"type", "message"}, body
    assert isinstance(error["type"], str), body
    assert error["type"], body
    assert isinstance(error["message"], str), body
    assert error["message"], body


def assert_door_refused_without_a_trace(
    http: httpx.Client, proxy: ProxyServer, upstream: FakeUpstream, path: str, body: bytes
) -> None:
    before = row_counts(proxy.config.store.path)
    sent_upstream = len(upstream.requests)
    response = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert 400 <= response.status_code < 500, (response.status_code, response.text[:500])
    assert response.headers["content-type"].startswith("application/json")
    if path.startswith(MESSAGES):
        assert_anthropic_error(response.json())
    else:
        assert_openai_error(response.json())
    assert row_counts(proxy.config.store.path) == before
    assert len(upstream.requests) == sent_upstream


@pytest.mark.time_budget(60)
@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=invalid_responses_body())
def test_invalid_responses_bodies_are_4xx_openai_errors_and_change_nothing(
    http: httpx.Client, fuzz_proxy: ProxyServer, upstream_server: FakeUpstream, body: bytes
) -> None:
    assert_door_refused_without_a_trace(http, fuzz_proxy, upstream_server, RESPONSES, body)


@pytest.mark.time_budget(60)
@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=invalid_messages_body(), path=st.sampled_from([MESSAGES, COUNT_TOKENS]))
def test_invalid_messages_bodies_are_4xx_anthropic_errors_and_change_nothing(
    http: httpx.Client, fuzz_proxy: ProxyServer, upstream_server: FakeUpstream, body: bytes, path: str
) -> None:
    assert_door_refused_without_a_trace(http, fuzz_proxy, upstream_server, path, body)


def test_the_fuzzed_store_is_still_sound(fuzz_proxy: ProxyServer) -> None:
    """After every property ran against it (module order), the store passes its integrity check."""
    from tests.reliability.support import integrity

    assert integrity(Path(fuzz_proxy.config.store.path)) == "ok"
