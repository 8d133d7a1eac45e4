"""Response ids (`proxy.doors.responses.ids`): `resp_` + a journal step's id in 16 hex digits, and back — only for
the exact form the proxy issues, so an id can never name a step it did not come from."""

from __future__ import annotations

import pytest

from proxy.doors.responses.ids import RESPONSE_ID_PREFIX, response_id, step_of
from proxy.numbers import MAX_STORED_INTEGER


@pytest.mark.parametrize("step_id", [1, 7, 255, 0xDEADBEEF, MAX_STORED_INTEGER])
def test_a_step_id_round_trips_through_its_response_id(step_id: int) -> None:
    response = response_id(step_id)
    assert response.startswith(RESPONSE_ID_PREFIX)
    assert len(response) == len(RESPONSE_ID_PREFIX) + 16
    assert step_of(response) == step_id


def test_the_id_is_fixed_width_lowercase_hex() -> None:
    assert response_id(1) == "resp_0000000000000001"
    assert response_id(0xABC) == "resp_0000000000000abc"
    assert response_id(MAX_STORED_INTEGER) == "resp_7fffffffffffffff"


@pytest.mark.parametrize(
    "response",
    [
        "msg_0000000000000001",  # another kind of id
        "0000000000000001",  # no prefix at all
        "RESP_0000000000000001",  # the prefix is case-sensitive
        "resp_",  # no digits
        "resp_00000000000000001",  # 17 digits
        "resp_8000000000000000",  # 2**63: past what SQLite stores as a step id
        "resp_ffffffffffffffff",
        "resp_1",  # the step's hex, but not as the proxy writes it
        "resp_00000000000000FF",  # uppercase
        "resp_0x00000000000001",
        "resp_000000000000000g",
        "resp_ 000000000000001",
        "resp_0000_00000000001",  # int() accepts underscores; the proxy never writes them
        "resp_+000000000000001",
        "resp_68a0c1e2d3f4b5a6978877665544332211",  # an id OpenAI itself would issue
    ],
)
def test_an_id_the_proxy_did_not_issue_names_no_step(response: str) -> None:
    assert step_of(response) is None


def test_a_negative_id_names_no_step() -> None:
    assert step_of("resp_-000000000000001") is None
