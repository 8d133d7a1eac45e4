"""SQLite's SQL, as the store writes it, in PostgreSQL's.

The store's queries are written once. Almost all of them are standard SQL; what is SQLite's own is a handful of
idioms, each rewritten here by an exact rule (anything else is left as it is, and PostgreSQL says so if it
cannot run it: the storage tests run every query on both engines):

- `?` placeholders (and `?N`, numbered) become psycopg's `%s`, with the parameters repeated into order; a
  literal `%` is doubled (in a statement with parameters: one without is run as it is).
- `x IN (SELECT value FROM json_each(?))`, a list passed as one JSON parameter, becomes `x = ANY(%s)` with the
  list itself, so PostgreSQL compares it with the column's own type (ids are integers or text).
- `json_extract(value, '$[N]') … FROM json_each(?)` over a JSON array of arrays becomes `value ->> N …
  FROM jsonb_array_elements(%s::jsonb) AS value`.
- `INSERT OR IGNORE INTO …` becomes `INSERT INTO … ON CONFLICT DO NOTHING` (before any `RETURNING`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_IN_LIST = re.compile(r"IN \(SELECT value FROM json_each\((\?\d*)\)\)")
_EXTRACT = re.compile(r"json_extract\(value, '\$\[(\d+)\]'\)")
_EACH = re.compile(r"FROM json_each\((\?\d*)\)")
_IGNORE = re.compile(r"^\s*INSERT OR IGNORE INTO", re.IGNORECASE)
_RETURNING = re.compile(r"\s+RETURNING\s+[\w\s,]+$", re.IGNORECASE)
_PLACEHOLDER = re.compile(r"\?(\d*)|%|'[^']*'")
_LIST_MARK = "\x00list\x00"


@dataclass(frozen=True)
class Translated:
    """One statement in PostgreSQL's SQL, and how to order the caller's parameters for it."""

    sql: str
    order: tuple[int, ...]
    """For each `%s`, the index of the caller's parameter it takes."""
    lists: frozenset[int]
    """Caller's parameters that are JSON lists to be passed as lists (`= ANY(%s)`)."""

    def parameters(self, given: Sequence[Any]) -> list[Any]:
        return [json.loads(given[i]) if i in self.lists else given[i] for i in self.order]


def translate(sql: str) -> Translated:
    sql = _IN_LIST.sub(lambda m: f"= ANY({_LIST_MARK}{m.group(1)})", sql)
    sql = _EXTRACT.sub(lambda m: f"(value ->> {m.group(1)})", sql)
    sql = _EACH.sub(lambda m: f"FROM jsonb_array_elements({m.group(1)}::jsonb) AS value", sql)
    if _IGNORE.match(sql):
        sql = _IGNORE.sub("INSERT INTO", sql, count=1).rstrip().rstrip(";")
        returning = _RETURNING.search(sql)
        cut = len(sql) if returning is None else returning.start()
        sql = sql[:cut] + " ON CONFLICT DO NOTHING" + sql[cut:]
    order: list[int] = []
    lists: set[int] = set()
    implicit = 0

    def placeholder(match: re.Match[str]) -> str:
        nonlocal implicit
        text = match.group(0)
        if text == "%":
            return "%%"
        if text.startswith("'"):
            return text.replace("%", "%%")  # a literal: its `?` are not placeholders
        if match.group(1):
            index = int(match.group(1)) - 1
        else:
            index = implicit
            implicit += 1
        order.append(index)
        if sql[max(0, match.start() - len(_LIST_MARK)) : match.start()] == _LIST_MARK:
            lists.add(index)
        return "%s"

    body = _PLACEHOLDER.sub(placeholder, sql).replace(_LIST_MARK, "")
    if not order:  # run without parameters, where psycopg reads `%` as it is
        body = sql.replace(_LIST_MARK, "")
    return Translated(body, tuple(order), frozenset(lists))
