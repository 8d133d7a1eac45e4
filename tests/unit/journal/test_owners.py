"""Journal step owners (`proxy.journal.owners`) on a real SQLite file: who is gone, what recovery may take, and
two recoveries at once ending each step exactly once."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from proxy.config.schema import JournalConfig
from proxy.journal.owners import Owner, Owners, local_host
from proxy.journal.recovery import Recovery, RecoveryReport
from proxy.journal.writer import Journal
from proxy.serving.services import _sweep_periodically
from tests.unit.journal.test_journal import Store, stream, text

LEASE_S = 5.0
OTHER_HOST = "elsewhere"


def owners_of(store: Store, **overrides: Any) -> Owners:
    return Owners(store.db, store.clock, heartbeat_s=1.0, lease_s=LEASE_S, **overrides)


async def insert_owner(store: Store, owner_id: str, *, host: str, pid: int, heartbeat_at: float) -> None:
    row = (owner_id, host, pid, heartbeat_at, heartbeat_at)

    def write(connection: sqlite3.Connection) -> None:
        connection.execute(
            "INSERT INTO journal_owners (id, host, pid, started_at, heartbeat_at) VALUES (?, ?, ?, ?, ?)", row
        )

    await store.db.write(write)


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def owner_rows(path: Path) -> set[str]:
    with sqlite3.connect(path) as connection:
        return {row[0] for row in connection.execute("SELECT id FROM journal_owners")}


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store(tmp_path / "store.sqlite", JournalConfig()).open()
    yield opened
    await opened.db.close()


# --- who is gone -----------------------------------------------------------------------------------------------


async def test_an_owner_whose_process_died_on_this_host_is_gone_at_once(store: Store) -> None:
    owners = owners_of(store)
    await insert_owner(store, "dead", host=local_host(), pid=dead_pid(), heartbeat_at=store.clock.now)
    assert set(await owners.gone()) == {"dead"}


async def test_a_live_owner_with_a_fresh_heartbeat_is_kept(store: Store) -> None:
    owners = owners_of(store)
    await owners.register()
    await insert_owner(store, "parent", host=local_host(), pid=os.getppid(), heartbeat_at=store.clock.now)
    await insert_owner(store, "remote", host=OTHER_HOST, pid=os.getpid(), heartbeat_at=store.clock.now)
    store.clock.now += LEASE_S - 1
    assert await owners.gone() == {}


async def test_a_stale_heartbeat_is_gone_after_the_lease(store: Store) -> None:
    owners = owners_of(store)
    await insert_owner(store, "remote", host=OTHER_HOST, pid=1, heartbeat_at=store.clock.now)
    store.clock.now += LEASE_S
    assert await owners.gone() == {}
    store.clock.now += 1
    assert set(await owners.gone()) == {"remote"}


async def test_a_previous_incarnation_of_this_process_is_gone(store: Store) -> None:
    owners = owners_of(store)
    await owners.register()
    await insert_owner(store, "before-restart", host=owners.host, pid=owners.pid, heartbeat_at=store.clock.now)
    assert set(await owners.gone()) == {"before-restart"}


async def test_no_owner_is_gone_and_this_one_never_is(store: Store) -> None:
    owners = owners_of(store)
    assert owners.is_gone(None, 0.0)
    assert not owners.is_gone(Owner(owners.id, owners.host, owners.pid, -1_000.0), 0.0)


async def test_heartbeat_keeps_an_owner_and_restores_a_row_taken_for_gone(store: Store) -> None:
    owners = owners_of(store)
    judge = owners_of(store, host=OTHER_HOST)
    await owners.register()
    store.clock.now += LEASE_S + 1
    assert set(await judge.gone()) == {owners.id}
    await owners.heartbeat()
    assert await judge.gone() == {}
    assert await judge.forget({owners.id: Owner(owners.id, owners.host, owners.pid, 0.0)}) == 0
    await owners.release()
    assert owner_rows(store.path) == set()
    await owners.heartbeat()  # a stalled process that outlived its lease comes back
    assert owner_rows(store.path) == {owners.id}


# --- what recovery takes ---------------------------------------------------------------------------------------


async def test_recovery_leaves_a_live_owners_step_and_takes_it_after_the_lease(store: Store) -> None:
    live = owners_of(store, host=OTHER_HOST)
    await live.register()
    store.journal.owner = live.id
    parent = await store.conversation()
    step = await store.begin(parent)
    await stream(store, step, [[text("still "), text("going")]])

    survivor = owners_of(store)
    other_journal = Journal(store.db, store.journal._answers, store.config, clock=store.clock)
    recovery = Recovery(store.db, other_journal, survivor)
    assert (await recovery.recover()).empty()
    assert await status(store, step.id) == "open"

    store.clock.now += LEASE_S + 1
    report = await recovery.settle()
    assert (report.interrupted, report.owners_removed) == ([step.id], 1)
    assert await status(store, step.id) == "interrupted"
    assert owner_rows(store.path) == set()


async def test_recovery_never_takes_its_own_processs_steps(store: Store) -> None:
    owners = owners_of(store)
    await owners.register()
    store.journal.owner = owners.id
    step = await store.begin()
    store.clock.now += 10 * LEASE_S  # even with its own heartbeat stale
    assert (await Recovery(store.db, store.journal, owners).settle()).empty()
    assert await status(store, step.id) == "open"


async def test_steps_without_an_owner_are_recovered(store: Store) -> None:
    step = await store.begin()  # journal.owner None: a step from before owners, or an unregistered tool
    await insert_owner(store, "remote", host=OTHER_HOST, pid=1, heartbeat_at=store.clock.now)
    report = await Recovery(store.db, store.journal, owners_of(store)).recover()
    assert report.interrupted == [step.id]
    assert owner_rows(store.path) == {"remote"}


async def test_a_dead_owners_row_is_deleted_once_its_steps_are_settled(store: Store) -> None:
    await insert_owner(store, "dead", host=local_host(), pid=dead_pid(), heartbeat_at=store.clock.now)
    store.journal.owner = "dead"
    parent = await store.conversation()
    step = await store.begin(parent)
    await stream(store, step, [[text("done", "stop")]])
    store.journal.owner = None
    report = await Recovery(store.db, store.journal, owners_of(store)).recover()
    assert (report.complete, report.owners_removed) == ([step.id], 1)
    assert owner_rows(store.path) == set()


async def test_two_recoveries_at_once_end_each_step_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "shared.sqlite"
    first = await Store(path, JournalConfig()).open()
    second = await Store(path, JournalConfig()).open()
    try:
        parent = await first.conversation()
        finished, unfinished = [], []
        for n in range(4):
            step = await first.begin(parent)
            await stream(first, step, [[text(f"answer {n}", "stop")]])
            finished.append(step.id)
            step = await first.begin(parent)
            await stream(first, step, [[text(f"partial {n}")]])
            unfinished.append(step.id)

        # Both have read the open steps before either ends one: every step is raced for.
        both_read = asyncio.Barrier(2)
        for store in (first, second):
            monkeypatch.setattr(store.journal, "close", gate(store.journal.close, both_read))

        reports: tuple[RecoveryReport, RecoveryReport] = await asyncio.gather(
            Recovery(first.db, first.journal, owners_of(first)).settle(),
            Recovery(second.db, second.journal, owners_of(second)).settle(),
        )
        complete = [step for report in reports for step in report.complete]
        interrupted = [step for report in reports for step in report.interrupted]
        skipped = [step for report in reports for step in report.skipped]
        assert sorted(complete) == finished
        assert sorted(interrupted) == unfinished
        assert sorted(skipped) == sorted(finished + unfinished)
    finally:
        await first.db.close()
        await second.db.close()

    with sqlite3.connect(path) as connection:
        done = dict(
            connection.execute(
                "SELECT step_id, COUNT(*) FROM journal_events WHERE type = 'done' GROUP BY step_id"
            ).fetchall()
        )
        answers = connection.execute("SELECT COUNT(*) FROM messages WHERE parent_id = ?", (parent,)).fetchone()[0]
        statuses = dict(connection.execute("SELECT id, status FROM journal_steps").fetchall())
    assert done == dict.fromkeys(finished, 1)
    assert answers == len(finished)  # each sealed answer is one node; no double write
    assert statuses == {**dict.fromkeys(finished, "complete"), **dict.fromkeys(unfinished, "interrupted")}


async def test_a_serving_process_sweeps_a_dead_replicas_steps_without_a_restart(store: Store) -> None:
    await insert_owner(store, "replica", host=OTHER_HOST, pid=1, heartbeat_at=store.clock.now)
    store.journal.owner = "replica"
    step = await store.begin()
    survivor = owners_of(store)
    survivor.heartbeat_s = 0.01
    await survivor.register()
    store.journal.owner = survivor.id
    sweeping = asyncio.create_task(_sweep_periodically(Recovery(store.db, store.journal, survivor), survivor))
    try:
        await asyncio.sleep(0.1)
        assert await status(store, step.id) == "open"  # the replica's lease still holds
        store.clock.now += LEASE_S + 1
        # One sweep closes the step, then forgets the gone owner: wait for both, not only the first.
        for _ in range(500):
            if await status(store, step.id) != "open" and owner_rows(store.path) == {survivor.id}:
                break
            await asyncio.sleep(0.01)
    finally:
        sweeping.cancel()
        await asyncio.gather(sweeping, return_exceptions=True)
    assert await status(store, step.id) == "interrupted"
    assert owner_rows(store.path) == {survivor.id}  # heartbeats kept the survivor's own row fresh


def gate(close: Callable[..., Awaitable[Any]], barrier: asyncio.Barrier) -> Callable[..., Awaitable[Any]]:
    """`close`, first waiting at `barrier`: the other recovery has read the same open steps by then."""
    waited = False

    async def gated(*args: Any, **kwargs: Any) -> Any:
        nonlocal waited
        if not waited:
            waited = True
            await barrier.wait()
        return await close(*args, **kwargs)

    return gated


async def status(store: Store, step_id: int) -> str:
    row = await store.db.fetchone("SELECT status FROM journal_steps WHERE id = ?", (step_id,))
    assert row is not None
    return str(row["status"])
