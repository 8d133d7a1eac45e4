"""The proxy's parts, built once from the frozen config and closed together.

Both the server (for its lifetime) and the CLI (for one look-up) open the same set, so the store, the journal
and the views they read are always wired the same way. The process environment is prepared here, before the
first token count or LiteLLM import. A serving process registers as a journal owner and recovers the steps of
gone owners before it accepts its first request, then heartbeats and sweeps for steps other processes abandoned
while it runs, writes the endings of its own steps that the store could not take once it can, and deletes the
sessions idle past `store.retention_days` (`proxy.lifecycle.retention`); a look-up (`recover=False`) registers
nothing, recovers nothing and sweeps nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from proxy import environment
from proxy.budget.budgets import Budgets
from proxy.budget.shared_corrections import REFRESH_S, SharedCorrections
from proxy.compaction.compactor import Compactor
from proxy.compaction.events import CompactionEvents
from proxy.compaction.recall import Recall
from proxy.compaction.span_store import SpanStore
from proxy.compaction.summarizer import Summarizer
from proxy.compaction.summarizer_calls import SummarizerCalls
from proxy.config.schema import Config
from proxy.history.answers import Answers
from proxy.history.pins import Pins
from proxy.history.store import History
from proxy.inspection.views import Inspector
from proxy.journal.owners import Owners
from proxy.journal.reader import JournalReader
from proxy.journal.recovery import Recovery
from proxy.journal.writer import Journal
from proxy.lifecycle.deletions import Deletions
from proxy.lifecycle.retention import Retention, sweep_periodically
from proxy.lifecycle.stats import StatsReader
from proxy.observability.metrics import Metrics
from proxy.request.pipeline import Pipeline
from proxy.store.database import Database
from proxy.upstream import credentials
from proxy.upstream.router import UpstreamRouter

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 10.0
"""How long streams still being read to their end (client gone) may take before shutdown interrupts them."""
PRUNE_INTERVAL_S = 3600.0
SETTLE_RETRY_S = 0.5
"""How often the endings the store could not write are tried again: they show as in flight until written."""


@dataclass(frozen=True)
class Services:
    config: Config
    db: Database
    pipeline: Pipeline
    inspector: Inspector
    upstream: UpstreamRouter
    pins: Pins
    events: CompactionEvents
    metrics: Metrics
    deletions: Deletions
    retention: Retention
    stats: StatsReader


@asynccontextmanager
async def open_services(
    config: Config, *, recover: bool = True, metrics: Metrics | None = None
) -> AsyncIterator[Services]:
    """`metrics`: the app's (its middleware records into them too); a look-up's are its own and go unread."""
    environment.prepare()
    metrics = Metrics(entry.name for entry in config.models) if metrics is None else metrics
    db = await Database.open(config.store.target, config.journal.synchronous, pool_size=config.store.pool_size)
    background: set[asyncio.Task[None]] = set()
    """Detached streams (the pipeline adds them), given a grace at shutdown."""
    maintenance: list[asyncio.Task[None]] = []
    owners: Owners | None = None
    upstream: UpstreamRouter | None = None
    compactor: Compactor | None = None
    try:
        history = History(db)
        journal = Journal(db, Answers(history), config.journal, metrics=metrics)
        owners = Owners(db, journal.clock) if recover else None
        recovery = Recovery(db, journal, owners)
        if owners is not None:
            await owners.register()
            journal.owner = owners.id
            await recovery.recover()
        upstream = UpstreamRouter(
            config.upstream, config.models, credentials.redactor(config), config.request_limits.max_answer_chars
        )
        ttl_s = config.context.correction_ttl_s
        budgets = Budgets(
            config.models, upstream.model_info, config.context.safety_margin, SharedCorrections(db, ttl_s), ttl_s=ttl_s
        )
        await budgets.refresh()
        name = config.context.summarizer_model
        summaries = SpanStore(db)
        pins = Pins(db)
        events = CompactionEvents(db, metrics=metrics)
        summarizer_calls = SummarizerCalls(db)
        summarizer = Summarizer(
            upstream, config.model(name) if name else None, budgets, config.context, metrics, summarizer_calls
        )
        recall = Recall(db)
        compactor = Compactor(config.context, summaries, summarizer, events=events, pins=pins, recall=recall, locks=db)
        reader = JournalReader(db, journal.unrecorded)
        pipeline = Pipeline(config, history, journal, reader, upstream, compactor, budgets, background)
        inspector = Inspector(config, history, summaries, reader, compactor, budgets, pins, events, summarizer_calls)
        if owners is not None:
            maintenance.append(asyncio.create_task(_prune_periodically(recovery), name="journal-pruning"))
            maintenance.append(asyncio.create_task(_sweep_periodically(recovery, owners), name="journal-owners"))
            maintenance.append(asyncio.create_task(_settle_unrecorded(recovery, journal), name="journal-unrecorded"))
            maintenance.append(asyncio.create_task(_refresh_periodically(budgets), name="shared-corrections"))
        deletions = Deletions(db, history, caches=(recall,))
        retention = Retention(db, deletions, config.store)
        if owners is not None and retention.enabled:
            maintenance.append(asyncio.create_task(sweep_periodically(retention), name="retention"))
        stats = StatsReader(db)
        yield Services(config, db, pipeline, inspector, upstream, pins, events, metrics, deletions, retention, stats)
    finally:
        await _finish(background, maintenance)
        if compactor is not None:
            await compactor.close()
        if owners is not None:
            await _release(owners)
        if upstream is not None:
            await upstream.aclose()
        await db.close()


async def _finish(background: set[asyncio.Task[None]], maintenance: list[asyncio.Task[None]]) -> None:
    """Stop maintenance, let detached streams seal (bounded), then cancel what remains: interrupted steps are
    recovered later."""
    for task in maintenance:
        task.cancel()
    streams = list(background)
    if streams:
        _done, pending = await asyncio.wait(streams, timeout=SHUTDOWN_GRACE_S)
        for task in pending:
            task.cancel()
    await asyncio.gather(*maintenance, *streams, return_exceptions=True)


async def _release(owners: Owners) -> None:
    try:
        await owners.release()
    except Exception as exc:
        # The row stays; other processes take this one's open steps once its lease runs out.
        log.warning("journal owner %s could not be released: %s", owners.id, exc)


async def _refresh_periodically(budgets: Budgets) -> None:
    """Adopt the corrections other replicas learned (a store that is down is read again next time)."""
    while True:
        await asyncio.sleep(REFRESH_S)
        try:
            await budgets.refresh()
        except Exception as exc:
            log.warning("shared corrections could not be read: %s", exc)


async def _prune_periodically(recovery: Recovery) -> None:
    while True:
        await asyncio.sleep(PRUNE_INTERVAL_S)
        try:
            pruned = await recovery.prune_expired()
        except Exception as exc:
            log.warning("journal: pruning failed, to be tried again: %s", exc)  # a full disk, the store down
            continue
        if pruned:
            log.info("journal: pruned %d events of expired steps", pruned)


async def _settle_unrecorded(recovery: Recovery, journal: Journal) -> None:
    """Write the endings of this process's own steps that the store could not take (an outage, a full disk) as
    soon as it takes writes again: until then their rows say `open`, in flight to every reader, and no other
    process may end them while this one lives. Tried again every `SETTLE_RETRY_S`, at most, while it fails (a
    store known down fails such a try at once: `proxy.store.outage`)."""
    while True:
        await journal.unrecorded.wait()
        try:
            await recovery.settle_unrecorded()
        except Exception as exc:
            log.debug("journal: ended steps not recorded yet: %s", exc)
            await asyncio.sleep(SETTLE_RETRY_S)


async def _sweep_periodically(recovery: Recovery, owners: Owners) -> None:
    """Stay alive in `journal_owners` and settle what gone owners left: a replica that died is recovered by a
    survivor after its lease (or at once on the same host), without a restart."""
    while True:
        await asyncio.sleep(owners.heartbeat_s)
        try:
            await owners.heartbeat()
            await recovery.settle()
        except Exception as exc:
            # A full disk or a locked file passes; the next round tries again, well within the lease.
            log.warning("journal owners: heartbeat or sweep failed: %s", exc)
