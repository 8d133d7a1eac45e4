"""A JSON body scanned member by member, and the list under one key element by element, resumable after an
element of a body seen before (`proxy.doors.resent`).

Values are read by the standard library's scanner (`scan_once`: the C one or the pure-Python one, as
`proxy.doors.body` chooses), between them the scan is Python, so the event loop gets its turn between elements.
How many values the body holds up to each element's end is kept with it (`ValueCount`), so that a resumed scan
counts from there.
Only a well-formed object is scanned: anything else gives None, and the caller parses the body whole for the
error the standard parser gives.
"""

from __future__ import annotations

import json
import re
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from proxy.doors.json_values import Scan, ValueCount


def offsets() -> array[int]:
    """Where a list's elements end: machine integers, so that a long list's are copied and freed as one block
    (a list of ints is an object per element, each touched by every copy)."""
    return array("q")


@dataclass
class Scanned:
    """A scanned body: its members, and where its list and the list's elements are (positions in the body's
    text)."""

    body: dict[str, Any]
    start: int = -1
    """Where the list's `[` is; -1: the key holds no list."""
    head: dict[str, Any] = field(default_factory=dict)
    """The members before the list."""
    ends: array[int] = field(default_factory=offsets)
    """Where each element ends."""
    values: array[int] = field(default_factory=offsets)
    """How many values the body holds up to each element's end (`ValueCount.at`: at most that many)."""
    reused: int = 0
    """How many elements were taken from the body seen before."""


@dataclass(frozen=True)
class Resume:
    """Where a scan picks up: just after element `count` of a body seen before whose text the new one repeats
    up to there; the text scanned then begins at `offset` of the new body's."""

    head: dict[str, Any]
    start: int
    elements: list[Any]
    ends: array[int]
    values: array[int]
    count: int
    offset: int


def scan_body(text: str, key: str, scan: Scan, count: ValueCount, resume: Resume | None = None) -> Scanned | None:
    """The object in `text` (or, with `resume`, the rest of one), its list under `key` element by element, its
    values counted by `count` (from those the resumed part held)."""
    if resume is not None:
        scanned = Scanned(
            dict(resume.head),
            resume.start,
            resume.head,
            resume.ends[: resume.count],
            resume.values[: resume.count],
            resume.count,
        )
        elements = resume.elements[: resume.count]
        idx = _rest_of_list(text, 0, scan, elements, scanned, count, resume.offset)
        if idx < 0:
            return None
        scanned.body[key] = elements
        return _members(text, idx, key, scan, scanned, count, resume.offset, after_value=True)
    idx = _skip(text, 0)
    if text[idx : idx + 1] != "{":
        return None
    idx = _skip(text, idx + 1)
    if text[idx : idx + 1] == "}":
        return Scanned({}) if _skip(text, idx + 1) == len(text) else None
    return _members(text, idx, key, scan, Scanned({}), count, 0)


def _members(
    text: str,
    idx: int,
    key: str,
    scan: Scan,
    scanned: Scanned,
    count: ValueCount,
    offset: int,
    *,
    after_value: bool = False,
) -> Scanned | None:
    """The object's members from a member's name at `idx` (or, `after_value`, from just after a value) to its
    end, which must end `text`."""
    body = scanned.body
    while True:
        if not after_value:
            if text[idx : idx + 1] != '"':
                return None
            name, idx = _string(text, idx + 1, True)
            idx = _skip(text, idx)
            if text[idx : idx + 1] != ":":
                return None
            idx = _skip(text, idx + 1)
            if name == key and text[idx : idx + 1] == "[":
                scanned.start, scanned.head, scanned.reused = offset + idx, dict(body), 0
                scanned.ends, scanned.values = offsets(), offsets()
                elements: list[Any] = []
                idx = _skip(text, idx + 1)
                if text[idx : idx + 1] == "]":
                    idx += 1
                else:
                    value, idx = scan(text, idx)
                    elements.append(value)
                    scanned.ends.append(offset + idx)
                    scanned.values.append(count.at(text, idx))
                    idx = _rest_of_list(text, idx, scan, elements, scanned, count, offset)
                    if idx < 0:
                        return None
                body[name] = elements
            else:
                body[name], idx = scan(text, idx)
                if name == key:
                    scanned.start = -1
        after_value = False
        idx = _skip(text, idx)
        mark = text[idx : idx + 1]
        if mark == "}":
            return scanned if _skip(text, idx + 1) == len(text) else None
        if mark != ",":
            return None
        idx = _skip(text, idx + 1)


def _rest_of_list(
    text: str, idx: int, scan: Scan, elements: list[Any], scanned: Scanned, count: ValueCount, offset: int
) -> int:
    """The list's elements after the one ending at `idx`, appended; the index after its `]` (-1: malformed)."""
    ends, values = scanned.ends, scanned.values
    while True:
        idx = _skip(text, idx)
        mark = text[idx : idx + 1]
        if mark == "]":
            return idx + 1
        if mark != ",":
            return -1
        value, idx = scan(text, _skip(text, idx + 1))
        elements.append(value)
        ends.append(offset + idx)
        values.append(count.at(text, idx))


_SPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, idx: int) -> int:
    """The index of the next token: whitespace skipped as the standard decoder skips it."""
    match = _SPACE.match(text, idx)
    return idx if match is None else match.end()


_string: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]
