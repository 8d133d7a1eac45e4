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
from collections.abc import Sequence


def shared_prefix(new: Sequence[object], old: Sequence[object]) -> int:
    """How many leading elements of `new` are the very objects of `old`'s: comparisons at C speed, and about
    two passes over the shorter list however late the first difference is (each probe halves what is left)."""
    count = min(len(new), len(old))
    if count == 0 or new[0] is not old[0]:
        return 0
    if all(map(operator.is_, new[:count], old[:count])):
        return count
    low, high = 1, count - 1  # new[:low] is shared; the first difference is at or before `high`
    while low < high:
        middle = (low + high + 1) // 2
        if all(map(operator.is_, new[low:middle], old[low:middle])):
            low = middle
        else:
            high = middle - 1
    return low


def shared_suffix(new: Sequence[object], old: Sequence[object]) -> int:
    """How many trailing elements of `new` are the very objects of `old`'s (`shared_prefix`, from the end)."""
    count = min(len(new), len(old))
    if count == 0 or new[-1] is not old[-1]:
        return 0
    return shared_prefix(new[len(new) - count :][::-1], old[len(old) - count :][::-1])
