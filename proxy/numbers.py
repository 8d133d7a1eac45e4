"""Integers from text: the one parser for headers, paths, query parameters and the config.

ASCII digits only (`"²"` and `"٣"` pass `str.isdigit`, and `int()` refuses or reads them), checked before
`int()`, which refuses more than 4,300 digits with a ValueError, and never past what SQLite stores.
"""

from __future__ import annotations

MAX_STORED_INTEGER = 2**63 - 1
"""SQLite's largest integer (PostgreSQL's BIGINT): no stored id or count is larger."""


def parse_integer(text: str, *, signed: bool = False) -> int | None:
    """`text` as an integer of at most `MAX_STORED_INTEGER`'s size, or None: not ASCII digits (after one `-`
    when `signed`), or too large. No whitespace, no `+`."""
    negative = signed and text.startswith("-")
    digits = text[1:] if negative else text
    if not digits.isascii() or not digits.isdigit() or len(digits) > len(str(MAX_STORED_INTEGER)):
        return None
    number = int(digits)
    if number > MAX_STORED_INTEGER:
        return None
    return -number if negative else number
