"""How many values a request body holds, against `limits.max_body_values`, known while it is scanned.

Parsing costs per value (~1 µs a value in the pure-Python scanner, ~50 bytes of memory), and so does everything
after it, so a body of millions of small values (`[0,0,0,...]`: two bytes each) costs seconds and gigabytes while
its byte size is well within `limits.max_body_bytes`. Its values are counted as they are read, and the scan stops
at the first one past the limit, before the rest is parsed.

Counting exactly needs the pure-Python scanner (the C one reads a whole document in one call). It is only needed
when the body might be over: every value but the outermost follows a `,`, `:` or `[`, so their count (three
passes, ~1 ms a MB, stopped once over) bounds the values from above; a text whose bound fits what the limit
leaves is read by whichever scanner `proxy.doors.body` chooses, and its elements' counts are that bound
(`ValueCount.at`).
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from proxy.errors import TooManyValues

Scan = Callable[[str, int], tuple[Any, int]]
"""A JSON scanner's `scan_once`: the value starting at an index, and the index after it."""


COUNT_PIECE_CHARS = 1024 * 1024
"""`count_chars` counts this much text per C call (~0.5 ms): a longer count would hold the GIL throughout."""


def count_chars(text: str, char: str, start: int, end: int, stop: int | None = None) -> int:
    """How many `char` are in `text[start:end]`, counted a piece at a time; once past `stop`, the count so far."""
    total = 0
    for at in range(start, end, COUNT_PIECE_CHARS):
        total += text.count(char, at, min(at + COUNT_PIECE_CHARS, end))
        if stop is not None and total > stop:
            break
    return total


def values_bound(text: str, start: int, end: int, stop: int | None = None) -> int:
    """At least as many as the values of `text[start:end]` not first in it: each follows a `,`, `:` or `[`
    (the count includes those inside strings, hence a bound); once past `stop`, the count so far."""
    total = 0
    for char in ",:[":
        total += count_chars(text, char, start, end, None if stop is None else stop - total)
        if stop is not None and total > stop:
            break
    return total


class ValueCount:
    """The values of a body read so far: `counted`, from `before` (those of the part of it a request before
    had), which may not pass `limit`. `exact`: counted one by one as the pure-Python scanner reads them
    (`scanner`); else bounded from the text (`at`), which then fits the limit whole."""

    def __init__(self, text: str, start: int, limit: int, before: int = 0) -> None:
        self.limit = limit
        self.counted = before
        self._last = start
        room = limit - before
        self.exact = len(text) - start > room and values_bound(text, start, len(text), room) > room

    def at(self, text: str, idx: int) -> int:
        """The values up to `idx` of `text` (where an element ends), from where the count last was (an element's
        text at a time: three C calls, no pieces)."""
        if not self.exact:
            last = self._last
            self.counted += text.count(",", last, idx) + text.count(":", last, idx) + text.count("[", last, idx)
            self._last = idx
        return self.counted

    def add(self) -> None:
        """One more value read; past the limit the body is refused."""
        self.counted += 1
        if self.counted > self.limit:
            raise TooManyValues(
                f"The JSON body of your request holds more than {self.limit} values (arrays, objects, strings, "
                "numbers, booleans and nulls); this proxy accepts at most that many (limits.max_body_values)."
            )

    def scanner(self, decoder: json.JSONDecoder) -> Scan:
        """`decoder`'s pure-Python scanner, each value it reads counted (and the scan stopped past the limit)."""
        self.exact = True
        add = self.add

        def counted(scan: Scan) -> Scan:
            def scan_counted(string: str, idx: int) -> tuple[Any, int]:
                add()
                return scan(string, idx)

            return scan_counted

        def parse_object(s_and_end: tuple[str, int], strict: bool, scan: Scan, *rest: Any) -> tuple[Any, int]:
            return _json_object(s_and_end, strict, counted(scan), *rest)  # type: ignore[no-any-return]

        def parse_array(s_and_end: tuple[str, int], scan: Scan) -> tuple[Any, int]:
            return _json_array(s_and_end, counted(scan))  # type: ignore[no-any-return]

        context = SimpleNamespace(
            parse_object=parse_object,
            parse_array=parse_array,
            parse_string=decoder.parse_string,  # type: ignore[attr-defined]
            strict=decoder.strict,
            parse_float=decoder.parse_float,
            parse_int=decoder.parse_int,
            parse_constant=decoder.parse_constant,
            object_hook=decoder.object_hook,
            object_pairs_hook=decoder.object_pairs_hook,
            memo={},
        )
        return counted(json.scanner.py_make_scanner(context))  # type: ignore[attr-defined]


_json_object = json.decoder.JSONObject  # type: ignore[attr-defined]
_json_array = json.decoder.JSONArray  # type: ignore[attr-defined]
