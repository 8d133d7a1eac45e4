"""`context-proxy`: serve the proxy, and read its store from the shell.

`serve` prepares the process environment before anything imports LiteLLM, refuses to expose an
unauthenticated proxy beyond loopback unless `--host` says so explicitly, and reports a bad config as one
line naming the key instead of a traceback. `sessions` and `journal` read the same SQLite file the server
writes (WAL lets them run beside it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
from collections.abc import Sequence

from proxy import environment
from proxy.config import Config, ConfigError, load_config

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
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    serve.set_defaults(run=_serve)

    sessions = commands.add_parser("sessions", help="list or show stored sessions")
    sessions_commands = sessions.add_subparsers(title="sessions commands", required=True)
    listing = sessions_commands.add_parser("list", help="sessions, newest first")
    show = sessions_commands.add_parser("show", help="one session's history, summaries and usage")
    show.add_argument("session_id")
    for command in (listing, show):
        _store_options(command)
    listing.set_defaults(run=lambda config, args: _run_inspection(config, args, "sessions_list"))
    show.set_defaults(run=lambda config, args: _run_inspection(config, args, "sessions_show"))

    journal = commands.add_parser("journal", help="list or show journaled responses")
    journal_commands = journal.add_subparsers(title="journal commands", required=True)
    jlist = journal_commands.add_parser("list", help="journal steps, newest first")
    jlist.add_argument("--status", choices=["sealed", "complete", "interrupted", "failed", "open"])
    jshow = journal_commands.add_parser("show", help="one step with its assembled text")
    jshow.add_argument("step_id", type=int)
    for command in (jlist, jshow):
        _store_options(command)
    jlist.set_defaults(run=lambda config, args: _run_inspection(config, args, "journal_list"))
    jshow.set_defaults(run=lambda config, args: _run_inspection(config, args, "journal_show"))
    return parser


def _store_options(command: argparse.ArgumentParser) -> None:
    command.add_argument("--config", required=True, help="the config file the server runs with")
    command.add_argument("--key", help="proxy key whose data to read (when auth.keys is set)")
    command.add_argument("--json", action="store_true", help="machine-readable output")
    command.add_argument("--limit", type=int, default=50)
    command.add_argument("--offset", type=int, default=0)


def _serve(config: Config, args: argparse.Namespace) -> int:
    environment.prepare()
    import uvicorn

    from proxy.app import create_app

    host = args.host or config.server.host
    port = config.server.port if args.port is None else args.port
    if not config.auth.enabled and host not in LOOPBACK_HOSTS and args.host is None:
        print(
            f"context-proxy: refusing to serve without auth.keys on {host}; set auth.keys, or pass --host "
            f"{host} to expose an open proxy deliberately",
            file=sys.stderr,
        )
        return EXIT_CONFIG
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(config), host=host, port=port, log_level=args.log_level, lifespan="on")
    return 0


def _run_inspection(config: Config, args: argparse.Namespace, what: str) -> int:
    environment.prepare()
    from proxy.inspection import InspectionError, cli_report

    try:
        report = asyncio.run(cli_report(config, what, args))
    except InspectionError as exc:
        print(f"context-proxy: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.data, indent=2, ensure_ascii=False) if args.json else report.text)
    return 0
