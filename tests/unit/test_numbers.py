"""Integers from text (`proxy.numbers`): ASCII digits only, bounded before and after `int()`."""

from __future__ import annotations

import pytest

from proxy.numbers import MAX_STORED_INTEGER, parse_integer


@pytest.mark.parametrize(
    ("text", "signed", "expected"),
    [
        ("0", False, 0),
        ("42", False, 42),
        (str(MAX_STORED_INTEGER), False, MAX_STORED_INTEGER),
        (str(MAX_STORED_INTEGER + 1), False, None),
        ("9" * 5000, False, None),
        ("-5", False, None),
        ("-5", True, -5),
        ("--5", True, None),
        ("+5", True, None),
        (" 5", False, None),
        ("²", False, None),
        ("٣", False, None),
        ("", False, None),
        ("-", True, None),
    ],
)
def test_parse_integer(text: str, signed: bool, expected: int | None) -> None:
    assert parse_integer(text, signed=signed) == expected
