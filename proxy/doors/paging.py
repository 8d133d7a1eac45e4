"""`limit` and `offset` query parameters of the listing routes, checked before they reach SQL."""

from __future__ import annotations

from proxy.errors import InvalidRequest
from proxy.journal.reader import DEFAULT_PAGE
from proxy.numbers import parse_integer

MAX_PAGE = 500


def page_params(limit: str | None, offset: str | None) -> tuple[int, int]:
    """A bad one is a 400 naming it."""
    values = []
    for name, text, default, maximum in (
        ("limit", limit, DEFAULT_PAGE, MAX_PAGE),
        ("offset", offset, 0, None),
    ):
        if text is None:
            values.append(default)
            continue
        number = parse_integer(text)
        if number is None or (maximum is not None and not 1 <= number <= maximum):
            bound = f" between 1 and {maximum}" if maximum else " below 2^63"
            raise InvalidRequest(f"Query parameter '{name}' must be a whole number{bound}.", param=name)
        values.append(number)
    return values[0], values[1]
