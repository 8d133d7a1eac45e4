"""Reading a store as another process would, through a fresh connection of its own: only what is committed is
visible. Tests write their checks in SQLite's SQL; on PostgreSQL it is translated as the proxy's own is."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import psycopg

from proxy.store.database import Database
from proxy.store.dialect import translate


def committed_rows(db: Database | Path | str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    target = db.target if isinstance(db, Database) else db
    if isinstance(target, Path):
        with contextlib.closing(sqlite3.connect(target)) as connection:
            return connection.execute(sql, params).fetchall()
    translated = translate(sql)
    with psycopg.connect(target) as connection:
        cursor = connection.execute(translated.sql, translated.parameters(params) if translated.order else None)  # type: ignore[arg-type]
        return cursor.fetchall() if cursor.description else []
