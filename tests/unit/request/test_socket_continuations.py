"""`proxy.request.continuations.SocketContinuations`: what one WebSocket lets a request continue without the store
(the latest warm-up, the responses it answered)."""

from __future__ import annotations

import json
from typing import Any

from proxy.canonical.conversation import Conversation
from proxy.config.schema import RequestLimits
from proxy.doors.responses.input import parse_socket_event
from proxy.request.continuations import SocketContinuations


def event(**fields: Any) -> Conversation:
    raw = json.dumps({"type": "response.create", "model": "m", **fields}).encode()
    return parse_socket_event(raw, RequestLimits()).conversation


def test_a_socket_keeps_only_its_latest_warm_up() -> None:
    socket = SocketContinuations()
    socket.warm("resp_warm_1", event(input="first warm-up"))
    socket.warm("resp_warm_2", event(input="second warm-up"))

    older = socket.resolve(event(input="next", previous_response_id="resp_warm_1"))
    assert older.continues is not None  # not resolved here: the pipeline answers previous_response_not_found
    latest = socket.resolve(event(input="next", previous_response_id="resp_warm_2"))
    assert latest.continues is None
    assert [message["content"] for message in latest.messages] == ["second warm-up", "next"]


def test_a_response_answered_on_the_socket_is_continued_even_unstored() -> None:
    socket = SocketContinuations()
    socket.answered.add(7)
    conversation = event(input="next", previous_response_id="resp_0000000000000007")
    assert conversation.continues is not None
    resolved = socket.resolve(conversation)
    assert resolved.continues is not None
    assert resolved.continues.step_id == 7
    assert resolved.continues.same_connection

    other = socket.resolve(event(input="next", previous_response_id="resp_0000000000000008"))
    assert other.continues is not None
    assert not other.continues.same_connection
