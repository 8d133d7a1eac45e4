"""The proxy's parts, built once from the frozen config and closed together.

Both the server (for its lifetime) and the CLI (for one look-up) open the same set, so the store, the journal
and the views they read are always wired the same way. Recovery of unsealed journal steps runs here, before
the server accepts its first request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from proxy.chat import ChatCompletions
from proxy.compactor import Compactor
from proxy.config import Config, ModelEntry
from proxy.database import Database
from proxy.forward import Upstream
from proxy.history import History
from proxy.inspection import Inspector
from proxy.journal import Journal
from proxy.limits import ModelLimits, model_limits
from proxy.summaries import Summaries
from proxy.summarizer import Summarizer

log = logging.getLogger(__name__)

SHUTDOWN_GRACE_S = 10.0
"""How long streams still being read to their end (client gone) may take before shutdown interrupts them."""
PRUNE_INTERVAL_S = 3600.0


@dataclass(frozen=True)
class Services:
    config: Config
    db: Database
    history: History
    journal: Journal
    upstream: Upstream
    chat: ChatCompletions
    inspector: Inspector


@asynccontextmanager
async def open_services(config: Config, *, recover: bool = True) -> AsyncIterator[Services]:
    db = await Database.open(config.store.path, config.journal.synchronous)
    background: set[asyncio.Task[None]] = set()
    try:
        history = History(db)
        summaries = Summaries(db)
        journal = Journal(db, history, config.journal)
        if recover:
            report = await journal.recover()
            log.info("journal recovery: %s", report)
        upstream = Upstream(config.upstream, config.models)
        limits = _limits_table(config, upstream)
        name = config.context.summarizer_model
        summarizer = Summarizer(upstream, config.model(name) if name else None, limits, config.context)
        compactor = Compactor(config.context, summaries, summarizer)
        chat = ChatCompletions(config, history, journal, upstream, compactor, limits, background)
        inspector = Inspector(config, history, summaries, journal, compactor, limits)
        if recover:
            pruning = asyncio.create_task(_prune_periodically(journal), name="journal-pruning")
            background.add(pruning)
            pruning.add_done_callback(background.discard)
        yield Services(config, db, history, journal, upstream, chat, inspector)
    finally:
        await _finish(background)
        await db.close()


def _limits_table(config: Config, upstream: Upstream) -> Callable[[ModelEntry], ModelLimits]:
    """Each configured model's limits, resolved once at startup (config → LiteLLM's map → prefixes → default)."""
    table = {entry.name: model_limits(entry, upstream.model_info) for entry in config.models}

    def limits(entry: ModelEntry) -> ModelLimits:
        known = table.get(entry.name)
        return known if known is not None else model_limits(entry, upstream.model_info)

    return limits


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


async def _prune_periodically(journal: Journal) -> None:
    while True:
        await asyncio.sleep(PRUNE_INTERVAL_S)
        pruned = await journal.prune_expired()
        if pruned:
            log.info("journal: pruned %d events of expired steps", pruned)
