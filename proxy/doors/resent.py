"""A conversation its client re-sends is parsed, checked and converted once.

Every chat client re-sends its whole conversation on every turn, so the text of a request's message list
(`messages`, `input`) mostly repeats that of a request a moment before. A door keeps its last requests
(`ResentLists`): their text, where each element of the list ended, the parsed elements and the chat messages they
became. A request whose text begins with the same characters as one of them, up to the end of an element, takes
those elements and their messages as they were; only the rest is parsed, checked against the limits and
converted. Sound because equal text parses to equal values, the per-element limits and checks look at nothing
else, and a door converts an element without looking past it (where a message waits for later elements, as a
Responses run of output items does, the reuse stops before it: `Conversion.closed`). The checks across elements
(calls and their outputs) still see the whole list.

Process memory, correct to lose: without it every element is parsed and converted. Reused objects are shared
with earlier requests, which is safe because nothing changes a `Conversation`'s messages in place.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.config import RequestLimits
from proxy.doors.body import check_messages, checked_object, decoded, json_decoder, parse_json_object
from proxy.types import Message

RECENT_LISTS = 4
"""How many of a door's last requests a new one is compared with, the most recent first."""
RECENT_BYTES = 64 * 1024 * 1024
"""About how many bytes of body the kept requests hold in all; the oldest go first."""

Scan = Callable[[str, int], tuple[Any, int]]
"""A JSON scanner's `scan_once`: the value starting at an index, and the index after it."""


@dataclass(frozen=True)
class Conversion:
    """A list's elements as chat messages."""

    messages: list[Message]
    origins: list[int]
    """The element each message came from (errors name it)."""
    closed: list[int]
    """For each j in 0..len(elements): how many messages the first j elements became, when none of them waits
    for a later element (a Responses run of output items going on past j); else -1."""

    @staticmethod
    def each(messages: Sequence[Sequence[Message]], first: int) -> Conversion:
        """The conversion of elements that each became their own messages (`messages[i]` from element
        `first + i`)."""
        flat: list[Message] = []
        origins: list[int] = []
        closed = [0]
        for offset, converted in enumerate(messages):
            flat.extend(converted)
            origins.extend([first + offset] * len(converted))
            closed.append(len(flat))
        return Conversion(flat, origins, closed)


Convert = Callable[[Sequence[Any], int], Conversion]
"""A door's conversion of a list's elements from an index on (which names them in errors); `InvalidRequest` for
an element its API refuses."""


@dataclass(frozen=True)
class _Kept:
    """A request as a door kept it."""

    raw: bytes
    tenant: str
    key: str
    limits: RequestLimits
    start: int
    """Where the list's `[` is in the body's text."""
    ends: list[int]
    """Where each element ends in the body's text."""
    byte_ends: list[int]
    """... and in `raw`: where a new body is compared with it."""
    elements: list[Any]
    conversion: Conversion


class Listed:
    """A body with its list under `key` (`elements`; None when it holds none), and what of it a kept request
    gave. `convert` checks and converts the rest."""

    def __init__(
        self,
        body: dict[str, Any],
        key: str,
        limits: RequestLimits,
        lists: TenantLists | None = None,
        walked: tuple[bytes, str, int, list[int], int, _Kept | None] | None = None,
    ) -> None:
        self.body = body
        value = body.get(key)
        self.elements: list[Any] | None = value if isinstance(value, list) else None
        self._key = key
        self._limits = limits
        self._lists = lists
        self._walked = walked
        """(the body, its text, the list's start, element ends, elements reused, the request they came from)."""

    def convert(self, convert: Convert, param: str) -> Conversion:
        """The list as chat messages: the elements a kept request had as they were, the others checked against
        the limits (`check_messages`) and converted; then kept for the next request."""
        elements = self.elements
        assert elements is not None, "the door checks that its list is a list"
        reused, kept = (0, None) if self._walked is None else self._walked[4:]
        if kept is not None:
            while reused and kept.conversion.closed[reused] < 0:
                reused -= 1
        check_messages(elements, param, self._limits, start=reused)
        tail = convert(elements[reused:], reused)
        if kept is None or not reused:
            conversion = tail
        else:
            before, base = kept.conversion, kept.conversion.closed[reused]
            conversion = Conversion(
                before.messages[:base] + tail.messages,
                before.origins[:base] + tail.origins,
                before.closed[:reused] + [base + count if count >= 0 else -1 for count in tail.closed],
            )
        if self._lists is not None and self._walked is not None:
            raw, text, start, ends, used, source = self._walked
            byte_ends = ends if len(raw) == len(text) else _byte_ends(text, ends, used, source)  # ASCII: the same
            kept = _Kept(
                raw, self._lists.tenant, self._key, self._limits, start, ends, byte_ends, list(elements), conversion
            )
            self._lists.lists.keep(kept)
        return conversion


def parse_listed(raw: bytes, key: str, limits: RequestLimits, resent: TenantLists | None) -> Listed:
    """The body with its list under `key`: after what a kept request had when the door keeps them (`resent`)."""
    return Listed(parse_json_object(raw), key, limits) if resent is None else resent.parse(raw, key, limits)


class ResentLists:
    """A door's last requests (`RECENT_LISTS`, within `RECENT_BYTES` of body), shared by the threads its bodies
    are parsed in."""

    def __init__(self, max_lists: int = RECENT_LISTS, max_bytes: int = RECENT_BYTES) -> None:
        self._kept: list[_Kept] = []
        """The most recent last."""
        self._max_lists = max_lists
        self._max_bytes = max_bytes
        self._lock = threading.Lock()

    def of(self, tenant: str) -> TenantLists:
        """The kept requests one tenant's requests build on: only its own. (Another's would tell it, by how
        quickly it is answered, whether that tenant sent the same conversation.)"""
        return TenantLists(self, tenant)

    def parse(self, raw: bytes, key: str, limits: RequestLimits, tenant: str) -> Listed:
        """The body as a JSON object, as `parse_json_object` gives it (and refuses it), with its list under `key`
        parsed element by element after what the tenant's best-matching kept request already had."""
        text = decoded(raw)
        kept, reused = self._longest(raw, tenant, key, limits)
        scanned = kept.ends[reused - 1] if kept is not None and reused else 0  # the text before is as kept
        non_finite: list[str] = []
        try:
            scan = json_decoder(text, non_finite, scanned).scan_once  # type: ignore[attr-defined]
            walked = _walk(text, key, scan, kept, reused)
        except (ValueError, RecursionError, StopIteration):
            walked = None
        if walked is None:  # not a well-formed object: the whole parse, for the error it has always given
            return Listed(parse_json_object(raw), key, limits)
        body, listed = walked
        checked_object(body, text, non_finite, scanned)
        if listed is None:
            return Listed(body, key, limits)
        start, ends, used = listed
        return Listed(body, key, limits, self.of(tenant), (raw, text, start, ends, used, kept if used else None))

    def keep(self, kept: _Kept) -> None:
        if len(kept.raw) > self._max_bytes:
            return
        with self._lock:
            self._kept.append(kept)
            total = sum(len(item.raw) for item in self._kept)
            while len(self._kept) > self._max_lists or (total > self._max_bytes and self._kept):
                total -= len(self._kept.pop(0).raw)

    def _longest(self, raw: bytes, tenant: str, key: str, limits: RequestLimits) -> tuple[_Kept | None, int]:
        """The kept request whose body `raw` repeats through the most elements, and how many."""
        with self._lock:
            candidates = self._kept[::-1]
        best: _Kept | None = None
        most = 0
        for kept in candidates:
            if kept.tenant != tenant or kept.key != key or kept.limits != limits or not kept.ends:
                continue
            count = _repeated(raw, kept)
            if count > most:
                best, most = kept, count
            if count and count >= len(kept.ends) - 2:
                break  # the request this one extends: no other can give much more
        return best, most


@dataclass(frozen=True)
class TenantLists:
    """A door's kept requests as one tenant's request sees them (`ResentLists.of`)."""

    lists: ResentLists
    tenant: str

    def parse(self, raw: bytes, key: str, limits: RequestLimits) -> Listed:
        return self.lists.parse(raw, key, limits, self.tenant)


def _repeated(raw: bytes, kept: _Kept) -> int:
    """How many of `kept`'s elements `raw` repeats: the most k with the same bytes up to the end of the k-th
    (compared in place: ~0.05 ms a MB). Probed from the top down first (a client's next request differs from its
    last in its last elements only: Claude Code moves its cache breakpoint), then by bisection."""
    ends = kept.byte_ends
    before = memoryview(kept.raw)

    def same(count: int) -> bool:
        end = ends[count - 1]
        return len(raw) >= end and raw.startswith(before[:end])

    if not same(1):
        return 0
    good, bad, step, galloping = 1, len(ends) + 1, 1, True
    while bad - good > 1:
        probe = max(good + 1, bad - step) if galloping else (good + bad) // 2
        if same(probe):
            good, galloping = probe, False
        else:
            bad, step = probe, step * 2
    return good


def _byte_ends(text: str, ends: list[int], reused: int, kept: _Kept | None) -> list[int]:
    """Where each element ends in the body's bytes (`ends` are in its text): the reused ones' as kept, the others
    by encoding what is new."""
    byte_ends = kept.byte_ends[:reused] if kept is not None and reused else []
    char, byte = (ends[reused - 1], byte_ends[-1]) if byte_ends else (0, 0)
    for end in ends[len(byte_ends) :]:
        byte += len(text[char:end].encode("utf-8"))
        char = end
        byte_ends.append(byte)
    return byte_ends


_SPACE = re.compile(r"[ \t\n\r]*")


def _skip(text: str, idx: int) -> int:
    """The index of the next token: whitespace skipped as the standard decoder skips it."""
    match = _SPACE.match(text, idx)
    return idx if match is None else match.end()


_string: Callable[[str, int, bool], tuple[str, int]] = json.decoder.scanstring  # type: ignore[attr-defined]


def _walk(
    text: str, key: str, scan: Scan, kept: _Kept | None, reused: int
) -> tuple[dict[str, Any], tuple[int, list[int], int] | None] | None:
    """The top-level object of `text`, its values scanned one by one and the list under `key` element by element
    (the first `reused` of them taken from `kept`); None for anything but a well-formed object. Returns the body
    and (where the list starts, where each element ends, how many were reused)."""
    idx = _skip(text, 0)
    if text[idx : idx + 1] != "{":
        return None
    body: dict[str, Any] = {}
    listed: tuple[int, list[int], int] | None = None
    idx = _skip(text, idx + 1)
    if text[idx : idx + 1] == "}":
        idx += 1
    else:
        while True:
            if text[idx : idx + 1] != '"':
                return None
            name, idx = _string(text, idx + 1, True)
            idx = _skip(text, idx)
            if text[idx : idx + 1] != ":":
                return None
            idx = _skip(text, idx + 1)
            if name == key and text[idx : idx + 1] == "[":
                here = kept is not None and kept.start == idx  # a key repeated earlier starts elsewhere
                start = idx
                elements, ends, used, idx = _elements(text, idx, scan, kept if here else None, reused if here else 0)
                if idx < 0:
                    return None
                body[name] = elements
                listed = (start, ends, used)
            else:
                body[name], idx = scan(text, idx)
                if name == key:
                    listed = None
            idx = _skip(text, idx)
            mark = text[idx : idx + 1]
            idx += 1
            if mark == "}":
                break
            if mark != ",":
                return None
            idx = _skip(text, idx)
    if _skip(text, idx) != len(text):
        return None
    return body, listed


def _elements(
    text: str, idx: int, scan: Scan, kept: _Kept | None, reused: int
) -> tuple[list[Any], list[int], int, int]:
    """The array at `idx`, its first `reused` elements from `kept`: (elements, where each ends, reused, the index
    after the array; -1 when it is malformed)."""
    if kept is not None and reused:
        elements, ends = kept.elements[:reused], kept.ends[:reused]
        idx = ends[-1]
    else:
        elements, ends, reused = [], [], 0
        idx = _skip(text, idx + 1)
        if text[idx : idx + 1] == "]":
            return elements, ends, 0, idx + 1
        value, idx = scan(text, idx)
        elements.append(value)
        ends.append(idx)
    while True:
        idx = _skip(text, idx)
        mark = text[idx : idx + 1]
        if mark == "]":
            return elements, ends, reused, idx + 1
        if mark != ",":
            return elements, ends, reused, -1
        value, idx = scan(text, _skip(text, idx + 1))
        elements.append(value)
        ends.append(idx)
