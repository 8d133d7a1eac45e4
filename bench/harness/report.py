"""One result format for every benchmark: a `Report`, written as JSON with `--json PATH` and printed as text.

A report says what ran (`bench`, its `parameters`), where (`machine`: commit, Python, CPUs, load), when and for
how long, and holds its measurements as named `Table`s of rows (plain dicts, one key per `Column`), the
headline `ratios` and free-form `notes`. The printed text is rendered from the same data by `render`, so what
a reader sees and what a script compares later cannot drift apart. The JSON layout (`SCHEMA`):

    {"schema": "context-infinity-bench/1", "bench": "overhead", "started_at": "2025-01-01T12:00:00+00:00",
     "seconds": 41.2, "machine": {"commit": "50485c2…", "dirty": false, "python": "3.12.3", "platform": "…",
     "cpus": 2, "cpus_total": 2, "load_average": 0.6},
     "parameters": {"requests": 20, "sizes": "10,500", "baseline": null},
     "tables": [{"name": "latency", "title": "…", "columns": [{"key": "messages", "label": "msgs",
                 "format": ""}, …], "rows": [{"messages": 10, "direct_p50": 1.9, …}], "notes": ["…"],
                 "transposed": false}],
     "ratios": {"proxy/floor added p50, 10 msgs non-stream": 2.7}, "notes": ["…"]}

NaN and infinities are written as null; paths and other objects as their `str`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "context-infinity-bench/1"
ROOT = Path(__file__).resolve().parents[2]
COLUMN_GAP = "  "
MISSING = "-"


@dataclass(frozen=True)
class Column:
    key: str
    label: str = ""
    """The printed header; the key when empty."""
    format: str = ""
    """A format spec for numbers (`.2f`, `,.0f`, `.1%`); empty: `str`."""

    @property
    def header(self) -> str:
        return self.label or self.key

    def cell(self, value: Any) -> str:
        if value is None or (isinstance(value, float) and math.isnan(value)):
            return MISSING
        if self.format and isinstance(value, int | float) and not isinstance(value, bool):
            return format(value, self.format)
        return str(value)


@dataclass
class Table:
    name: str
    """An identifier, stable across runs: what a script comparing reports looks up."""
    columns: list[Column]
    title: str = ""
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    transposed: bool = False
    """Printed with one line per column and one column per row: for a few rows of many measurements."""

    def add(self, **values: Any) -> dict[str, Any]:
        self.rows.append(values)
        return values

    def column(self, key: str) -> list[Any]:
        return [row.get(key) for row in self.rows]


def columns(*specs: tuple[str, ...]) -> list[Column]:
    """Columns from `(key, label, format)` tuples, label and format optional: tables read as one line each."""
    return [Column(*spec) for spec in specs]


def render(table: Table) -> str:
    """The table as aligned text: numbers right-aligned, text left, a rule under the header, then its notes; a
    transposed table has a line per column, headed by its first column's values."""
    if table.transposed:
        key = table.columns[0]
        headers = [key.header, *(key.cell(row.get(key.key)) for row in table.rows)]
        cells = [[c.header, *(c.cell(row.get(c.key)) for row in table.rows)] for c in table.columns[1:]]
        numeric = [False, *(True for _ in table.rows)]
    else:
        headers = [column.header for column in table.columns]
        cells = [[column.cell(row.get(column.key)) for column in table.columns] for row in table.rows]
        numeric = [_numeric(table.column(column.key)) for column in table.columns]
    widths = [max(len(line[i]) for line in [headers, *cells]) for i in range(len(headers))]

    def line(values: list[str]) -> str:
        justified = (
            value.rjust(width) if right else value.ljust(width)
            for value, width, right in zip(values, widths, numeric, strict=True)
        )
        return COLUMN_GAP.join(justified).rstrip()

    lines = [f"== {table.title}"] if table.title else []
    lines += [line(headers), COLUMN_GAP.join("-" * width for width in widths)]
    lines += [line(row) for row in cells]
    lines += table.notes
    return "\n".join(lines)


def _numeric(values: list[Any]) -> bool:
    """A column of numbers (missing cells aside) is right-aligned."""
    present = [value for value in values if value is not None]
    return bool(present) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in present)


@dataclass
class Machine:
    commit: str | None
    dirty: bool | None
    """Uncommitted changes in the checkout (None: not a git checkout)."""
    python: str
    platform: str
    cpus: int
    """Usable by this process (its affinity)."""
    cpus_total: int
    load_average: float
    """The 1-minute load average when the run started: others' work on a shared machine."""

    @classmethod
    def current(cls, root: Path = ROOT) -> Machine:
        commit, dirty = checkout_state(root)
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0
        return cls(
            commit=commit,
            dirty=dirty,
            python=sys.version.split()[0],
            platform=platform.platform(),
            cpus=usable,
            cpus_total=os.cpu_count() or 0,
            load_average=os.getloadavg()[0],
        )

    def summary(self) -> str:
        commit = f"{self.commit[:10]}{' (dirty)' if self.dirty else ''}" if self.commit else "no git checkout"
        return (
            f"commit {commit}; Python {self.python}; {self.cpus} usable CPUs of {self.cpus_total}; "
            f"load average {self.load_average:.1f} at the start"
        )


def checkout_state(root: Path) -> tuple[str | None, bool | None]:
    """The commit checked out at `root` and whether it has uncommitted changes; (None, None) outside git."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None, None
    return commit, bool(status.strip())


@dataclass
class Report:
    bench: str
    parameters: dict[str, Any]
    machine: Machine = field(default_factory=Machine.current)
    started_at: str = field(default_factory=lambda: datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"))
    seconds: float = 0.0
    tables: list[Table] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    schema: str = SCHEMA
    _clock: float = field(default_factory=time.monotonic, repr=False)

    @classmethod
    def start(cls, bench: str, args: argparse.Namespace) -> Report:
        """A report for `bench` whose parameters are the command line's options (less `--json`)."""
        parameters = {key: value for key, value in vars(args).items() if key != "json"}
        return cls(bench, parameters)

    def table(self, name: str, title: str, table_columns: list[Column], transposed: bool = False) -> Table:
        """A new table, appended to the report."""
        table = Table(name, table_columns, title, transposed=transposed)
        self.tables.append(table)
        return table

    def finish(self) -> Report:
        self.seconds = round(time.monotonic() - self._clock, 1)
        return self

    def text(self) -> str:
        parts = [self.machine.summary(), *(render(table) for table in self.tables)]
        if self.ratios:
            width = max(len(name) for name in self.ratios)
            parts.append("\n".join(f"{name.ljust(width)}  {value:.2f}" for name, value in self.ratios.items()))
        parts += ["\n".join(self.notes)] if self.notes else []
        parts.append(f"({self.bench}: {self.seconds:.0f} s)")
        return "\n\n".join(parts)

    def to_json(self) -> dict[str, Any]:
        data = {key: value for key, value in asdict(self).items() if not key.startswith("_")}
        ordered = {key: data[key] for key in ("schema", "bench", "started_at", "seconds", "machine", "parameters")}
        ordered.update((key, data[key]) for key in ("tables", "ratios", "notes"))
        plain: dict[str, Any] = _plain(ordered)
        return plain

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_json(), indent=1, allow_nan=False, default=str) + "\n")

    def publish(self, json_path: Path | None) -> None:
        """Finish the report, print it, and write it as JSON when asked."""
        self.finish()
        print(self.text())
        if json_path is not None:
            self.write(json_path)
            print(f"(results written to {json_path})")


def _plain(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    return value


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--json", type=Path, metavar="PATH", help="also write the results here (bench/harness/report.py's schema)"
    )


def read(path: Path) -> dict[str, Any]:
    """A report written by `Report.write`, as plain data (for scripts that compare runs)."""
    data: dict[str, Any] = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a {SCHEMA} report")
    return data
