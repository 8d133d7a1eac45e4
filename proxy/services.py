"""The proxy's parts, built once from the frozen config and closed together.

Both the server (for its lifetime) and the CLI (for one look-up) open the same set, so the store, the journal
and the views they read are always wired the same way. The process environment is prepared here, before the
first token count or LiteLLM import, and recovery of unsealed journal steps runs here, before the server accepts
its first request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from proxy import environment
from proxy.budget.budgets import Budgets
from proxy.compaction.compactor import Compactor
from proxy.compaction.summaries import Summaries
from proxy.compaction.summarizer import Summarizer
from proxy.config import Config
from proxy.history.answers import Answers
from proxy.history.store import History
from proxy.inspection import Inspector
from proxy.journal.reader import JournalReader
from proxy.journal.recovery import Recovery
from proxy.journal.writer import Journal
from proxy.pipeline import Pipeline
from proxy.store.database import Database
from proxy.upstream.litellm_client import LiteLLMUpstream
from proxy.upstream.redaction import Redactor

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 10.0
"""How long streams still being read to their end (client gone) may take before shutdown interrupts them."""
PRUNE_INTERVAL_S = 3600.0


@dataclass(frozen=True)
class Services:
    config: Config
    db: Database
    pipeline: Pipeline
    inspector: Inspector
    upstream: LiteLLMUpstream


@asynccontextmanager
async def open_services(config: Config, *, recover: bool = True) -> AsyncIterator[Services]:
    environment.prepare()
    db = await Database.open(config.store.path, config.journal.synchronous)
    background: set[asyncio.Task[None]] = set()
    try:
        history = History(db)
        journal = Journal(db, Answers(history), config.journal)
        recovery = Recovery(db, journal)
        if recover:
            report = await recovery.recover()
            log.info("journal recovery: %s", report)
        upstream = LiteLLMUpstream(config.upstream, config.models, Redactor.from_config(config))
        budgets = Budgets(config.models, upstream.model_info, config.context.safety_margin)
        name = config.context.summarizer_model
        summaries = Summaries(db)
        summarizer = Summarizer(upstream, config.model(name) if name else None, budgets, config.context)
        compactor = Compactor(config.context, summaries, summarizer)
        reader = JournalReader(db, journal.unrecorded)
        pipeline = Pipeline(config, history, journal, reader, upstream, compactor, budgets, background)
        inspector = Inspector(config, history, summaries, reader, compactor, budgets)
        if recover:
            pruning = asyncio.create_task(_prune_periodically(recovery), name="journal-pruning")
            background.add(pruning)
            pruning.add_done_callback(background.discard)
        yield Services(config, db, pipeline, inspector, upstream)
    finally:
        await _finish(background)
        await db.close()


async def _finish(background: set[asyncio.Task[None]]) -> None:
    """Let detached streams seal (bounded), then cancel what remains: interrupted steps are recovered later."""
    streams = [task for task in background if task.get_name() != "journal-pruning"]
    for task in background - set(streams):
        task.cancel()
    if streams:
        _done, pending = await asyncio.wait(streams, timeout=SHUTDOWN_GRACE_S)
        for task in pending:
            task.cancel()
    await asyncio.gather(*background, return_exceptions=True)


async def _prune_periodically(recovery: Recovery) -> None:
    while True:
        await asyncio.sleep(PRUNE_INTERVAL_S)
        pruned = await recovery.prune_expired()
        if pruned:
            log.info("journal: pruned %d events of expired steps", pruned)
