"""psycopg made to run the store's SQL as `proxy.store.connection` asks: rows by position or name as `sqlite3.Row`
gives them, SQLite's integer and boolean habits, and each statement translated once from SQLite's SQL
(`proxy.store.dialect`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from decimal import Decimal
from typing import Any

import psycopg
from psycopg.adapt import Buffer, Dumper, Loader
from psycopg.rows import RowMaker

from proxy.store.dialect import Translated, translate


class PgRow:
    """A row read by position or by column name, as `sqlite3.Row` is."""

    __slots__ = ("_index", "_values")

    def __init__(self, values: Sequence[Any], index: dict[str, int]) -> None:
        self._values = values
        self._index = index

    def __getitem__(self, key: int | str) -> Any:
        return self._values[self._index[key]] if isinstance(key, str) else self._values[key]

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def keys(self) -> list[str]:
        return list(self._index)


def pg_rows(cursor: Any) -> RowMaker[PgRow]:
    index = {column.name: i for i, column in enumerate(cursor.description or ())}
    return lambda values: PgRow(values, index)


class _Number(Loader):
    """`numeric` (what SUM of integers gives) as an int when whole, as SQLite gives it; else a float."""

    def load(self, data: Buffer) -> int | float:
        value = Decimal(bytes(data).decode())
        return int(value) if value == value.to_integral_value() else float(value)


class _Flag(Dumper):
    """A bool as the integer SQLite stores it (`stream`, `background` are integer columns)."""

    oid = psycopg.adapters.types["int8"].oid

    def dump(self, obj: bool) -> Buffer:
        return b"1" if obj else b"0"


def adapt(connection: psycopg.Connection[Any] | psycopg.AsyncConnection[Any]) -> None:
    connection.adapters.register_loader("numeric", _Number)
    connection.adapters.register_dumper(bool, _Flag)


class Translations:
    """Each statement translated once (`proxy.store.dialect`); the store runs a few dozen distinct ones."""

    def __init__(self) -> None:
        self._done: dict[str, Translated] = {}

    def __call__(self, sql: str) -> Translated:
        found = self._done.get(sql)
        if found is None:
            found = self._done[sql] = translate(sql)
        return found


class PgCursor:
    def __init__(self, cursor: psycopg.Cursor[PgRow]) -> None:
        self._cursor = cursor

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def fetchone(self) -> PgRow | None:
        return self._cursor.fetchone() if self._cursor.description is not None else None

    def fetchall(self) -> list[PgRow]:
        return self._cursor.fetchall() if self._cursor.description is not None else []

    def __iter__(self) -> Iterator[PgRow]:
        return iter(self.fetchall())


class PgConnection:
    """A psycopg connection that runs the store's SQLite SQL (`proxy.store.connection.Connection`)."""

    def __init__(self, connection: psycopg.Connection[PgRow], translations: Translations) -> None:
        self.raw = connection
        self._translations = translations

    def execute(self, sql: str, parameters: Sequence[Any] = (), /) -> PgCursor:
        translated = self._translations(sql)
        query = translated.sql
        return PgCursor(self.raw.execute(query, translated.parameters(parameters) if translated.order else None))

    def executemany(self, sql: str, parameters: Sequence[Sequence[Any]], /) -> PgCursor:
        translated = self._translations(sql)
        cursor = self.raw.cursor()
        cursor.executemany(translated.sql, [translated.parameters(p) for p in parameters])
        return PgCursor(cursor)


async def configure(connection: psycopg.AsyncConnection[Any]) -> None:
    adapt(connection)
