"""`shared_prefix`, `shared_suffix`: how many leading (trailing) elements two lists share as the very same objects."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence

from hypothesis import given
from hypothesis import strategies as st

from proxy.sharing import Resent, shared_prefix, shared_suffix


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
    assert new.shared_with(old) == 3
    assert shared_prefix(new, old) == 3
    copy = list(old)  # equal elements, another list: compared
    assert new.shared_with(copy) is None
    assert shared_prefix(new, copy) == 3
    assert Resent(old[:2], old, 5).shared_with(old) == 2  # never more than either holds


def test_a_resent_list_does_not_keep_the_one_it_was_made_from() -> None:
    old: Resent[object] = Resent([object(), object()])
    new = Resent(old, old, 2)
    gone = weakref.ref(old)
    del old
    gc.collect()
    assert gone() is None
    assert new.shared_with(Resent([])) is None
