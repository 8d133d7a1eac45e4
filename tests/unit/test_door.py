"""`proxy.doors.door`: which door's shape an error takes, by route; the registry's doors; what a socket holds
(a key's open sockets against its cap, the latest warm-up)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.config import RequestLimits
from proxy.conversation import Conversation
from proxy.doors.door import OpenSockets, SocketState, error_door
from proxy.doors.gemini import Gemini
from proxy.doors.messages import Messages
from proxy.doors.registry import DOORS
from proxy.doors.responses import Responses
from proxy.doors.responses.input import parse_socket_event
from proxy.errors import TooManySockets


@pytest.mark.parametrize(
    ("path", "door"),
    [
        ("/v1/messages", Messages),
        ("/v1/messages/count_tokens", Messages),
        ("/v1/messages/anything/below", Messages),
        ("/v1/messagesX", None),
        ("/v1/responses/resp_1/input_items", Responses),
        ("/v1/models", None),
        ("/v1/models/gpt-4o", None),
        ("/v1/models/ft:gpt-4o:org:abc123", None),
        ("/v1/models/gemini-2.5-pro:generateContent", Gemini),
        ("/v1/models/org/model:countTokens", Gemini),
        ("/v1beta/models/gemini-2.5-pro:streamGenerateContent", Gemini),
        ("/v1beta/anything", Gemini),
        ("/sessions/x", None),
    ],
)
def test_the_error_shape_is_chosen_by_route(path: str, door: type | None) -> None:
    assert error_door(path, DOORS) is door


def test_every_door_is_registered_once_with_its_own_route_and_prefix() -> None:
    paths = [path for door in DOORS for path in door.paths]
    assert len({door.name for door in DOORS}) == len(DOORS)
    assert len(set(paths)) == len(paths)
    for door in DOORS:
        for path in door.paths:
            assert error_door(path, DOORS) is door
        for route in door.routes:
            assert callable(getattr(door, route.handler))


def test_a_key_holds_at_most_its_limit_of_sockets_and_a_closed_one_gives_the_room_back() -> None:
    sockets = OpenSockets()
    with sockets.held("a", 2), sockets.held("a", 2):
        with pytest.raises(TooManySockets) as refused, sockets.held("a", 2):
            pass
        assert refused.value.status == 429
        assert refused.value.code == "too_many_sockets"
        with sockets.held("b", 2):
            assert (sockets.count("a"), sockets.count("b")) == (2, 1)
        assert sockets.count("a") == 2
    assert (sockets.count("a"), sockets.count("b")) == (0, 0)
    with sockets.held("a", 2):
        assert sockets.count("a") == 1


def test_a_socket_that_fails_while_held_gives_its_room_back() -> None:
    sockets = OpenSockets()
    with pytest.raises(RuntimeError), sockets.held("a", 1):
        raise RuntimeError("the socket broke")
    assert sockets.count("a") == 0


def event(**fields: Any) -> Conversation:
    raw = json.dumps({"type": "response.create", "model": "m", **fields}).encode()
    return parse_socket_event(raw, RequestLimits()).conversation


def test_a_socket_keeps_only_its_latest_warm_up() -> None:
    socket = SocketState()
    socket.warm("resp_warm_1", event(input="first warm-up"))
    socket.warm("resp_warm_2", event(input="second warm-up"))

    older = socket.resolve(event(input="next", previous_response_id="resp_warm_1"))
    assert older.continues is not None  # not resolved here: the pipeline answers previous_response_not_found
    latest = socket.resolve(event(input="next", previous_response_id="resp_warm_2"))
    assert latest.continues is None
    assert [message["content"] for message in latest.messages] == ["second warm-up", "next"]
