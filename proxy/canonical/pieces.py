"""A request body held as pieces, the bytes it repeats of an earlier body being that body's own.

A client re-sends its whole conversation on every turn, so a long session's body is megabytes that repeat the
body it sent a moment before. Joining such a body's chunks into one buffer and comparing that with the earlier
body afterwards took two passes over megabytes of fresh memory per request (~3 ms at 10 MB, most of it the page
faults of the new buffer). Instead each chunk is compared with the earlier bodies as it arrives, while it is
still in the processor's cache (`Reading`): the bytes a body shares with one of them are not kept again, only
that body's pieces are, and what is new is joined into one more piece. Bytes never change, so sharing them is
safe; the earlier body's pieces stay alive as long as a later body holds them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate

MAX_PIECES = 64
"""Past this many pieces a body is joined into one (a copy of its bytes, once every ~60 requests of a session
that grows by one piece a request): comparing and slicing stay cheap, and old bodies are let go."""


Run = tuple[bytes, int, int]
"""The bytes `data[start:stop]`, not copied."""


class Pieces:
    """Bytes as a sequence of runs of other bytes. Immutable."""

    __slots__ = ("_ends", "_runs")

    def __init__(self, runs: Sequence[Run]) -> None:
        self._runs = tuple(run for run in runs if run[2] > run[1])
        self._ends = list(accumulate(stop - start for _, start, stop in self._runs))

    @staticmethod
    def of(data: bytes) -> Pieces:
        """Bytes in one piece, shared with no earlier body."""
        return Pieces([(data, 0, len(data))])

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def tobytes(self, start: int = 0) -> bytes:
        """The bytes from `start` on, as one object (no copy when they are one whole piece)."""
        runs = self.runs(start, len(self))
        if len(runs) == 1 and runs[0][1] == 0 and runs[0][2] == len(runs[0][0]):
            return runs[0][0]
        return b"".join(_views(runs))

    def views(self, start: int, stop: int) -> list[memoryview]:
        """The bytes from `start` to `stop` as views of the pieces (no copy)."""
        return _views(self.runs(start, stop))

    def runs(self, start: int, stop: int) -> list[Run]:
        """The bytes from `start` to `stop` as runs of the pieces' bytes."""
        runs: list[Run] = []
        index = bisect_right(self._ends, start)
        while start < stop and index < len(self._runs):
            data, first, last = self._runs[index]
            begin = self._ends[index] - (last - first)
            runs.append((data, first + start - begin, first + min(stop, self._ends[index]) - begin))
            start = self._ends[index]
            index += 1
        return runs

    def same_memory(self, other: Pieces) -> int:
        """How many first bytes these and `other` hold in the very same memory (a body and the one it extends,
        where it took them from it): what need not be compared twice."""
        done = 0
        for (data, start, stop), (other_data, other_start, other_stop) in zip(self._runs, other._runs, strict=False):
            if data is not other_data or start != other_start:
                break
            done += min(stop, other_stop) - start
            if stop != other_stop:
                break
        return done

    def extended(self, shared: int, rest: bytes) -> Pieces:
        """A new body: the first `shared` of these bytes, then `rest`."""
        if shared == len(self) and not rest:
            return self
        runs = [*self.runs(0, shared), (rest, 0, len(rest))]
        if len(runs) > MAX_PIECES:
            joined = b"".join(_views(runs))
            runs = [(joined, 0, len(joined))]
        return Pieces(runs)


def _views(runs: Iterable[Run]) -> list[memoryview]:
    return [memoryview(data)[start:stop] for data, start, stop in runs]


def _matched(chunk: bytes, runs: Sequence[Run]) -> int:
    """How many of `chunk`'s first bytes equal those of `runs` (compared at C speed)."""
    done = 0
    for view in _views(runs):
        if not chunk.startswith(view, done):
            return done + _first_difference(chunk, done, view)
        done += len(view)
    return done


def _first_difference(chunk: bytes, start: int, view: memoryview) -> int:
    """Where, counted from `start`, `chunk` first differs from `view` (which it does not begin with there): by
    halving the range known to differ, comparing ~its length in all."""
    same, differs = 0, len(view)
    while differs - same > 1:
        middle = (same + differs) // 2
        if chunk.startswith(view[same:middle], start + same):
            same = middle
        else:
            differs = middle
    return same


@dataclass(frozen=True)
class Received:
    """A body as read: its bytes, and the earlier body (`base`) whose first `shared` bytes it begins with (the
    body does not refer to it: a session's bodies would hold each other alive, every one since the first)."""

    body: Pieces
    base: Pieces | None = None
    shared: int = 0

    @staticmethod
    def of(data: bytes) -> Received:
        return Received(Pieces.of(data))

    @property
    def fresh(self) -> int:
        """Bytes not taken from `base`: what is new to parse."""
        return len(self.body) - self.shared


class Reading:
    """A body as its chunks arrive, each compared with the `earlier` bodies still equal to it so far; `received`
    is the body, sharing the longest run of bytes any of them began with.

    A session's bodies hold their shared prefix in the same memory, so a chunk is compared with the first body
    still equal (the leader) and only with another where that one's bytes are not the leader's own."""

    def __init__(self, earlier: Iterable[Pieces]) -> None:
        self._alive = _led([body for body in earlier if len(body)])
        self._base: Pieces | None = None
        self._shared = 0
        self._size = 0
        self._rest: list[bytes | memoryview] = []

    def add(self, chunk: bytes) -> None:
        if not chunk:
            return
        if self._alive:
            stop = self._size + len(chunk)
            counts: list[int] = []
            for body, common in self._alive:
                if stop <= common:  # the leader's own bytes: its count
                    counts.append(counts[0])
                else:
                    counts.append(_matched(chunk, body.runs(self._size, stop)))
            whole = [body for (body, _), count in zip(self._alive, counts, strict=True) if count == len(chunk)]
            if whole:
                self._alive = self._alive if len(whole) == len(self._alive) else _led(whole)
                self._size = stop
                return
            best = max(range(len(counts)), key=counts.__getitem__)  # the first of the longest
            self._base, count = self._alive[best][0], counts[best]
            self._shared = self._size + count
            self._alive = []
            self._rest.append(memoryview(chunk)[count:])
        else:
            self._rest.append(chunk)
        self._size += len(chunk)

    def received(self) -> Received:
        if self._alive:  # the body is the first bytes of an earlier one (or all of it)
            self._base, self._shared = self._alive[0][0], self._size
        if self._base is None:
            return Received.of(b"".join(self._rest))
        return Received(self._base.extended(self._shared, b"".join(self._rest)), self._base, self._shared)


def _led(bodies: Sequence[Pieces]) -> list[tuple[Pieces, int]]:
    """The bodies, each with how many first bytes it holds in the same memory as the first (the leader, which
    is always compared)."""
    return [(body, index and bodies[0].same_memory(body)) for index, body in enumerate(bodies)]
