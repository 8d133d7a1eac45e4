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
from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


LINEAGE_DEPTH = 4
"""How many earlier sequences a `Lineage` remembers: a session's next request is built from the path its answer
extended, which was built from the previous request's."""


class Lineage:
    """What a sequence was made from: for each of its last `LINEAGE_DEPTH` ancestors, how many of its first
    elements are that ancestor's very objects, so `shared_prefix` answers without a pass.

    An ancestor is named by a token only it holds (`mark`), not held itself: a session's lists and paths do not
    keep one another alive, and a token held here keeps its identity from being reused."""

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


class Resent(list[T]):
    """A list made from an earlier one (`base`, if any): its first `shared` elements are that list's very objects.

    A door makes a request's messages so from its kept request's (`doors.resent`), where it knows how far they
    repeat it; every stage that compares them with that list then knows it without a pass over thousands of
    messages (`shared_prefix`)."""

    __slots__ = ("lineage",)
    lineage: Lineage

    def __init__(self, elements: Iterable[T], base: Resent[T] | None = None, shared: int = 0) -> None:
        super().__init__(elements)
        self.lineage = Lineage(
            None if base is None else base.lineage, 0 if base is None else min(shared, len(self), len(base))
        )


def known_shared(new: object, old: object) -> int | None:
    """At least how many first elements of `new` are `old`'s very objects, when `new`'s `lineage` remembers
    `old`'s (a `Resent` list, a stored path); None when it does not say."""
    lineage, before = getattr(new, "lineage", None), getattr(old, "lineage", None)
    if isinstance(lineage, Lineage) and isinstance(before, Lineage):
        return lineage.shared_with(before)
    return None


def shared_prefix(new: Sequence[object], old: Sequence[object]) -> int:
    """How many leading elements of `new` are the very objects of `old`'s, at C speed and without a slice (a
    slice's copy touches every object it holds): ~20 ns an element when all are shared, twice that else.
    Without a pass when `new`'s lineage knows `old` (`known_shared`)."""
    if new is old:
        return len(new)
    known = known_shared(new, old)
    if known is not None:
        # At least `known` (a lineage through a branch knows less than two paths share): one look past it says.
        if known < min(len(new), len(old)) and new[known] is old[known]:
            return known + shared_prefix(new[known:], old[known:])
        return known
    if all(map(operator.is_, new, old)):
        return min(len(new), len(old))
    return list(map(operator.is_, new, old)).index(False)


def shared_suffix(new: Sequence[object], old: Sequence[object]) -> int:
    """How many trailing elements of `new` are the very objects of `old`'s (`shared_prefix`, from the end)."""
    if len(new) == len(old) and all(map(operator.is_, new, old)):
        return len(new)  # the common case, checked forwards: twice as fast as backwards
    if all(map(operator.is_, reversed(new), reversed(old))):
        return min(len(new), len(old))
    return list(map(operator.is_, reversed(new), reversed(old))).index(False)
