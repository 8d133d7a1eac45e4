"""Compacting one long shared path at once (issue 41 item 6), through the summarizer's upstream seam.

A path that was never compacted (a conversation continued from a `compaction` item, or sent whole) needs one
span per summarizer input's worth of it, and then merges: as many rounds as that takes, not a fixed 32. Sessions
continuing it at the same moment, and replicas sharing the store, write each span once and build on the spans the
others wrote, even on the ones a wider summary has orphaned since.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from proxy.budget.budgets import Budgets
from proxy.compaction import compactor as compactor_module
from proxy.compaction.compactor import Compactor
from proxy.compaction.layout import SpanNeeded
from proxy.compaction.span_store import SpanStore
from proxy.compaction.spans import Allowance, CompactionRequest, SpanWriter
from proxy.compaction.summarizer import Summarizer
from proxy.config.models import ModelEntry
from proxy.config.schema import SUMMARIZE, ContextConfig
from proxy.errors import ContextTooLarge
from proxy.history.messages import StoredMessage, StoredPath
from proxy.history.store import History
from proxy.store.database import Database
from tests.support.postgres_server import PostgresServer
from tests.support.scripted_upstream import ScriptedUpstream, completion
from tests.unit.compaction.test_span_store import ENCODING, TENANT, conversation, stored_path

SUMMARIZER = ModelEntry(name="small", model="openai/fake-model", context_window=2_000, max_output=500)
"""The request's model, which summarizes too: it reads ~1,260 tokens at once, a few turns of `conversation`."""
BUDGET = 3_000
TURNS = 260
"""~44,000 tokens: some 35 spans of first summaries, then merges (more than the 32 rounds that used to be all)."""
SESSIONS = 6
WAIT_S = 60.0


def budgets() -> Budgets:
    return Budgets((SUMMARIZER,), lambda model: None, 0.05)


def compactor(db: Database, upstream: ScriptedUpstream) -> Compactor:
    summarizer = Summarizer(upstream, None, budgets(), ContextConfig())
    return Compactor(ContextConfig(), SpanStore(db), summarizer, locks=db)


def summaries(calls: int) -> ScriptedUpstream:
    """A summarizer upstream answering `calls` calls with a short summary (a further call fails the test)."""
    upstream = ScriptedUpstream()
    for number in range(calls):
        upstream.reply(completion(f"Summary {number}: the user asked questions and the assistant answered."))
    return upstream


def continued(path: list[StoredMessage], session: str) -> CompactionRequest:
    return CompactionRequest(
        tenant=TENANT,
        session_id=session,
        messages=[dict(stored.message) for stored in path],
        path=StoredPath(path),
        entry=SUMMARIZER,
        encoding=ENCODING,
        budget=BUDGET,
        preserve_recent=4,
    )


async def shared_path(history: History, session: str) -> list[StoredMessage]:
    """The long conversation and one question more, as a session continuing it sends them."""
    messages: list[dict[str, Any]] = [*conversation(TURNS), {"role": "user", "content": "and what now?"}]
    return await stored_path(history, messages, session=session)


async def ranges(db: Database) -> Counter[tuple[int, str, str]]:
    """How many spans the store holds over each (start depth, end message, strategy)."""
    rows = await db.fetchall("SELECT start_depth, end_id, strategy FROM summaries", ())
    return Counter((row["start_depth"], row["end_id"], row["strategy"]) for row in rows)


async def test_a_long_path_never_compacted_takes_as_many_spans_as_it_needs(db: Database) -> None:
    history = History(db)
    path = await shared_path(history, "alone")

    async with asyncio.timeout(WAIT_S):
        prepared = await compactor(db, summaries(2)).prepare(continued(path, "alone"))

    assert prepared.written > 32
    assert prepared.tokens <= BUDGET
    assert max((await ranges(db)).values()) == 1


async def test_a_round_that_changes_nothing_ends_the_request_at_once(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were a span written of no use to the builder (it asks for the same span again), the request is refused at
    once, instead of writing the same span round after round up to the bound."""
    path = await shared_path(History(db), "stuck")
    monkeypatch.setattr(compactor_module, "_superseded", lambda stored, need, summary: dict(stored))

    with pytest.raises(ContextTooLarge, match=r"again would change nothing"):
        await compactor(db, summaries(2)).prepare(continued(path, "stuck"))
    assert sum((await ranges(db)).values()) == 1


async def test_sessions_continuing_one_long_path_at_once_all_fit_and_write_each_span_once(db: Database) -> None:
    history = History(db)
    paths = [await shared_path(history, f"session {number}") for number in range(SESSIONS)]
    shared = compactor(db, summaries(2 * SESSIONS))

    async with asyncio.timeout(WAIT_S):
        prepared = await asyncio.gather(
            *(shared.prepare(continued(path, f"session {number}")) for number, path in enumerate(paths))
        )

    assert all(context.tokens <= BUDGET for context in prepared)
    assert max((await ranges(db)).values()) == 1


async def test_a_replica_whose_plan_another_merged_meanwhile_builds_on_the_merge(tmp_path: Path) -> None:
    """Two processes on one SQLite file share no lock: B's first summary is under way while A compacts the whole
    path, merging the first summaries it wrote. B then goes on from A's spans, orphaned ones included, instead of
    writing A's work again range by range."""
    db = await Database.open(tmp_path / "store.sqlite")
    try:
        history = History(db)
        path = await shared_path(history, "b")
        slow = ScriptedUpstream()
        under_way = slow.reply(completion("B's summary of the oldest turns."))
        released = under_way.hold()
        slow.reply(completion("Another summary."))
        b = asyncio.ensure_future(compactor(db, slow).prepare(continued(path, "b")))
        async with asyncio.timeout(WAIT_S):
            await under_way.taken.wait()
            a = await compactor(db, summaries(2)).prepare(continued(await shared_path(history, "a"), "a"))
            released.set()
            after_a = sum((await ranges(db)).values())
            prepared = await b
        assert a.written > 32
        assert prepared.tokens <= BUDGET
        assert prepared.written == 1  # the summary it had under way; then A's spans were all it needed
        assert sum((await ranges(db)).values()) - after_a <= 1
        assert len(slow.calls) == 1
    finally:
        await db.close()


async def test_a_span_a_wider_one_orphaned_is_found_written_not_written_again(db: Database) -> None:
    """A request that read the spans before another wrote a range and then merged it (orphaning it) finds that
    range written when it comes to write it: a summary of it all the same, and no summarizer call."""
    history = History(db)
    path = await shared_path(history, "a")
    await compactor(db, summaries(2)).prepare(continued(path, "a"))
    first = min(
        (span for span in await SpanStore(db).on_path(TENANT, path) if span.orphaned_at is not None),
        key=lambda span: span.start_depth,
    )
    start = first.start_depth - path[0].depth
    end = first.end_depth - path[0].depth + 1
    idle = summaries(0)
    writer = SpanWriter(ContextConfig(), SpanStore(db), Summarizer(idle, None, budgets(), ContextConfig()), locks=db)

    found = await writer.write(
        continued(path, "b"),
        SpanNeeded(start, end, parts=tuple(range(start, end))),
        {},
        Allowance(2, 60.0),
        lambda need, stored: [dict(path[part].message) for part in range(need.start, need.end)],
        original=first.original_tokens,
    )

    assert found == first
    assert idle.calls == []
    assert (await ranges(db))[(first.start_depth, first.end_id, SUMMARIZE)] == 1


async def test_replicas_compacting_one_path_at_once_write_each_span_once(postgres: PostgresServer) -> None:
    """Two replicas on one PostgreSQL store: a span's range is written under the store's lock, so the replica
    that comes second finds it written instead of paying the summarizer for it again."""
    url = postgres.database()
    replicas = [await Database.open(url), await Database.open(url)]
    try:
        history = History(replicas[0])
        paths = [await shared_path(history, f"session {number}") for number in range(SESSIONS)]
        compactors = [compactor(db, summaries(2 * SESSIONS)) for db in replicas]
        async with asyncio.timeout(WAIT_S):
            prepared = await asyncio.gather(
                *(
                    compactors[number % 2].prepare(continued(path, f"session {number}"))
                    for number, path in enumerate(paths)
                )
            )
        assert all(context.tokens <= BUDGET for context in prepared)
        assert max((await ranges(replicas[0])).values()) == 1
    finally:
        for db in replicas:
            await db.close()
