"""`shared_prefix`, `shared_suffix`: how many leading (trailing) elements two lists share as the very same objects."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from proxy.canonical.sharing import LINEAGE_DEPTH, Lineage, Resent, known_shared, shared_prefix, shared_suffix


def naive(new: Sequence[object], old: Sequence[object]) -> int:
    count = 0
    for a, b in zip(new, old, strict=False):
        if a is not b:
            break
        count += 1
    return count


@given(
    size=st.integers(0, 60),
    new_size=st.integers(0, 60),
    changed=st.sets(st.integers(0, 59), max_size=4),
)
def test_it_is_the_length_of_the_identical_prefix(size: int, new_size: int, changed: set[int]) -> None:
    old: list[object] = [object() for _ in range(size)]
    new: list[object] = [old[i] if i < size and i not in changed else object() for i in range(new_size)]
    assert shared_prefix(new, old) == naive(new, old)
    assert shared_suffix(new[::-1], old[::-1]) == naive(new, old)


def test_equal_values_that_are_other_objects_are_not_shared() -> None:
    old = [{"role": "user", "content": "hi"}]
    assert shared_prefix([{"role": "user", "content": "hi"}], old) == 0
    assert shared_prefix(old, old) == 1
    assert shared_prefix([], old) == 0


def test_a_resent_list_shares_what_it_was_made_with_only_with_the_list_it_was_made_from() -> None:
    old: Resent[object] = Resent([object() for _ in range(5)])
    new = Resent([*old[:3], object()], old, 3)
    assert known_shared(new, old) == 3
    assert shared_prefix(new, old) == 3
    copy = list(old)  # equal elements, another list: compared
    assert known_shared(new, copy) is None
    assert shared_prefix(new, copy) == 3
    assert known_shared(Resent(old[:2], old, 5), old) == 2  # never more than either holds


class Watched(Resent[object]):
    """A `Resent` that can be referred to weakly, to see when it is freed."""


def test_a_resent_list_does_not_keep_the_one_it_was_made_from() -> None:
    old = Watched([object(), object()])
    new = Resent(old, old, 2)
    gone = weakref.ref(old)
    del old
    gc.collect()
    assert gone() is None
    assert known_shared(new, Resent([])) is None


class Derived(list[object]):
    """A list that knows what it was made from, as a stored path does (`Lineage`)."""

    def __init__(self, elements: Sequence[object], base: Derived | None = None, shared: int = 0) -> None:
        super().__init__(elements)
        self.lineage = Lineage(None if base is None else base.lineage, shared)


@given(steps=st.lists(st.tuples(st.integers(0, 8), st.integers(0, 3)), min_size=1, max_size=12))
def test_a_lineage_knows_what_each_remembered_ancestor_shares(steps: list[tuple[int, int]]) -> None:
    """Each list keeps a prefix of the one before and adds new objects: what it knows it shares with each of its
    last `LINEAGE_DEPTH` ancestors is the identity prefix, and it knows nothing of older ones."""
    lists = [Derived([object() for _ in range(6)])]
    for keep, added in steps:
        before = lists[-1]
        lists.append(Derived([*before[:keep], *(object() for _ in range(added))], before, min(keep, len(before))))
    newest = lists[-1]
    for back, ancestor in enumerate(reversed(lists[:-1]), 1):
        known = known_shared(newest, ancestor)
        if back <= LINEAGE_DEPTH:
            assert known == naive(newest, ancestor)
            assert shared_prefix(newest, ancestor) == known
        else:
            assert known is None
            assert shared_prefix(newest, ancestor) == naive(newest, ancestor)


def test_a_lineage_is_trusted_up_to_what_it_knows_and_looked_past() -> None:
    old = Derived([object(), object(), object()])
    claims = Derived([old[0], object(), object()], old, 2)  # a lie, to show the known part is not compared
    assert shared_prefix(claims, old) == 2
    knows_less = Derived([*old, object()], old, 1)  # as through a branch: what follows is compared
    assert shared_prefix(knows_less, old) == 3
    assert shared_prefix(old, old) == 3
    assert known_shared(Derived(list(old)), old) is None  # made from nothing: compared
    assert shared_prefix(Derived(list(old)), old) == 3
