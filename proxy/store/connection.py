"""What the store's code may ask of a connection and a row, whichever engine holds the data.

Write jobs and readers are written once, in SQLite's SQL, against these protocols: `sqlite3` satisfies them as
it is, and `proxy.store.postgres` wraps psycopg so that it does too (translating the SQL, `proxy.store.dialect`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Row(Protocol):
    """A result row, read by position (`row[0]`) or by column name (`row["id"]`), as `sqlite3.Row` is."""

    def __getitem__(self, key: int | str, /) -> Any: ...

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...

    def keys(self) -> list[str]: ...


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Connection(Protocol):
    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Sequence[Sequence[Any]], /) -> Cursor: ...


WriteWork = Callable[[Connection], T]
"""A write job: run on the writer, inside the group's transaction, never touching the event loop."""
