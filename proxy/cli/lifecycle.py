"""`context-proxy sessions delete`, `tenants list|purge`, `retention [--dry-run]`, `stats`: the stored data's
lifecycle from the shell.

They open the same parts the server runs (`proxy.serving.services`, without recovery) and delete through the same one
writer, in one transaction each (`proxy.lifecycle`); beside a running server on SQLite (WAL), or on the
PostgreSQL store the replicas share, whose other processes notice the deletion through the store. A tenant is
named by its id (`key-…`, as `tenants list` shows it, with the `auth.keys` entry it belongs to) or by `--key`: a
departed user's key need not be in the config any more.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from proxy import environment
from proxy.auth import OPEN_TENANT, tenant_of
from proxy.config.schema import Config
from proxy.errors import NotFound
from proxy.lifecycle.forget import Forgotten
from proxy.serving.services import Services, open_services
from proxy.store.database import StoreRefused, StoreUnavailable

Action = Callable[[Services, Config, argparse.Namespace], Awaitable[dict[str, Any]]]


def add_commands(commands: Any, sessions_commands: Any, store_options: Callable[..., None]) -> None:
    """Register `sessions delete` and `tenants` on the CLI's parsers (`proxy.cli.commands`)."""
    delete = sessions_commands.add_parser("delete", help="delete a session and everything it stored")
    delete.add_argument("session_id")
    store_options(delete, paged=False)
    delete.set_defaults(run=_command(_delete_session, _render_deleted))

    tenants = commands.add_parser("tenants", help="the tenants (proxy keys) with stored data; purge one")
    tenants_commands = tenants.add_subparsers(title="tenants commands", required=True)
    listing = tenants_commands.add_parser("list", help="every tenant's sessions and last activity")
    purge = tenants_commands.add_parser("purge", help="delete everything a tenant stored")
    which = purge.add_mutually_exclusive_group(required=True)
    which.add_argument("tenant", nargs="?", help="the tenant's id (key-…, as `tenants list` shows it)")
    which.add_argument("--key", help="the tenant's proxy key (it need not be configured any more)")
    for command in (listing, purge):
        command.add_argument("--config", required=True, help="the config file the server runs with")
        command.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(run=_command(_list_tenants, _render_tenants))
    purge.set_defaults(run=_command(_purge_tenant, _render_deleted))

    stats = commands.add_parser("stats", help="the store's size, rows per table and sessions by last activity")
    stats.add_argument("--config", required=True, help="the config file the server runs with")
    stats.add_argument("--json", action="store_true", help="machine-readable output")
    stats.set_defaults(run=_command(_stats, _render_stats))

    retention = commands.add_parser("retention", help="delete the sessions idle past store.retention_days now")
    retention.add_argument("--dry-run", action="store_true", help="say what would be deleted; delete nothing")
    retention.add_argument("--config", required=True, help="the config file the server runs with")
    retention.add_argument("--json", action="store_true", help="machine-readable output")
    retention.set_defaults(run=_command(_retention, _render_sweep))


def _command(action: Action, render: Callable[[dict[str, Any]], str]) -> Callable[[Config, argparse.Namespace], int]:
    def run(config: Config, args: argparse.Namespace) -> int:
        environment.prepare()

        async def opened() -> dict[str, Any]:
            async with open_services(config, recover=False) as services:
                return await action(services, config, args)

        try:
            data = asyncio.run(opened())
        except (NotFound, StoreRefused, StoreUnavailable, LookupError) as exc:
            print(f"context-proxy: {getattr(exc, 'message', exc)}", file=sys.stderr)
            return 1
        print(json.dumps(data, indent=2, ensure_ascii=False) if args.json else render(data))
        return 0

    return run


def _caller(config: Config, key: str | None) -> str:
    if not config.auth.enabled:
        return OPEN_TENANT
    if key is None or key not in config.auth.keys:
        raise LookupError("auth.keys is set: pass --key with one of the configured proxy keys")
    return tenant_of(key)


async def _delete_session(services: Services, config: Config, args: argparse.Namespace) -> dict[str, Any]:
    forgotten = await services.deletions.delete_session(_caller(config, args.key), args.session_id)
    return {"id": args.session_id, "object": "session.deleted", **forgotten.as_json()}


async def _purge_tenant(services: Services, config: Config, args: argparse.Namespace) -> dict[str, Any]:
    tenant = tenant_of(args.key) if args.key is not None else args.tenant
    forgotten: Forgotten = await services.deletions.purge_tenant(tenant)
    return {"id": tenant, "object": "tenant.purged", **forgotten.as_json()}


async def _list_tenants(services: Services, config: Config, args: argparse.Namespace) -> dict[str, Any]:
    rows = await services.db.fetchall(
        "SELECT tenant, COUNT(*) AS sessions, MAX(updated_at) AS updated_at FROM sessions GROUP BY tenant "
        "ORDER BY MAX(updated_at) DESC"
    )
    configured = {tenant_of(key): f"auth.keys[{index}]" for index, key in enumerate(config.auth.keys)}
    configured.setdefault(OPEN_TENANT, "no auth.keys")
    data = [
        {
            "id": row["tenant"],
            "sessions": int(row["sessions"]),
            "updated_at": float(row["updated_at"]),
            "key": configured.get(row["tenant"]),
        }
        for row in rows
    ]
    return {"object": "list", "data": data}


async def _retention(services: Services, config: Config, args: argparse.Namespace) -> dict[str, Any]:
    if not services.retention.enabled:
        raise LookupError("no retention is configured: set store.retention_days (or store.tenant_retention_days)")
    sweep = await services.retention.sweep(dry_run=args.dry_run)
    return sweep.as_json(time.time())


def _render_sweep(data: dict[str, Any]) -> str:
    sessions = data["sessions"]
    verb = "would delete" if data["dry_run"] else "deleted"
    lines = [f"{verb} {len(sessions)} idle session(s)"]
    lines.extend(f"  {s['tenant']}  {s['id']}  idle {s['idle_days']} days" for s in sessions[:1000])
    if len(sessions) > 1000:
        lines.append(f"  … and {len(sessions) - 1000:,} more (--json lists them all)")
    if data["rows"]:
        lines.append("rows: " + ", ".join(f"{table} {count:,}" for table, count in data["rows"].items()))
    return "\n".join(lines)


async def _stats(services: Services, config: Config, args: argparse.Namespace) -> dict[str, Any]:
    return (await services.stats.read(fresh=True)).as_json()


def _render_stats(data: dict[str, Any]) -> str:
    lines = [
        f"store ({data['engine']}): {_size(data['bytes'])}"
        + (f", of which {_size(data['free_bytes'])} free for reuse" if data["free_bytes"] else "")
    ]
    lines.append("rows" + (" (estimated)" if data["rows_estimated"] else "") + ":")
    lines.extend(f"  {table:<20} {count:>12,}" for table, count in data["rows"].items())
    idle = data["sessions_by_last_activity"]
    lines.append("sessions last used: " + ", ".join(f"within {k}: {v:,}" for k, v in idle.items() if k != "older"))
    lines.append(f"  longer ago: {idle['older']:,}")
    return "\n".join(lines)


def _size(count: int) -> str:
    value = float(count)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "bytes" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} TiB"


def _render_deleted(data: dict[str, Any]) -> str:
    rows = ", ".join(f"{table} {count:,}" for table, count in data["rows"].items()) or "no rows"
    what = "session" if data["object"] == "session.deleted" else "tenant"
    return f"deleted {what} {data['id']}: {data['sessions']} session(s); {rows}"


def _render_tenants(data: dict[str, Any]) -> str:
    if not data["data"]:
        return "no tenant has stored anything"
    lines = [f"{'TENANT':<30} {'SESSIONS':>9}  {'LAST ACTIVE':<20} KEY"]
    for tenant in data["data"]:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(tenant["updated_at"]))
        lines.append(f"{tenant['id']:<30} {tenant['sessions']:>9,}  {when:<20} {tenant['key'] or '(not configured)'}")
    return "\n".join(lines)
