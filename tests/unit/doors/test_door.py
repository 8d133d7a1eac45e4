"""`proxy.doors.door`: which door's shape an error takes, by route; the registry's doors; what a socket holds
(a key's open sockets against its cap); the request view a door parses."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from proxy.doors.door import OpenSockets, RequestView, error_door
from proxy.doors.gemini import Gemini
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


@pytest.mark.parametrize("query", [b"", b"key=k1&alt=sse&key=k2"])
def test_the_request_view_is_what_starlette_reads_of_the_request(query: bytes) -> None:
    """Read from the scope directly (it is built on every request): the same path, path parameters, query and
    headers as Starlette's own accessors give, a repeated header's first value included."""
    headers = [(b"host", b"proxy:8080"), (b"x-goog-api-key", b"first"), (b"x-goog-api-key", b"second"), (b"a", b"\xe9")]
    scope = {
        "type": "http",
        "method": "POST",
        "scheme": "http",
        "server": ("127.0.0.1", 8080),
        "path": "/v1beta/models/gemini-2.5-pro:streamGenerateContent",
        "root_path": "",
        "query_string": query,
        "headers": headers,
        "path_params": {"model": "gemini-2.5-pro", "method": "streamGenerateContent"},
    }
    request = Request(scope)

    view = RequestView.of(request, b"{}")

    assert view.body == b"{}"
    assert view.path == request.url.path
    assert view.path_params == dict(request.path_params)
    assert view.query == dict(request.query_params)
    assert view.headers == dict(request.headers)
    assert view.headers["x-goog-api-key"] == "first"
