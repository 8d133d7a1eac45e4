"""A process killed with SIGKILL while it deletes a long session leaves that session whole or wholly gone: the
deletion is one transaction (`proxy.lifecycle.forget`), never a session with part of its rows."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

import pytest

from proxy.config.schema import JournalConfig
from proxy.history.answers import Answers
from proxy.history.store import History
from proxy.journal.writer import Journal
from proxy.store.database import Database

ENCODING = "cl100k_base"
TURNS = 2_000
"""4,000 messages: a long agent session."""

CHILD = """
import asyncio, sys, time
from pathlib import Path
from proxy.history.store import History
from proxy.lifecycle.deletions import Deletions
from proxy.store.database import Database

async def main() -> None:
    db = await Database.open(Path(sys.argv[1]))
    history = History(db)
    print("deleting", flush=True)
    started = time.perf_counter()
    await Deletions(db, history).delete_session("t", "long")
    print(f"deleted {time.perf_counter() - started:.3f}", flush=True)
    await db.close()

asyncio.run(main())
"""


async def build(path: Path) -> None:
    db = await Database.open(path)
    try:
        history = History(db)
        journal = Journal(db, Answers(history), JournalConfig())
        messages: list[dict[str, str]] = [{"role": "system", "content": "a long agent session"}]
        for turn in range(TURNS):
            messages.append({"role": "user", "content": f"step {turn}: read file {turn}.py " + "text " * 40})
            messages.append({"role": "assistant", "content": f"done with {turn}.py " + "words " * 40})
        await history.reconcile("t", "long", messages, "gpt-4", ENCODING)
        reconciled = await history.reconcile("t", "other", messages[:3], "gpt-4", ENCODING)
        for session, parent in (("long", None), ("other", reconciled.path[-1].id)):
            step = await journal.begin(
                tenant="t",
                session_id=session,
                model="gpt-4",
                fingerprint="",
                idempotency_key=None,
                stream=True,
                parent_message_id=parent,
                encoding=ENCODING,
            )
            await journal.append(step, [{"choices": [{"index": 0, "delta": {"content": "x"}}]}] * 50)
    finally:
        await db.close()


def counts(path: Path) -> dict[str, int]:
    with closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("PRAGMA foreign_key_check").fetchall() == []
        return {
            table: int(db.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
            for table in ("sessions", "messages", "message_tokens", "journal_steps", "journal_events")
        }


def run_child(store: Path, kill_after_s: float | None) -> str:
    """The deletion in a process of its own; SIGKILL `kill_after_s` after it began. Its last line."""
    with subprocess.Popen([sys.executable, "-c", CHILD, str(store)], stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "deleting"
        if kill_after_s is not None:
            time.sleep(kill_after_s)
            child.kill()
        child.wait(timeout=60)
        return child.stdout.read().strip()


@pytest.mark.time_budget(240)
def test_a_deletion_killed_at_any_moment_leaves_the_session_whole_or_gone(tmp_path: Path) -> None:
    pristine = tmp_path / "pristine.sqlite"
    asyncio.run(build(pristine))
    whole = counts(pristine)
    store = tmp_path / "store.sqlite"
    shutil.copy(pristine, store)
    finished = run_child(store, None)
    duration = float(finished.split()[1])
    gone = counts(store)
    assert gone["sessions"] == whole["sessions"] - 1
    assert gone["messages"] == 3  # the opening the other session shares
    assert gone["journal_steps"] == 1  # the other session's

    outcomes = []
    for fraction in (0.1, 0.3, 0.5, 0.7, 0.9, 1.5, 3.0):  # of the deletion's own time: mostly inside it
        shutil.copy(pristine, store)
        for sidecar in tmp_path.glob("store.sqlite-*"):
            sidecar.unlink()
        last = run_child(store, duration * fraction)
        after = counts(store)
        assert after in (whole, gone), (fraction, last, after)
        outcomes.append("gone" if after == gone else "whole")
    assert "whole" in outcomes, outcomes  # a kill before the commit kept everything
