"""`proxy.doors.door`: which door's shape an error takes, by route; the registry's doors; what a socket holds
(a key's open sockets against its cap)."""

from __future__ import annotations

import pytest

from proxy.doors.door import OpenSockets, error_door
from proxy.doors.messages import Messages
from proxy.doors.registry import DOORS
from proxy.doors.responses import Responses
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
        ("/sessions/x", None),
    ],
)
def test_the_error_shape_is_chosen_by_route(path: str, door: type | None) -> None:
    assert error_door(path, DOORS) is door


def test_every_door_is_registered_once_with_its_own_route_and_prefix() -> None:
    assert len({door.name for door in DOORS}) == len({door.path for door in DOORS}) == len(DOORS)
    for door in DOORS:
        assert door.path == door.prefix or door.path.startswith(door.prefix + "/")
        for route in door.routes:
            assert callable(getattr(door, route.handler))


def test_a_key_holds_at_most_its_limit_of_sockets_and_a_closed_one_gives_the_room_back() -> None:
    sockets = OpenSockets()
    with sockets.slot("a", 2), sockets.slot("a", 2):
        with pytest.raises(TooManySockets) as refused, sockets.slot("a", 2):
            pass
        assert refused.value.status == 429
        assert refused.value.code == "too_many_sockets"
        with sockets.slot("b", 2):
            assert (sockets.count("a"), sockets.count("b")) == (2, 1)
        assert sockets.count("a") == 2
    assert (sockets.count("a"), sockets.count("b")) == (0, 0)
    with sockets.slot("a", 2):
        assert sockets.count("a") == 1


def test_a_socket_that_fails_while_held_gives_its_room_back() -> None:
    sockets = OpenSockets()
    with pytest.raises(RuntimeError), sockets.slot("a", 1):
        raise RuntimeError("the socket broke")
    assert sockets.count("a") == 0
