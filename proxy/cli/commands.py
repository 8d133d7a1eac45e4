"""`context-proxy`: serve the proxy, and read its store from the shell.

`serve` prepares the process environment before anything else runs, refuses to expose an unauthenticated proxy
beyond loopback unless `--host` says so explicitly, and reports a bad config (or a store written by a newer
version, another application's database, a damaged, read-only or locked file, a directory) as one line instead
of a traceback. `sessions` and `journal` open the same parts the server runs
(`proxy.serving.services`, without recovery and without registering as a journal owner) on the same SQLite file (WAL
lets them run beside it) and print the inspection views; `sessions pin|unpin` write through the same one
writer, checked as `POST /sessions/{id}/pins` checks them; `sessions delete` and `tenants` delete
(`proxy.cli.lifecycle`). `corrections` lists and resets the budget corrections
learned from upstream refusals (every tenant's: no `--key`). `migrate` applies the schema's migrations as `serve`
does on startup (under a lock, so replicas starting together apply each once) and says which; `export` and
`import` move a whole store between files and servers, SQLite and PostgreSQL alike (`proxy.store.transfer`).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import logging
import logging.config
import sys
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal, TextIO

import uvicorn

from proxy import environment
from proxy.auth import OPEN_TENANT, tenant_of
from proxy.cli.lifecycle import add_commands as add_lifecycle_commands
from proxy.cli.render import (
    render_corrections,
    render_events,
    render_pins,
    render_reset,
    render_session,
    render_sessions,
    render_step,
    render_steps,
)
from proxy.config.schema import Config, ConfigError, load_config
from proxy.errors import InvalidRequest, NotFound
from proxy.inspection.views import Inspector
from proxy.journal.owners import LEASE_S
from proxy.journal.steps import StepStatus
from proxy.observability.logs import log_config
from proxy.serving.app import create_app
from proxy.serving.heap import keep_large_buffers
from proxy.serving.server import raise_file_limit, server_options
from proxy.serving.services import open_services
from proxy.store.database import Database, StoreRefused, StoreUnavailable, check_store
from proxy.store.transfer import TransferError, export_store, import_store

EXIT_STORE = 1
EXIT_CONFIG = 2
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not hasattr(args, "run"):
        parser.print_help()
        return EXIT_CONFIG
    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"context-proxy: config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    result: int = args.run(config, args)
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="context-proxy", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(title="commands")

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", required=True, help="YAML or JSON config file")
    serve.add_argument("--host", help="interface to bind (default: server.host from the config)")
    serve.add_argument("--port", type=int, help="port to bind (default: server.port from the config)")
    serve.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error"], help="default: logging.level in the config"
    )
    serve.set_defaults(run=_serve)

    sessions = commands.add_parser("sessions", help="list or show stored sessions")
    sessions_commands = sessions.add_subparsers(title="sessions commands", required=True)
    listing = sessions_commands.add_parser("list", help="sessions, newest first")
    show = sessions_commands.add_parser("show", help="one session's history, summaries and usage")
    show.add_argument("session_id")
    pins = sessions_commands.add_parser("pins", help="one session's pinned messages")
    pins.add_argument("session_id")
    pin = sessions_commands.add_parser("pin", help="pin messages: always sent verbatim, never summarized")
    unpin = sessions_commands.add_parser("unpin", help="unpin messages")
    for command in (pin, unpin):
        command.add_argument("session_id")
        command.add_argument("message_ids", nargs="+", metavar="MSG_ID")
    events = sessions_commands.add_parser("events", help="one session's compaction events, oldest first")
    events.add_argument("session_id")
    for command in (listing, show, events):
        _store_options(command)
    for command in (pins, pin, unpin):
        _store_options(command, paged=False)
    listing.set_defaults(run=_inspection(_sessions_list, render_sessions))
    show.set_defaults(run=_inspection(_sessions_show, render_session))
    pins.set_defaults(run=_inspection(_sessions_pins, render_pins))
    pin.set_defaults(run=_inspection(_sessions_pin, render_pins))
    unpin.set_defaults(run=_inspection(_sessions_unpin, render_pins))
    events.set_defaults(run=_inspection(_sessions_events, render_events))
    add_lifecycle_commands(commands, sessions_commands, _store_options)

    journal = commands.add_parser("journal", help="list or show journaled responses")
    journal_commands = journal.add_subparsers(title="journal commands", required=True)
    jlist = journal_commands.add_parser("list", help="journal steps, newest first")
    jlist.add_argument("--status", choices=[str(status) for status in StepStatus])
    jshow = journal_commands.add_parser("show", help="one step with its assembled text")
    jshow.add_argument("step_id", type=int)
    for command in (jlist, jshow):
        _store_options(command)
    jlist.set_defaults(run=_inspection(_journal_list, render_steps))
    jshow.set_defaults(run=_inspection(_journal_show, render_step))

    corrections = commands.add_parser("corrections", help="budget corrections learned from upstream refusals")
    corrections_commands = corrections.add_subparsers(title="corrections commands", required=True)
    clist = corrections_commands.add_parser("list", help="the corrections in force, per model")
    reset = corrections_commands.add_parser("reset", help="drop a model's correction (every replica, within 5 s)")
    which = reset.add_mutually_exclusive_group(required=True)
    which.add_argument("model", nargs="?", help="the configured model name")
    which.add_argument("--all", action="store_true", help="every model's correction")
    for command in (clist, reset):
        command.add_argument("--config", required=True, help="the config file the server runs with")
        command.add_argument("--json", action="store_true", help="machine-readable output")
    clist.set_defaults(run=_inspection(_corrections_list, render_corrections, tenanted=False))
    reset.set_defaults(run=_inspection(_corrections_reset, render_reset, tenanted=False))

    migrate = commands.add_parser("migrate", help="apply the schema's migrations to the store (serve does too)")
    export = commands.add_parser("export", help="write every row of the store as JSON lines")
    export.add_argument("output", metavar="OUTPUT", help="the file to write, or - for stdout")
    load = commands.add_parser("import", help="load an export into a new, empty store")
    load.add_argument("input", metavar="INPUT", help="the file an export wrote, or - for stdin")
    for command in (migrate, export, load):
        command.add_argument("--config", required=True, help="the config file the server runs with")
    migrate.set_defaults(run=_store_command(_migrate))
    export.set_defaults(run=_store_command(_export))
    load.set_defaults(run=_store_command(_import))
    return parser


def _store_options(command: argparse.ArgumentParser, *, paged: bool = True) -> None:
    command.add_argument("--config", required=True, help="the config file the server runs with")
    command.add_argument("--key", help="proxy key whose data to read (when auth.keys is set)")
    command.add_argument("--json", action="store_true", help="machine-readable output")
    if paged:
        command.add_argument("--limit", type=int, default=50)
        command.add_argument("--offset", type=int, default=0)


def _serve(config: Config, args: argparse.Namespace) -> int:
    environment.prepare()
    host = args.host or config.server.host
    port = config.server.port if args.port is None else args.port
    if not config.auth.enabled and host not in LOOPBACK_HOSTS and args.host is None:
        print(
            f"context-proxy: refusing to serve without auth.keys on {host}; set auth.keys, or pass --host "
            f"{host} to expose an open proxy deliberately",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    try:
        check_store(config.store.target)
    except (StoreRefused, StoreUnavailable) as exc:
        print(f"context-proxy: {exc}", file=sys.stderr)
        return EXIT_STORE
    level = (args.log_level or config.observability.log_level).lower()
    logs = log_config(config.observability.log_format, level)
    logging.config.dictConfig(logs)
    raise_file_limit()
    keep_large_buffers()
    options = server_options(config.server)
    app = create_app(config, serving=True)
    uvicorn.run(app, host=host, port=port, log_level=level, log_config=logs, lifespan="on", **options)
    return 0


View = Callable[[Inspector, str, argparse.Namespace], Awaitable[dict[str, Any]]]
Command = Callable[[Config, argparse.Namespace], int]


class InspectionError(Exception):
    """A look-up that found nothing or was asked wrongly: one line on stderr, exit 1."""


def _inspection(view: View, render: Callable[[dict[str, Any]], str], *, tenanted: bool = True) -> Command:
    """`tenanted`: the view shows one tenant's data (`--key`); otherwise the operator's, for every tenant."""

    def run(config: Config, args: argparse.Namespace) -> int:
        environment.prepare()
        try:
            data = asyncio.run(_look_up(config, args, view, tenanted))
        except (InspectionError, StoreRefused, StoreUnavailable) as exc:
            print(f"context-proxy: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(data, indent=2, ensure_ascii=False) if args.json else render(data))
        return 0

    return run


async def _look_up(config: Config, args: argparse.Namespace, view: View, tenanted: bool) -> dict[str, Any]:
    """Open the store read-side, build one view, close again."""
    tenant = _tenant(config, args.key) if tenanted else OPEN_TENANT
    async with open_services(config, recover=False) as services:
        try:
            return await view(services.inspector, tenant, args)
        except (NotFound, InvalidRequest) as exc:
            raise InspectionError(exc.message) from exc


def _tenant(config: Config, key: str | None) -> str:
    if not config.auth.enabled:
        return OPEN_TENANT
    if key is None or key not in config.auth.keys:
        raise InspectionError("auth.keys is set: pass --key with one of the configured proxy keys")
    return tenant_of(key)


async def _sessions_list(inspector: Inspector, tenant: str, args: argparse.Namespace) -> dict[str, Any]:
    return await inspector.sessions(tenant, args.limit, args.offset)


async def _sessions_show(inspector: Inspector, tenant: str, args: argparse.Namespace) -> dict[str, Any]:
    return await inspector.session(tenant, args.session_id)


async def _sessions_pins(inspector: Inspector, tenant: str, args: argparse.Namespace) -> dict[str, Any]:
    return await inspector.session_pins(tenant, args.session_id)


async def _sessions_pin(inspector: Inspector, tenant: str, args: argparse.Namespace) -> dict[str, Any]:
    ids = await _whole_ids(inspector, tenant, args.session_id, args.message_ids)
    return await inspector.pin(tenant, args.session_id, ids)


async def _sessions_unpin(inspector: Inspector, tenant: str, args: argparse.Namespace) -> dict[str, Any]:
    ids = await _whole_ids(inspector, tenant, args.session_id, args.message_ids)
    return await inspector.unpin(tenant, args.session_id, ids)


async def _whole_ids(inspector: Inspector, tenant: str, session_id: str, given: Sequence[str]) -> list[str]:
    """Each id as given, or the one id of the session's path (or pins) it is a prefix of, as `sessions show`
    prints them; anything else is left for the inspector to refuse by name."""
    path = await inspector.history.path(tenant, session_id) or []
    known = [message.id for message in path] + sorted(await inspector.pins.on_session(tenant, session_id))
    whole = []
    for prefix in given:
        matches = {message_id for message_id in known if message_id.startswith(prefix)}
        whole.append(matches.pop() if prefix not in matches and len(matches) == 1 else prefix)
    return whole


async def _sessions_events(inspector: Inspector, tenant: str, args: argparse.Namespace) -> dict[str, Any]:
    return await inspector.session_events(tenant, args.session_id, args.limit, args.offset)


async def _journal_list(inspector: Inspector, tenant: str, args: argparse.Namespace) -> dict[str, Any]:
    return await inspector.steps(tenant, args.status, None, args.limit, args.offset)


async def _journal_show(inspector: Inspector, tenant: str, args: argparse.Namespace) -> dict[str, Any]:
    return await inspector.step(tenant, args.step_id)


async def _corrections_list(inspector: Inspector, tenant: str, args: argparse.Namespace) -> dict[str, Any]:
    return inspector.corrections()


async def _corrections_reset(inspector: Inspector, tenant: str, args: argparse.Namespace) -> dict[str, Any]:
    return await inspector.forget_corrections(None if args.all else args.model)


StoreWork = Callable[[Database, Config, argparse.Namespace, float], Awaitable[None]]
"""A command on the opened store; its last argument is when the command started, before the store was opened."""


def _store_command(work: StoreWork) -> Command:
    """Open the configured store (migrating it, as every opening does), run `work`, close; a store this proxy
    cannot use, or a transfer it refuses, is one line on stderr."""

    def run(config: Config, args: argparse.Namespace) -> int:
        async def opened() -> None:
            store, started = config.store, time.time()
            db = await Database.open(store.target, config.journal.synchronous, pool_size=store.pool_size)
            try:
                await work(db, config, args, started)
            finally:
                await db.close()

        try:
            asyncio.run(opened())
        except (StoreRefused, StoreUnavailable, TransferError, OSError) as exc:
            print(f"context-proxy: {' '.join(str(exc).split())}", file=sys.stderr)  # psycopg's hints on one line
            return EXIT_STORE
        return 0

    return run


async def _migrate(db: Database, config: Config, args: argparse.Namespace, started: float) -> None:
    # Opening the store applied what was missing. What was applied since this command started: by it, or by a
    # replica that took the migration lock first.
    rows = await db.fetchall("SELECT name, applied_at FROM migrations ORDER BY name")
    applied = [row[0] for row in rows if row[1] >= started]
    where = f"{config.store.location} ({db.dialect})"
    if applied:
        print(f"{where}: applied {len(applied)} migration(s): {', '.join(applied)}")
    if len(applied) < len(rows):
        print(f"{where}: {len(rows) - len(applied)} already applied, up to {rows[-1][0]}; nothing else to apply")


async def _export(db: Database, config: Config, args: argparse.Namespace, started: float) -> None:
    live = await db.fetchone("SELECT COUNT(*) FROM journal_owners WHERE heartbeat_at > ?", (time.time() - LEASE_S,))
    if live is not None and live[0]:
        print(
            f"context-proxy: warning: {live[0]} proxy process(es) are serving this store; rows they write during "
            "the export may be left out of it, and the import may then refuse it: stop them for an exact copy",
            file=sys.stderr,
        )
    with _opened(args.output, "w") as output:
        counts = await export_store(db, output)
    print(f"exported {_counted(counts)} from {config.store.location}", file=sys.stderr)


async def _import(db: Database, config: Config, args: argparse.Namespace, started: float) -> None:
    with _opened(args.input, "r") as lines:
        counts = await import_store(db, lines)
    print(f"imported {_counted(counts)} into {config.store.location}", file=sys.stderr)


@contextmanager
def _opened(name: str, mode: Literal["r", "w"]) -> Iterator[TextIO]:
    """`name` as a text file, or stdin / stdout for `-`. An export that fails leaves no file behind."""
    if name == "-":
        stream = sys.stdout if mode == "w" else sys.stdin
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(encoding="utf-8")
        yield stream
        return
    path = Path(name)
    with path.open(mode, encoding="utf-8", newline="\n") as file:
        try:
            yield file
        except BaseException:
            if mode == "w":
                path.unlink(missing_ok=True)
            raise


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{rows:,} {table}" for table, rows in counts.items())
