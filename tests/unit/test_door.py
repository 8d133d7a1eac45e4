"""`proxy.doors.door`: which door's shape an error takes, by route; the registry's doors."""

from __future__ import annotations

import pytest

from proxy.doors.door import error_door
from proxy.doors.messages import Messages
from proxy.doors.registry import DOORS
from proxy.doors.responses import Responses


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
