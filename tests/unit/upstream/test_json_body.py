"""An upstream body with the client's bytes for the messages it re-sends (`proxy.upstream.json_body`): always
the JSON of the same value, and the client's bytes where its very objects are sent."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.canonical.types import RawList
from proxy.config.schema import RequestLimits
from proxy.doors.chat import parse_chat_request
from proxy.doors.resent import ResentLists
from proxy.upstream.json_body import client_run, json_body

FIELDS = {"model": "m", "stream": True, "temperature": 0.5}


def conversation(turns: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": "Be brief ☀️."}]
    for index in range(turns):
        messages += [{"role": "user", "content": f"q{index} «é»"}, {"role": "assistant", "content": f"a{index}"}]
    return [*messages, {"role": "user", "content": "last"}]


def client_bytes(messages: list[dict[str, Any]]) -> bytes:
    """As a client might write them: indented, not ASCII-escaped, members after the list."""
    return json.dumps({"model": "m", "messages": messages, "stream": True}, indent=3, ensure_ascii=False).encode()


def parsed(turns: int) -> tuple[list[dict[str, Any]], RawList]:
    """A request parsed by the chat door after one it extends, as a served request is."""
    resent = ResentLists().of("t")
    parse_chat_request(client_bytes(conversation(turns - 1)), RequestLimits(), resent)
    request = parse_chat_request(client_bytes(conversation(turns)), RequestLimits(), resent)
    assert request.raw_messages is not None
    return request.messages, request.raw_messages


@pytest.mark.parametrize("fields", [FIELDS, {}])
def test_a_re_sent_conversation_is_written_with_the_clients_bytes(fields: dict[str, Any]) -> None:
    messages, raw = parsed(6)
    body = json_body(fields, messages, raw, client_run(messages, raw))
    assert json.loads(body) == {**fields, "messages": messages}
    assert b'\n         "content": "q5' in body  # the client's indentation: its bytes, not encoded again


@pytest.mark.parametrize(
    "shape",
    ["compacted", "one shared", "cut before the end", "none shared", "equal copies", "no raw", "empty"],
)
def test_the_body_is_the_json_of_what_is_sent_whatever_it_shares(shape: str) -> None:
    messages, raw = parsed(6)
    summary = {"role": "user", "content": "[summary of turns 0-3]"}
    sent = {
        "compacted": [messages[0], summary, *messages[-5:]],
        "one shared": [summary, messages[-1]],
        "cut before the end": messages[:-1],
        "none shared": [summary],
        "equal copies": [dict(message) for message in messages],
        "no raw": messages,
        "empty": [],
    }[shape]
    given = None if shape == "no raw" else raw
    body = json_body(FIELDS, sent, given, client_run(sent, given))
    assert json.loads(body) == {**FIELDS, "messages": sent}
    assert (b'\n         "content"' in body) == (shape == "compacted")
