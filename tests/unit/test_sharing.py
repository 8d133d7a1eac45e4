"""`shared_prefix`, `shared_suffix`: how many leading (trailing) elements two lists share as the very same objects."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from proxy.sharing import shared_prefix, shared_suffix


def naive(new: list[object], old: list[object]) -> int:
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
