"""Which process owns an open journal step, and which owners are gone, so recovery takes only abandoned steps.

Several processes may serve one store (a second process, a rolling restart, replicas on a shared file). Each
registers an *owner* row in `journal_owners` when it starts serving (a random id per process start) and stamps
it on every step it opens; it heartbeats every `HEARTBEAT_S` and deletes its row at a clean shutdown. Another
process may end a step only when its owner is gone: its heartbeat is older than `LEASE_S` (the only test that
works across machines), or it lived on this host and its process no longer exists (known at once, no lease to
wait for), or it is a previous incarnation of this very process (same host and pid, another id: pid 1 in a
restarted container). A step with no owner (written before owners existed, or by a tool that does not
register) or whose owner row is gone belongs to nobody alive.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from dataclasses import dataclass

from proxy.canonical.types import Clock
from proxy.store.connection import Connection, Row
from proxy.store.database import Database

log = logging.getLogger(__name__)

HEARTBEAT_S = 10.0
"""How often a live process stamps its owner row (and sweeps for steps other owners abandoned)."""
LEASE_S = 60.0
"""How old a heartbeat may be before its owner counts as gone: several missed heartbeats, so a busy event loop
or a slow disk does not cost a live process its streams."""


def local_host() -> str:
    """This machine as seen by pids: the hostname, plus the pid namespace where Linux names it.

    Two containers may share a hostname and both run as pid 1; a pid says something about another owner only
    when both live in the same pid namespace.
    """
    host = socket.gethostname()
    try:
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return host
    return f"{host} {namespace}"


def process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    except OSError:
        return True  # cannot tell: let the lease decide
    return True


@dataclass(frozen=True)
class Owner:
    id: str
    host: str
    pid: int
    heartbeat_at: float


class Owners:
    """This process's owner row and the judgement of everyone else's."""

    def __init__(
        self,
        db: Database,
        clock: Clock,
        *,
        heartbeat_s: float = HEARTBEAT_S,
        lease_s: float = LEASE_S,
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        self._db = db
        self._clock = clock
        self.heartbeat_s = heartbeat_s
        self.lease_s = lease_s
        self.id = uuid.uuid4().hex
        self.host = local_host() if host is None else host
        self.pid = os.getpid() if pid is None else pid

    async def register(self) -> None:
        now = self._clock()
        row = (self.id, self.host, self.pid, now, now)

        def write(connection: Connection) -> None:
            connection.execute(
                "INSERT INTO journal_owners (id, host, pid, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?)", row
            )

        await self._db.write(write, atomic=False)

    async def heartbeat(self) -> None:
        """Stamp this owner alive; re-register if another process judged it gone (a stall past the lease)."""
        now = self._clock()
        row = (self.id, self.host, self.pid, now, now)

        def write(connection: Connection) -> int:
            updated = connection.execute(
                "UPDATE journal_owners SET heartbeat_at = ? WHERE id = ?", (now, self.id)
            ).rowcount
            if updated == 0:
                connection.execute(
                    "INSERT INTO journal_owners (id, host, pid, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?)",
                    row,
                )
            return int(updated)

        if await self._db.write(write) == 0:
            log.warning("journal owner %s was taken for gone by another process; registered again", self.id)

    async def release(self) -> None:
        """At a clean shutdown, after the streams ended: any step still open is free for recovery at once."""

        def write(connection: Connection) -> None:
            connection.execute("DELETE FROM journal_owners WHERE id = ?", (self.id,))

        await self._db.write(write, atomic=False)

    def is_gone(self, owner: Owner | None, now: float) -> bool:
        """Whether `owner` (None: a step without one, or an owner whose row was removed) is gone."""
        if owner is None:
            return True
        if owner.id == self.id:
            return False
        if now - owner.heartbeat_at > self.lease_s:
            return True
        if owner.host != self.host:
            return False
        return owner.pid == self.pid or not process_exists(owner.pid)

    async def gone(self) -> dict[str, Owner]:
        """The registered owners judged gone now, by id."""
        rows = await self._db.fetchall("SELECT id, host, pid, heartbeat_at FROM journal_owners")
        now = self._clock()
        owners = (owner_from_row(row) for row in rows)
        return {owner.id: owner for owner in owners if self.is_gone(owner, now)}

    async def forget(self, owners: dict[str, Owner]) -> int:
        """Delete the rows of gone owners that hold no open step and have not heartbeated since judged gone."""
        rows = [(owner.id, owner.heartbeat_at, owner.id) for owner in owners.values()]
        if not rows:
            return 0

        def write(connection: Connection) -> int:
            deleted = 0
            for row in rows:
                deleted += connection.execute(
                    "DELETE FROM journal_owners WHERE id = ? AND heartbeat_at <= ? AND NOT EXISTS "
                    "(SELECT 1 FROM journal_steps WHERE owner = ? AND status = 'open')",
                    row,
                ).rowcount
            return deleted

        return await self._db.write(write)


def owner_from_row(row: Row) -> Owner:
    return Owner(row["id"], row["host"], int(row["pid"]), float(row["heartbeat_at"]))
