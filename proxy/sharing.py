"""What one request shares with the one before it, found by object identity.

A door hands the messages a client re-sends as the very objects it parsed for that client's previous request
(`doors.resent`), and nothing changes a conversation's messages in place (docs/architecture.md, "The
canonical form"). So a list that starts with the same objects as a list seen before starts with the same
values, and what was worked out for that prefix still holds: the history's recent paths and the compaction's
path items carry it over instead of comparing or rebuilding every re-sent message. Objects are compared only
while both lists are held, so an identity is never that of a freed object.
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


class Resent(list[T]):
    """A list made from an earlier one (`base`, if any): its first `shared` elements are that list's very objects.

    A door makes a request's messages so from its kept request's (`doors.resent`), where it knows how far they
    repeat it; every stage that compares them with that list then knows it without a pass over thousands of
    messages (`shared_prefix`). The earlier list is held weakly: a session's lists do not keep one another
    alive, and a freed one matches nothing."""

    __slots__ = ("__weakref__", "_base", "_shared")

    def __init__(self, elements: Iterable[T], base: Resent[T] | None = None, shared: int = 0) -> None:
        super().__init__(elements)
        self._base = None if base is None else weakref.ref(base)
        self._shared = 0 if base is None else min(shared, len(self), len(base))

    def shared_with(self, old: Sequence[object]) -> int | None:
        """How many first elements are `old`'s very objects, when `old` is the list this one was made from."""
        return self._shared if self._base is not None and self._base() is old else None


def shared_prefix(new: Sequence[object], old: Sequence[object]) -> int:
    """How many leading elements of `new` are the very objects of `old`'s, at C speed and without a slice (a
    slice's copy touches every object it holds): ~20 ns an element when all are shared, twice that else.
    Without a pass when `new` knows it was made from `old` (a `Resent`, or a `Lineage` holder)."""
    if new is old:
        return len(new)
    shared_with = getattr(new, "shared_with", None)
    if shared_with is not None and (known := shared_with(old)) is not None:
        # At least `known` (a lineage through a branch knows less than two paths share): one look past it says.
        if known < min(len(new), len(old)) and new[known] is old[known]:
            return int(known) + shared_prefix(new[known:], old[known:])
        return int(known)
    if all(map(operator.is_, new, old)):
        return min(len(new), len(old))
    return list(map(operator.is_, new, old)).index(False)


LINEAGE_DEPTH = 4
"""How many earlier sequences a `Lineage` remembers: a session's next request is built from the path its answer
extended, which was built from the previous request's."""


class Lineage:
    """What an immutable sequence was made from: for each of its last `LINEAGE_DEPTH` ancestors, how many of its
    first elements are that ancestor's very objects, so `shared_prefix` answers without a pass.

    An ancestor is named by a token only it holds (`mark`), not held itself: a session's paths do not keep one
    another alive, and a token held here keeps its identity from being reused."""

    __slots__ = ("_ancestors", "mark")

    def __init__(self, base: Lineage | None = None, shared: int = 0) -> None:
        self.mark = object()
        self._ancestors: tuple[tuple[object, int], ...] = (
            ()
            if base is None
            else ((base.mark, shared), *((mark, min(count, shared)) for mark, count in base._ancestors))[:LINEAGE_DEPTH]
        )

    def shared_with(self, old: Lineage) -> int | None:
        """At least how many first elements are `old`'s very objects, when `old` is among the remembered
        ancestors (exactly, but for an ancestor on another branch, which may share more)."""
        return next((count for mark, count in self._ancestors if mark is old.mark), None)


def shared_suffix(new: Sequence[object], old: Sequence[object]) -> int:
    """How many trailing elements of `new` are the very objects of `old`'s (`shared_prefix`, from the end)."""
    if len(new) == len(old) and all(map(operator.is_, new, old)):
        return len(new)  # the common case, checked forwards: twice as fast as backwards
    if all(map(operator.is_, reversed(new), reversed(old))):
        return min(len(new), len(old))
    return list(map(operator.is_, reversed(new), reversed(old))).index(False)
