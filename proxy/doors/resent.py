"""A conversation its client re-sends is parsed, checked and converted once.

Every chat client re-sends its whole conversation on every turn, so the text of a request's message list
(`messages`, `input`) mostly repeats that of a request a moment before. A door keeps its last requests
(`ResentLists`): their bytes, where each element of the list ended, the parsed elements and the chat messages
they became. Its body is read against them (`proxy.canonical.pieces`: how many bytes it shares with which); a request
whose bytes begin as one of them does, up to the end of an element, takes those elements and their messages as
they were; only the rest is decoded, parsed (`proxy.doors.list_scan`), checked against the limits and
converted. Sound because equal bytes parse to equal values, the per-element limits and checks look at nothing
else, and a door converts an element without looking past it (where a message waits for later elements, as a
Responses run of output items does, the reuse stops before it: `Conversion.closed`). The checks across elements
(calls and their outputs) look past what a kept request that passed them began with (`Check`).

Process memory, correct to lose: without it every element is parsed and converted. Reused objects are shared
with earlier requests, which is safe because nothing changes a `Conversation`'s messages in place.
"""

from __future__ import annotations

import contextlib
import threading
from array import array
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.canonical.pieces import Pieces, Reading, Received
from proxy.canonical.sharing import Resent
from proxy.canonical.types import Message, RawList
from proxy.config.schema import RequestLimits
from proxy.doors.body import check_messages, checked_object, decoded, json_decoder, parse_json_object
from proxy.doors.json_values import ValueCount
from proxy.doors.list_scan import Resume, Scanned, offsets, scan_body
from proxy.errors import InvalidRequest, TooManyValues

RECENT_LISTS = 4
"""How many of a door's last requests a new one is compared with, the most recent first."""
RECENT_BYTES = 64 * 1024 * 1024
"""About how many bytes of body the kept requests hold in all; the oldest go first."""


@dataclass(frozen=True)
class Conversion:
    """A list's elements as chat messages."""

    messages: list[Message]
    origins: array[int]
    """The element each message came from (errors name it)."""
    closed: array[int]
    """For each j in 0..len(elements): how many messages the first j elements became, when none of them waits
    for a later element (a Responses run of output items going on past j); else -1. (Both machine integers, as
    `list_scan.offsets` are: a long list's are copied as one block.)"""

    @staticmethod
    def each(messages: Sequence[Sequence[Message]], first: int) -> Conversion:
        """The conversion of elements that each became their own messages (`messages[i]` from element
        `first + i`)."""
        flat: list[Message] = []
        origins, closed = array("q"), array("q", [0])
        for offset, converted in enumerate(messages):
            flat.extend(converted)
            origins.extend([first + offset] * len(converted))
            closed.append(len(flat))
        return Conversion(flat, origins, closed)


Convert = Callable[[Sequence[Any], int], Conversion]
"""A door's conversion of a list's elements from an index on (which names them in errors); `InvalidRequest` for
an element its API refuses."""
Check = Callable[[Conversion, int], None]
"""A door's checks across a list's messages (a tool output and its call); `InvalidRequest` for a list its API
refuses. Given how many leading messages are those a list that passed them began with."""


@dataclass(frozen=True)
class _Kept:
    """A request as a door kept it."""

    raw: Pieces
    tenant: str
    key: str
    limits: RequestLimits
    head: dict[str, Any]
    """The body's members before the list."""
    start: int
    """Where the list's `[` is in the body's text."""
    ends: array[int]
    """Where each element ends in the body's text."""
    byte_ends: array[int]
    """... and in `raw`: where a new body is compared with it."""
    values: array[int]
    """How many values the body holds up to each element's end (at most)."""
    elements: list[Any]
    conversion: Conversion
    prelude: tuple[Any, list[Message]] | None
    """A member outside the list and the messages it became (`Listed.prelude`)."""
    checked: bool
    """Its messages passed the door's `Check`."""
    messages: Resent[Message]
    """The request's messages: the prelude's, then the list's (`Listed.convert`)."""


@dataclass(frozen=True)
class _Scan:
    """What `ResentLists.parse` read of a body: its bytes, the text scanned (from `offset`, byte `byte_offset`
    on), the scan, and the kept request it resumed."""

    raw: Pieces
    text: str
    offset: int
    byte_offset: int
    scanned: Scanned
    kept: _Kept | None


class Listed:
    """A body with its list under `key` (`elements`; None when it holds none), and what of it a kept request
    gave. `convert` checks and converts the rest."""

    def __init__(
        self,
        body: dict[str, Any],
        key: str,
        limits: RequestLimits,
        lists: TenantLists | None = None,
        scan: _Scan | None = None,
    ) -> None:
        self.body = body
        value = body.get(key)
        self.elements: list[Any] | None = value if isinstance(value, list) else None
        self._key = key
        self._limits = limits
        self._lists = lists
        self._scan = scan
        self._prelude: tuple[Any, list[Message]] | None = None
        self._prelude_kept = False
        """The prelude's messages are the kept request's."""
        self.messages: Resent[Message] = Resent(())
        """The request's messages, once `convert` has made them."""
        self.raw: RawList | None = None
        """The list's bytes, once `convert` has scanned them."""

    def prelude(self, value: Any, make: Callable[[Any], list[Message]]) -> list[Message]:
        """The messages a member outside the list becomes (a system prompt, instructions), those of the kept
        request this one resumed when it sent an equal value: a re-sent conversation is then the same objects
        from its first message on (`proxy.canonical.sharing`). Called before `convert`, which keeps it."""
        kept = None if self._scan is None else self._scan.kept
        if kept is not None and kept.prelude is not None and kept.prelude[0] == value:
            messages = kept.prelude[1]
            self._prelude_kept = True
        else:
            messages = make(value)
        self._prelude = (value, messages)
        return list(messages)

    @property
    def resumed(self) -> int:
        """How many leading elements of the list are those of a kept request (whose list `convert` converted)."""
        scan = self._scan
        return 0 if scan is None or scan.kept is None else scan.scanned.reused

    def convert(
        self,
        convert: Convert,
        param: str,
        check: Check | None = None,
        prelude: Sequence[Message] = (),
        *,
        answered_later: bool = False,
        keep: bool = True,
    ) -> Conversion:
        """The list as chat messages: the elements a kept request had as they were, the others checked against
        the limits (`check_messages`) and converted; the whole then passed to `check`, with how many leading
        messages are those of a list that passed it (`answered_later`: for a check that looks for a call's answer
        anywhere after it, only when that list held no tool output past them). The request's messages,
        `prelude`'s (`Listed.prelude`: a system prompt, instructions) then these, become `messages`, made from the
        kept request's as far as they are its very objects (`proxy.canonical.sharing.Resent`), and are kept, with the
        list, for the next request (unless not to `keep`: a list no later request begins with)."""
        elements = self.elements
        assert elements is not None, "the door checks that its list is a list"
        scan = self._scan
        kept = None if scan is None else scan.kept
        reused = 0 if scan is None or kept is None else scan.scanned.reused
        if kept is not None:
            while reused and kept.conversion.closed[reused] < 0:
                reused -= 1
        check_messages(elements, param, self._limits, start=reused)
        tail = convert(elements[reused:], reused)
        checked = base = 0
        if kept is None or not reused:
            conversion = tail
        else:
            before, base = kept.conversion, kept.conversion.closed[reused]
            messages = before.messages[:base]
            messages += tail.messages
            conversion = Conversion(
                messages,
                before.origins[:base] + tail.origins,
                before.closed[:reused] + array("q", [base + count if count >= 0 else -1 for count in tail.closed]),
            )
            answers_past = answered_later and any(message["role"] == "tool" for message in before.messages[base:])
            checked = base if kept.checked and not answers_past else 0
        if check is not None:
            check(conversion, checked)
        # The kept request's messages were its prelude's then its list's: these are theirs up to the end of the
        # list's messages this one took, when the preludes are the same objects (or neither has one).
        same_prelude = self._prelude_kept or (kept is not None and self._prelude is None and kept.prelude is None)
        self.messages = Resent(
            [*prelude, *conversion.messages],
            None if kept is None else kept.messages,
            len(prelude) + base if same_prelude else 0,
        )
        if self._lists is not None and scan is not None and keep:
            scanned = scan.scanned
            byte_ends, kept_elements = _byte_ends(scan), list(elements)
            self.raw = RawList(scan.raw, kept_elements, byte_ends)
            self._lists.lists.keep(
                _Kept(
                    scan.raw,
                    self._lists.tenant,
                    self._key,
                    self._limits,
                    scanned.head,
                    scanned.start,
                    scanned.ends,
                    byte_ends,
                    scanned.values,
                    kept_elements,
                    conversion,
                    self._prelude,
                    check is not None,
                    self.messages,
                )
            )
        return conversion


def parse_listed(raw: Received | bytes, key: str, limits: RequestLimits, resent: TenantLists | None) -> Listed:
    """The body with its list under `key`: after what a kept request had when the door keeps them (`resent`)."""
    if resent is None:
        body = parse_json_object(raw if isinstance(raw, bytes) else raw.body.tobytes(), limits.max_body_values)
        return Listed(body, key, limits)
    return resent.parse(raw, key, limits)


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

    def earlier(self, tenant: str) -> list[Pieces]:
        """The bodies of the tenant's kept requests, the most recent first: what its next body is read against."""
        with self._lock:
            return [kept.raw for kept in reversed(self._kept) if kept.tenant == tenant]

    def parse(self, raw: Received, key: str, limits: RequestLimits, tenant: str) -> Listed:
        """The body as a JSON object, as `parse_json_object` gives it (and refuses it), with its list under `key`
        scanned element by element after what the kept request it was read against already had: the elements
        whose bytes it repeats, up to the end of the last."""
        kept = self._resumed(raw, tenant, key, limits)
        reused = 0 if kept is None else bisect_right(kept.byte_ends, raw.shared)
        scan = None
        max_values = limits.max_body_values
        try:
            with contextlib.suppress(ValueError, RecursionError, StopIteration):
                scan = _scanned(raw.body, key, kept if reused else None, reused, max_values)
        except TooManyValues:
            if not reused:
                raise
            # The values the kept part held were counted at most: the whole body counted one by one says.
            return Listed(parse_json_object(raw.body.tobytes(), max_values), key, limits)
        except InvalidRequest:
            scan = None
        if scan is None:  # not a well-formed object: the whole parse, for the error it has always given
            return Listed(parse_json_object(raw.body.tobytes(), max_values), key, limits)
        if scan.scanned.start < 0:
            return Listed(scan.scanned.body, key, limits)
        return Listed(scan.scanned.body, key, limits, self.of(tenant), scan)

    def keep(self, kept: _Kept) -> None:
        if len(kept.raw) > self._max_bytes:
            return
        with self._lock:
            self._kept.append(kept)
            total = sum(len(item.raw) for item in self._kept)
            while len(self._kept) > self._max_lists or (total > self._max_bytes and self._kept):
                total -= len(self._kept.pop(0).raw)

    def _resumed(self, raw: Received, tenant: str, key: str, limits: RequestLimits) -> _Kept | None:
        """The kept request `raw` was read against, when it is the tenant's and its list was parsed alike."""
        if raw.base is None:
            return None
        with self._lock:
            kept = next((kept for kept in self._kept if kept.raw is raw.base), None)
        if kept is None or kept.tenant != tenant or kept.key != key or kept.limits != limits:
            return None
        return kept


@dataclass(frozen=True)
class TenantLists:
    """A door's kept requests as one tenant's request sees them (`ResentLists.of`)."""

    lists: ResentLists
    tenant: str

    def earlier(self) -> list[Pieces]:
        return self.lists.earlier(self.tenant)

    def parse(self, raw: Received | bytes, key: str, limits: RequestLimits) -> Listed:
        """`raw` as `ResentLists.parse` parses it; bytes not read against the kept bodies (as a test gives them)
        are compared with them first."""
        if isinstance(raw, bytes):
            reading = Reading(self.earlier())
            reading.add(raw)
            raw = reading.received()
        return self.lists.parse(raw, key, limits, self.tenant)


def _scanned(raw: Pieces, key: str, kept: _Kept | None, reused: int, max_values: int) -> _Scan | None:
    """The body scanned: only its bytes after the `reused` elements it repeats of `kept` are decoded and
    scanned, their values counted from those `kept` held up to there (`proxy.doors.json_values`), and checked
    for what JSON can spell but the proxy cannot pass on (`checked_object`); the rest is as kept."""
    resume = None
    offset = byte_offset = before = 0
    if kept is not None:
        offset, byte_offset, before = kept.ends[reused - 1], kept.byte_ends[reused - 1], kept.values[reused - 1]
        resume = Resume(kept.head, kept.start, kept.elements, kept.ends, kept.values, reused, offset)
    text = decoded(raw.tobytes(byte_offset))
    non_finite: list[str] = []
    count = ValueCount(text, 0, max_values, before)
    scan = json_decoder(text, non_finite, count).scan_once  # type: ignore[attr-defined]
    scanned = scan_body(text, key, scan, count, resume)
    if scanned is None:
        return None
    checked_object(scanned.body, text, non_finite)
    return _Scan(raw, text, offset, byte_offset, scanned, kept)


def _byte_ends(scan: _Scan) -> array[int]:
    """Where each element ends in the body's bytes (`Scanned.ends` are in its text): the reused ones' as kept,
    the others by encoding what is new (nothing to encode when it is ASCII: the same)."""
    scanned, kept = scan.scanned, scan.kept
    reused = scanned.reused
    byte_ends = kept.byte_ends[:reused] if kept is not None and reused else offsets()
    ascii = len(scan.text) == len(scan.raw) - scan.byte_offset
    char, byte = (scanned.ends[reused - 1], byte_ends[-1]) if byte_ends else (scan.offset, scan.byte_offset)
    for end in scanned.ends[reused:]:
        byte += end - char if ascii else len(scan.text[char - scan.offset : end - scan.offset].encode("utf-8"))
        char = end
        byte_ends.append(byte)
    return byte_ends
