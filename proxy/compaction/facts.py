"""The facts a conversation states as `KEY=value`, `key = value` or `key: 42`, which a no-model summary lists
as their exact strings on one `facts:` line (`extractive`), so that many fit a small summary and a later merge
reads them back. A later value of a key replaces the earlier one: the newer value wins. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

FACTS_LABEL = "facts"
"""Starts the fallback's line of facts, so that a later fallback merging this summary reads them back as facts."""
FACT_SEPARATOR = "; "
_ASSIGNMENT = re.compile(
    r"(?<![\w.\-/?&%])[A-Za-z_][\w.-]*(?: ?=(?![=>]) ?|(?P<colon>: +))"
    r"(?P<value>\"[^\"\n;]*\"|'[^'\n;]*'|`[^`\n;]*`|[^\s,;\"'`]+)"
)
"""`KEY=value`, `key = value`, `key: value` as written in a sentence; a value ends at a space, comma or semicolon."""
_VALUE_END = ".,:!?)]}"
_KEY = re.compile(r"[=:]")
_NAMED_KEY = re.compile(r"[_\d.]|[a-z][A-Z]")
"""A key that is clearly a name (`retry_limit`, `apiTimeout`, `v2`): `key: value` is a fact whatever the value."""
_VALUE_LIKE = re.compile(r"\d|[_/]|[a-z][A-Z]")
"""A value that is clearly data (a number, a path, an identifier), which makes `Word: value` a fact too."""
_ROLES = frozenset(("summary", "user", "assistant", "system", "developer", "tool", "facts"))
_CLOSING = {")": "(", "]": "[", "}": "{"}


@dataclass(frozen=True)
class Fact:
    position: int
    text: str
    """As it was written: `DEPLOY_REGION=eu-west-3`, `retry_limit = 7`."""
    score: int

    @property
    def key(self) -> str:
        """What the fact sets (`DEPLOY_REGION`): a later value of it replaces this one."""
        return _KEY.split(self.text, maxsplit=1)[0].strip()


def add_fact(facts: dict[str, Fact], fact: Fact) -> None:
    """`fact`, unless it is already there; a fact of the same key said earlier goes: the newer value wins."""
    if fact.text in facts:
        return
    for older in [text for text, known in facts.items() if known.key == fact.key]:
        del facts[older]
    facts[fact.text] = fact


def fact_line(line: str) -> list[str] | None:
    """The facts of a `facts:` line an earlier fallback wrote, or None if `line` is not one."""
    if not line.startswith(FACTS_LABEL + ": "):
        return None
    listed = line[len(FACTS_LABEL) + 2 :].split(FACT_SEPARATOR)
    if all(facts_in(fact) == [(0, len(fact))] for fact in listed):
        return listed
    return None


def facts_in(sentence: str) -> list[tuple[int, int]]:
    """Where facts are written in a sentence: `KEY=value`, `key = value`, and `key: value` where the key is a name
    or the value is data (`Note: the` is prose). Trailing punctuation is the sentence's, not the value's."""
    found = []
    for match in _ASSIGNMENT.finditer(sentence):
        value, end = match.group("value"), match.end()
        if value[0] not in "\"'`":
            while value and (value[-1] in _VALUE_END or (value[-1] in _CLOSING and _unbalanced(value))):
                value, end = value[:-1], end - 1
            if not value or "(" in value or value[0] in "[{<":
                continue
        key = sentence[match.start() : match.start("value")].rstrip(" =:")
        if match.group("colon") and (
            key.lower() in _ROLES or not (_NAMED_KEY.search(key) or _VALUE_LIKE.search(value))
        ):
            continue
        found.append((match.start(), end))
    return found


def _unbalanced(value: str) -> bool:
    closing = value[-1]
    return value.count(closing) > value.count(_CLOSING[closing])


def remove(sentence: str, found: Sequence[tuple[int, int]]) -> str:
    for start, end in reversed(found):
        sentence = sentence[:start] + " " + sentence[end:]
    return sentence
