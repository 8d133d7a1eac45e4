"""Response ids: a response is a journal step, and its id (`resp_` + the step's id in 16 hex digits) names it, so
a stream, its replay, a JSON answer and a stored response read back all agree."""

from __future__ import annotations

from proxy.numbers import MAX_STORED_INTEGER

RESPONSE_ID_PREFIX = "resp_"


def response_id(step_id: int) -> str:
    return f"{RESPONSE_ID_PREFIX}{step_id:016x}"


def step_of(response: str) -> int | None:
    """The journal step a response id names; None when it names none."""
    digits = response.removeprefix(RESPONSE_ID_PREFIX)
    if not response.startswith(RESPONSE_ID_PREFIX) or not 0 < len(digits) <= 16 or not digits.isalnum():
        return None
    try:
        step_id = int(digits, 16)
    except ValueError:
        return None
    # Past SQLite's integers no step can have it (and binding it would raise OverflowError).
    return step_id if step_id <= MAX_STORED_INTEGER and response_id(step_id) == response else None
